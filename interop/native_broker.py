"""Run a broker (with its embedded name server) plus RocketMQ's native remoting port, for real clients.

``python interop/native_broker.py --port 0 --native-port 0 [broker flags]`` prints
``READY <host>:<port> native=<host>:<native port>`` once both listen. Point real clients' name server
address at the native port: route answers given there name the native port too.
"""

from __future__ import annotations

import asyncio
import sys

from broker.__main__ import build_parser, config_from_args
from broker.config import BrokerConfig
from broker.controller import BrokerController
from protocol.codes import RequestCode, ResponseCode
from protocol.command import DEFAULT_MAX_FRAME_BYTES, RemotingCommand
from protocol.native import start_native_port
from protocol.remoting import RemotingClient
from protocol.runtime import EventLog, announce_ready, port_number, run_async_main


async def create_topics(addr: str, topics: list[str], queue_nums: int) -> None:
    """Create topics through the broker's own UPDATE_AND_CREATE_TOPIC, so real consumers find routes."""
    client = RemotingClient()
    try:
        for topic in topics:
            ext = {"topic": topic, "readQueueNums": queue_nums, "writeQueueNums": queue_nums, "perm": 6}
            req = RemotingCommand.request(RequestCode.UPDATE_AND_CREATE_TOPIC, ext)
            resp = await client.invoke(addr, req, 5.0)
            if resp.code != ResponseCode.SUCCESS:
                raise SystemExit(f"native_broker: cannot create topic {topic}: {resp.remark}")
    finally:
        await client.close()


async def serve(config: BrokerConfig, native_port: int, topics: list[str], log: EventLog) -> int:
    broker = BrokerController(config, log=log)
    try:
        await broker.start()
        native = await start_native_port(broker.server, config.host, native_port, log=log)
    except OSError as exc:
        print(f"native_broker: cannot listen: {exc}", file=sys.stderr)
        await broker.shutdown()
        return 2
    log.emit("native_port_started", addr=native.address, broker=config.broker_name)
    try:
        await create_topics(broker.address, topics, config.default_topic_queue_nums)
        announce_ready(f"{broker.address} native={native.address}")
        await asyncio.Event().wait()
    finally:
        await asyncio.shield(native.close())
        await asyncio.shield(broker.shutdown())
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    parser.prog = "native_broker"
    parser.add_argument("--native-port", type=port_number, default=9876, help="RocketMQ remoting port")
    parser.add_argument(
        "--create-topic",
        action="append",
        default=[],
        metavar="TOPIC",
        help="create this topic at start (real clients look a topic up before its first message)",
    )
    args = parser.parse_args(argv)
    if not isinstance(args.max_frame_bytes, int):  # guard against a non-int parser default
        args.max_frame_bytes = DEFAULT_MAX_FRAME_BYTES
    config = config_from_args(args)
    log = EventLog(args.node or config.broker_name, "broker", args.log_file)
    try:
        return run_async_main(lambda: serve(config, args.native_port, args.create_topic, log))
    finally:
        log.close()


if __name__ == "__main__":
    sys.exit(main())
