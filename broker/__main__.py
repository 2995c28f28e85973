"""``python -m rmqlab.broker`` / ``rmq-broker``: run one broker; prints ``READY host:port`` once listening."""

from __future__ import annotations

import argparse
import asyncio
import sqlite3
import sys

from rmqlab.broker.controller import BrokerController
from rmqlab.broker.plain_acl import AclConfigError, PlainAccessValidator
from rmqlab.broker.server_config import BrokerConfig
from rmqlab.broker.store import StoreError
from rmqlab.broker.topic_config import PERM_READ_WRITE, TopicConfig
from rmqlab.cli import (
    ROLE_EXIT_CODES,
    add_common_args,
    add_metrics_port,
    add_native_port_arg,
    announce_ready,
    command_parser,
    host_port,
    non_negative_int,
    port_number,
    positive_int,
)
from rmqlab.protocol.command import DEFAULT_MAX_FRAME_BYTES
from rmqlab.protocol.event_log import EventLog
from rmqlab.protocol.main_loop import run_async_main


def _namesrv(text: str) -> str:
    return text if text == "embedded" else host_port(text)


def _topic_spec(text: str) -> tuple[str, int | None]:
    name, sep, queues = text.partition(":")
    if not name or any(c.isspace() for c in name):
        raise argparse.ArgumentTypeError(f"bad topic name in {text!r}")
    if not sep:
        return name, None
    if not queues.isdigit() or not 1 <= int(queues) <= 1024:
        raise argparse.ArgumentTypeError(f"queues must be 1..1024 in {text!r}")
    return name, int(queues)


