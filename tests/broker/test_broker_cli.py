"""The broker's and name server's command lines map onto their configs."""

from __future__ import annotations

import pytest

from rmqlab.broker.__main__ import build_parser, config_from_args
from rmqlab.broker.namesrv_main import build_parser as namesrv_parser


def test_broker_flags():
    args = build_parser().parse_args(
        [
            "--host", "0.0.0.0", "--port", "0", "--time-scale", "0.05", "--node", "b1",
            "--log-file", "x.jsonl", "--broker-name", "broker-b", "--cluster", "C", "--store-dir", "d",
            "--namesrv", "h:9876", "--max-frame-bytes", "1024", "--no-auto-create-topic",
            "--default-queue-nums", "8", "--notify-on-channel-expired", "--release-locks-on-close",
            "--disable-notify", "--advertise-port", "7000",
        ]
    )  # fmt: skip
    cfg = config_from_args(args)
    assert (cfg.host, cfg.port, cfg.time_scale, cfg.broker_name, cfg.cluster_name) == (
        "0.0.0.0", 0, 0.05, "broker-b", "C",
    )  # fmt: skip
    assert (cfg.store_dir, cfg.namesrv, cfg.max_frame_bytes, cfg.default_topic_queue_nums) == (
        "d",
        "h:9876",
        1024,
        8,
    )
    assert not cfg.auto_create_topic and not cfg.notify_consumer_ids_changed
    assert cfg.notify_on_channel_expired and cfg.release_locks_on_close and cfg.advertised_port == 7000
    assert cfg.channel_expired_timeout == 6000 and cfg.lock_max_live_time == 3000
    assert cfg.scaled_delay_levels[0] == 50 and cfg.scaled(5_000) == 250


def test_broker_defaults_are_rocketmq_s():
    cfg = config_from_args(build_parser().parse_args([]))
    assert (cfg.port, cfg.namesrv, cfg.broker_name, cfg.cluster_name) == (
        10911,
        "embedded",
        "broker-a",
        "DefaultCluster",
    )
    assert cfg.auto_create_topic and cfg.notify_consumer_ids_changed and cfg.default_topic_queue_nums == 4
    assert not cfg.notify_on_channel_expired and not cfg.release_locks_on_close
    assert cfg.max_frame_bytes == 16 * 1024 * 1024 and isinstance(cfg.max_frame_bytes, int)
    assert (cfg.channel_expired_timeout, cfg.lock_max_live_time) == (120_000, 60_000)


def test_slave_flags():
    args = build_parser().parse_args(
        [
            "--broker-id", "2", "--broker-role", "slave", "--namesrv", "h:9876",
            "--ha-master-address", "m:10911", "--ha-replication-lag-ms", "1500", "--slave-read-enable",
            "--access-message-in-memory-max-bytes", "4096",
        ]
    )  # fmt: skip
    cfg = config_from_args(args)
    assert (cfg.broker_id, cfg.broker_role, cfg.ha_master_address, cfg.ha_replication_lag_ms) == (
        2, "SLAVE", "m:10911", 1500,
    )  # fmt: skip
    assert cfg.slave_read_enable and cfg.access_message_in_memory_max_bytes == 4096
    default = config_from_args(build_parser().parse_args([]))
    assert (default.broker_id, default.broker_role, default.slave_read_enable) == (0, "ASYNC_MASTER", False)
    assert (default.slave_timeout_ms, default.slave_sync_interval_ms) == (3_000, 10_000)


@pytest.mark.parametrize(
    "argv",
    [
        ["--namesrv", "nohost"],
        ["--port", "70000"],
        ["--time-scale", "-1"],
        ["--default-queue-nums", "0"],
        ["--broker-id", "-1"],
        ["--broker-role", "PRIMARY"],
        ["--ha-replication-lag-ms", "x"],
    ],
)
def test_bad_flags_exit_with_usage_error(argv, capsys):
    with pytest.raises(SystemExit) as ei:
        build_parser().parse_args(argv)
    assert ei.value.code == 2
    assert argv[0] in capsys.readouterr().err


def test_namesrv_flags():
    args = namesrv_parser().parse_args(["--port", "0", "--time-scale", "0.1"])
    assert (args.host, args.port, args.time_scale) == ("127.0.0.1", 0, 0.1)
    assert namesrv_parser().parse_args([]).port == 9876


@pytest.mark.parametrize("module", ["rmqlab.broker.__main__", "rmqlab.broker.namesrv_main"])
def test_every_flag_has_a_help_text(module: str) -> None:
    import importlib

    parser = importlib.import_module(module).build_parser()
    missing = [a.option_strings[0] for a in parser._actions if a.option_strings and not a.help]
    assert missing == []
