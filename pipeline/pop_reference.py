"""Client-side balancing and RocketMQ 5's POP side by side: per-group message waits, revive
redeliveries and idle consumers, from the events alone (plain Python; definitions in EVENTS.md,
"RocketMQ 5: POP (proposed)").

``python -m rmqlab.pipeline.pop_reference RUN_DIR`` writes ``modes.json`` into the run directory and
prints the table (RocketMQ seconds: wall time divided by the run's time scale).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from rmqlab.pipeline.metrics_reference import load_run

MODES = ("client", "server-pull", "server-pop")
_END_EVENTS = ("consumer_stopped",)


def _is_retry(topic: str) -> bool:
    return topic.startswith("%RETRY%")


def group_mode(assignments: list[dict[str, Any]]) -> str:
    """``server-pop`` when a consumer of the group was assigned a POP queue, ``server-pull`` when the
    broker assigned its queues but none by POP, ``client`` when it never asked the broker."""
    if not assignments:
        return "client"
    return "server-pop" if any(a.get("pop") for a in assignments) else "server-pull"


def idle_ms(allocations: list[tuple[int, str, bool]], live: list[tuple[int, int]], run_end: int) -> int:
    """Time a consumer was live while every topic's latest allocation was empty. ``allocations`` are
    (ts, topic, has_queues) in event order; ``live`` its live spans. Before its first allocation a
    consumer is not counted idle (it has not balanced yet)."""
    latest: dict[str, bool] = {}
    changes: list[tuple[int, bool]] = []  # (ts, idle from ts on)
    for ts, topic, has in allocations:
        latest[topic] = has
        changes.append((ts, not any(latest.values())))
    total = 0
    for start, end in live:
        for i, (ts, idle) in enumerate(changes):
            if not idle:
                continue
            nxt = changes[i + 1][0] if i + 1 < len(changes) else run_end
            lo, hi = max(ts, start), min(nxt, end)
            if hi > lo:
                total += hi - lo
    return total


LIFECYCLE_EVENTS = ("rebalance", "assignment", "consumer_started", "consumer_stopped", "nemesis")


def consumer_metrics(records: Iterable[dict[str, Any]], run_end: int) -> dict[str, dict[str, Any]]:
    """Per group, from the consumers' lifecycle lines (``LIFECYCLE_EVENTS``, in event order): its mode,
    its topics, and its idle consumers (count and total ms). A consumer belongs to the group and node of
    its ``consumer_started``; it is live from there to its ``consumer_stopped``, a ``kill``/``stop`` of
    its node, or ``run_end``."""
    group_topics: dict[str, set[str]] = defaultdict(set)
    assignments: dict[str, list[dict[str, Any]]] = defaultdict(list)
    client_group: dict[str, str] = {}
    client_node: dict[str, str] = {}
    starts: dict[str, list[int]] = defaultdict(list)
    ends: dict[str, list[int]] = defaultdict(list)
    node_ends: dict[str, list[int]] = defaultdict(list)
    allocations: dict[str, list[tuple[int, str, bool]]] = defaultdict(list)
    for r in records:
        ev, ts = r.get("event"), r["ts_ms"]
        group, client = r.get("group"), r.get("client_id")
        if ev == "rebalance" and group and client and not _is_retry(r["topic"]):
            group_topics[group].add(r["topic"])
            allocations[client].append((ts, r["topic"], bool(r.get("allocated"))))
        elif ev == "assignment" and group and client and not _is_retry(r["topic"]):
            group_topics[group].add(r["topic"])
            assignments[group].append(r)
            allocations[client].append((ts, r["topic"], bool(r.get("pull") or r.get("pop"))))
        elif ev == "nemesis" and r.get("action") in ("kill", "stop"):
            node_ends[r.get("target") or ""].append(ts)
        elif ev == "consumer_started" and group and client:
            starts[client].append(ts)
            client_group.setdefault(client, group)
            client_node.setdefault(client, r.get("node") or "")
        elif ev in _END_EVENTS and client:
            ends[client].append(ts)

    def live_spans(client: str) -> list[tuple[int, int]]:
        stops = sorted(ends[client] + node_ends.get(client_node.get(client, ""), []))
        return [(s, next((e for e in stops if e >= s), run_end)) for s in sorted(starts[client])]

    out: dict[str, dict[str, Any]] = {}
    for group in set(group_topics) | set(client_group.values()):
        clients = sorted(c for c, g in client_group.items() if g == group)
        idle = {c: idle_ms(allocations.get(c, []), live_spans(c), run_end) for c in clients}
        out[group] = {
            "mode": group_mode(assignments.get(group, [])),
            "topics": sorted(group_topics.get(group, set())),
            "idle_consumers": sum(1 for v in idle.values() if v > 0),
            "idle_consumer_ms": sum(idle.values()),
        }
    return out


def assemble(
    run: dict[str, Any],
    consumers: dict[str, dict[str, Any]],
    messages: dict[str, dict[str, Any]],
) -> dict[str, Any]:
    """The output: per group (those with topics or consumptions) the consumer part and the message part."""
    empty = {"mode": "client", "topics": [], "idle_consumers": 0, "idle_consumer_ms": 0}
    groups = {}
    for group in sorted(set(consumers) | set(messages)):
        c = consumers.get(group, empty)
        if not c["topics"] and group not in messages:
            continue
        groups[group] = {**c, **messages.get(group, message_defaults())}
    return {"run": run, "groups": groups}


def add_modes(summary: dict[str, Any], modes: dict[str, str], result: dict[str, Any] | None) -> None:
    """summary.json's `mode` and `pop` of every group (EVENTS.md, proposed section): `modes` by group
    from the analysis, `result` this module's output for the run (None: `pop` is null)."""
    for name, entry in summary["groups"].items():
        entry["mode"] = modes.get(name, "client")
        if result is None:
            entry["pop"] = None
            continue
        figures = result["groups"].get(name) or {"idle_consumers": 0, "idle_consumer_ms": 0}
        entry["pop"] = {
            **message_defaults(),
            **{k: v for k, v in figures.items() if k not in ("mode", "topics")},
        }


