"""The control plane of a run, computed from its few control events (sans-IO): ownership intervals,
liveness, pauses, the ownership metrics and convergence of EVENTS.md.

Control events (routes, rebalances, queue changes, starts, stops, nemeses) are a few per consumer and
rebalance round, whatever the message volume, so the Spark pipeline collects them once (one job) and
computes everything they decide here, in one ordered pass plus sweeps over interval bounds. The message
lines stay in Spark; what they need from here (group topics, ownership intervals) goes back to Spark as
small broadcast tables.

Input rows are mappings with the event fields and the order columns (`ts_ms`, `fidx`, `blk`, `rid`);
with many runs in one table, names carry their run's prefix (see `pipeline.ingest.RUN_SEP`) and
`run_end` / `unqualified` say how to read them.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from rmqlab.pipeline.contract import (
    CLIENT_MODE,
    CLOSING_ACTIONS,
    RETRY_PREFIX,
    SERVER_ASSIGNMENT,
    UNPAUSING_ACTIONS,
    members_digest,
    queue_key,
    server_mode,
)
from rmqlab.pipeline.unavailability import merge_spans

INF = 2**63 - 1  # "never ends" for open periods, as the Spark tables had it (Long.MaxValue)
CONTROL_EVENTS = (
    "topic_route",
    "rebalance",
    "mq_added",
    "mq_removed",
    "consumer_started",
    "consumer_stopped",
    "nemesis",
    "assignment",
)
# Control events whose group/client_id/node tie a client to a node of a consumer group.
_GROUP_CONTROL = ("rebalance", "mq_added", "mq_removed", "consumer_started", "consumer_stopped")

Span = tuple[int, int]
QueueId = tuple[str, str, str]  # (group, topic, "broker:queue_id")


@dataclass(frozen=True)
class Interval:
    """A span during which one client held one queue (end > start)."""

    group: str
    client_id: str
    topic: str
    queue: str
    start: int
    end: int


@dataclass
class ControlModel:
    """Everything the control events decide, per (qualified) group."""

    groups: set[str] = field(default_factory=set)
    group_topics: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))
    universe: dict[str, set[tuple[str, str]]] = field(default_factory=dict)  # group -> (topic, queue)
    group_clients: set[tuple[str, str]] = field(default_factory=set)
    client_nodes: set[tuple[str, str]] = field(default_factory=set)
    intervals: list[Interval] = field(default_factory=list)
    live: dict[tuple[str, str], list[Span]] = field(default_factory=dict)  # (group, client) -> spans
    client_pauses: dict[str, list[Span]] = field(default_factory=dict)  # client -> disjoint spans
    nemeses: list[tuple[int, str, str]] = field(default_factory=list)  # (ts_ms, action, target)
    rebalances: list[Mapping[str, Any]] = field(default_factory=list)  # in event order
    first_add: dict[str, int] = field(default_factory=dict)  # group -> ts of its first mq_added
    # Groups whose queues the broker assigns (an `assignment` line): their universe is the queues an
    # `mq_added` named (PULL queues; POP queues are shared), and convergence leaves out the members rule.
    server_assigned: set[str] = field(default_factory=set)
    pop_assigned: set[str] = field(default_factory=set)  # ... with a POP queue of a non-%RETRY% topic
    added_queues: dict[str, set[tuple[str, str]]] = field(default_factory=lambda: defaultdict(set))

    def mode(self, group: str) -> str:
        """`client`, `server-pull` or `server-pop` (EVENTS.md, proposed section)."""
        return server_mode(group in self.pop_assigned) if group in self.server_assigned else CLIENT_MODE

    def node_of(self) -> dict[str, str]:
        """One node per client (the least name, when a client id appears on several)."""
        out: dict[str, str] = {}
        for client, node in sorted(self.client_nodes):
            out.setdefault(client, node)
        return out


def _order(row: Mapping[str, Any]) -> tuple[int, int, int, int]:
    return (row["ts_ms"], row["fidx"], row["blk"], row["rid"])


def _toggle(
    rows: Iterable[tuple[Any, int, bool]], end_default: Callable[[Any], int]
) -> dict[Any, list[Span]]:
    """Periods of an on/off state machine per key from (key, ts, on) rows in event order: a period opens
    at an "on" while off and closes at the first "off" after it (else at end_default(key))."""
    opened: dict[Any, int] = {}
    out: dict[Any, list[Span]] = defaultdict(list)
    for key, ts, on in rows:
        if on and key not in opened:
            opened[key] = ts
        elif not on and key in opened:
            out[key].append((opened.pop(key), ts))
    for key, start in opened.items():
        out[key].append((start, end_default(key)))
    return out


def build(
    rows: Iterable[Mapping[str, Any]],
    consumer_nodes: Iterable[tuple[str, str, str]],
    run_end: Callable[[str], int],
) -> ControlModel:
    """The model of the control events `rows` (any order; sorted here by event order), given the
    (group, client, node) triples of the consumption lines and the end of each group's run."""
    events = sorted(rows, key=_order)
    m = ControlModel()
    gcn = set(consumer_nodes)
    topic_queues: dict[str, set[str]] = defaultdict(set)
    for e in events:
        ev = e["event"]
        if ev in _GROUP_CONTROL:
            gcn.add((e["group"], e["client_id"], e["node"]))
        if ev == "topic_route":
            m.client_nodes.add((e["client_id"], e["node"]))
            topic_queues[e["topic"]].update(e["queues"])
        elif ev == "rebalance":
            m.group_topics[e["group"]].add(e["topic"])
            m.rebalances.append(e)
        elif ev == SERVER_ASSIGNMENT and e["group"] is not None and e["topic"] is not None:
            m.group_topics[e["group"]].add(e["topic"])
            m.server_assigned.add(e["group"])
            if e.get("pop") and not e["topic"].startswith(RETRY_PREFIX):
                m.pop_assigned.add(e["group"])
        elif ev == "nemesis":
            m.nemeses.append((e["ts_ms"], e["action"], e["target"]))
    for g, c, node in gcn:
        m.groups.add(g)
        m.group_clients.add((g, c))
        m.client_nodes.add((c, node))
    for e in events:
        if e["event"] == "mq_added" and e["topic"] in m.group_topics.get(e["group"], ()):
            m.added_queues[e["group"]].add((e["topic"], queue_key(e["broker"], e["queue_id"])))
    m.universe = {
        g: set(m.added_queues.get(g, ()))
        if g in m.server_assigned
        else {(t, q) for t in m.group_topics.get(g, ()) for q in topic_queues.get(t, ())}
        for g in m.groups
    }
    clients_of_node: dict[str, set[str]] = defaultdict(set)
    for c, node in m.client_nodes:
        clients_of_node[node].add(c)

    # Deaths (consumer_stopped, kill or stop of the client's node) close ownership and liveness.
    owning: list[tuple[tuple[str, str, str, str], int, bool]] = []
    living: list[tuple[tuple[str, str], int, bool]] = []
    toggles: list[tuple[str, int, bool]] = []
    owned_by: dict[str, set[tuple[str, str, str, str]]] = defaultdict(set)
    started: dict[str, set[tuple[str, str]]] = defaultdict(set)
    for e in events:
        ev, ts = e["event"], e["ts_ms"]
        if ev in ("mq_added", "mq_removed"):
            g, t = e["group"], e["topic"]
            if t not in m.group_topics.get(g, ()):
                continue
            key = (g, e["client_id"], t, queue_key(e["broker"], e["queue_id"]))
            if ev == "mq_added":
                owned_by[key[1]].add(key)
                m.first_add.setdefault(g, ts)
            owning.append((key, ts, ev == "mq_added"))
        elif ev == "consumer_started":
            pair = (e["group"], e["client_id"])
            started[pair[1]].add(pair)
            living.append((pair, ts, True))
        else:
            dead: set[str] = set()
            if ev == "consumer_stopped":
                dead = {e["client_id"]}
            elif ev == "nemesis":
                action = e["action"]
                if action in CLOSING_ACTIONS:
                    dead = clients_of_node.get(e["target"], set())
                if action == "pause" or action in UNPAUSING_ACTIONS:
                    toggles.append((e["target"], ts, action == "pause"))
            for c in dead:
                owning.extend((key, ts, False) for key in owned_by.get(c, ()))
                living.extend((pair, ts, False) for pair in started.get(c, ()))
    for (g, c, t, q), spans in _toggle(owning, lambda key: run_end(key[0])).items():
        m.intervals.extend(Interval(g, c, t, q, s, e) for s, e in spans if e > s)
    m.intervals.sort(key=lambda iv: (iv.start, iv.group, iv.client_id, iv.topic, iv.queue))
    m.live = dict(_toggle(living, lambda _key: INF))
    node_pauses = _toggle(toggles, lambda _key: INF)
    per_client: dict[str, list[Span]] = defaultdict(list)
    for c, node in m.client_nodes:
        per_client[c].extend(node_pauses.get(node, ()))
    m.client_pauses = {c: merged for c, spans in per_client.items() if (merged := merge_spans(spans))}
    return m


