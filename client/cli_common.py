"""Configuration layering shared by rmq-consumer and rmq-producer: TOML file, RMQ_* environment variables,
``--set key=value`` options, then the explicit flags (later layers win)."""

from __future__ import annotations

import argparse
import dataclasses
import os
from typing import Any

from client.config import ClientConfig, ConfigError, _parse_scalar


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
        if key not in types:
            raise ConfigError(f"unknown setting {key!r} for --set")
        out[key] = _parse_scalar(key, types[key], raw.strip())
    for key, value in list(out.items()):
        typ = str(types.get(key, ""))
        if typ.startswith("tuple") and isinstance(value, list | str):
            items = value.split(",") if isinstance(value, str) else value
            out[key] = tuple(int(v) for v in items)
    return out
