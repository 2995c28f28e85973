"""Hand-driven faults on a compose cluster, written down: ``rmq-chaos nemesis`` and ``rmq-chaos wait``.

A container killed with a bare ``docker kill`` leaves no event, so the analysis counts its consumer
alive and holding its queues until the end of the run. ``rmq-chaos nemesis ACTION CONTAINER --run-dir
DIR`` does the action through the engine *and* appends the ``nemesis`` event the local runner would
have written (node, role, group and client id read from the container and the node's own log) to
``DIR/nemesis.jsonl``; ``--record-only`` writes the event for an action done some other way.
``rmq-chaos wait`` blocks until the run's logs show a balanced group or a drained workload.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rmqlab.lab.tally import LogTailer, RunTally
from rmqlab.protocol.event_log import EventLog

# action -> (the docker command, the container states it applies to)
ACTIONS: dict[str, tuple[list[str], tuple[str, ...]]] = {
    "kill": (["kill", "--signal", "KILL"], ("running", "paused")),
    "stop": (["stop", "--time", "10"], ("running", "paused")),
    "start": (["start"], ("exited", "created")),
    "pause": (["pause"], ("running",)),
    "resume": (["unpause"], ("paused",)),
    # The hung listener of the lab's consumers: the signals reach the role through the init (init: true).
    "hang": (["kill", "--signal", "USR1"], ("running",)),
    "unhang": (["kill", "--signal", "USR2"], ("running",)),
}
CONSUMER_ONLY = ("hang", "unhang")
NEMESIS_FILE = "nemesis.jsonl"


class HandError(RuntimeError):
    """The action cannot be done or recorded (no such container, wrong state, no log of the node)."""


@dataclass(frozen=True)
class Target:
    container: str
    node: str
    role: str
    group: str | None
    client_id: str | None
    state: str


def node_of(inspect: dict[str, Any]) -> str | None:
    """The ``--node`` a container's command gives its role (``$(hostname)`` as the container sees it)."""
    cfg = inspect.get("Config") or {}
    words = [*(cfg.get("Entrypoint") or []), *(cfg.get("Cmd") or [])]
    text = " ".join(str(w) for w in words).replace("$(hostname)", str(cfg.get("Hostname", "")))
    found = re.search(r"--node[= ](\S+)", text)
    return found.group(1) if found else None


def _node_facts(run_dir: Path, node: str) -> tuple[str | None, str | None, str | None]:
    """Role, group and latest client id from the node's own event logs in the run directory."""
    role = group = client_id = None
    for path in sorted(run_dir.rglob(f"{node}*.jsonl")):
        if path.name not in (f"{node}.jsonl",) and not re.fullmatch(
            re.escape(node) + r"\.\d+\.jsonl", path.name
        ):
            continue
        with path.open(encoding="utf-8", errors="replace") as f:
            for line in f:
                try:
                    ev = json.loads(line)
                except ValueError:
                    continue
                if not isinstance(ev, dict) or ev.get("node") != node:
                    continue
                role = ev.get("role") if isinstance(ev.get("role"), str) else role
                if ev.get("event") == "consumer_started":
                    group = ev.get("group") if isinstance(ev.get("group"), str) else group
                    client_id = ev.get("client_id") if isinstance(ev.get("client_id"), str) else client_id
    return role, group, client_id