def message_defaults() -> dict[str, Any]:
    return {
        "sent": 0,
        "consumed_unique": 0,
        "lost": 0,
        "duplicates": 0,
        "longest_wait_ms": 0,
        "time_to_drain_ms": None,
        "revived": 0,
        "revived_messages": 0,
        "longest_revived_wait_ms": 0,
        "invisible_time_changes": 0,
    }


def mode_metrics(records: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """Per group: its mode, sent, consumed, lost, duplicates, the longest wait of a message (first send
    to first consumption, or to the run's end when never consumed), the time to drain (last send to the
    last first consumption; None when a message was lost), revives, invisible-time changes, the longest
    wait of a revived message (its first pop to its first consumption) and idle consumers. The
    plain-Python reference of ``pipeline.pop_spark``."""
    recs = sorted(records, key=lambda r: r["ts_ms"])
    if not recs:
        return {"run": {"start_ms": None, "end_ms": None, "time_scale": 1.0, "t0_ms": None}, "groups": {}}
    run_end = recs[-1]["ts_ms"]
    scale, t0 = 1.0, recs[0]["ts_ms"]
    sent_at: dict[tuple[str, str], int] = {}  # (topic, msg_id) -> first send
    consumed: dict[str, dict[str, list[int]]] = defaultdict(lambda: defaultdict(list))
    popped: dict[str, dict[str, int]] = defaultdict(dict)
    revived: dict[str, list[str]] = defaultdict(list)
    changed: dict[str, int] = defaultdict(int)
    for r in recs:
        ev, ts, group = r.get("event"), r["ts_ms"], r.get("group")
        if ev == "schedule_started":
            t0 = ts
            scale = float(r.get("time_scale") or 1.0)
        elif ev == "message_sent":
            sent_at.setdefault((r["topic"], r["msg_id"]), ts)
        elif ev == "message_consumed" and group:
            consumed[group][r["msg_id"]].append(ts)
        elif ev == "message_popped" and group and isinstance(r.get("msg_id"), str):
            popped[group].setdefault(r["msg_id"], ts)
        elif ev == "message_revived" and group and isinstance(r.get("msg_id"), str):
            revived[group].append(r["msg_id"])
        elif ev == "invisible_time_changed" and group:
            changed[group] += 1
    consumers = consumer_metrics((r for r in recs if r.get("event") in LIFECYCLE_EVENTS), run_end)
    messages: dict[str, dict[str, Any]] = {}
    for group in set(consumers) | set(consumed) | set(revived) | set(changed):
        topics = set(consumers.get(group, {}).get("topics", []))
        sent = {mid: ts for (topic, mid), ts in sent_at.items() if topic in topics}
        got = consumed.get(group, {})
        first = {mid: min(tss) for mid, tss in got.items()}
        waits = [first.get(mid, run_end) - ts for mid, ts in sent.items()]
        lost = [mid for mid in sent if mid not in first]
        drain = None
        if sent and not lost:
            drain = max(first[mid] for mid in sent) - max(sent.values())
        rev = revived.get(group, [])
        rev_waits = [
            first[mid] - popped[group][mid]
            for mid in set(rev)
            if mid in first and mid in popped.get(group, {})
        ]
        messages[group] = {
            "sent": len(sent),
            "consumed_unique": sum(1 for mid in first if mid in sent),
            "lost": len(lost),
            "duplicates": sum(len(t) - 1 for t in got.values()),
            "longest_wait_ms": max(waits) if waits else 0,
            "time_to_drain_ms": drain,
            "revived": len(rev),
            "revived_messages": len(set(rev)),
            "longest_revived_wait_ms": max(rev_waits) if rev_waits else 0,
            "invisible_time_changes": changed.get(group, 0),
        }
    run = {"start_ms": recs[0]["ts_ms"], "end_ms": run_end, "time_scale": scale, "t0_ms": t0}
    return assemble(run, consumers, messages)


def _rmq_s(ms: int | None, scale: float) -> str:
    return "-" if ms is None else f"{ms / 1000.0 / scale:.0f}"


def table(result: dict[str, Any]) -> str:
    """The groups side by side, times in RocketMQ seconds."""
    scale = result["run"]["time_scale"] or 1.0
    head = (
        "| group | mode | sent | lost | duplicates | longest wait (s) | time to drain (s) | revived "
        "| idle consumers |"
    )
    lines = [head, "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for name, g in sorted(result["groups"].items()):
        lines.append(
            f"| {name} | {g['mode']} | {g['sent']} | {g['lost']} | {g['duplicates']} "
            f"| {_rmq_s(g['longest_wait_ms'], scale)} | {_rmq_s(g['time_to_drain_ms'], scale)} "
            f"| {g['revived']} | {g['idle_consumers']} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m rmqlab.pipeline.pop_reference",
        description="Message waits, revives and idle consumers per group, client-side balancing and POP "
        "side by side; writes modes.json into the run directory.",
    )
    p.add_argument("run_dir", help="a run directory (its *.jsonl event logs)")
    p.add_argument("--out", default=None, help="where to write modes.json (default: the run directory)")
    args = p.parse_args(argv)
    if not os.path.isdir(args.run_dir):
        print(f"pop_metrics: {args.run_dir}: not a directory", file=sys.stderr)
        return 2
    events, malformed = load_run(args.run_dir)
    result = mode_metrics(e.rec for e in events)
    result["run"]["malformed_lines"] = malformed
    write(result, args.out or os.path.join(args.run_dir, "modes.json"))
    return 0


def write(result: dict[str, Any], out: str) -> None:
    """``modes.json`` and the table on stdout."""
    with open(out, "w", encoding="utf-8") as f:
        json.dump(result, f, indent=2, sort_keys=True)
    print(table(result))


if __name__ == "__main__":
    sys.exit(main())
