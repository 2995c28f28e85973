"""Per-queue unavailability and its cause, and the run's clock in RocketMQ time (sans-IO core).

A queue is *unavailable* while messages wait on it and nobody consumes it. The Spark pipeline
(`pipeline.availability_spark`) and the plain-Python reference (`pipeline.availability_reference`) extract
the same small inputs per queue -- waiting spans, quiet spans, ownership intervals, pauses, liveness,
allocations -- and this module classifies them. Definitions (times are wall milliseconds; every span
is half-open):

- ``G``, the idle threshold: 3 s of RocketMQ time (``PULL_TIME_DELAY_MILLS_WHEN_EXCEPTION``, the delay
  before a failed pull is retried), i.e. ``round(3000 * time_scale)`` wall ms.
- A message *waits* from its first acknowledged send until the group first consumed it (the run's end
  when never). The queue's *waiting spans* are the union of the waits longer than ``G``.
- Its *quiet spans* are the maximal parts of the waiting spans in which no message of the queue was
  consumed by the group, longer than ``G``.
- At each instant of a waiting span the queue's state is, in this order:
  ``owner_paused`` when it has open ownership intervals and every one belongs to a paused client;
  ``owner_idle`` when it has an owner that is not paused (counted only inside a quiet span, and only
  when the quiet span holds more than ``G`` of it: a running owner that consumed nothing of a queue with
  waiting messages, such as the C++ client's regained queue);
  ``lock_wait`` when no ownership interval is open but a live, running client's latest ``rebalance`` of
  the topic allocates the queue (RocketMQ's orderly consumer adds a queue only once the broker's lock is
  taken; in a concurrent group this is the moment of an offset lookup);
  ``no_owner`` otherwise.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

CAUSES = ("no_owner", "lock_wait", "owner_paused", "owner_idle")
CAUSE_TEXT = {
    "no_owner": "no owner",
    "lock_wait": "allocated but not taken (waiting for the broker lock)",
    "owner_paused": "owner paused",
    "owner_idle": "owner running but consuming nothing",
}
IDLE_THRESHOLD_RMQ_MS = 3000

Span = tuple[int, int]


@dataclass(frozen=True)
class RunClock:
    """The run's origin (the experiment's t = 0, epoch ms) and its time scale (wall / RocketMQ); ``note``
    says when the run's processes logged other time scales than the one taken; ``kind`` names the time
    its timestamps were taken in (``discover.clock_word``): ``wall`` for real processes, ``simulated``
    for a simulated run, which has no wall time."""

    t0_ms: int
    time_scale: float = 1.0
    note: str | None = None
    kind: str = "wall"

    def at_s(self, ts_ms: int) -> float:
        """RocketMQ seconds since the origin."""
        return (ts_ms - self.t0_ms) / 1000.0 / self.time_scale

    def wall_s(self, ts_ms: int) -> float:
        return (ts_ms - self.t0_ms) / 1000.0

    def rmq_ms(self, wall_ms: int | float) -> int:
        """A wall-clock duration in RocketMQ milliseconds."""
        return round(wall_ms / self.time_scale)

    @property
    def idle_threshold_ms(self) -> int:
        return max(1, round(IDLE_THRESHOLD_RMQ_MS * self.time_scale))


@dataclass
class QueueInputs:
    """What the classification of one queue (group, topic, queue) needs; all spans in wall ms."""

    waiting: list[Span] = field(default_factory=list)
    quiet: list[Span] = field(default_factory=list)
    owners: list[tuple[str, int, int]] = field(default_factory=list)  # client, start, end


@dataclass
class GroupInputs:
    """Per-client facts of one group shared by its queues."""

    pauses: dict[str, list[Span]] = field(default_factory=dict)  # client -> paused spans
    live: dict[str, list[Span]] = field(default_factory=dict)  # client -> live spans
    # (client, topic) -> [(ts, allocated queues)] in event order
    rebalances: dict[tuple[str, str], list[tuple[int, frozenset[str]]]] = field(default_factory=dict)


@dataclass
class QueueResult:
    topic: str
    queue: str
    by_cause: dict[str, int]  # wall ms
    spans: list[tuple[int, int, str]]  # (start, end, cause), merged where adjacent

    @property
    def total(self) -> int:
        return sum(self.by_cause.values())


def merge_spans(spans: Iterable[Span]) -> list[Span]:
    """The union of half-open spans, sorted, with touching spans joined."""
    out: list[Span] = []
    for s, e in sorted(sp for sp in spans if sp[1] > sp[0]):
        if out and s <= out[-1][1]:
            if e > out[-1][1]:
                out[-1] = (out[-1][0], e)
        else:
            out.append((s, e))
    return out


def waiting_spans(waits: Iterable[Span], threshold_ms: int) -> list[Span]:
    """Union of the message waits longer than the threshold."""
    return merge_spans(w for w in waits if w[1] - w[0] > threshold_ms)


def quiet_spans(waiting: Sequence[Span], consumed_ts: Sequence[int], threshold_ms: int) -> list[Span]:
    """Parts of the waiting spans between consecutive consumptions of the queue, longer than the
    threshold; `consumed_ts` sorted."""
    out: list[Span] = []
    for s, e in waiting:
        lo = bisect.bisect_left(consumed_ts, s)
        hi = bisect.bisect_left(consumed_ts, e)
        points = [s, *consumed_ts[lo:hi], e]
        for a, b in itertools.pairwise(points):
            if b - a > threshold_ms:
                out.append((a, b))
    return out


def _covers(spans: Sequence[Span], t: int) -> bool:
    return any(s <= t < e for s, e in spans)


def _allocated(rows: Sequence[tuple[int, frozenset[str]]], queue: str, t: int) -> bool:
    latest = None
    for ts, allocated in rows:
        if ts > t:
            break
        latest = allocated
    return latest is not None and queue in latest


def _state(q: QueueInputs, g: GroupInputs, topic: str, queue: str, t: int) -> str:
    open_owners = {c for c, s, e in q.owners if s <= t < e}
    if open_owners:
        if all(_covers(g.pauses.get(c, ()), t) for c in open_owners):
            return "owner_paused"
        return "owner_idle"
    for (client, tp), rows in g.rebalances.items():
        if tp != topic or not _covers(g.live.get(client, ()), t) or _covers(g.pauses.get(client, ()), t):
            continue
        if _allocated(rows, queue, t):
            return "lock_wait"
    return "no_owner"


def classify_queue(topic: str, queue: str, q: QueueInputs, g: GroupInputs, threshold_ms: int) -> QueueResult:
    """Unavailable time of one queue by cause, and its spans."""
    bounds: set[int] = set()
    for s, e in (*q.waiting, *q.quiet):
        bounds.update((s, e))
    for _, s, e in q.owners:
        bounds.update((s, e))
    for spans in (*g.pauses.values(), *g.live.values()):
        for s, e in spans:
            bounds.update((s, e))
    for (_, tp), rows in g.rebalances.items():
        if tp == topic:
            bounds.update(ts for ts, _ in rows)
    points = sorted(bounds)
    by_cause = dict.fromkeys(CAUSES, 0)
    pieces: list[tuple[int, int, str]] = []
    for ws, we in q.waiting:
        lo, hi = bisect.bisect_left(points, ws), bisect.bisect_left(points, we)
        cuts = [ws, *points[lo:hi], we]
        for a, b in itertools.pairwise(cuts):
            if b > a:
                pieces.append((a, b, _state(q, g, topic, queue, a)))
    # A running owner counts only for the part of a quiet span it holds, when that part exceeds G.
    idle: list[Span] = []
    for qs, qe in q.quiet:
        inside = [(max(a, qs), min(b, qe)) for a, b, st in pieces if st == "owner_idle" and a < qe and b > qs]
        if sum(e - s for s, e in inside) > threshold_ms:
            idle += inside
    idle = merge_spans(idle)
    spans: list[tuple[int, int, str]] = []
    for a, b, st in pieces:
        if st == "owner_idle":
            continue
        spans.append((a, b, st))
    spans += [(s, e, "owner_idle") for s, e in idle]
    spans.sort()
    merged: list[tuple[int, int, str]] = []
    for a, b, st in spans:
        by_cause[st] += b - a
        if merged and merged[-1][2] == st and merged[-1][1] == a:
            merged[-1] = (merged[-1][0], b, st)
        else:
            merged.append((a, b, st))
    return QueueResult(topic, queue, by_cause, merged)


@dataclass
class GroupAvailability:
    queues: list[QueueResult]

    def by_cause(self) -> dict[str, int]:
        total = dict.fromkeys(CAUSES, 0)
        for r in self.queues:
            for c, ms in r.by_cause.items():
                total[c] += ms
        return total


def classify_group(
    queues: dict[tuple[str, str], QueueInputs], g: GroupInputs, threshold_ms: int
) -> GroupAvailability:
    results = [classify_queue(t, qu, q, g, threshold_ms) for (t, qu), q in sorted(queues.items())]
    return GroupAvailability([r for r in results if r.total > 0])


def to_json(av: GroupAvailability, clock: RunClock) -> dict[str, Any]:
    """The group's `unavailability` entry of summary.json."""
    total = av.by_cause()
    return {
        "total_ms": sum(total.values()),
        "total_rocketmq_ms": clock.rmq_ms(sum(total.values())),
        "by_cause_ms": total,
        "by_cause_rocketmq_ms": {c: clock.rmq_ms(ms) for c, ms in total.items()},
        "queues": [
            {
                "topic": r.topic,
                "queue": r.queue,
                "total_ms": r.total,
                "total_rocketmq_ms": clock.rmq_ms(r.total),
                "by_cause_rocketmq_ms": {c: clock.rmq_ms(ms) for c, ms in r.by_cause.items() if ms},
                "spans": [
                    {"from_s": round(clock.at_s(a), 3), "to_s": round(clock.at_s(b), 3), "cause": c}
                    for a, b, c in r.spans
                ],
            }
            for r in av.queues
        ],
    }


