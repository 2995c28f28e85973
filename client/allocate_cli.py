"""rmq-allocate: who gets which queue under a strategy, and how many queues move when consumers come and go.

Pure: builds a topic (``--brokers`` brokers named broker-a, broker-b, ... with ``--queues`` queues each)
and a group of ``--consumers`` clients named consumer-00, consumer-01, ..., then runs the allocation every
RocketMQ client runs (``protocol.allocate``). ``--leave N`` removes the last N consumers (with
``--leave-from first`` the first N); ``--join N`` adds N consumers numbered after the existing ones.

Strategies that need configuration: MACHINE_ROOM_NEARBY puts broker i and consumer j into rooms
``room{i % R}`` and ``room{j % R}`` (``--rooms R``, default 2) around the inner strategy ``--inner``
(default AVG). CONFIG (every client takes a fixed configured list) and MACHINE_ROOM (needs brokers named
``room@broker``) cannot be simulated on this topic; ``--compare`` lists them as skipped, with the reason.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rmqlab.cli import bounded_int, command_parser
from rmqlab.protocol.allocate import (
    DEFAULT_VIRTUAL_NODE_CNT,
    AllocateMessageQueueStrategy,
    StaticMachineRoomResolver,
    allocate_all,
    get_strategy,
    sort_mq_all,
)
from rmqlab.protocol.model import MessageQueue

SIMULATED = ("AVG", "AVG_BY_CIRCLE", "CONSISTENT_HASH", "MACHINE_ROOM_NEARBY")
SKIPPED = {
    "CONFIG": "every client takes the same configured queue list, so there is nothing to balance",
    "MACHINE_ROOM": "needs brokers named room@broker; this topic's brokers are broker-a, broker-b, ...",
}
INNER_CHOICES = ("AVG", "AVG_BY_CIRCLE", "CONSISTENT_HASH")
MAX_BROKERS = 702  # broker-a .. broker-zz
MAX_QUEUES = 4096
MAX_TOTAL_QUEUES = 10_000  # keeps the worst --compare run at seconds, not minutes
MAX_CONSUMERS = 1000
SHOWN_NAMES = 8


def broker_name(index: int) -> str:
    """broker-a .. broker-z, broker-aa, ... (bijective base 26)."""
    letters = ""
    n = index + 1
    while n:
        n, rem = divmod(n - 1, 26)
        letters = chr(ord("a") + rem) + letters
    return f"broker-{letters}"


def _strategy_name(text: str) -> str:
    name = text.strip().upper()
    if name in SKIPPED:
        raise argparse.ArgumentTypeError(f"{name} cannot be simulated here: {SKIPPED[name]}")
    if name.startswith("MACHINE_ROOM_NEARBY-"):
        raise argparse.ArgumentTypeError("give the inner strategy with --inner, e.g. --inner AVG_BY_CIRCLE")
    if name not in SIMULATED:
        raise argparse.ArgumentTypeError(f"unknown strategy {text!r}; choose from {', '.join(SIMULATED)}")
    return name


def _inner_name(text: str) -> str:
    name = text.strip().upper()
    if name not in INNER_CHOICES:
        raise argparse.ArgumentTypeError(
            f"unknown inner strategy {text!r}; choose from {', '.join(INNER_CHOICES)}"
        )
    return name


def build_parser() -> argparse.ArgumentParser:
    p = command_parser(
        "rmq-allocate",
        "Show how a RocketMQ allocation strategy spreads a topic's queues over a consumer group, "
        "and how many queues move when consumers leave or join.",
        {0: "printed", 1: "the output could not be written (a closed pipe)", 2: "bad usage"},
        note="CONFIG and MACHINE_ROOM are not simulated: CONFIG gives every client the same configured "
        "list; MACHINE_ROOM needs brokers named room@broker.",
    )
    p.add_argument(
        "--queues",
        type=bounded_int(1, MAX_QUEUES),
        required=True,
        help="queues per broker (an experiment file's topic `queues` counts the whole topic: "
        "16 there is --queues 8 --brokers 2)",
    )
    p.add_argument("--brokers", type=bounded_int(1, MAX_BROKERS), default=1, help="brokers (default 1)")
    p.add_argument(
        "--consumers", type=bounded_int(1, MAX_CONSUMERS), required=True, help="consumers in the group"
    )
    p.add_argument("--topic", default="TopicTest", help="topic name (default TopicTest)")
    p.add_argument("--group", default="GID_DEMO", help="consumer group name (default GID_DEMO)")
    which = p.add_mutually_exclusive_group()
    which.add_argument(
        "--strategy", type=_strategy_name, default=None, help=f"one of {', '.join(SIMULATED)} (default AVG)"
    )
    which.add_argument("--compare", action="store_true", help="every strategy side by side")
    p.add_argument(
        "--vnodes",
        type=bounded_int(0, 1000),
        default=DEFAULT_VIRTUAL_NODE_CNT,
        help="CONSISTENT_HASH virtual nodes per consumer (default 10)",
    )
    p.add_argument(
        "--inner", type=_inner_name, default="AVG", help="MACHINE_ROOM_NEARBY inner strategy (default AVG)"
    )
    p.add_argument(
        "--rooms",
        type=bounded_int(1, 1000),
        default=2,
        help="MACHINE_ROOM_NEARBY rooms, round robin (default 2)",
    )
    p.add_argument("--leave", type=bounded_int(0, MAX_CONSUMERS), default=0, help="N consumers leave")
    p.add_argument("--leave-from", choices=("last", "first"), default="last", help="which consumers leave")
    p.add_argument("--join", type=bounded_int(0, MAX_CONSUMERS), default=0, help="N new consumers join")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    return p


@dataclass(frozen=True)
class Scenario:
    """One allocation question: the queues, the clients before and after a change, who left and joined."""

    topic: str
    group: str
    brokers: list[str]
    mq_all: list[MessageQueue]
    before: list[str]
    after: list[str]
    left: list[str]
    joined: list[str]
    rooms: int
    vnodes: int
    inner: str

    @property
    def changes(self) -> bool:
        return bool(self.left or self.joined)


def build_scenario(args: argparse.Namespace) -> Scenario:
    brokers = [broker_name(i) for i in range(args.brokers)]
    mq_all = sort_mq_all(MessageQueue(args.topic, b, q) for b in brokers for q in range(args.queues))
    total = args.consumers + args.join
    width = max(2, len(str(total - 1)))
    names = [f"consumer-{i:0{width}d}" for i in range(total)]
    before = names[: args.consumers]
    left = before[: args.leave] if args.leave_from == "first" else before[len(before) - args.leave :]
    joined = names[args.consumers :]
    after = [c for c in before if c not in set(left)] + joined
    return Scenario(
        args.topic,
        args.group,
        brokers,
        mq_all,
        before,
        after,
        left,
        joined,
        args.rooms,
        args.vnodes,
        args.inner,
    )


def make_strategy(name: str, sc: Scenario) -> AllocateMessageQueueStrategy:
    if name == "CONSISTENT_HASH":
        return get_strategy(name, virtual_node_cnt=sc.vnodes)
    if name == "MACHINE_ROOM_NEARBY":
        everyone = dict.fromkeys([*sc.before, *sc.joined])
        resolver = StaticMachineRoomResolver(
            {b: f"room{i % sc.rooms}" for i, b in enumerate(sc.brokers)},
            {c: f"room{i % sc.rooms}" for i, c in enumerate(everyone)},
        )
        options: dict[str, Any] = {"inner": sc.inner, "resolver": resolver}
        if sc.inner == "CONSISTENT_HASH":
            options["virtual_node_cnt"] = sc.vnodes
        return get_strategy(name, **options)
    return get_strategy(name)


def describe(allocation: dict[str, list[MessageQueue]], mq_all: list[MessageQueue]) -> dict[str, Any]:
    counts = {cid: len(share) for cid, share in allocation.items()}
    owners: dict[MessageQueue, list[str]] = {}
    for cid, share in allocation.items():
        for mq in share:
            owners.setdefault(mq, []).append(cid)
    return {
        "allocation": {cid: [mq.short for mq in share] for cid, share in allocation.items()},
        "counts": counts,
        "unassigned": [mq.short for mq in mq_all if mq not in owners],
        "shared": [mq.short for mq in mq_all if len(owners.get(mq, [])) > 1],
        "balance": max(counts.values()) - min(counts.values()),
        "_owners": owners,
    }


def run_strategy(name: str, sc: Scenario) -> dict[str, Any]:
    strategy = make_strategy(name, sc)
    before = describe(allocate_all(strategy, sc.group, sc.mq_all, sc.before), sc.mq_all)
    result: dict[str, Any] = {"strategy": strategy.name, "before": before}
    if sc.changes:
        after = describe(allocate_all(strategy, sc.group, sc.mq_all, sc.after), sc.mq_all)
        moved = []
        for mq in sc.mq_all:
            old, new = before["_owners"].get(mq, []), after["_owners"].get(mq, [])
            if old != new:
                moved.append({"queue": mq.short, "from": ",".join(old) or None, "to": ",".join(new) or None})
        result |= {"after": after, "moved": moved}
    return result


def _public(d: dict[str, Any]) -> dict[str, Any]:
    return {k: (_public(v) if isinstance(v, dict) else v) for k, v in d.items() if not k.startswith("_")}


def _table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    cells = [[str(h) for h in headers], *[[str(c) for c in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = []
    for n, row in enumerate(cells):
        lines.append("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return lines


def _names(names: list[str]) -> str:
    if len(names) <= SHOWN_NAMES:
        return ", ".join(names)
    return ", ".join(names[: SHOWN_NAMES - 1]) + f", ..., {names[-1]}"


def _header(sc: Scenario, what: str) -> list[str]:
    lines = [
        f"topic {sc.topic}: {len(sc.brokers)} broker(s) x {len(sc.mq_all) // len(sc.brokers)} queues = "
        f"{len(sc.mq_all)} queues; {len(sc.before)} consumer(s); {what}"
    ]
    if sc.changes:
        parts = []
        if sc.left:
            parts.append(f"{len(sc.left)} leave ({_names(sc.left)})")
        if sc.joined:
            parts.append(f"{len(sc.joined)} join ({_names(sc.joined)})")
        lines.append(f"change: {' and '.join(parts)} -> {len(sc.after)} consumer(s)")
    return lines


def _allocation_lines(state: dict[str, Any], sc: Scenario) -> list[str]:
    rows = [[cid, len(qs), " ".join(qs) or "-"] for cid, qs in state["allocation"].items()]
    lines = _table(["consumer", "queues", "assigned"], rows)
    if state["unassigned"]:
        lines.append(f"unassigned: {len(state['unassigned'])} ({' '.join(state['unassigned'])})")
    if state["shared"]:
        lines.append(f"held by more than one consumer: {' '.join(state['shared'])}")
    lines.append(f"balance (max-min queues per consumer): {state['balance']}")
    return lines


def render_single(result: dict[str, Any], sc: Scenario) -> list[str]:
    lines = _header(sc, f"strategy {result['strategy']}")
    lines += ["", "before:" if sc.changes else "allocation:"]
    lines += _allocation_lines(result["before"], sc)
    if sc.changes:
        lines += ["", "after:"]
        lines += _allocation_lines(result["after"], sc)
        moved = result["moved"]
        lines += ["", f"moved: {len(moved)} of {len(sc.mq_all)} queues"]
        lines += [f"  {m['queue']}: {m['from'] or '(nobody)'} -> {m['to'] or '(nobody)'}" for m in moved]
        lines.append(f"balance: before {result['before']['balance']}, after {result['after']['balance']}")
    return lines


def render_compare(results: list[dict[str, Any]], sc: Scenario) -> list[str]:
    lines = _header(sc, "all strategies")
    lines.append("")
    if sc.changes:
        headers = ["strategy", "moved", "balance before", "balance after", "unassigned after"]
        rows = [
            [
                r["strategy"],
                f"{len(r['moved'])}/{len(sc.mq_all)}",
                r["before"]["balance"],
                r["after"]["balance"],
                len(r["after"]["unassigned"]),
            ]
            for r in results
        ]
    else:
        headers = ["strategy", "balance", "min", "max", "unassigned"]
        rows = [
            [
                r["strategy"],
                r["before"]["balance"],
                min(r["before"]["counts"].values()),
                max(r["before"]["counts"].values()),
                len(r["before"]["unassigned"]),
            ]
            for r in results
        ]
    lines += _table(headers, rows)

    lines += ["", "queues per consumer" + (" (before -> after)" if sc.changes else "") + ":"]
    everyone = list(dict.fromkeys([*sc.before, *sc.joined]))
    rows = []
    for cid in everyone:
        row: list[Any] = [cid]
        for r in results:
            old = r["before"]["counts"].get(cid)
            if not sc.changes:
                row.append(old)
                continue
            new = r["after"]["counts"].get(cid)
            row.append(f"{'-' if old is None else old} -> {'-' if new is None else new}")
        rows.append(row)
    lines += _table(["consumer", *[r["strategy"] for r in results]], rows)
    lines += ["", "skipped:"] + [f"  {name}: {why}" for name, why in SKIPPED.items()]
    notes = [f"CONSISTENT_HASH uses {sc.vnodes} virtual nodes per consumer"]
    notes.append(f"MACHINE_ROOM_NEARBY puts brokers and consumers round robin into {sc.rooms} room(s)")
    lines += ["", "notes: " + "; ".join(notes)]
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.leave > args.consumers:
        parser.error(f"--leave {args.leave}: only {args.consumers} consumer(s) to leave")
    if args.consumers - args.leave + args.join < 1:
        parser.error(f"--leave {args.leave} leaves no consumer; add --join or leave fewer")
    if args.queues * args.brokers > MAX_TOTAL_QUEUES:
        parser.error(
            f"--queues {args.queues} x --brokers {args.brokers} = {args.queues * args.brokers} queues; "
            f"at most {MAX_TOTAL_QUEUES} can be simulated"
        )
    if args.consumers + args.join > MAX_CONSUMERS:
        parser.error(f"--consumers + --join = {args.consumers + args.join}; at most {MAX_CONSUMERS}")
    if not args.topic.strip():
        parser.error("--topic must not be empty")
    sc = build_scenario(args)
    names = list(SIMULATED) if args.compare else [args.strategy or "AVG"]
    results = [run_strategy(name, sc) for name in names]
    if args.json:
        doc = {
            "topic": sc.topic,
            "group": sc.group,
            "brokers": sc.brokers,
            "queues_per_broker": args.queues,
            "queue_count": len(sc.mq_all),
            "consumers": sc.before,
            "left": sc.left,
            "joined": sc.joined,
            "consumers_after": sc.after if sc.changes else None,
            "options": {"vnodes": sc.vnodes, "inner": sc.inner, "rooms": sc.rooms},
            "strategies": [_public(r) for r in results],
            "skipped": SKIPPED if args.compare else {},
        }
        return _emit(json.dumps(doc, indent=2))
    return _emit("\n".join(render_compare(results, sc) if args.compare else render_single(results[0], sc)))


def _emit(text: str) -> int:
    try:
        print(text)
        sys.stdout.flush()
    except BrokenPipeError:
        # the reader went away (e.g. piped into head); point stdout at devnull so the interpreter's final
        # flush stays quiet, as the Python documentation recommends for SIGPIPE
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
