"""``rmq-chaos clean``: remove what runs of the docker backend left behind.

Every container and network of ``rmq-chaos run --backend docker`` carries the label
``org.rocketmq-rebalance-lab.run`` (its value is the run's id, ``rmqlab-<hex>``). The runner removes
them at its end, after a failure and on Ctrl-C; a SIGKILL of ``rmq-chaos`` itself, or an engine that
went away mid-run, leaves them. ``clean`` removes every container carrying the label (running, paused
or stopped), then every network carrying it; ``--run ID`` only one run's. The iptables rules and netem
qdiscs of the lab's network faults live in the containers' network namespaces and go with them: the lab
sets no rule in the host's namespace (the engine's own rules for a network go with the network).
Containers without the label, such as a compose cluster's, are left alone.

It also removes the containers of a run still in progress: name one run with ``--run`` when others may
be going on, and look first with ``--dry-run``.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from typing import Any

from rmqlab.chaos.container import RUN_LABEL, engine_problem
from rmqlab.cli import add_json, print_json, subcommand

EXIT_CODES = {
    0: "done: everything labelled is gone (also when nothing was there); with --dry-run, listed",
    1: "something could not be removed (each named on stderr)",
    2: "bad usage",
    3: "the container engine cannot be reached",
}
_RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
_TIMEOUT_S = 120.0


class CleanError(RuntimeError):
    """The engine did not answer a listing."""


@dataclass(frozen=True)
class Item:
    kind: str  # "container" or "network"
    id: str
    name: str
    run: str  # the value of the run label
    state: str = ""  # a container's (running, paused, exited, created, ...)


@dataclass
class Outcome:
    dry_run: bool
    containers: list[Item] = field(default_factory=list)
    networks: list[Item] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)  # names of what is gone
    errors: list[str] = field(default_factory=list)

    @property
    def runs(self) -> list[str]:
        return sorted({i.run for i in (*self.containers, *self.networks)})

    def as_json(self) -> dict[str, Any]:
        return {
            "dry_run": self.dry_run,
            "runs": self.runs,
            "containers": [asdict(i) for i in self.containers],
            "networks": [asdict(i) for i in self.networks],
            "removed": self.removed,
            "errors": self.errors,
            "ok": not self.errors,
        }


def run_id(text: str) -> str:
    """A run's id as the label carries it (argparse type)."""
    if not _RUN_ID.fullmatch(text):
        raise argparse.ArgumentTypeError(
            f"not a run id (rmqlab-<hex>: the network the run's manifest.json names): {text!r}"
        )
    return text


def _docker(*args: str) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(
            ["docker", *args], capture_output=True, text=True, timeout=_TIMEOUT_S, check=False
        )
    except subprocess.TimeoutExpired:
        raise CleanError(f"docker {' '.join(args[:2])} did not answer within {_TIMEOUT_S:g} s") from None
    except OSError as e:
        raise CleanError(f"docker {' '.join(args[:2])}: {e}") from None


def _label_filter(run: str | None) -> str:
    return f"label={RUN_LABEL}" + (f"={run}" if run else "")


def _fields(line: str, n: int) -> list[str]:
    """The ``n`` tab-separated fields of a listing's line (empty ones for what it leaves out)."""
    return [*line.split("\t"), *[""] * n][:n]


def find(run: str | None = None) -> tuple[list[Item], list[Item]]:
    """The labelled containers and networks (of one run when ``run`` is given), sorted by name."""
    label = '{{.Label "' + RUN_LABEL + '"}}'
    ps = _docker(
        "ps", "-a", "--filter", _label_filter(run), "--format", "{{.ID}}\t{{.Names}}\t{{.State}}\t" + label
    )
    nets = _docker(
        "network", "ls", "--filter", _label_filter(run), "--format", "{{.ID}}\t{{.Name}}\t" + label
    )
    for proc in (ps, nets):
        if proc.returncode != 0:
            raise CleanError(proc.stderr.strip() or "docker failed")
    containers = []
    for line in ps.stdout.splitlines():
        cid, name, state, value = _fields(line, 4)
        containers.append(Item("container", cid, name, value, state))
    networks = []
    for line in nets.stdout.splitlines():
        nid, name, value = _fields(line, 3)
        networks.append(Item("network", nid, name, value))
    return sorted(containers, key=lambda i: i.name), sorted(networks, key=lambda i: i.name)