def _length(points: dict[int, list[int]], counters: int, pred: Callable[[list[int]], bool]) -> int:
    """Total length of the segments between consecutive times of `points` (time -> counter deltas)
    where pred(running counters at the segment's start) holds."""
    total, running, prev = 0, [0] * counters, None
    for t in sorted(points):
        if prev is not None and pred(running):
            total += t - prev
        running = [a + b for a, b in zip(running, points[t], strict=True)]
        prev = t
    return total


def _add(points: dict[int, list[int]], span: Span, index: int, counters: int) -> None:
    s, e = span
    if e <= s:
        return
    points.setdefault(s, [0] * counters)[index] += 1
    points.setdefault(e, [0] * counters)[index] -= 1


def _clip(spans: Iterable[Span], lo: int, hi: int) -> list[Span]:
    return [(max(s, lo), min(e, hi)) for s, e in spans if s < hi and e > lo]


def ownership_metrics(m: ControlModel, run_end: Callable[[str], int]) -> dict[str, dict[str, int]]:
    """overlap_ms, stalled_ms and orphan_ms per group (EVENTS.md), summed over queues, and
    idle_member_ms."""
    by_queue: dict[QueueId, list[Interval]] = defaultdict(list)
    for iv in m.intervals:
        by_queue[(iv.group, iv.topic, iv.queue)].append(iv)
    # The group's live spans from its first mq_added to its run's end: orphan time counts only there.
    group_live: dict[str, list[Span]] = {}
    for g in m.groups:
        if g in m.first_add:
            spans = [sp for (gg, _c), s in m.live.items() if gg == g for sp in s]
            group_live[g] = _clip(merge_spans(spans), m.first_add[g], run_end(g))
    out = {g: {"overlap_ms": 0, "stalled_ms": 0, "orphan_ms": 0} for g in m.groups}
    queues = set(by_queue) | {(g, t, q) for g, u in m.universe.items() for t, q in u}
    for qid in queues:
        g = qid[0]
        points: dict[int, list[int]] = {}  # counters: open, paused owners, group live
        for iv in by_queue.get(qid, ()):
            _add(points, (iv.start, iv.end), 0, 3)
            for piece in _clip(m.client_pauses.get(iv.client_id, ()), iv.start, iv.end):
                _add(points, piece, 1, 3)
        if qid[1:] in m.universe.get(g, ()):
            for span in group_live.get(g, ()):
                _add(points, span, 2, 3)
        entry = out[g]
        entry["overlap_ms"] += _length(points, 3, lambda n: n[0] >= 2)
        entry["stalled_ms"] += _length(points, 3, lambda n: n[0] >= 1 and n[0] == n[1])
        entry["orphan_ms"] += _length(points, 3, lambda n: n[0] == 0 and n[2] >= 1)
    for g, idle in idle_member_ms(m, run_end).items():
        out[g]["idle_member_ms"] = idle
    return out