# -- the run's clock and the broker's changes --------------------------------------------------------

# The chaos runner's events that carry the experiment's time scale, and the roles' that carry the one
# each process runs at (the servers log theirs when they start; a compose cluster has no runner).
RUNNER_CLOCK_EVENTS = ("schedule_started", "experiment_started")
ROLE_CLOCK_EVENTS = ("broker_started", "namesrv_started")
SIDE_EVENTS = (
    *RUNNER_CLOCK_EVENTS,
    "consumer_unregistered",
    "notify_sent",
    "lock_acquired",
    *ROLE_CLOCK_EVENTS,
)


def _logged_scale(r: dict[str, Any]) -> float | None:
    """The line's ``time_scale`` when it is a positive finite number."""
    v = r.get("time_scale")
    if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) and v > 0:
        return float(v)
    return None


def _scales_text(logged: dict[float, set[str]]) -> str:
    """``0.05 (broker-a, broker-b), 0.1 (namesrv)``: each scale with the nodes that logged it."""
    return ", ".join(f"{s:g} ({', '.join(sorted(nodes))})" for s, nodes in sorted(logged.items()))


def run_clock(side: Sequence[dict[str, Any]], start_ms: int | None, time_scale: float | None) -> RunClock:
    """The origin is the chaos runner's `schedule_started` (the experiment's t = 0), else the first
    event. The time scale is the given one, else the chaos runner's (`schedule_started`,
    `experiment_started`), else the one the servers logged in `broker_started` and `namesrv_started`
    (a compose cluster has no runner; when they disagree, the one most of them logged), else 1. When
    the run's processes logged other scales than the one taken, the clock's note says which."""
    lines = sorted(side, key=lambda r: (r["ts_ms"], r.get("node") or "", r["event"]))
    t0 = next((r["ts_ms"] for r in lines if r["event"] == "schedule_started"), None)
    runner = next(
        (s for r in lines if r["event"] in RUNNER_CLOCK_EVENTS and (s := _logged_scale(r)) is not None),
        None,
    )
    roles: dict[float, set[str]] = {}  # scale -> the servers that logged it
    first: dict[float, int] = {}  # scale -> where it was first logged
    for i, r in enumerate(lines):
        s = _logged_scale(r) if r["event"] in ROLE_CLOCK_EVENTS else None
        if s is not None:
            roles.setdefault(s, set()).add(str(r.get("node") or r["event"]))
            first.setdefault(s, i)
    note = None
    if time_scale is not None:
        logged = {s: set(nodes) for s, nodes in roles.items()}
        if runner is not None:
            logged.setdefault(runner, set()).add("the chaos runner")
        if set(logged) - {time_scale}:
            note = (
                f"time scale {time_scale:g} as given, but the run's processes logged {_scales_text(logged)}"
            )
    elif runner is not None:
        time_scale = runner
        if set(roles) - {runner}:
            note = (
                f"time scale {runner:g} from the chaos runner, but the servers logged {_scales_text(roles)}"
            )
    elif roles:
        # the scale most servers logged; of as many, the first logged
        time_scale = min(roles, key=lambda s: (-len(roles[s]), first[s]))
        if len(roles) > 1:
            note = (
                f"no chaos runner logged a time scale and the servers disagree: {_scales_text(roles)}; "
                f"the analysis takes {time_scale:g}, the one most of them logged"
            )
    return RunClock(t0 if t0 is not None else (start_ms or 0), time_scale or 1.0, note)


