"""rmq-producer: sends ``--count`` messages to a topic at ``--rate`` messages per second.

Prints ``READY`` once started and exits 0 after the last acknowledged send; when sends fail even after
RocketMQ's retries it keeps going and exits 1 at the end, saying how many failed. Every acknowledged send
is a ``message_sent`` event.
"""

from __future__ import annotations

import argparse
import asyncio
import sys

from rmqlab.cli import (
    add_common_args,
    announce_ready,
    command_parser,
    host_port,
    non_negative_int,
    positive_float,
    positive_int,
)
from rmqlab.client.cli_common import add_config_args, layered_settings, run_client_main
from rmqlab.client.client_config import ConfigError, ProducerConfig
from rmqlab.client.errors import MQBrokerError, MQClientError
from rmqlab.client.producer import DEFAULT_PRODUCER_GROUP, Producer, check_topic
from rmqlab.protocol.event_log import EventLog


def build_parser() -> argparse.ArgumentParser:
    p = command_parser(
        "rmq-producer",
        "RocketMQ-style producer workload",
        {
            0: "every message was sent and acknowledged",
            1: "some sends failed",
            2: "bad usage or configuration",
        },
    )
    p.add_argument("--namesrv", required=True, type=host_port, help="name server HOST:PORT")
    p.add_argument("--topic", required=True, help="topic to send to")
    p.add_argument("--rate", required=True, type=positive_float, help="messages per second (wall clock)")
    p.add_argument("--count", required=True, type=positive_int, help="how many messages to send")
    p.add_argument("--size", type=positive_int, default=128, help="body size in bytes (default 128)")
    p.add_argument("--group", default=DEFAULT_PRODUCER_GROUP, help="producer group")
    p.add_argument("--tags", default=None, help="tag of every message")
    p.add_argument("--max-inflight", type=positive_int, default=32, help="concurrent sends (default 32)")
    p.add_argument("--instance-name", default=None, help="instanceName (default pid#nanos)")
    p.add_argument("--progress-every", type=non_negative_int, default=0, help="print progress every N acks")
    add_config_args(p)
    add_common_args(p)
    return p


def make_body(i: int, size: int, node: str) -> bytes:
    head = f"{node}:{i}:".encode()
    if len(head) >= size:
        return head[:size]
    return head + b"x" * (size - len(head))


async def run(args: argparse.Namespace, log: EventLog, node: str) -> int:
    check_topic(args.topic)
    settings = layered_settings(ProducerConfig, args, "producer")
    settings.update(namesrv_addr=args.namesrv, time_scale=args.time_scale)
    if args.instance_name is not None:
        settings["instance_name"] = args.instance_name
    config = ProducerConfig.from_mapping(settings)
    if args.size > config.max_message_size:
        raise ConfigError(f"--size {args.size} is over max_message_size {config.max_message_size}")
    producer = Producer(args.group, config=config, log=log)
    await producer.start()
    announce_ready(producer.client_id)
    acked = 0
    failed = 0
    slots = asyncio.Semaphore(args.max_inflight)
    loop = asyncio.get_running_loop()
    t0 = loop.time()

    async def send_one(i: int) -> None:
        nonlocal acked, failed
        try:
            await producer.send(args.topic, make_body(i, args.size, node), tags=args.tags, keys=f"{node}-{i}")
            acked += 1
            if args.progress_every and acked % args.progress_every == 0:
                print(f"acked {acked}/{args.count}", flush=True)
        except (MQClientError, MQBrokerError) as exc:  # a broker error code no retry covers (SYSTEM_BUSY)
            failed += 1
            print(f"rmq-producer: message {i} failed: {exc}", file=sys.stderr, flush=True)
            log.emit("send_abandoned", topic=args.topic, index=i, error=str(exc))
        finally:
            slots.release()

    try:
        async with asyncio.TaskGroup() as tg:
            for i in range(args.count):
                delay = t0 + i / args.rate - loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)
                await slots.acquire()
                tg.create_task(send_one(i))
    finally:
        await producer.shutdown()
    if failed:
        print(f"rmq-producer: {failed} of {args.count} sends failed ({acked} acknowledged)", file=sys.stderr)
        return 1
    print(f"sent {acked} messages to {args.topic}", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    node = args.node or "producer"
    log = EventLog(node, "producer", args.log_file)
    return run_client_main("rmq-producer", log, lambda: run(args, log, node))


if __name__ == "__main__":
    sys.exit(main())
