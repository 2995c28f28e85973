"""client_version: each release's behaviour switches, from Apache's release history."""

from __future__ import annotations

import pytest

from rmqlab.client.client_config import ConfigError, ConsumerConfig
from rmqlab.client.versions import (
    BEHAVIOURS,
    CLIENT_VERSIONS,
    DEFAULT_CLIENT_VERSION,
    UnknownVersion,
    behaviour,
    settings_for_version,
)


def test_the_default_version_is_the_default_config() -> None:
    defaults = ConsumerConfig()
    assert settings_for_version(DEFAULT_CLIENT_VERSION) == {
        b.field: getattr(defaults, b.field) for b in BEHAVIOURS
    }


def test_the_newest_5x_is_what_rocketmq5_selects() -> None:
    assert ConsumerConfig.rocketmq5() == settings_for_version(CLIENT_VERSIONS[-1])
    assert ConsumerConfig.rocketmq5() != settings_for_version(DEFAULT_CLIENT_VERSION)


@pytest.mark.parametrize(
    ("version", "field", "value"),
    [
        ("4.9.4", "lock_new_process_queue", False),
        ("4.9.5", "lock_new_process_queue", True),
        ("4.9.8", "query_offset_error_as_not_found", True),
        ("5.0.0", "query_offset_error_as_not_found", False),
        ("5.1.4", "orderly_unlock_5x", False),
        ("5.2.0", "orderly_unlock_5x", True),
        ("5.3.1", "lock_in_broadcasting", True),
        ("5.3.2", "lock_in_broadcasting", False),
        ("5.3.1", "query_assignment_fallback", True),
        ("5.3.2", "query_assignment_fallback", False),
        ("4.9.8", "pull_request_dispatch_delay", 0),
        ("5.0.0", "pull_request_dispatch_delay", 500),
    ],
)
def test_a_switch_turns_at_its_release(version: str, field: str, value: object) -> None:
    assert settings_for_version(version)[field] == value


def test_every_switch_is_a_consumer_setting_with_a_known_release() -> None:
    for b in BEHAVIOURS:
        assert b.since in CLIENT_VERSIONS
        ConsumerConfig.from_mapping({b.field: b.before})
        ConsumerConfig.from_mapping({b.field: b.after})
        assert b.before != b.after


def test_unknown_versions_and_switches_name_what_exists() -> None:
    with pytest.raises(UnknownVersion, match=r"unknown client_version '4\.9'; known: 4\.7\.0, .*5\.3\.3"):
        settings_for_version("4.9")
    with pytest.raises(UnknownVersion, match="known: instance_name_with_nano_time, lock_new_process_queue, "):
        behaviour("lock_new_queue")
    assert behaviour("orderly_unlock_5x").since == "5.2.0"


def test_a_config_given_a_client_version_takes_its_switches_and_named_ones_win() -> None:
    cfg = ConsumerConfig.from_mapping({"client_version": "4.9.4", "pull_batch_size": 16})
    assert not cfg.lock_new_process_queue and cfg.pull_batch_size == 16
    cfg = ConsumerConfig.from_mapping({"client_version": "5.2.0", "orderly_unlock_5x": False})
    assert cfg.rebalance_retry_when_unbalanced and not cfg.orderly_unlock_5x
    with pytest.raises(ConfigError, match=r"unknown client_version '4\.6\.0'; known: 4\.7\.0"):
        ConsumerConfig.from_mapping({"client_version": "4.6.0"})


def test_before_4_9_0_the_default_instance_name_is_the_pid() -> None:
    import os

    from rmqlab.client.push_consumer import PushConsumer

    old = PushConsumer("GID_v", config=ConsumerConfig.from_mapping({"client_version": "4.8.0"}))
    new = PushConsumer("GID_v", config=ConsumerConfig.from_mapping({"client_version": "4.9.0"}))
    assert old.instance_name == str(os.getpid())
    assert new.instance_name.startswith(f"{os.getpid()}#") and new.client_id != old.client_id


def test_rmq_consumer_takes_a_client_version_with_set() -> None:
    import argparse

    from rmqlab.client.cli_common import add_config_args, layered_settings
    from rmqlab.client.client_config import ProducerConfig

    parser = argparse.ArgumentParser()
    add_config_args(parser)
    args = parser.parse_args(["--set", "client_version=4.9.4", "--set", "pull_batch_size=16"])
    settings = layered_settings(ConsumerConfig, args, "consumer", environ={})
    cfg = ConsumerConfig.from_mapping(settings)
    assert not cfg.lock_new_process_queue and cfg.pull_batch_size == 16
    with pytest.raises(ConfigError, match="unknown setting 'client_version' for --set"):
        layered_settings(ProducerConfig, parser.parse_args(["--set", "client_version=4.9.4"]), "producer", {})
