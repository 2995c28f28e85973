"""A consumer process whose listener is a user's function (what the pytest plugin starts).

``python -m rmqlab.chaos.listener_host --listener PATH.py::NAME [rmq-consumer flags]`` imports the function
``NAME`` from the file (or ``--listener package.module:NAME`` from an importable module) and runs a
push consumer with it, exactly as ``rmq-consumer`` does with its built-in listener: ``READY <client_id>``
when started, a graceful shutdown on SIGTERM, a ``message_consumed`` event per acknowledged message.

The function takes the batch of messages (``fn(msgs)`` or ``fn(msgs, context)``), sync or async;
returning normally acknowledges the batch, raising asks for redelivery (RocketMQ's RECONSUME_LATER, or
SUSPEND_CURRENT_QUEUE_A_MOMENT when orderly).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rmqlab.protocol.event_log import EventLog


class ListenerError(ValueError):
    """The listener given to rmq-consumer cannot be loaded."""


def load_listener(spec: str) -> Callable[..., Any]:
    """``path/to/file.py::name`` or ``package.module:name`` -> the callable."""
    if "::" in spec:
        path_text, _, qualname = spec.partition("::")
        path = Path(path_text).resolve()
        if not path.is_file():
            raise ListenerError(f"listener file {path} does not exist")
        # Let the file import its sibling modules (conftest-style ones too) as it does under pytest.
        for p in (str(path.parent), str(path.parent.parent)):
            if p not in sys.path:
                sys.path.insert(0, p)
        mod_spec = importlib.util.spec_from_file_location(f"_rmq_listener_{path.stem}", path)
        if mod_spec is None or mod_spec.loader is None:
            raise ListenerError(f"cannot import {path}")
        module = importlib.util.module_from_spec(mod_spec)
        sys.modules[mod_spec.name] = module
        mod_spec.loader.exec_module(module)
    elif ":" in spec:
        mod_name, _, qualname = spec.partition(":")
        module = importlib.import_module(mod_name)
    else:
        raise ListenerError(f"--listener must be PATH.py::NAME or module:NAME, got {spec!r}")
    obj: Any = module
    for part in qualname.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ListenerError(f"{spec}: no attribute {part!r}") from None
    if not callable(obj):
        raise ListenerError(f"{spec} is not callable")
    return obj


def listener_spec(fn: Callable[..., Any]) -> str:
    """How to find ``fn`` again from another process: by its file when it has one, else by module."""
    qualname = getattr(fn, "__qualname__", "")
    if not qualname or "<" in qualname:
        raise ListenerError(
            f"the listener {fn!r} must be a module-level function (not a lambda or a nested function): "
            "it is imported again in each consumer process"
        )
    module = sys.modules.get(fn.__module__)
    path = getattr(module, "__file__", None)
    if path:
        return f"{path}::{qualname}"
    return f"{fn.__module__}:{qualname}"


def build_parser() -> argparse.ArgumentParser:
    from rmqlab.client.consumer_main import build_parser as consumer_parser

    p = consumer_parser()
    p.prog = "python -m rmqlab.chaos.listener_host"
    p.description = "A push consumer whose listener is a user's function."
    p.add_argument("--listener", required=True, help="PATH.py::NAME or package.module:NAME")
    return p


async def run(args: argparse.Namespace, log: EventLog) -> int:
    from rmqlab.client.consumer_main import serve

    return await serve(args, log, load_listener(args.listener))


def main(argv: list[str] | None = None) -> int:
    from rmqlab.client.cli_common import run_client_main

    args = build_parser().parse_args(argv)
    log = EventLog(args.node or f"consumer-{args.group}", "consumer", args.log_file)
    return run_client_main("listener host", log, lambda: run(args, log))


if __name__ == "__main__":
    sys.exit(main())