def idle_member_ms(m: ControlModel, run_end: Callable[[str], int]) -> dict[str, int]:
    """idle_member_ms per group (EVENTS.md): per topic of the group and live member, the time from the
    member's first rebalance of the topic on during which it held no queue of it while the topic had at
    least as many queues as the group had live members. 0 for a server-assigned group."""
    first_rebalance: dict[tuple[str, str, str], int] = {}
    for e in m.rebalances:  # in event order: the first is the earliest
        first_rebalance.setdefault((e["group"], e["client_id"], e["topic"]), e["ts_ms"])
    held: dict[tuple[str, str, str], list[Span]] = defaultdict(list)
    for iv in m.intervals:
        held[(iv.group, iv.client_id, iv.topic)].append((iv.start, iv.end))
    out = {g: 0 for g in m.groups}
    for g in m.groups:
        if g in m.server_assigned:
            continue
        end = run_end(g)
        live = {c: _clip(spans, -INF, end) for (gg, c), spans in m.live.items() if gg == g}
        for t in m.group_topics.get(g, ()):
            queues = sum(1 for tt, _q in m.universe.get(g, ()) if tt == t)
            if not queues:
                continue
            for c, spans in live.items():
                first = first_rebalance.get((g, c, t))
                if first is None:
                    continue
                points: dict[int, list[int]] = {}  # counters: live members, this one live, its queues
                for other in live.values():
                    for span in other:
                        _add(points, span, 0, 3)
                for span in _clip(spans, first, end):
                    _add(points, span, 1, 3)
                for span in held.get((g, c, t), ()):
                    _add(points, span, 2, 3)
                out[g] += _length(points, 3, lambda n, q=queues: n[1] >= 1 and n[2] == 0 and n[0] <= q)
    return out