def broker_markers(
    side: Sequence[dict[str, Any]], group: str, node_of: dict[str, str]
) -> list[dict[str, Any]]:
    """The broker's changes of a group, in time order: channel expiries, NOTIFY sends and locks taken
    over from another client (the previous holder's lock had expired). Changes at the same instant go
    by broker, each broker's in its file's order: Spark hands the files over in an order of its own
    (by size), the reference in name order."""
    out = []
    for r in sorted(side, key=lambda r: (r["ts_ms"], r.get("node") or "")):
        if r.get("group") != group:
            continue
        client = r.get("client_id")
        entry: dict[str, Any] | None = None
        if r["event"] == "consumer_unregistered" and r.get("reason") == "channel_expired":
            entry = {"kind": "channel_expired", "client_id": client}
        elif r["event"] == "notify_sent":
            entry = {"kind": "notify_sent", "detail": r.get("cause") or ""}
        elif r["event"] == "lock_acquired":
            prev = r.get("previous_client_id")
            if prev and prev != client:
                entry = {
                    "kind": "lock_taken_over",
                    "client_id": client,
                    "previous_client_id": prev,
                    "previous_node": node_of.get(prev, prev),
                    "detail": f"{r.get('topic')} {r.get('broker')}:{r.get('queue_id')}",
                }
        if entry is None:
            continue
        entry["ts_ms"] = r["ts_ms"]
        entry["broker"] = r.get("node")
        if client:
            entry["node"] = node_of.get(client, client)
        out.append(entry)
    return out


