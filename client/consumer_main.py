"""rmq-consumer: a push consumer process for workloads and experiments.

Each consumed message is written as a ``message_consumed`` event; ``--consume-ms`` is the listener's
simulated work time (wall-clock milliseconds, not scaled). Prints ``READY <client_id>`` once started;
SIGTERM or SIGINT shut it down gracefully (offsets persisted, locks released, UNREGISTER_CLIENT sent).
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from collections.abc import Callable
from typing import Any

from rmqlab.cli import (
    ROLE_EXIT_CODES,
    add_common_args,
    add_metrics_port,
    announce_ready,
    command_parser,
    host_port,
    non_negative_int,
)
from rmqlab.client.cli_common import add_config_args, layered_settings, run_client_main
from rmqlab.client.client_config import ConsumerConfig
from rmqlab.client.consumer_base import normalize_enums
from rmqlab.client.push_consumer import PushConsumer
from rmqlab.protocol.allocate import STRATEGY_NAMES
from rmqlab.protocol.event_log import EventLog
from rmqlab.protocol.model import Message, MessageModel


def build_parser() -> argparse.ArgumentParser:
    p = command_parser("rmq-consumer", "RocketMQ-style push consumer", ROLE_EXIT_CODES)
    p.add_argument("--namesrv", required=True, type=host_port, help="name server HOST:PORT")
    p.add_argument("--group", required=True, help="consumer group")
    p.add_argument("--topic", required=True, action="append", help="topic to subscribe (repeatable)")
    p.add_argument("--expression", default="*", help="tag expression, e.g. 'TagA || TagB' (default *)")
    p.add_argument("--orderly", action="store_true", help="orderly consumption (queue locks)")
    p.add_argument("--broadcast", action="store_true", help="BROADCASTING instead of CLUSTERING")
    p.add_argument(
        "--strategy",
        default="AVG",
        help=f"allocation strategy: {', '.join(STRATEGY_NAMES)} (default AVG)",
    )
    p.add_argument(
        "--consume-ms", type=non_negative_int, default=0, help="work time per message, ms (literal)"
    )
    p.add_argument(
        "--consume-from",
        choices=("first", "last", "timestamp"),
        default=None,
        help="for new queues (default last)",
    )
    p.add_argument("--consume-timestamp", default=None, help="yyyyMMddHHmmss for --consume-from timestamp")
    p.add_argument(
        "--instance-name",
        default=None,
        help="instanceName (default DEFAULT, which CLUSTERING consumers change to pid#nanos, unique "
        "per process; a BROADCASTING consumer keeps it, so its local offsets survive a restart)",
    )
    p.add_argument("--rocketmq5", action="store_true", help="RocketMQ >=5.2 client behaviour (see README)")
    add_config_args(p)
    add_common_args(p)
    add_metrics_port(p)
    return p


def make_config(args: argparse.Namespace) -> ConsumerConfig:
    settings = layered_settings(ConsumerConfig, args, "consumer")
    if args.rocketmq5:
        settings.update(ConsumerConfig.rocketmq5())
    settings.update(
        namesrv_addr=args.namesrv,
        time_scale=args.time_scale,
        message_model=MessageModel.BROADCASTING if args.broadcast else MessageModel.CLUSTERING,
    )
    if args.consume_timestamp is not None:
        settings["consume_timestamp"] = args.consume_timestamp
    if args.instance_name is not None:
        settings["instance_name"] = args.instance_name
    if args.consume_from is not None:
        settings["consume_from_where"] = args.consume_from
    return ConsumerConfig.from_mapping(normalize_enums(settings))


async def serve(args: argparse.Namespace, log: EventLog, listener: Callable[..., Any]) -> int:
    """Run a push consumer with ``listener`` until cancelled (SIGTERM/SIGINT): READY line once
    started, then leave the group the way RocketMQ's shutdown() does."""
    consumer = PushConsumer(args.group, config=make_config(args), strategy=args.strategy, log=log)
    for topic in args.topic:
        consumer.subscribe(topic, args.expression)
    if args.orderly:
        consumer.register_message_listener_orderly(listener)
    else:
        consumer.register_message_listener(listener)
    await consumer.start()
    metrics = getattr(args, "metrics_addr", None)
    announce_ready(consumer.client_id + (f" metrics={metrics}" if metrics else ""))
    try:
        await asyncio.Event().wait()
    finally:
        await consumer.shutdown()
    return 0


class ListenerGate:
    """The hung-listener fault: SIGUSR1 makes every listener call block (a stuck database call) while the
    process stays alive and keeps heartbeating; SIGUSR2 lets the blocked calls return success."""

    def __init__(self, log: EventLog, group: str) -> None:
        self.log = log
        self.group = group
        self.open = asyncio.Event()
        self.open.set()

    def hang(self) -> None:
        if self.open.is_set():
            self.open.clear()
            self.log.emit("listener_hung", group=self.group)

    def release(self) -> None:
        if not self.open.is_set():
            self.open.set()
            self.log.emit("listener_released", group=self.group)

    def install(self) -> None:
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGUSR1, self.hang)
        loop.add_signal_handler(signal.SIGUSR2, self.release)


async def run(args: argparse.Namespace, log: EventLog) -> int:
    if args.metrics_port is not None:
        from prometheus_client import CollectorRegistry

        from rmqlab.protocol.metrics import ConsumerMetrics, MetricsServer

        registry = CollectorRegistry()
        log.listeners.append(ConsumerMetrics(registry).on_event)
        try:
            server = MetricsServer(registry, args.metrics_port)
        except OSError as exc:
            print(f"rmq-consumer: cannot serve metrics on port {args.metrics_port}: {exc}", file=sys.stderr)
            return 2
        args.metrics_addr = f"127.0.0.1:{server.port}"
        try:
            return await _run(args, log)
        finally:
            server.close()
    return await _run(args, log)


async def _run(args: argparse.Namespace, log: EventLog) -> int:
    work_s = args.consume_ms / 1000.0
    gate = ListenerGate(log, args.group)
    gate.install()

    async def listener(msgs: list[Message]) -> None:
        await gate.open.wait()
        if work_s > 0:
            await asyncio.sleep(work_s * len(msgs))

    return await serve(args, log, listener)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    node = args.node or f"consumer-{args.group}"
    log = EventLog(node, "consumer", args.log_file)
    return run_client_main("rmq-consumer", log, lambda: run(args, log))


if __name__ == "__main__":
    sys.exit(main())
