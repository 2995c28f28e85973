"""``rmq-proxy``: RocketMQ 5's gRPC endpoint for Apache's v5 clients, over the lab's brokers.

Prints ``READY host:port`` once listening. Needs the ``[v5]`` extra (grpcio, protobuf and the v5 API
classes); without it, one line on stderr says how to install them.
"""

from __future__ import annotations

import argparse
import asyncio
import sys

from rmqlab.cli import (
    ROLE_EXIT_CODES,
    add_common_args,
    announce_ready,
    command_parser,
    host_port,
    port_number,
    positive_int,
)
from rmqlab.protocol.event_log import EventLog
from rmqlab.protocol.main_loop import run_async_main


def build_parser() -> argparse.ArgumentParser:
    p = command_parser(
        "rmq-proxy",
        "A gRPC endpoint of RocketMQ 5 (apache.rocketmq.v2) over the lab's brokers.",
        ROLE_EXIT_CODES,
    )
    p.add_argument(
        "--namesrv", required=True, type=host_port, help="HOST:PORT of the name server (msgpack port)"
    )
    p.add_argument(
        "--host", default="127.0.0.1", help="address to listen on and to give clients (default 127.0.0.1)"
    )
    p.add_argument(
        "--port", type=port_number, default=8081, help="gRPC port (default 8081, RocketMQ's); 0 picks one"
    )
    p.add_argument(
        "--min-invisible-ms",
        type=positive_int,
        default=None,
        help="smallest invisible duration a receive may ask (default RocketMQ's 10000)",
    )
    add_common_args(p)
    return p


async def serve(args: argparse.Namespace, log: EventLog) -> int:
    from rmqlab.proxy.proxy_config import ProxyConfig
    from rmqlab.proxy.server import ProxyServer

    extra = {"min_invisible_ms": args.min_invisible_ms} if args.min_invisible_ms is not None else {}
    config = ProxyConfig(
        namesrv=args.namesrv, host=args.host, port=args.port, time_scale=args.time_scale, **extra
    )
    server = ProxyServer(config, log)
    try:
        await server.start()
    except OSError as exc:
        print(f"rmq-proxy: cannot listen on {config.host}:{config.port}: {exc}", file=sys.stderr)
        return 2
    try:
        announce_ready(server.address)
        await server.wait()
    finally:
        await asyncio.shield(server.stop())
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        import rmqlab.proxy.v5  # noqa: F401  (fails early, with the install command, when the extra is missing)
    except ImportError as exc:
        print(f"rmq-proxy: {exc}", file=sys.stderr)
        return 2
    log = EventLog(args.node or "proxy", "proxy", args.log_file)
    try:
        return run_async_main(lambda: serve(args, log))
    finally:
        log.close()


if __name__ == "__main__":
    sys.exit(main())
