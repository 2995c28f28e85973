"""What rmq-consumer and rmq-producer share: configuration layering (TOML file, RMQ_* environment
variables, ``--set key=value`` options, then the explicit flags; later layers win) and the process entry."""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from collections.abc import Awaitable, Callable
from typing import Any

from rmqlab.cli import add_access_keys
from rmqlab.client.client_config import PROTOCOLS, ClientConfig, ConfigError, _parse_scalar
from rmqlab.client.errors import MQClientError
from rmqlab.protocol.event_log import EventLog
from rmqlab.protocol.main_loop import run_async_main


def add_config_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config", metavar="FILE.toml", help="settings file (its [consumer] or [producer] table)"
    )
    parser.add_argument(
        "--set",
        metavar="KEY=VALUE",
        action="append",
        default=[],
        help="any client setting by its field name, e.g. --set pull_batch_size=16 (repeatable)",
    )
    parser.add_argument(
        "--protocol",
        choices=PROTOCOLS,
        default=None,
        help="wire to the name server and brokers: msgpack (the lab's servers, the default) or native "
        "(RocketMQ's own remoting protocol: Apache's broker and name server, or our servers' native ports)",
    )
    add_access_keys(parser)


def layered_settings(
    cls: type[ClientConfig], args: argparse.Namespace, table: str, environ: dict[str, str] | None = None
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if args.config:
        try:
            out.update(cls.load_toml(args.config, table))
        except OSError as exc:
            raise ConfigError(f"cannot read {args.config}: {exc.strerror or exc}") from None
        except ValueError as exc:
            raise ConfigError(f"{args.config}: {exc}") from None
    out.update(cls.from_env("RMQ_", dict(os.environ) if environ is None else environ))
    types = {f.name: f.type for f in dataclasses.fields(cls)}
    for item in args.set:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError(f"--set expects KEY=VALUE, got {item!r}")
        if key in cls.MAPPING_KEYS:  # e.g. client_version, which from_mapping expands
            out[key] = raw.strip()
            continue
        if key not in types:
            raise ConfigError(f"unknown setting {key!r} for --set")
        out[key] = _parse_scalar(key, types[key], raw.strip())
    for key in ("protocol", "access_key", "secret_key"):
        if getattr(args, key, None) is not None:
            out[key] = getattr(args, key)
    for key, value in list(out.items()):
        typ = str(types.get(key, ""))
        if typ.startswith("tuple") and isinstance(value, list | str):
            items = value.split(",") if isinstance(value, str) else value
            out[key] = tuple(int(v) for v in items)
    return out


def run_client_main(prog: str, log: EventLog, run: Callable[[], Awaitable[int]]) -> int:
    """Run a client process until ``run`` returns: a bad setting or a client error is one line on
    stderr and exit code 2, not a traceback; the event log is flushed and closed in every case."""

    async def entry() -> int:
        try:
            return await run()
        except (ConfigError, MQClientError, ValueError) as exc:
            print(f"{prog}: {exc}", file=sys.stderr)
            return 2

    try:
        return run_async_main(entry)
    finally:
        log.close()