def build_parser() -> argparse.ArgumentParser:
    p = command_parser(
        "rmq-broker",
        "A RocketMQ broker emulator: consumer groups, offsets, locks, messages, long polling.",
        ROLE_EXIT_CODES,
    )
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=port_number, default=10911, help="port to listen on; 0 picks a free one")
    add_common_args(p)
    add_metrics_port(p)
    p.add_argument(
        "--broker-name",
        default="broker-a",
        help="the broker's name in routes and queues (brokerName); default broker-a",
    )
    p.add_argument("--cluster", default="DefaultCluster", help="cluster name registered with the name server")
    p.add_argument(
        "--broker-id",
        type=non_negative_int,
        default=0,
        help="brokerId: 0 for the master (default), 1 or more for a slave (needs --broker-role SLAVE)",
    )
    p.add_argument(
        "--broker-role",
        type=str.upper,
        choices=("ASYNC_MASTER", "SYNC_MASTER", "SLAVE"),
        default="ASYNC_MASTER",
        help="brokerRole (default ASYNC_MASTER); a SYNC_MASTER answers a send once a slave holds it",
    )
    p.add_argument(
        "--ha-master-address",
        default=None,
        help="HOST:PORT a slave copies messages from; default: the master its registration names",
    )
    p.add_argument(
        "--ha-replication-lag-ms",
        type=non_negative_int,
        default=0,
        help="a slave holds each copied batch this long before storing it (RocketMQ ms, at --time-scale; "
        "default 0)",
    )
    p.add_argument(
        "--slave-read-enable",
        action="store_true",
        help="slaveReadEnable: pull answers suggest the slave to consumers far behind",
    )
    p.add_argument(
        "--access-message-in-memory-max-bytes",
        type=non_negative_int,
        default=BrokerConfig.access_message_in_memory_max_bytes,
        help="bytes behind the commit log's end past which a pull counts as slow (default %(default)s)",
    )
    p.add_argument(
        "--store-dir", default=None, help="keep messages, offsets and topics durably in SQLite here"
    )
    p.add_argument(
        "--namesrv",
        type=_namesrv,
        default="embedded",
        help="HOST:PORT of a name server to register with, or 'embedded' (default): serve routes here",
    )
    p.add_argument(
        "--max-frame-bytes",
        type=positive_int,
        default=DEFAULT_MAX_FRAME_BYTES,
        help="largest frame accepted; a bigger one closes its connection (default %(default)s)",
    )
    p.add_argument("--no-auto-create-topic", action="store_true", help="unknown topics get TOPIC_NOT_EXIST")
    p.add_argument("--default-queue-nums", type=positive_int, default=4, help="queues of auto-created topics")
    p.add_argument(
        "--notify-on-channel-expired",
        action="store_true",
        help="what-if: notify the group when a registration expires (RocketMQ does not)",
    )
    p.add_argument(
        "--release-locks-on-close",
        action="store_true",
        help="what-if: release a client's queue locks when its connection closes (RocketMQ does not)",
    )
    p.add_argument(
        "--flush-consumer-offset-interval",
        type=non_negative_int,
        default=0,
        metavar="MS",
        help="keep committed offsets in memory and write them every MS (RocketMQ: 5000, the first time "
        "after 10 s), so a kill -9 rolls them back; 0 (default): every commit is durable at once",
    )
    p.add_argument(
        "--rocketmq5",
        action="store_true",
        help="RocketMQ 5's broker rules: no NOTIFY for broadcasting groups, the 5.x retry/DLQ rule, and "
        "QUERY_NOT_FOUND for the offset of a fresh, empty queue",
    )
    p.add_argument(
        "--controller-mode",
        action="store_true",
        help="RocketMQ 5's controller mode (enableControllerMode): the controller elects this broker set's "
        "master; --broker-id 0 may be the set's first master, --broker-role is the role as master",
    )
    p.add_argument(
        "--controller-addr",
        default=None,
        metavar="HOST:PORT",
        help="the controller (controllerAddr); default: the name server (enableControllerInNamesrv)",
    )
    p.add_argument(
        "--default-message-request-mode",
        choices=("PULL", "POP"),
        default="PULL",
        help="RocketMQ 5 server-side assignment: the mode of a topic and group with none set "
        "(defaultMessageRequestMode, default PULL)",
    )
    p.add_argument(
        "--default-pop-share-queue-num",
        type=int,
        default=-1,
        metavar="N",
        help="the pop share number that goes with the POP default mode (defaultPopShareQueueNum, default -1: "
        "every consumer pops every queue)",
    )
    p.add_argument(
        "--no-server-load-balancer",
        action="store_true",
        help="QUERY_ASSIGNMENT answers every queue (serverLoadBalancerEnable off)",
    )
    p.add_argument("--disable-notify", action="store_true", help="send no NOTIFY_CONSUMER_IDS_CHANGED at all")
    p.add_argument(
        "--create-topic",
        action="append",
        default=[],
        type=_topic_spec,
        metavar="TOPIC[:QUEUES]",
        help="create this topic at start (repeatable; queues default to --default-queue-nums); real "
        "clients look a topic's route up before its first message",
    )
    p.add_argument(
        "--advertise-port",
        type=port_number,
        default=None,
        help="port published in routes when clients must reach the broker elsewhere (e.g. a fault relay)",
    )
    add_native_port_arg(p, " (0 picks a free one); the msgpack port is unchanged")
    p.add_argument(
        "--acl",
        metavar="FILE",
        default=None,
        help="check every request against this plain_acl.yml as RocketMQ 4.9's ACL does (both ports)",
    )
    p.add_argument(
        "--admin-from",
        choices=("loopback", "any"),
        default="loopback",
        help="without --acl: who may use topic creation, broker registration and the admin and fault "
        "codes 9000-9099 (default loopback)",
    )
    return p


