"""Client configuration: RocketMQ's defaults, range checks, the time scale, and the CLI layering."""

from __future__ import annotations

import argparse

import pytest

from rmqlab.client.cli_common import add_config_args, layered_settings
from rmqlab.client.client_config import ConfigError, ConsumerConfig, ProducerConfig
from rmqlab.client.consumer_base import normalize_enums
from rmqlab.protocol.clock import TimeScale
from rmqlab.protocol.model import ConsumeFromWhere, MessageModel


def test_rocketmq_defaults() -> None:
    c = ConsumerConfig()
    assert (c.rebalance_wait_interval, c.heartbeat_broker_interval, c.poll_name_server_interval) == (
        20_000,
        30_000,
        30_000,
    )
    assert (c.persist_consumer_offset_interval, c.pull_max_idle_time, c.lock_max_live_time) == (
        5_000,
        120_000,
        30_000,
    )
    assert (c.lock_interval, c.unlock_delay_time_mills, c.broker_suspend_max_time_millis) == (
        20_000,
        20_000,
        15_000,
    )
    assert (c.pull_threshold_for_queue, c.pull_threshold_size_for_queue, c.consume_concurrently_max_span) == (
        1000,
        100,
        2000,
    )
    assert (c.pull_batch_size, c.consume_message_batch_max_size, c.consume_thread_min) == (32, 1, 20)
    assert c.message_model is MessageModel.CLUSTERING
    assert c.consume_from_where is ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET
    assert c.max_reconsume_times_concurrently() == 16 and c.max_reconsume_times_orderly() == 2**31 - 1
    p = ProducerConfig()
    assert (p.send_msg_timeout, p.retry_times_when_send_failed, p.send_latency_fault_enable) == (
        3000,
        2,
        False,
    )


def test_time_scale_applies_to_every_interval() -> None:
    c = ConsumerConfig(time_scale=0.05)
    assert c.seconds(c.rebalance_wait_interval) == pytest.approx(1.0)
    assert c.ms(c.pull_max_idle_time) == pytest.approx(6000)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("pull_batch_size", 0),
        ("pull_batch_size", 1025),
        ("consume_thread_min", 0),
        ("pull_threshold_for_topic", 0),
        ("consume_concurrently_max_span", 65536),
        ("time_scale", 0),
        ("consume_timestamp", "2024-01-01"),
    ],
)
def test_out_of_range_values_are_rejected_by_name(field: str, value: object) -> None:
    with pytest.raises(ConfigError, match=field):
        ConsumerConfig.from_mapping({field: value})


def test_unknown_setting_is_named() -> None:
    with pytest.raises(ConfigError, match="no_such_thing"):
        ConsumerConfig.from_mapping({"no_such_thing": 1})


def test_enum_strings_and_rocketmq5_switches() -> None:
    opts = normalize_enums({"message_model": "broadcasting", "consume_from_where": "first"})
    assert opts["message_model"] is MessageModel.BROADCASTING
    assert opts["consume_from_where"] is ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET
    with pytest.raises(ConfigError, match="consume_from_where"):
        normalize_enums({"consume_from_where": "middle"})
    five = ConsumerConfig.from_mapping(ConsumerConfig.rocketmq5())
    assert five.rebalance_retry_when_unbalanced and five.pull_request_dispatch_delay == 500


def test_layering_toml_env_and_set(tmp_path: object) -> None:
    toml = tmp_path / "c.toml"  # type: ignore[operator]
    toml.write_text("[consumer]\npull_batch_size = 8\nconsume_thread_min = 4\n")
    parser = argparse.ArgumentParser()
    add_config_args(parser)
    args = parser.parse_args(
        ["--config", str(toml), "--set", "consume_thread_min=2", "--set", "orderly_unlock_5x=true"]
    )
    settings = layered_settings(ConsumerConfig, args, "consumer", environ={"RMQ_PULL_BATCH_SIZE": "16"})
    assert settings == {"pull_batch_size": 16, "consume_thread_min": 2, "orderly_unlock_5x": True}
    with pytest.raises(ConfigError, match="unknown setting"):
        layered_settings(ConsumerConfig, parser.parse_args(["--set", "bogus=1"]), "consumer", environ={})
    with pytest.raises(ConfigError, match="cannot parse"):
        layered_settings(
            ConsumerConfig, parser.parse_args(["--set", "pull_batch_size=x"]), "consumer", environ={}
        )


def test_consumer_rejects_bad_arguments_clearly() -> None:
    from rmqlab.client.errors import MQClientError
    from rmqlab.client.push_consumer import PushConsumer

    with pytest.raises(MQClientError, match="group"):
        PushConsumer("", namesrv="127.0.0.1:9876")
    with pytest.raises(ValueError, match="unknown allocation strategy"):
        PushConsumer("g", namesrv="127.0.0.1:9876", strategy="NOPE")
    c = PushConsumer("g", namesrv="127.0.0.1:9876")
    with pytest.raises(MQClientError, match="illegal characters"):
        c.subscribe("a topic")
    with pytest.raises(MQClientError, match="callable"):
        c.register_message_listener("not a function")  # type: ignore[arg-type]


def test_consume_timestamp_in_local_time_ms_per_config() -> None:
    """The parse is remembered per string: each config still gets its own timestamp."""
    import time

    for text in ("20240102030405", "20250607080910", "20240102030405"):
        want = int(time.mktime((int(text[:4]), int(text[4:6]), int(text[6:8]), 0, 0, 0, 0, 0, -1))) * 1000
        want += (int(text[8:10]) * 3600 + int(text[10:12]) * 60 + int(text[12:])) * 1000
        assert ConsumerConfig(consume_timestamp=text).consume_timestamp_ms() == want


@pytest.mark.parametrize("factor", [0.05, 1.0, 3, 0.1])
def test_intervals_scale_exactly_as_time_scale_does(factor: float) -> None:
    c = ConsumerConfig(time_scale=factor)
    for value in (0, 1, 1_000, 15_000, 20_000.5, 3):
        assert c.ms(value) == TimeScale(factor).ms(value)
        assert c.seconds(value) == TimeScale(factor).seconds(value)


@pytest.mark.parametrize("factor", [0.0, -1.0, 0])
def test_a_time_scale_that_is_not_positive_is_refused_when_used(factor: float) -> None:
    c = ConsumerConfig(time_scale=factor)
    with pytest.raises(ValueError, match="time scale must be > 0"):
        c.seconds(1_000)
    with pytest.raises(ValueError, match="time scale must be > 0"):
        c.ms(1_000)
