"""Driver for Apache's RocketMQ 5 Python client (PyPI ``rocketmq-python-client`` 5.1.2), for the lab.

Run it with the v5 client's interpreter (``.venv-v5/bin/python interop/py5_client.py ...``, made by
scripts/setup_real_clients.sh); it needs nothing from the project. It talks gRPC to ``rmq-proxy``.

``consumer`` joins a group as a push consumer (``--kind push``, the default) or a simple consumer
(``--kind simple``: receive, process, ack), and writes EVENTS.md lines: ``consumer_started``,
``message_consumed`` (``mode`` CONCURRENTLY) when the listener returned success, ``consumer_stopped``;
SIGUSR1 hangs the listener and SIGUSR2 releases it (``listener_hung`` / ``listener_released``).
The queue a message came from is read from its receipt handle (broker name, queue id, queue offset); a
message revived into the pop retry topic names that topic. ``producer`` sends ``--count`` messages and
prints one JSON line per acknowledged send (the proxy, the producer the broker sees, writes their
``message_sent`` events).

Prints ``READY <client id>`` once started; SIGTERM or SIGINT shuts down gracefully.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from typing import Any

# Run as a script, so this folder is on sys.path (the project itself is not importable here).
from lab_events import EventWriter, now_ms

POP_RETRY_FLAG = "1"


def queue_of(receipt: str, topic: str, group: str) -> tuple[str, str, int, int]:
    """(topic, broker, queue id, queue offset) from a receipt handle: ``ckOffset popTime invisibleTime
    reviveQid retry brokerName queueId offset``; retry ``1`` means the pop retry topic."""
    parts = receipt.split(" ")
    if len(parts) < 8:
        return topic, "", -1, -1
    real = f"%RETRY%{group}_{topic}" if parts[4] == POP_RETRY_FLAG else topic
    return real, parts[5], int(parts[6]), int(parts[7])


class Consumed:
    """Writes ``message_consumed`` for one processed message. The lab's hung-listener fault: SIGUSR1 makes
    every listener call block (the process lives and heartbeats), SIGUSR2 lets them return."""

    def __init__(self, events: EventWriter, group: str, consume_ms: int) -> None:
        self.events = events
        self.group = group
        self.consume_ms = consume_ms
        self.client_id = ""
        self.open = threading.Event()
        self.open.set()

    def hang(self, *_: Any) -> None:
        if self.open.is_set():
            self.open.clear()
            self.events.emit("listener_hung", group=self.group)

    def release(self, *_: Any) -> None:
        if not self.open.is_set():
            self.open.set()
            self.events.emit("listener_released", group=self.group)

    def process(self, message: Any) -> None:
        self.open.wait()
        started = now_ms()
        if self.consume_ms > 0:
            time.sleep(self.consume_ms / 1000)
        topic, broker, queue_id, offset = queue_of(message.receipt_handle or "", message.topic, self.group)
        self.events.emit(
            "message_consumed",
            group=self.group,
            client_id=self.client_id,
            msg_id=message.message_id,
            topic=topic,
            broker=broker,
            queue_id=queue_id,
            queue_offset=offset,
            started_ms=started,
            mode="CONCURRENTLY",
            reconsume_times=max(0, (message.delivery_attempt or 1) - 1),
            body=bytes(message.body or b"").decode("utf-8", "replace")[:200],
        )


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="py5_client", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="role", required=True)
    c = sub.add_parser("consumer", help="a push or simple consumer")
    c.add_argument("--endpoints", required=True, help="HOST:PORT of rmq-proxy")
    c.add_argument("--group", required=True)
    c.add_argument("--topic", required=True)
    c.add_argument("--tags", default="*", help="tag expression (default *)")
    c.add_argument("--kind", choices=("push", "simple"), default="push")
    c.add_argument("--consume-ms", type=int, default=0, help="time the listener takes per message")
    c.add_argument("--invisible-s", type=int, default=20, help="simple consumer: invisible duration (s)")
    c.add_argument("--batch", type=int, default=16, help="simple consumer: messages per receive")
    c.add_argument("--node", default=None, help="node name in events (default: py5-<pid>)")
    c.add_argument("--log-file", default=None, help="events file (JSON lines); stderr when absent")
    pr = sub.add_parser("producer", help="send messages")
    pr.add_argument("--endpoints", required=True)
    pr.add_argument("--topic", required=True)
    pr.add_argument("--count", type=int, default=10)
    pr.add_argument("--prefix", default="py5")
    pr.add_argument("--tag", default=None)
    return p


class Stopping(Exception):
    """SIGTERM or SIGINT while a simple consumer waits in a receive."""


def simple_loop(
    consumer: Any, consumed: Consumed, events: EventWriter, args: argparse.Namespace, stop: Any
) -> None:
    while not stop.is_set():
        try:
            messages = consumer.receive(args.batch, args.invisible_s)
        except Stopping:
            raise
        except Exception as exc:  # no message within the long polling, or the proxy went away
            if "MESSAGE_NOT_FOUND" not in str(exc) and "no new message" not in str(exc):
                events.emit("log", level="warning", msg=f"receive failed: {exc}")
                stop.wait(1)
            continue
        for message in messages:
            consumed.process(message)
            try:
                consumer.ack(message)
            except Stopping:
                raise
            except Exception as exc:
                events.emit(
                    "ack_failed",
                    group=args.group,
                    client_id=consumed.client_id,
                    msg_id=message.message_id,
                    error=str(exc)[:200],
                )


def run_consumer(args: argparse.Namespace) -> int:
    from rocketmq import (
        ClientConfiguration,
        ConsumeResult,
        Credentials,
        FilterExpression,
        MessageListener,
        PushConsumer,
        SimpleConsumer,
    )

    events = EventWriter(args.node or f"py5-{os.getpid()}", args.log_file)
    consumed = Consumed(events, args.group, args.consume_ms)
    config = ClientConfiguration(args.endpoints, Credentials())
    subscription = {args.topic: FilterExpression(args.tags)}
    stop = threading.Event()

    def on_signal(*_: Any) -> None:
        stop.set()
        if args.kind == "simple":
            raise Stopping  # out of a receive's long poll at once

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGUSR1, consumed.hang)
    signal.signal(signal.SIGUSR2, consumed.release)

    class Listener(MessageListener):  # type: ignore[misc]
        def consume(self, message: Any) -> Any:
            consumed.process(message)
            return ConsumeResult.SUCCESS

    if args.kind == "push":
        consumer: Any = PushConsumer(config, args.group, Listener(), subscription)
    else:
        consumer = SimpleConsumer(config, args.group, subscription)
    consumer.startup()
    consumed.client_id = consumer.client_id
    events.emit(
        "consumer_started",
        group=args.group,
        client_id=consumer.client_id,
        client="py5-5.1.2",
        topic=args.topic,
    )
    print(f"READY {consumer.client_id}", flush=True)
    if args.kind == "push":
        while not stop.wait(0.2):
            pass
    else:
        try:
            simple_loop(consumer, consumed, events, args, stop)
        except Stopping:
            pass  # messages received and not acked come back after their invisible time
    consumer.shutdown()
    events.emit("consumer_stopped", group=args.group, client_id=consumed.client_id)
    events.close()
    return 0


def run_producer(args: argparse.Namespace) -> int:
    from rocketmq import ClientConfiguration, Credentials, Message, Producer

    producer = Producer(ClientConfiguration(args.endpoints, Credentials()), (args.topic,))
    producer.startup()
    print(f"READY {producer.client_id}", flush=True)
    for i in range(args.count):
        msg = Message()
        msg.topic = args.topic
        msg.body = f"{args.prefix}-{i}".encode()
        if args.tag:
            msg.tag = args.tag
        receipt = producer.send(msg)
        print(
            json.dumps({"sent": receipt.message_id, "offset": receipt.offset, "body": f"{args.prefix}-{i}"}),
            flush=True,
        )
    producer.shutdown()
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return run_consumer(args) if args.role == "consumer" else run_producer(args)


if __name__ == "__main__":
    sys.exit(main())