def change_points(m: ControlModel, rows: Iterable[Mapping[str, Any]]) -> dict[str, dict[int, set[str]]]:
    """Per group, the times of its starts, stops and kills of its clients' nodes, with their causes."""
    nodes_of_group: dict[str, set[str]] = defaultdict(set)
    clients_nodes: dict[str, set[str]] = defaultdict(set)
    for c, node in m.client_nodes:
        clients_nodes[c].add(node)
    for g, c in m.group_clients:
        nodes_of_group[g].update(clients_nodes.get(c, ()))
    out: dict[str, dict[int, set[str]]] = defaultdict(lambda: defaultdict(set))
    for e in rows:
        ev = e["event"]
        if ev in ("consumer_started", "consumer_stopped"):
            verb = "start" if ev == "consumer_started" else "stop"
            out[e["group"]][e["ts_ms"]].add(f"{verb} {e['client_id']} on {e['node']}")
    for ts, action, target in m.nemeses:
        if action == "kill":
            for g, nodes in nodes_of_group.items():
                if target in nodes:
                    out[g][ts].add(f"kill {target}")
    return out


def convergence_timeline(
    m: ControlModel, group: str, unqualified: Callable[[str], str]
) -> list[tuple[int, bool]]:
    """(t, converged from t on) at every time the group's state may change, in time order. Converged:
    nobody live, or every queue of the universe has exactly one open interval whose owner is live and
    (unless the broker assigns the group's queues) every live, unpaused client's latest rebalance of
    every group topic saw exactly the live set."""
    universe = m.universe.get(group, set())
    topics = sorted(m.group_topics.get(group, ()))
    changes: dict[int, list[tuple[str, Any, int]]] = defaultdict(list)
    for iv in m.intervals:
        if iv.group == group:
            changes[iv.start].append(("iv", iv, 1))
            changes[iv.end].append(("iv", iv, -1))
    clients = set()
    for (g, c), spans in m.live.items():
        if g != group:
            continue
        clients.add(c)
        for s, e in spans:
            if e > s:
                changes[s].append(("live", c, 1))
                if e < INF:
                    changes[e].append(("live", c, -1))
    for c in clients:
        for s, e in m.client_pauses.get(c, ()):
            changes[s].append(("pause", c, 1))
            if e < INF:
                changes[e].append(("pause", c, -1))
    latest_of: dict[tuple[str, str], list[tuple[int, str]]] = defaultdict(list)
    for r in m.rebalances:
        if r["group"] == group and r["client_id"] in clients:
            changes[r["ts_ms"]].append(("rebalance", (r["client_id"], r["topic"]), 0))
            latest_of[(r["client_id"], r["topic"])].append((r["ts_ms"], _members(r)))
    latest_at = {k: iter(v) for k, v in latest_of.items()}
    pending = {k: next(it, None) for k, it in latest_at.items()}
    digest: dict[tuple[str, str], str] = {}

    live_n: dict[str, int] = defaultdict(int)
    paused_n: dict[str, int] = defaultdict(int)
    open_on: dict[tuple[str, str], list[Interval]] = defaultdict(list)
    timeline: list[tuple[int, bool]] = []
    for t in sorted(changes):
        for kind, what, d in changes[t]:
            if kind == "iv":
                lst = open_on[(what.topic, what.queue)]
                if d > 0:
                    lst.append(what)
                else:
                    lst.remove(what)
            elif kind == "live":
                live_n[what] += d
            elif kind == "pause":
                paused_n[what] += d
        for key in [k for k, nxt in pending.items() if nxt is not None and nxt[0] <= t]:
            it = latest_at[key]
            nxt = pending[key]
            while nxt is not None and nxt[0] <= t:
                digest[key] = nxt[1]
                nxt = next(it, None)
            pending[key] = nxt
        live = sorted(c for c in clients if live_n[c] > 0)
        if not live:
            timeline.append((t, True))
            continue
        ok = all(len(open_on.get(q, ())) == 1 and live_n[open_on[q][0].client_id] > 0 for q in universe)
        if ok and group not in m.server_assigned:
            live_digest = members_digest(unqualified(c) for c in live)
            ok = all(
                digest.get((c, topic)) == live_digest for c in live if paused_n[c] == 0 for topic in topics
            )
        timeline.append((t, ok))
    return timeline