def inspect_container(container: str) -> dict[str, Any]:
    proc = subprocess.run(
        ["docker", "inspect", "--type", "container", container],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    if proc.returncode != 0:
        raise HandError(f"no container {container!r}: {proc.stderr.strip() or 'docker inspect failed'}")
    return dict(json.loads(proc.stdout)[0])


def describe(container: str, run_dir: Path) -> Target:
    info = inspect_container(container)
    node = node_of(info)
    if node is None:
        raise HandError(f"{container}: its command has no --node, so it is not one of the lab's roles")
    role, group, client_id = _node_facts(run_dir, node)
    if role is None:
        raise HandError(
            f"{container} runs node {node}, but {run_dir} holds no event of it: is --run-dir the "
            "directory its --log-file writes to?"
        )
    state = str((info.get("State") or {}).get("Status", "unknown"))
    name = str(info.get("Name", container)).lstrip("/")
    return Target(name, node, role, group, client_id, state)


def nemesis_fields(action: str, t: Target) -> dict[str, Any]:
    fields: dict[str, Any] = {"action": action, "target": t.node, "target_role": t.role}
    if t.role == "consumer" and t.group is not None:
        fields["group"] = t.group
    if t.client_id is not None and t.role == "consumer":
        fields["client_id"] = t.client_id
    return {**fields, "container": t.container, "by": "hand"}


def do_nemesis(action: str, container: str, run_dir: Path, *, record_only: bool = False) -> Target:
    """Record the action (before it happens, as the runner does) and carry it out through the engine."""
    if action not in ACTIONS:
        raise HandError(f"unknown action {action!r} (one of {', '.join(ACTIONS)})")
    t = describe(container, run_dir)
    command, states = ACTIONS[action]
    if not record_only and t.state not in states:
        raise HandError(f"cannot {action} {t.container} ({t.node}): it is {t.state}")
    if action in CONSUMER_ONLY and t.role != "consumer":
        raise HandError(f"cannot {action} {t.container} ({t.node}): only a consumer's listener can be hung")
    log = EventLog("chaos", "chaos", str(run_dir / NEMESIS_FILE))
    try:
        log.emit("nemesis", **nemesis_fields(action, t))
        if not record_only:
            proc = subprocess.run(
                ["docker", *command, t.container], capture_output=True, text=True, timeout=60, check=False
            )
            if proc.returncode != 0:
                log.emit("nemesis_failed", action=action, target=t.node, reason=proc.stderr.strip())
                raise HandError(f"docker {command[0]} {t.container} failed: {proc.stderr.strip()}")
    finally:
        log.close()
    return t


# ------------------------------------------------------------------------------------------------
# Waiting on the logs


class GroupWatch:
    """Live consumers of a group and the member set each saw in its latest rebalance, from events."""

    def __init__(self, group: str) -> None:
        self.group = group
        self.tally = RunTally()
        self.seen: dict[str, set[str]] = {}  # client id -> cid_all of its latest rebalance

    def feed(self, events: list[dict[str, Any]]) -> None:
        self.tally.feed(events)
        for ev in events:
            if ev.get("event") == "rebalance" and ev.get("group") == self.group:
                cid, cids = ev.get("client_id"), ev.get("cid_all")
                if isinstance(cid, str) and isinstance(cids, list):
                    self.seen[cid] = {str(c) for c in cids}

    def live(self) -> set[str]:
        return set(self.tally.groups[self.group].live_clients) if self.group in self.tally.groups else set()

    def balanced(self, count: int) -> bool:
        live = self.live()
        return len(live) == count and all(self.seen.get(c) == live for c in live)


def wait(run_dir: Path, *, group: str | None, balanced: int | None, drained: bool, timeout_s: float) -> str:
    """Poll the run's logs until the condition holds; a one-line account of what was seen."""
    tailer = LogTailer(run_dir)
    watch = GroupWatch(group or "")
    deadline = time.monotonic() + timeout_s
    while True:
        watch.feed(tailer.poll())
        t = watch.tally
        ok_balanced = balanced is None or watch.balanced(balanced)
        ok_drained = not drained or (t.sent_total > 0 and t.drained())
        state = f"sent {t.sent_total}, missing " + (
            ", ".join(f"{g} {n}" for g, n in sorted(t.missing().items())) or "0"
        )
        if group:
            state = f"live consumers of {group} {len(watch.live())}, {state}"
        if ok_balanced and ok_drained:
            return state
        if time.monotonic() > deadline:
            raise HandError(f"not there after {timeout_s:g}s: {state}")
        time.sleep(0.25)


def add_commands(sub: Any) -> None:
    """The ``nemesis`` and ``wait`` subcommands of rmq-chaos."""
    nem = sub.add_parser(
        "nemesis",
        help="kill/stop/start/pause/resume/hang/unhang a container of a compose cluster and record it for "
        "the analysis",
    )
    nem.add_argument("action", choices=list(ACTIONS))
    nem.add_argument("container", help="the container's name or id (docker compose ps)")
    nem.add_argument("--run-dir", required=True, type=Path, help="the run directory the cluster logs to")
    nem.add_argument(
        "--record-only", action="store_true", help="write the event; the action was done already"
    )
    nem.set_defaults(func=cmd_nemesis)
    w = sub.add_parser("wait", help="wait until a run's logs show a balanced group and/or a drained workload")
    w.add_argument("run_dir", type=Path, metavar="RUN_DIR")
    w.add_argument("--group", default=None, help="the consumer group (with --balanced)")
    w.add_argument("--balanced", type=int, default=None, metavar="N", help="N live consumers, all agreeing")
    w.add_argument("--drained", action="store_true", help="every group consumed every sent message")
    w.add_argument("--timeout", type=float, default=60.0, metavar="S")
    w.set_defaults(func=cmd_wait)


def cmd_nemesis(args: argparse.Namespace) -> int:
    if not args.run_dir.is_dir():
        print(f"rmq-chaos nemesis: no run directory {args.run_dir}", flush=True)
        return 2
    try:
        t = do_nemesis(args.action, args.container, args.run_dir, record_only=args.record_only)
    except (HandError, OSError, subprocess.TimeoutExpired) as e:
        print(f"rmq-chaos nemesis: {e}", flush=True)
        return 1
    done = "recorded" if args.record_only else "done and recorded"
    print(f"{args.action} {t.container} ({t.node}, {t.role}): {done} in {args.run_dir / NEMESIS_FILE}")
    return 0


def cmd_wait(args: argparse.Namespace) -> int:
    if args.balanced is not None and not args.group:
        print("rmq-chaos wait: --balanced needs --group", flush=True)
        return 2
    if args.balanced is None and not args.drained:
        print("rmq-chaos wait: give --balanced N (with --group) and/or --drained", flush=True)
        return 2
    if not args.run_dir.is_dir():
        print(f"rmq-chaos wait: no run directory {args.run_dir}", flush=True)
        return 2
    try:
        state = wait(
            args.run_dir,
            group=args.group,
            balanced=args.balanced,
            drained=args.drained,
            timeout_s=args.timeout,
        )
    except HandError as e:
        print(f"rmq-chaos wait: {e}", flush=True)
        return 1
    print(f"ok: {state}")
    return 0
