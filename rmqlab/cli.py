"""What every console script shares: argument types, the common options (``--version``, ``--quiet``,
``--json``, ``--out``, ``--master``, the access keys), the exit-code epilog of ``--help``, the resolver
of shipped experiments and sweeps, and the progress printer.

A leaf: it imports nothing of the lab but its version, so every layer may use it.
"""

from __future__ import annotations

import argparse
import difflib
import json
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, TextIO

import shtab

from rmqlab import DISTRIBUTION, __version__

EXIT_OK = 0
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130

# --------------------------------------------------------------------------------------------------
# Argument types: each rejects bad input with a message that names the value (argparse exits 2).


def _number(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if value != value or value in (float("inf"), float("-inf")):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text}")
    return value


def positive_float(text: str) -> float:
    value = _number(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text}")
    return value


def non_negative_float(text: str) -> float:
    value = _number(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text}")
    return value


def integer(text: str) -> int:
    try:
        return int(text, 10)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None


def positive_int(text: str) -> int:
    value = integer(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def non_negative_int(text: str) -> int:
    value = integer(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def bounded_int(low: int, high: int) -> Callable[[str], int]:
    """An argparse type for an integer in ``low..high``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be between {low} and {high}, got {value}")
        return value

    return parse


def port_number(text: str) -> int:
    value = non_negative_int(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"port must be 0..65535, got {text}")
    return value


def host_port(text: str) -> str:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) <= 65535:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {text!r}")
    return text


# What a long-running role's exit status says (rmq-broker, rmq-namesrv, rmq-consumer, rmq-proxy).
ROLE_EXIT_CODES = {
    0: "stopped (SIGTERM or SIGINT) after a clean shutdown",
    2: "bad usage or configuration (a port in use, an unreadable file)",
}

# --------------------------------------------------------------------------------------------------
# Parsers: one way to make a command's parser and its common options.


def version_text(prog: str | None = None) -> str:
    return f"{prog} ({DISTRIBUTION} {__version__})" if prog else f"{DISTRIBUTION} {__version__}"


def exit_codes_epilog(codes: Mapping[int, str]) -> str:
    width = max(len(str(c)) for c in codes)
    return "exit codes:\n" + "\n".join(f"  {c:<{width}}  {text}" for c, text in sorted(codes.items()))


def command_parser(
    prog: str, description: str, exit_codes: Mapping[int, str], note: str = "", **kwargs: Any
) -> argparse.ArgumentParser:
    """A console script's parser: ``--version``, and ``--help`` ending with ``note`` and the exit codes."""
    p = argparse.ArgumentParser(
        prog=prog,
        description=description,
        epilog=(note + "\n\n" if note else "") + exit_codes_epilog(exit_codes),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        **kwargs,
    )
    p.add_argument("--version", action="version", version=version_text(prog), help="print the version")
    # Completion scripts generated from the parser itself, so they follow every flag: e.g.
    # `rmq-chaos --print-completion bash > /etc/bash_completion.d/rmq-chaos`.
    shtab.add_argument_to(p, "--print-completion", help="print a shell completion script for the shell named")
    return p


def subcommand(
    sub: Any, name: str, help_text: str, exit_codes: Mapping[int, str] | None = None, **kwargs: Any
) -> argparse.ArgumentParser:
    """A subcommand's parser, its ``--help`` ending with its exit codes when given."""
    extra: dict[str, Any] = {"help": help_text, "description": kwargs.pop("description", help_text)}
    if exit_codes:
        extra.update(
            epilog=exit_codes_epilog(exit_codes), formatter_class=argparse.RawDescriptionHelpFormatter
        )
    return sub.add_parser(name, **extra, **kwargs)  # type: ignore[no-any-return]


def add_native_port_arg(parser: argparse.ArgumentParser, detail: str = "") -> None:
    """``--remoting-port`` (alias ``--native-port``): also serve RocketMQ's own remoting protocol."""
    parser.add_argument(
        "--remoting-port",
        "--native-port",
        dest="remoting_port",
        type=port_number,
        default=None,
        help="also serve RocketMQ's own remoting protocol on this port, for real RocketMQ clients" + detail,
    )


def add_common_args(parser: argparse.ArgumentParser) -> None:
    """The flags every role shares: --node, --log-file, --time-scale."""
    parser.add_argument(
        "--node", default=None, help="this process's name in the cluster (event field 'node')"
    )
    parser.add_argument(
        "--log-file", default=None, help="write events as JSON lines to this file (default: console)"
    )
    parser.add_argument(
        "--time-scale",
        type=positive_float,
        default=1.0,
        help="multiply every interval and timeout by X (0.05 = 20x faster); default 1",
    )


def announce_ready(text: str) -> None:
    """Print the readiness line supervisors wait for."""
    sys.stdout.write(f"READY {text}\n" if text else "READY\n")
    sys.stdout.flush()


def add_metrics_port(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--metrics-port",
        type=port_number,
        default=None,
        metavar="PORT",
        help="serve live metrics in Prometheus text on http://HOST:PORT/metrics (0 picks a port; the READY "
        "line then says metrics=HOST:PORT)",
    )


def add_quiet(p: argparse.ArgumentParser, help_text: str = "no progress lines") -> None:
    p.add_argument("--quiet", "-q", action="store_true", help=help_text)


# The behaviours a catalogue entry (known/NAME) runs with: before its fix, and with it.
KNOWN_VARIANTS = ("affected", "fixed")


def add_variant(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--variant",
        choices=KNOWN_VARIANTS,
        default=None,
        help="for a known problem (known/NAME): the behaviour before its fix (affected, the default) or "
        "with it (fixed)",
    )


def add_json(p: argparse.ArgumentParser, what: str = "the result") -> None:
    p.add_argument(
        "--json",
        action="store_true",
        help=f"print {what} as one JSON object on stdout (progress goes to stderr)",
    )


def add_out(p: argparse.ArgumentParser, help_text: str, default: str | None = None) -> None:
    p.add_argument("--out", default=default, metavar="DIR", help=help_text)


def add_master(p: argparse.ArgumentParser, help_text: str | None = None) -> None:
    p.add_argument(
        "--master",
        default=None,
        metavar="URL",
        help=help_text or "Spark master (default local[2]; e.g. spark://host:7077 for a cluster)",
    )


def add_access_keys(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--access-key", default=None, help="ACL access key: requests are signed (also RMQ_ACCESS_KEY)"
    )
    p.add_argument("--secret-key", default=None, help="ACL secret key (also RMQ_SECRET_KEY)")


def print_json(obj: Any, stream: TextIO | None = None) -> None:
    (stream or sys.stdout).write(json.dumps(obj, sort_keys=True, default=str) + "\n")
    (stream or sys.stdout).flush()


def usage_error(prog: str, message: str) -> int:
    print(f"{prog}: {message}", file=sys.stderr)
    return EXIT_USAGE


# --------------------------------------------------------------------------------------------------
# Shipped experiments and sweeps: found by name in the installed package (or the checkout).


class UnknownName(ValueError):
    """A name that is neither a file nor a shipped experiment or sweep; the message lists what exists."""


@dataclass(frozen=True)
class Shelf:
    """Where shipped files of one kind live: a package, a folder in it, and how sources are named."""

    package: str  # e.g. "rmqlab.chaos"
    folder: str  # "" for the package itself
    label: str  # the source prefix shown in messages, e.g. "chaos/experiments"

    def entries(self) -> dict[str, Any]:
        base = resources.files(self.package)
        if self.folder:
            base = base / self.folder
        if not base.is_dir():
            return {}
        return {
            e.name.removesuffix(".toml"): e
            for e in sorted(base.iterdir(), key=lambda e: e.name)
            if e.name.endswith(".toml") and e.is_file()
        }


CHAOS_EXPERIMENTS = Shelf("rmqlab.chaos", "experiments", "chaos/experiments")
SIM_EXPERIMENTS = Shelf("rmqlab.sim", "experiments", "sim/experiments")
SWEEPS = Shelf("rmqlab.sweeps", "", "sweeps")
# Each command looks at its own experiments first; a sweep's base is looked up as rmq-sim does.
CHAOS_SHELVES = (CHAOS_EXPERIMENTS,)
SIM_SHELVES = (SIM_EXPERIMENTS, CHAOS_EXPERIMENTS)


@dataclass(frozen=True)
class Shipped:
    name: str
    source: str
    text: str


def shipped(shelves: Sequence[Shelf]) -> dict[str, Shipped]:
    """Every shipped file on the shelves by name; an earlier shelf wins a name both have."""
    out: dict[str, Shipped] = {}
    for shelf in shelves:
        for name, entry in shelf.entries().items():
            if name not in out:
                out[name] = Shipped(name, f"{shelf.label}/{name}.toml", entry.read_text(encoding="utf-8"))
    return out


def find_shipped(path_or_name: str, shelves: Sequence[Shelf], what: str = "experiment") -> Shipped | None:
    """The shipped file ``path_or_name`` names, or None when it is a path (an existing file, one with a
    ``/`` or a ``.toml`` name) to be read as such. A bare name that is neither raises UnknownName
    listing what exists."""
    if Path(path_or_name).exists() or "/" in path_or_name:
        return None
    name = path_or_name.removesuffix(".toml")
    found = shipped(shelves)
    if name in found:
        return found[name]
    if name != path_or_name:  # FILE.toml: a file's name, reported as a file that cannot be read
        return None
    names = sorted(found)
    close = difflib.get_close_matches(name, names, n=3, cutoff=0.6)
    hint = f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
    raise UnknownName(
        f"no {what} file or shipped {what} named {path_or_name!r}{hint} "
        f"(shipped: {', '.join(names) or 'none'})"
    )


# --------------------------------------------------------------------------------------------------
# Progress lines.


class Progress:
    """A command's progress lines: each on its own line, prefixed; ``live`` lines rewrite one line in
    place on a terminal and are thinned to one per ``every_s`` elsewhere."""

    def __init__(
        self,
        stream: TextIO | None = None,
        *,
        enabled: bool = True,
        prefix: str = "",
        every_s: float = 5.0,
    ) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = enabled
        self.prefix = prefix
        self.every_s = every_s
        self.started = time.monotonic()
        self._last_live = float("-inf")
        self._tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self._live_shown = False

    def _write(self, text: str) -> None:
        if self._live_shown:
            self.stream.write("\r\x1b[K")
            self._live_shown = False
        self.stream.write(text + "\n")
        self.stream.flush()

    def note(self, message: str) -> None:
        if self.enabled:
            self._write(f"[{self.prefix}] {message}" if self.prefix else message)

    def live(self, line: str, *, force: bool = False) -> None:
        if not self.enabled:
            return
        if self._tty:
            self.stream.write("\r\x1b[K" + line)
            self.stream.flush()
            self._live_shown = True
        elif force or time.monotonic() - self._last_live >= self.every_s:
            self._last_live = time.monotonic()
            self._write(line)

    def end_live(self) -> None:
        """Keep the live line shown on a terminal: what follows starts on a line of its own."""
        if self._live_shown:
            self.stream.write("\n")
            self.stream.flush()
            self._live_shown = False

    @contextmanager
    def stage(self, name: str) -> Iterator[dict[str, str]]:
        """Run a stage; the caller may put a short result text into the yielded dict under 'info'."""
        info: dict[str, str] = {}
        t0 = time.monotonic()
        yield info
        extra = f": {info['info']}" if info.get("info") else ""
        self.note(f"{name}{extra} ({time.monotonic() - t0:.1f} s)")