def pop_retry_topics(m: ControlModel, unqualified: Callable[[str], str]) -> list[tuple[str, str]]:
    """(group, topic) of the pop retry topics `%RETRY%<group>_<topic>` of the server-assigned groups'
    topics: a revived copy is consumed from there and counts as a consumption of its topic. (Names of
    many runs keep their run's prefix.)"""
    out = []
    for g in sorted(m.server_assigned & m.groups):
        prefix = g.removesuffix(unqualified(g))
        for t in sorted(m.group_topics.get(g, ())):
            if not unqualified(t).startswith(RETRY_PREFIX):
                out.append((g, f"{prefix}{RETRY_PREFIX}{unqualified(g)}_{unqualified(t)}"))
    return out


def _members(row: Mapping[str, Any]) -> str | None:
    ids = row.get("cid_all")
    if ids is not None:
        return members_digest(ids)
    return row.get("cid_all_digest")


def convergence(
    m: ControlModel,
    rows: Iterable[Mapping[str, Any]],
    run_end: Callable[[str], int],
    unqualified: Callable[[str], str],
) -> dict[str, list[dict[str, Any]]]:
    """Per group, one entry per change point: converged (within the run) and how long it took."""
    out: dict[str, list[dict[str, Any]]] = {}
    for g, points in change_points(m, rows).items():
        timeline = convergence_timeline(m, g, unqualified)
        times = [t for t, _ in timeline]
        entries = []
        end = run_end(g)
        for cp in sorted(points):
            i = bisect.bisect_right(times, cp)
            if i == 0 or timeline[i - 1][1]:
                ms: int | None = 0
            else:
                nxt = next((t for t, ok in timeline[i:] if ok and t <= end), None)
                ms = None if nxt is None else nxt - cp
            entries.append(
                {
                    "change_ms": cp,
                    "cause": "; ".join(sorted(points[cp])),
                    "converged": ms is not None,
                    "convergence_ms": ms,
                }
            )
        out[g] = entries
    return out