def config_from_args(args: argparse.Namespace) -> BrokerConfig:
    if args.default_queue_nums > 1024:
        raise SystemExit("rmq-broker: error: --default-queue-nums must be at most 1024")
    return BrokerConfig(
        broker_name=args.broker_name,
        cluster_name=args.cluster,
        broker_id=args.broker_id,
        broker_role=args.broker_role,
        ha_master_address=args.ha_master_address,
        ha_replication_lag_ms=args.ha_replication_lag_ms,
        slave_read_enable=args.slave_read_enable,
        access_message_in_memory_max_bytes=args.access_message_in_memory_max_bytes,
        host=args.host,
        port=args.port,
        advertised_port=args.advertise_port or None,
        time_scale=args.time_scale,
        store_dir=args.store_dir,
        namesrv=args.namesrv,
        max_frame_bytes=args.max_frame_bytes,
        auto_create_topic=not args.no_auto_create_topic,
        default_topic_queue_nums=args.default_queue_nums,
        notify_consumer_ids_changed=not args.disable_notify,
        notify_on_channel_expired=args.notify_on_channel_expired,
        release_locks_on_close=args.release_locks_on_close,
        admin_from=args.admin_from,
        acl_file=_acl_file(args.acl),
        flush_consumer_offset_interval_ms=args.flush_consumer_offset_interval,
        rocketmq5=args.rocketmq5,
        controller_mode=args.controller_mode,
        controller_addr=args.controller_addr,
        default_message_request_mode=args.default_message_request_mode,
        default_pop_share_queue_num=args.default_pop_share_queue_num,
        server_load_balancer_enable=not args.no_server_load_balancer,
    )


def _acl_file(path: str | None) -> str | None:
    """Read the ACL file once here so that a bad one stops the broker with ``file:line: problem``."""
    if path is None:
        return None
    try:
        PlainAccessValidator.from_file(path)
    except OSError as exc:
        raise SystemExit(f"rmq-broker: error: --acl {path}: {exc.strerror or exc}") from None
    except AclConfigError as exc:
        raise SystemExit(f"rmq-broker: error: {exc}") from None
    return path


async def serve(
    config: BrokerConfig,
    log: EventLog,
    native_port: int | None = None,
    topics: list[tuple[str, int | None]] | None = None,
    metrics_port: int | None = None,
) -> int:
    try:
        broker = BrokerController(config, log=log)
    except ValueError as exc:  # a role that does not fit the broker id, a slave without a master
        print(f"rmq-broker: error: {exc}", file=sys.stderr)
        return 2
    metrics = None
    if metrics_port is not None:
        from rmqlab.protocol.metrics import NodeLabels, RoleMetrics

        broker.metrics = metrics = RoleMetrics(NodeLabels("broker", log.node))
    try:
        await broker.start()
    except (OSError, sqlite3.Error, StoreError) as exc:
        print(f"rmq-broker: cannot start on {config.host}:{config.port}: {exc}", file=sys.stderr)
        return 2
    try:
        for name, queues in topics or []:
            n = queues or config.default_topic_queue_nums
            tc = TopicConfig(name, n, n, PERM_READ_WRITE)
            if broker.topic_manager.put(tc):
                broker.topic_created(tc)
        ready = broker.address
        if native_port is not None:
            try:
                ready += f" native={await broker.start_native_port(native_port)}"
            except OSError as exc:
                print(f"rmq-broker: cannot listen on {config.host}:{native_port}: {exc}", file=sys.stderr)
                return 2
        if metrics is not None:
            assert metrics_port is not None
            metrics.watch(asyncio.get_running_loop(), broker.metrics_snapshot)
            try:
                ready += f" metrics={config.host}:{metrics.serve(metrics_port, config.host)}"
            except OSError as exc:
                print(
                    f"rmq-broker: cannot serve metrics on {config.host}:{metrics_port}: {exc}",
                    file=sys.stderr,
                )
                return 2
        announce_ready(ready)
        await asyncio.Event().wait()  # until SIGTERM/SIGINT cancels us
    finally:
        if metrics is not None:
            metrics.close()
        await asyncio.shield(broker.shutdown())
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    config = config_from_args(args)
    log = EventLog(args.node or config.broker_name, "broker", args.log_file)
    try:
        return run_async_main(
            lambda: serve(config, log, args.remoting_port, args.create_topic, args.metrics_port)
        )
    finally:
        log.close()


if __name__ == "__main__":
    sys.exit(main())