def clean(run: str | None = None, *, dry_run: bool = False) -> Outcome:
    """Remove (or with ``dry_run`` only list) the labelled containers, then the labelled networks.
    CleanError when the engine does not answer a listing; what cannot be removed is in ``errors``."""
    containers, networks = find(run)
    out = Outcome(dry_run, containers, networks)
    if dry_run or not (containers or networks):
        return out
    if containers:  # first: a network with a container on it cannot go
        proc = _docker("rm", "--force", *(c.id for c in containers))
        if proc.returncode != 0:
            out.errors += [line for line in proc.stderr.strip().splitlines() if line]
    if networks:
        proc = _docker("network", "rm", *(n.id for n in networks))
        if proc.returncode != 0:
            out.errors += [line for line in proc.stderr.strip().splitlines() if line]
    left_containers, left_networks = find(run)
    left = {i.id for i in (*left_containers, *left_networks)}
    out.removed = [i.name for i in (*containers, *networks) if i.id not in left]
    for i in (*left_containers, *left_networks):
        if not any(i.name in e or i.id in e for e in out.errors):
            out.errors.append(f"{i.kind} {i.name} is still there")
    return out


def _describe(i: Item) -> str:
    state = f" ({i.state})" if i.state else ""
    return f"  {i.kind:<9} {i.name}{state}  [run {i.run}]"


def cmd_clean(args: argparse.Namespace) -> int:
    problem = engine_problem()
    if problem:
        if args.json:
            print_json({"ok": False, "errors": [problem], "exit_code": 3})
        print(f"rmq-chaos clean: {problem}", file=sys.stderr)
        return 3
    try:
        out = clean(args.run, dry_run=args.dry_run)
    except CleanError as e:
        if args.json:
            print_json({"ok": False, "errors": [str(e)], "exit_code": 3})
        print(f"rmq-chaos clean: {e}", file=sys.stderr)
        return 3
    code = 1 if out.errors else 0
    if args.json:
        print_json({**out.as_json(), "exit_code": code})
    else:
        items = [*out.containers, *out.networks]
        where = f"{RUN_LABEL}={args.run}" if args.run else RUN_LABEL
        if not items:
            print(f"nothing to clean: no container or network carries the label {where}")
        else:
            verb = "would remove" if out.dry_run else "removed"
            count = len(out.removed) if not out.dry_run else len(items)
            print(f"{verb} {count} of {len(items)} labelled item(s) of {len(out.runs)} run(s):")
            for i in items:
                if out.dry_run or i.name in out.removed:
                    print(_describe(i))
            if not out.dry_run and out.containers:
                print("their iptables rules and netem qdiscs went with the containers' network namespaces")
    for e in out.errors:
        print(f"rmq-chaos clean: {e}", file=sys.stderr)
    return code


def add_clean_command(sub: Any) -> None:
    """The ``clean`` subcommand of rmq-chaos."""
    p = subcommand(
        sub,
        "clean",
        "remove the containers and networks that runs of the docker backend left behind",
        EXIT_CODES,
        description=(__doc__ or "").split("\n\n", 1)[-1].strip().replace("``", "`"),
    )
    p.add_argument(
        "--run",
        type=run_id,
        default=None,
        metavar="ID",
        help="only this run's (the label's value, rmqlab-<hex>)",
    )
    p.add_argument("--dry-run", action="store_true", help="list what would be removed; remove nothing")
    add_json(p, "what was found and removed")
    p.set_defaults(func=cmd_clean)
