"""``rmq-namesrv``: run a standalone name server; prints ``READY host:port`` once listening."""

from __future__ import annotations

import argparse
import asyncio
import sys

from rmqlab.broker.namesrv import NamesrvController
from rmqlab.broker.server_config import NamesrvConfig
from rmqlab.cli import (
    ROLE_EXIT_CODES,
    add_common_args,
    add_metrics_port,
    add_native_port_arg,
    announce_ready,
    command_parser,
    port_number,
    positive_int,
)
from rmqlab.protocol.command import DEFAULT_MAX_FRAME_BYTES
from rmqlab.protocol.event_log import EventLog
from rmqlab.protocol.main_loop import run_async_main


def build_parser() -> argparse.ArgumentParser:
    p = command_parser("rmq-namesrv", "A RocketMQ name server emulator.", ROLE_EXIT_CODES)
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=port_number, default=9876, help="port to listen on; 0 picks a free one")
    p.add_argument(
        "--max-frame-bytes",
        type=positive_int,
        default=DEFAULT_MAX_FRAME_BYTES,
        help="largest frame accepted; a bigger one closes its connection (default %(default)s)",
    )
    p.add_argument(
        "--enable-controller-in-namesrv",
        action="store_true",
        help="run RocketMQ 5's controller in the name server (enableControllerInNamesrv): brokers started "
        "with --controller-mode elect their masters through it",
    )
    add_native_port_arg(p)
    add_common_args(p)
    add_metrics_port(p)
    return p


async def serve(
    config: NamesrvConfig, log: EventLog, native_port: int | None = None, metrics_port: int | None = None
) -> int:
    ns = NamesrvController(config, log=log)
    try:
        await ns.start()
    except OSError as exc:
        print(f"rmq-namesrv: cannot listen on {config.host}:{config.port}: {exc}", file=sys.stderr)
        return 2
    native = None
    ready = ns.address
    if native_port is not None:
        from rmqlab.protocol.native import start_native_port

        try:
            # Brokers that opened a native port register it as nativeAddr; routes asked for here
            # point real clients at those ports.
            native = await start_native_port(ns.server, config.host, native_port, log=log)
        except OSError as exc:
            print(f"rmq-namesrv: cannot listen on {config.host}:{native_port}: {exc}", file=sys.stderr)
            await ns.shutdown()
            return 2
        ready += f" native={config.host}:{native.port}"
    metrics = None
    try:
        if metrics_port is not None:
            from rmqlab.protocol.metrics import NodeLabels, RoleMetrics

            metrics = RoleMetrics(NodeLabels("nameserver", log.node))
            metrics.watch(asyncio.get_running_loop(), ns.metrics_snapshot)
            try:
                ready += f" metrics={config.host}:{metrics.serve(metrics_port, config.host)}"
            except OSError as exc:
                print(
                    f"rmq-namesrv: cannot serve metrics on {config.host}:{metrics_port}: {exc}",
                    file=sys.stderr,
                )
                return 2
        announce_ready(ready)
        await asyncio.Event().wait()
    finally:
        if metrics is not None:
            metrics.close()
        if native is not None:
            await asyncio.shield(native.close())
        await asyncio.shield(ns.shutdown())
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    config = NamesrvConfig(
        host=args.host,
        port=args.port,
        time_scale=args.time_scale,
        max_frame_bytes=args.max_frame_bytes,
        enable_controller_in_namesrv=args.enable_controller_in_namesrv,
    )
    log = EventLog(args.node or "namesrv", "namesrv", args.log_file)
    try:
        return run_async_main(lambda: serve(config, log, args.remoting_port, args.metrics_port))
    finally:
        log.close()


if __name__ == "__main__":
    sys.exit(main())
