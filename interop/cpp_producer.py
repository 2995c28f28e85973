"""Producer driver for Apache's C++ RocketMQ client 2.1.0, run with ``.venv-real/bin/python``.

Sends ``--count`` messages to ``--topic`` round-robin over its queues, with bodies
``<prefix>-<n>``, and writes a ``message_sent`` line per acknowledged send. ``msg_id`` is what the client
reports, the message's ``UNIQ_KEY`` (what real consumers see as the message id). Prints ``READY``
once started and exits 0 after the last acknowledged send.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import sys
import time
from typing import Any

# Run as a script, so this folder is on sys.path (the project itself is not importable here).
from lab_events import EventWriter


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="cpp_producer", description=__doc__.split("\n\n")[0])
    p.add_argument("--namesrv", required=True, help="HOST:PORT of the emulator's native port")
    p.add_argument("--topic", required=True)
    p.add_argument("--group", default="cpp-producer")
    p.add_argument("--count", type=int, default=10)
    p.add_argument("--rate", type=float, default=0.0, help="messages per second (0: as fast as acked)")
    p.add_argument("--prefix", default="cpp")
    p.add_argument("--tags", default=None)
    p.add_argument("--broker-name", default="broker-a", help="broker name written in events")
    p.add_argument("--access-key", default=None, help="ACL session credentials (with --secret-key)")
    p.add_argument("--secret-key", default=None)
    p.add_argument("--node", default=None)
    p.add_argument("--log-file", default=None)
    args = p.parse_args(argv)

    from rocketmq.client import Message, Producer
    from rocketmq.ffi import dll

    events = EventWriter(args.node or f"cpp-producer-{os.getpid()}", args.log_file, role="producer")
    producer = Producer(args.group)
    producer.set_namesrv_addr(args.namesrv)
    if args.access_key or args.secret_key:
        # AclClientRPCHook's C++ twin: every request signed with these
        producer.set_session_credentials(args.access_key or "", args.secret_key or "", "")
    dll.SetProducerMessageTrace.argtypes = [ctypes.c_void_p, ctypes.c_int]
    dll.SetProducerMessageTrace(producer._handle, 0)  # OPEN: see cpp_consumer.py
    producer.start()
    print("READY", flush=True)
    chosen: dict[str, int] = {}

    def round_robin(mq_size: int, _msg: Any, arg: Any) -> int:
        qid = ctypes.cast(arg, ctypes.POINTER(ctypes.c_int))[0] % mq_size
        chosen["queue_id"] = qid
        return qid

    failures = 0
    for n in range(args.count):
        msg = Message(args.topic)
        msg.set_body(f"{args.prefix}-{n}")
        msg.set_keys(f"{args.prefix}-{n}")
        if args.tags:
            msg.set_tags(args.tags)
        try:
            result = producer.send_orderly(msg, n, retry_times=3, queue_selector=round_robin)
        except Exception as exc:  # the client raises its own exception types
            failures += 1
            events.emit("send_failed", topic=args.topic, error=repr(exc))
            continue
        events.emit(
            "message_sent",
            msg_id=result.msg_id,
            topic=args.topic,
            broker=args.broker_name,
            queue_id=chosen.get("queue_id", -1),
            queue_offset=int(result.offset),
            body=f"{args.prefix}-{n}",
        )
        if args.rate > 0:
            time.sleep(1 / args.rate)
    producer.shutdown()
    events.close()
    sys.stdout.flush()
    os._exit(1 if failures else 0)


if __name__ == "__main__":
    sys.exit(main())