RMQ_METRICS = ("overlap_ms", "orphan_ms", "idle_member_ms", "stalled_ms", "concurrent_consume_ms")


def extend_summary(
    summary: dict[str, Any],
    clock: RunClock,
    availability: dict[str, GroupAvailability],
    markers: dict[str, list[dict[str, Any]]],
) -> dict[str, Any]:
    """Add the RocketMQ-time fields (the contract's fields stay as they are, in wall ms)."""
    summary["run"]["time_scale"] = clock.time_scale
    summary["run"]["t0_ms"] = clock.t0_ms
    if clock.note:
        summary["run"]["time_scale_note"] = clock.note
    for name, g in summary["groups"].items():
        av = availability.get(name, GroupAvailability([]))
        g["unavailability"] = to_json(av, clock)
        g["rocketmq_time"] = {
            **{k: clock.rmq_ms(g[k]) for k in RMQ_METRICS},
            "unavailable_ms": g["unavailability"]["total_rocketmq_ms"],
        }
        for e in g["convergence"]:
            e["at_s"] = round(clock.at_s(e["change_ms"]), 3)
            e["convergence_rocketmq_ms"] = (
                None if e["convergence_ms"] is None else clock.rmq_ms(e["convergence_ms"])
            )
        g["broker_markers"] = [{**m, "at_s": round(clock.at_s(m["ts_ms"]), 3)} for m in markers.get(name, [])]
    return summary
