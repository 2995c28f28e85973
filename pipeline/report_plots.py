"""report.html: what happened in a run, for someone who was not there. One self-contained page: the
metrics with a plain explanation, the verdict and why, and matplotlib pictures (PNG, inline base64).

The pictures are drawn from small aggregates computed in Spark (ownership intervals, nemesis actions,
per-bucket counts); only those are collected to the driver.
"""

from __future__ import annotations

import base64
import html
import io
import itertools
import json
import math
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from rmqlab.pipeline.unavailability import CAUSE_TEXT, CAUSES, IDLE_THRESHOLD_RMQ_MS, RunClock

T = TypeVar("T")

METRICS: dict[str, str] = {
    "sent": "Distinct messages the producers sent to the group's topics and the broker acknowledged.",
    "consumed_unique": "Distinct messages the group's consumers processed successfully.",
    "lost": "Messages that were sent but never consumed by the group. Should be 0.",
    "duplicates": "Extra deliveries: every processing of a message after its first one. After a crash "
    "or a rebalance RocketMQ replays from the last committed offset, so some are expected.",
    "duplicated_messages": "Messages processed two or more times.",
    "overlap_ms": "Time during which two or more consumers owned the same queue at once (summed over "
    "queues). Happens briefly during a rebalance, before the old owner lets go.",
    "orphan_ms": "Time during which a queue of the group had no owner at all, counted from the group's "
    "first queue assignment to the end of the run (summed over queues). Messages on it wait.",
    "stalled_ms": "Time during which a queue was owned only by paused (frozen) consumers, summed over "
    "queues: owned on paper but nobody working on it.",
    "concurrent_consume_ms": "Time during which two different consumers were processing messages of "
    "the same queue at the same moment. Forbidden for an orderly group.",
    "order_violations": "Orderly deliveries that went backwards (an offset not above an earlier one) "
    "within one consumer's ownership of a queue.",
}

UNAVAILABLE_TEXT = (
    "Time during which messages waited on a queue (one had waited more than 3 s of RocketMQ time) and "
    "nobody consumed it, summed over queues, by cause: no owner; allocated but not taken (an orderly "
    "consumer waiting for the broker's lock); owner paused; owner running but consuming nothing."
)

VERDICT_RULES = (
    "The verdict is FAIL when a message was lost, when an orderly group (one that consumed in ORDERLY "
    "mode) had two consumers in the same queue at once or delivered out of order, or when after a "
    "change of membership (a consumer starting, stopping or being killed) the group never became whole "
    "again before the run ended. Whole means: every queue has exactly one owner, that owner is alive, and "
    "every running consumer has rebalanced with the current member list. Otherwise the verdict is OK."
)

NUMBERED_MARKERS_TEXT = (
    "Numbered markers above the {what} are the chaos runner's actions (dashed) and the broker's "
    "channel expiries and lock take-overs (dotted); small ticks are the broker's NOTIFY sends."
)
TICK_MARKERS_TEXT = (
    "Above the {what}, a tick per action of the chaos runner (upper row) and per channel expiry or lock "
    "take-over of the broker (lower row), coloured by kind; the small ticks under them are the broker's "
    "NOTIFY sends."
)
OWNERSHIP_BASE_TEXT = (
    "Each row is a queue; each bar is the time one consumer owned it (colour = consumer; a "
    "restarted node's new process is '#2'). Hatched: the owner was paused. The thin strip under "
    "a row marks the time its messages waited and nobody consumed them, coloured by cause."
)
OWNERSHIP_TEXT = f"{OWNERSHIP_BASE_TEXT} {NUMBERED_MARKERS_TEXT.format(what='chart')}"

RATE_TEXT = (
    "Messages each consumer node finished per wall second; the grey line is what the producers "
    "sent. A consumer that stops at a kill or pause drops to zero; the others speed up to drain "
    "the backlog once they take over its queues."
)
MANY_NODES = 20  # past the palette's 20 colours, the rates of a group's nodes are drawn summed
RATES_TEXT = (
    "Messages the group's {nodes} consumer nodes finished per wall second, all together (a line each "
    "would be {nodes} lines); the grey line is what the producers sent. A dip below it is a backlog "
    "growing, a rise above it the backlog being drained."
)

DUPLICATES_TEXT = (
    "Deliveries of a message after its first one, by when they happened: after a kill the new "
    "owner resumes from the last committed offset; after a pause past the channel expiry, the "
    "resumed consumer re-consumes what it had fetched before the others took over."
)

ACTION_COLORS = {
    "kill": "#d62728",
    "stop": "#ff7f0e",
    "start": "#2ca02c",
    "pause": "#9467bd",
    "resume": "#17becf",
}


@dataclass
class PlotData:
    """Everything the pictures need, already small (collected rows)."""

    run_start: int
    run_end: int
    bucket_ms: int
    intervals: list[dict[str, Any]] = field(
        default_factory=list
    )  # group client_id node topic queue start end
    nemeses: list[dict[str, Any]] = field(default_factory=list)  # ts_ms action target
    rates: list[dict[str, Any]] = field(default_factory=list)  # group node bucket n
    duplicates: list[dict[str, Any]] = field(default_factory=list)  # group bucket n
    sends: list[dict[str, Any]] = field(default_factory=list)  # group bucket n
    orderly: set[str] = field(default_factory=set)  # groups with ORDERLY consumption
    clock: RunClock | None = None  # the run's t = 0 and time scale (summary.json's run fields)
    intervals_cut_at: int | None = None  # start of the first interval left out (past MAX_INTERVALS)


# Nemesis actions kept per run for the markers: sim-scale.toml's hour has 2,179 (GC pauses included).
MAX_NEMESES = 20_000
# Past this many markers a chart's lane draws ticks instead of numbered circles (which would pile up),
# and the list of them under the ownership chart is folded.
MANY_MARKERS = 40

# Ownership intervals collected per run: a 1,000-consumer group on 4,000 queues churned every 30 s for
# ten minutes has about 43,000; past the cap the health map shows the rest as not collected.
MAX_INTERVALS = 200_000


def pick_bucket_ms(duration_ms: int, target: int = 150) -> int:
    """A round bucket width giving about `target` buckets over the run."""
    raw = max(duration_ms, 1) / target
    for step in (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10_000, 30_000, 60_000):
        if step >= raw:
            return step
    return 60_000 * math.ceil(raw / 60_000)


def collect_plot_data(
    analysis: Any, max_intervals: int = MAX_INTERVALS, clock: RunClock | None = None
) -> PlotData:
    """What the plots of a single run need: the control plane's intervals and nemeses, and three small
    aggregates of the message lines (collected in one Spark job)."""
    start = analysis.stats.start_ms or 0
    end = analysis.stats.end_ms or 0
    data = plot_data_by_run(analysis, {"": (start, end)}, max_intervals)[""]
    data.clock = clock
    return data


def plot_data_by_run(
    analysis: Any, spans: dict[str, tuple[int, int]], max_intervals: int = MAX_INTERVALS
) -> dict[str, PlotData]:
    """The plot data of every run of `analysis` by run prefix ("" for a single run, whose names carry
    no prefix), given each run's (start, end); buckets are chosen per run."""
    import pyspark.sql.functions as F

    from rmqlab.pipeline.ingest import RUN_SEP

    many = analysis.runs is not None

    def split(name: str) -> tuple[str, str]:
        if not many:
            return "", name
        cut = name.index(RUN_SEP) + 1
        return name[:cut], name[cut:]

    out = {p: PlotData(s, e, pick_bucket_ms(e - s)) for p, (s, e) in spans.items()}
    m = analysis.control
    node_of = m.node_of()
    for iv in m.intervals:  # sorted by start
        prefix, group = split(iv.group)
        data = out[prefix]
        if len(data.intervals) < max_intervals:
            node = node_of.get(iv.client_id)
            data.intervals.append(
                {
                    "group": group,
                    "client_id": split(iv.client_id)[1],
                    "node": None if node is None else split(node)[1],
                    "topic": split(iv.topic)[1],
                    "queue": iv.queue,
                    "start": iv.start,
                    "end": iv.end,
                }
            )
        elif data.intervals_cut_at is None:
            data.intervals_cut_at = iv.start
    for ts, action, target in sorted(m.nemeses, key=lambda n: n[0]):
        prefix, name = split(target)
        if len(out[prefix].nemeses) < MAX_NEMESES:
            out[prefix].nemeses.append({"ts_ms": ts, "action": action, "target": name})

    # Each line's bucket, from its run's start and bucket width.
    if many:
        prefix_of = F.concat(F.substring_index(F.col("group"), RUN_SEP, 1), F.lit(RUN_SEP))
        starts = F.create_map(*[F.lit(x) for p, d in sorted(out.items()) for x in (p, d.run_start)])
        widths = F.create_map(*[F.lit(x) for p, d in sorted(out.items()) for x in (p, d.bucket_ms)])
        origin, width = F.element_at(starts, prefix_of), F.element_at(widths, prefix_of)
    else:
        only = out[""]
        origin, width = F.lit(only.run_start), F.lit(only.bucket_ms)
    bucket = F.floor((F.col("ts_ms") - origin) / width).cast("long").alias("bucket")
    consumed = analysis.consumed.select("group", "client_id", "msg_id", "ts_ms")
    # Lines per (group, client, bucket) give the rates and the lines per bucket; duplicates per bucket
    # are the lines minus the first deliveries in the bucket (a message's earliest line), so no
    # per-message sort is needed.
    lines = consumed.groupBy("group", "client_id", bucket).agg(F.count("*").alias("n"))
    firsts = (
        consumed.groupBy("group", "msg_id")
        .agg(F.min("ts_ms").alias("ts_ms"))
        .groupBy("group", bucket)
        .agg(F.count("*").alias("n"))
        .withColumn("client_id", F.lit(None).cast("string"))
    )
    sends = (
        analysis.ev.where(F.col("event") == "message_sent")
        .select("topic", "ts_ms")
        .join(F.broadcast(analysis.group_topics), "topic")
        .groupBy("group", bucket)
        .agg(F.count("*").alias("n"))
        .withColumn("client_id", F.lit(None).cast("string"))
    )
    tagged = (
        lines.withColumn("kind", F.lit("line"))
        .unionByName(firsts.withColumn("kind", F.lit("first")))
        .unionByName(sends.withColumn("kind", F.lit("sent")))
    )
    rates: dict[tuple[str, str, str, int], int] = {}
    per_bucket: dict[tuple[str, str, int], int] = {}
    for r in tagged.collect():
        prefix, group = split(r["group"])
        if r["kind"] == "sent":
            out[prefix].sends.append({"group": group, "bucket": r["bucket"], "n": r["n"]})
            continue
        key = (prefix, group, r["bucket"])
        if r["kind"] == "first":
            per_bucket[key] = per_bucket.get(key, 0) - r["n"]
            continue
        per_bucket[key] = per_bucket.get(key, 0) + r["n"]
        node = node_of.get(r["client_id"], r["client_id"])  # one node per client
        rate_key = (prefix, group, split(node)[1], r["bucket"])
        rates[rate_key] = rates.get(rate_key, 0) + r["n"]
    for (prefix, group, node, b), n in rates.items():
        out[prefix].rates.append({"group": group, "node": node, "bucket": b, "n": n})
    for (prefix, group, b), n in per_bucket.items():
        if n > 0:
            out[prefix].duplicates.append({"group": group, "bucket": b, "n": n})
    for g in analysis.orderly():
        prefix, group = split(g)
        out[prefix].orderly.add(group)
    return out


# -- time and markers ---------------------------------------------------------------------------------

FONT = 13  # at 850 px wide the pictures stay legible when a 700 px screen shrinks them by a quarter
FIG_W = 8.5
LANE_H = 1.0  # inches for the marker lane: three rows of numbered circles that never touch
LANE_ROWS = (3.3, 2.0, 0.7)
# Outside the consumers' palette (tab10/tab20), so a strip is never read as an owner.
CAUSE_COLORS = {
    "no_owner": "#000000",
    "lock_wait": "#ff00ff",
    "owner_paused": "#5a5a5a",
    "owner_idle": "#ffd700",
}
BROKER_MARKS = {
    "channel_expired": ("channel expired (no NOTIFY)", "#8c564b"),
    "lock_taken_over": ("broker lock taken over", "#e377c2"),
}


def _clock(data: PlotData | None, summary: dict[str, Any] | None = None) -> RunClock:
    if data is not None and data.clock is not None:
        return data.clock
    run = (summary or {}).get("run", {})
    start = data.run_start if data is not None else (run.get("start_ms") or 0)
    return RunClock(run.get("t0_ms") or start, run.get("time_scale") or 1.0)


def _when(ts: int, clock: RunClock) -> str:
    """t = RocketMQ seconds (wall seconds)."""
    # z: a change a few ms before t = 0 (a consumer started with the cluster) reads "t = 0.0 s", not -0.0
    if clock.time_scale == 1.0:
        return f"t = {clock.at_s(ts):z.1f} s"
    return f"t = {clock.at_s(ts):z.1f} s ({clock.wall_s(ts):z.2f} s wall)"


def _rmq_s(ms: int | None) -> str:
    return "-" if ms is None else f"{ms / 1000:.1f} s"


def _short_s(ms: float) -> str:
    """A duration that may be milliseconds: '4 ms' under a second, '2.8 s' from there."""
    return f"{ms:.0f} ms" if ms < 999.5 else f"{ms / 1000:.1f} s"


def pause_spans(data: PlotData) -> list[tuple[str, int, int]]:
    """(node, start, end) of each paused stretch: a pause until the next resume, kill or stop."""
    out, since = [], {}
    for n in sorted(data.nemeses, key=lambda n: n["ts_ms"]):
        node, action = n["target"], n["action"]
        if action == "pause" and node not in since:
            since[node] = n["ts_ms"]
        elif action in ("resume", "kill", "stop") and node in since:
            out.append((node, since.pop(node), n["ts_ms"]))
    out += [(node, ts, data.run_end) for node, ts in since.items()]
    return out


@dataclass
class Marker:
    ts: int
    text: str
    color: str
    kind: str  # nemesis or a broker mark


def group_markers(data: PlotData, group: str, summary_group: dict[str, Any] | None) -> list[Marker]:
    """The chaos runner's actions on the group's nodes (and on nodes of no group, such as brokers) and
    the broker's channel expiries and lock take-overs, in time order; actions of one instant merged."""
    mine = group_nodes(data, group)
    everyone = {r["node"] for r in data.intervals if r["node"]} | {r["node"] for r in data.rates}
    by_time: dict[int, list[dict[str, Any]]] = {}
    for n in data.nemeses:
        if n["target"] in mine or n["target"] not in everyone:
            by_time.setdefault(n["ts_ms"], []).append(n)
    out = [
        Marker(
            ts,
            ", ".join(f"{a['action']} {a['target']}" for a in acts)
            if len(acts) < MANY_ACTIONS
            else _many_actions([(a["action"], a["target"]) for a in acts]),
            ACTION_COLORS.get(acts[0]["action"], "gray"),
            "nemesis",
        )
        for ts, acts in sorted(by_time.items())
    ]
    taken: dict[tuple[int, str], list[str]] = {}
    for m in (summary_group or {}).get("broker_markers", []):
        if m["kind"] == "channel_expired":
            out.append(
                Marker(
                    m["ts_ms"],
                    f"{m.get('broker')} expired {m.get('node')}'s channel, no NOTIFY",
                    BROKER_MARKS["channel_expired"][1],
                    "channel_expired",
                )
            )
        elif m["kind"] == "lock_taken_over":
            # Take-overs come in batches (one per queue): one marker per client and instant.
            taken.setdefault((m["ts_ms"] // max(1, data.bucket_ms), m.get("node", "?")), []).append(m)  # type: ignore[arg-type]
    for (_, node), ms in taken.items():
        first = min(x["ts_ms"] for x in ms)  # type: ignore[index]
        prev = sorted({x.get("previous_node", "?") for x in ms})  # type: ignore[union-attr]
        out.append(
            Marker(
                first,
                f"{node} took {len(ms)} queue lock(s) of {', '.join(prev)} (expired)",
                BROKER_MARKS["lock_taken_over"][1],
                "lock_taken_over",
            )
        )
    out.sort(key=lambda m: m.ts)
    return out


def _levels(xs: list[float], gap: float, lanes: int = 3) -> list[int]:
    """A lane per label so that labels closer than `gap` never share one (greedy, lowest lane first)."""
    last = [-math.inf] * lanes
    out = []
    for x in xs:
        lane = next((i for i in range(lanes) if x - last[i] >= gap), min(range(lanes), key=lambda i: last[i]))
        last[lane] = x
        out.append(lane)
    return out


def _figure(height: float, markers: list[Marker]) -> tuple[Any, Any, Any]:
    """A figure with a marker lane above the main axes (sharing x), so labels never sit on the data."""
    import matplotlib.pyplot as plt

    if not markers:
        fig, ax = plt.subplots(figsize=(FIG_W, height))
        return fig, None, ax
    fig, (lane, ax) = plt.subplots(
        2,
        1,
        figsize=(FIG_W, height + LANE_H),
        sharex=True,
        gridspec_kw={"height_ratios": [LANE_H, height], "hspace": 0.04},
    )
    return fig, lane, ax


def _draw_markers(
    lane: Any, ax: Any, markers: list[Marker], clock: RunClock, x_max: float, notifies: list[int] = ()
) -> None:  # type: ignore[assignment]
    """Numbered markers in their own lane (staggered), a line through the data for each, and small
    ticks for the broker's NOTIFY sends; the numbers are explained under the picture."""
    if lane is None:
        return
    xs = [clock.at_s(m.ts) for m in markers]
    if len(markers) > MANY_MARKERS:
        # a tick per marker in the lane, the chaos runner's above the broker's, and no line through
        # the data: hundreds of them would hide it
        for m, x in zip(markers, xs, strict=True):
            low, high = (1.6, 3.6) if m.kind == "nemesis" else (0.3, 1.4)
            lane.plot([x, x], [low, high], color=m.color, linewidth=0.8, alpha=0.8)
        xs = []
    levels = _levels(xs, gap=max(x_max, 1e-9) * 0.035)
    for i, (m, x, level) in enumerate(zip(markers, xs, levels, strict=False), start=1):
        dashed = "--" if m.kind == "nemesis" else ":"
        ax.axvline(x, color=m.color, linestyle=dashed, linewidth=1.2)
        lane.axvline(x, color=m.color, linestyle=dashed, linewidth=0.8, alpha=0.5)
        lane.annotate(
            str(i),
            (x, LANE_ROWS[level]),
            ha="center",
            va="center",
            fontsize=FONT - 1,
            color="white",
            fontweight="bold",
            bbox={"boxstyle": "circle,pad=0.2", "facecolor": m.color, "edgecolor": "none"},
        )
    for ts in notifies:
        lane.plot([clock.at_s(ts)] * 2, [-0.45, 0.0], color="#1f77b4", linewidth=0.8)
    lane.set_ylim(-0.5, 4.0)
    lane.set_yticks([])
    lane.tick_params(axis="x", which="both", bottom=False)
    for side in ("top", "right", "left"):
        lane.spines[side].set_visible(False)
    if notifies:
        lane.text(  # beside the lane, where no tick can be
            1.01,
            -0.25,
            "NOTIFY\nsent",
            transform=lane.get_yaxis_transform(),
            ha="left",
            va="center",
            fontsize=FONT - 3,
            color="#1f77b4",
        )


def _x_label(ax: Any, clock: RunClock) -> None:
    if clock.time_scale == 1.0:
        ax.set_xlabel("seconds since t = 0", fontsize=FONT)
    else:
        ax.set_xlabel(f"RocketMQ seconds since t = 0 (wall seconds = x {clock.time_scale:g})", fontsize=FONT)


def _png(fig: Any) -> str:
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, bbox_inches="tight")
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def group_nodes(data: PlotData, group: str) -> set[str]:
    """Nodes of the group's consumers (from its ownership intervals and consumption lines)."""
    nodes = {r["node"] for r in data.intervals if r["group"] == group and r["node"]}
    return nodes | {r["node"] for r in data.rates if r["group"] == group}


def client_labels(rows: list[dict[str, Any]]) -> dict[str, str]:
    """Consumers by node name; a node's later processes (restarts) get '#2', '#3' in order of start."""
    first: dict[str, int] = {}
    node: dict[str, str] = {}
    for r in rows:
        c = r["client_id"]
        first[c] = min(first.get(c, r["start"]), r["start"])
        node.setdefault(c, r["node"] or c)
    out: dict[str, str] = {}
    seen: dict[str, int] = {}
    for c in sorted(first, key=lambda c: (first[c], c)):
        seen[node[c]] = seen.get(node[c], 0) + 1
        out[c] = node[c] if seen[node[c]] == 1 else f"{node[c]} #{seen[node[c]]}"
    return out


def _queue_sort_key(q: tuple[str, str]) -> tuple[Any, ...]:
    broker, _, qid = q[1].rpartition(":")
    return (q[0], broker, int(qid) if qid.isdigit() else qid)


# Past this many queues the ownership chart is a health map: at 0.3 inch a row, 64 rows already make a
# picture of about 2,000 px, two screens, and a group that large has more consumers than a palette has
# colours that can be told apart.
MANY_QUEUES = 64
MAP_ROWS = 128  # rows of cells at most: about 4 px each at the map's height
MAP_COLUMNS = 150  # columns of cells (time buckets): about 5 px each
MAP_H = 5.2  # inches
# A cell's states from least to most severe (key, legend text, colour): a cell shows the most severe
# state its queues were in for a share of its time (BRIEF_SHARE). Messages waiting (unavailable) is
# the harm itself, so it ranks above the ownership states that lead to it.
MAP_STATES: list[tuple[str, str, str]] = [
    ("unassigned", "before the group's first assignment", "#ffffff"),
    ("not_collected", "not collected (too many ownership intervals)", "#d9d9d9"),
    ("one_owner", "one owner", "#c7e9c0"),
    ("overlap", "two or more owners (overlap)", "#6baed6"),
    ("paused", "owned only by paused consumers", "#c5b0d5"),
    ("orphan", "no owner (orphan)", "#fdae6b"),
    *((f"unavailable_{c}", f"unavailable: {CAUSE_TEXT[c].split(' (')[0]}", CAUSE_COLORS[c]) for c in CAUSES),
]
RANK = {key: i for i, (key, _, _) in enumerate(MAP_STATES)}
# A cell shows the worst state that took at least this share of its queue-time (its queues x its
# seconds), else the worst of any moment, pale: at a thousand consumers a rebalance leaves hundreds of
# queues without an owner for milliseconds, which in full colour would read as the whole cell's time.
BRIEF_SHARE = 0.05

MAP_TEXT = (
    "The group has {queues} queues, too many for a row each. Each row of cells is {per} in the order "
    "topic, broker, queue id; each column is {col} of RocketMQ time. A cell has the colour of the worst "
    "state its queues were in for at least "
    f"{BRIEF_SHARE:.0%} of its queue-time (its queues times its seconds), worst first: messages waited "
    "and nobody consumed them (by cause), no owner, owned only by paused consumers, two or more owners, "
    "one owner. A pale cell had no such state: it shows the worst of any moment, such as the milliseconds "
    "without an owner that a rebalance leaves."
)


@dataclass
class HealthMap:
    """The cells of a many-queue group's health map: `cells[row][column]` is an index in MAP_STATES."""

    cells: Any  # numpy array, rows x columns
    # True where no state worse than one owner took BRIEF_SHARE of the cell's queue-time: the cell
    # shows the worst it had at any moment, pale
    brief: Any
    queues: list[tuple[str, str]]  # in row order, `per_row` to a row
    per_row: int
    x0: float  # RocketMQ seconds at the left edge
    x1: float


def _map_shape(queues: int) -> tuple[int, int]:
    """(queues per row, rows) of a health map."""
    per = max(1, math.ceil(queues / MAP_ROWS))
    return per, math.ceil(queues / per)


def health_map(data: PlotData, group: str, summary_group: dict[str, Any] | None = None) -> HealthMap | None:
    """The group's queues (binned) against time buckets, each cell at its worst lasting state (or its
    worst, brief), from the ownership intervals, the pauses and the summary's unavailable spans."""
    import numpy as np

    rows = [r for r in data.intervals if r["group"] == group]
    if not rows:
        return None
    clock = _clock(data)
    x = clock.at_s
    queues = sorted({(r["topic"], r["queue"]) for r in rows}, key=_queue_sort_key)
    index = {q: i for i, q in enumerate(queues)}
    x0, x1 = min(0.0, x(data.run_start)), max(x(data.run_end), 0.001)
    width = (x1 - x0) / MAP_COLUMNS
    cells = np.zeros((len(queues), MAP_COLUMNS), dtype=np.int8)
    per, n_rows = _map_shape(len(queues))
    # queue-seconds in each state per cell (summed over the row's queues): how long its worst state lasted
    spent = np.zeros((len(MAP_STATES), n_rows, MAP_COLUMNS), dtype=np.float64)

    def mark(row: int, start_s: float, end_s: float, state: str) -> None:
        c0 = min(max(int((start_s - x0) // width), 0), MAP_COLUMNS - 1)
        c1 = min(max(math.ceil((end_s - x0) / width), c0 + 1), MAP_COLUMNS)
        np.maximum(cells[row, c0:c1], RANK[state], out=cells[row, c0:c1])
        left = x0 + width * np.arange(c0, c1)
        spent[RANK[state], row // per, c0:c1] += np.clip(
            np.minimum(end_s, left + width) - np.maximum(start_s, left), 0, None
        )

    paused: dict[str, list[tuple[int, int]]] = {}
    for node, ps, pe in pause_spans(data):
        paused.setdefault(node, []).append((ps, pe))
    by_queue: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in rows:
        by_queue.setdefault((r["topic"], r["queue"]), []).append(r)
    first = min(r["start"] for r in rows)
    end = data.run_end if data.intervals_cut_at is None else min(data.run_end, data.intervals_cut_at)
    for queue, ivs in by_queue.items():
        # the queue's time cut where its owners or their pauses change; each piece has one state
        cuts = {first, end}
        for r in ivs:
            cuts.update((r["start"], r["end"]))
            for ps, pe in paused.get(r["node"], ()):
                cuts.update((max(ps, r["start"]), min(pe, r["end"])))
        edges = sorted(t for t in cuts if first <= t <= end)
        for a, b in itertools.pairwise(edges):
            owners = [r for r in ivs if r["start"] <= a < r["end"]]
            if not owners:
                state = "orphan"
            elif all(any(ps <= a < pe for ps, pe in paused.get(r["node"], ())) for r in owners):
                state = "paused"
            else:
                state = "overlap" if len({r["client_id"] for r in owners}) > 1 else "one_owner"
            mark(index[queue], x(a), x(b), state)
    if data.intervals_cut_at is not None:
        c0 = max(int((x(data.intervals_cut_at) - x0) // width), 0)
        cells[:, c0:] = RANK["not_collected"]
        spent[:, :, c0:] = 0  # what was seen of the owners there is a part, not a share
    for q in (summary_group or {}).get("unavailability", {}).get("queues", []):
        row = index.get((q["topic"], q["queue"]))
        if row is not None:
            for sp in q["spans"]:
                mark(row, sp["from_s"], sp["to_s"], f"unavailable_{sp['cause']}")
    padded = np.zeros((n_rows * per, MAP_COLUMNS), dtype=np.int8)
    padded[: len(queues)] = cells
    worst = padded.reshape(n_rows, per, MAP_COLUMNS).max(axis=1)
    queue_time = np.minimum(per, len(queues) - per * np.arange(n_rows))[:, None] * width
    share = spent / queue_time[None]
    # The worst state that took at least BRIEF_SHARE of the cell; failing one, the worst at any moment,
    # pale (so a rebalance's milliseconds of orphan do not hide a lasting overlap or pause)
    ranks = np.arange(len(MAP_STATES))[:, None, None]
    lasting = (ranks > RANK["one_owner"]) & (share >= BRIEF_SHARE)
    shown = np.where(lasting.any(axis=0), np.where(lasting, ranks, -1).max(axis=0), worst).astype(np.int8)
    brief = ~lasting.any(axis=0) & (worst > RANK["one_owner"])
    return HealthMap(shown, brief, queues, per, x0, x1)


def _pale(color: str) -> str:
    """The colour three fifths of the way to white: a state that lasted only briefly in its cell."""
    from matplotlib.colors import to_hex, to_rgb

    return to_hex(tuple(1 - 0.4 * (1 - c) for c in to_rgb(color)))


def plot_health_map(
    data: PlotData, group: str, markers: list[Marker], summary_group: dict[str, Any] | None = None
) -> str | None:
    """The ownership chart of a group of many queues: its health map, with the other charts' marker
    lane and time axis, and a legend of the states in it."""
    import matplotlib.pyplot as plt
    from matplotlib.colors import ListedColormap

    hm = health_map(data, group, summary_group)
    if hm is None:
        return None
    clock = _clock(data)
    n_rows = hm.cells.shape[0]
    fig, lane, ax = _figure(MAP_H, markers)
    n = len(MAP_STATES)
    colors = [c for _, _, c in MAP_STATES] + [_pale(c) for _, _, c in MAP_STATES]
    ax.imshow(
        hm.cells + n * hm.brief,  # a brief state's pale twin sits n further along the colour map
        cmap=ListedColormap(colors),
        vmin=-0.5,
        vmax=2 * n - 0.5,
        interpolation="nearest",
        aspect="auto",
        extent=(hm.x0, hm.x1, n_rows, 0),
    )
    many_topics = len(_real_topics(sorted({q[0] for q in hm.queues}))) > 1
    ticks = list(range(0, n_rows, max(1, math.ceil(n_rows / 8))))
    ax.set_yticks([t + 0.5 for t in ticks])
    ax.set_yticklabels(
        [_queue_label(*hm.queues[t * hm.per_row], many_topics) for t in ticks], fontsize=FONT - 2
    )
    ax.set_ylabel(f"queues ({hm.per_row} a row)" if hm.per_row > 1 else "queues", fontsize=FONT)
    ax.tick_params(axis="x", labelsize=FONT - 1)
    ax.set_xlim(hm.x0, hm.x1)
    _x_label(ax, clock)
    (lane or ax).set_title(f"{group}: health of its {len(hm.queues):,} queues over time", fontsize=FONT + 1)
    _draw_markers(lane, ax, markers, clock, hm.x1, _notifies(summary_group))
    for line in ax.lines:  # the marker lines, thin and faint so the cells at a change stay visible
        line.set_linewidth(0.7)
        line.set_alpha(0.5)
    seen = {int(v) for v in set(hm.cells[~hm.brief].flat)} | {RANK["one_owner"]}
    pale = {int(v) for v in set(hm.cells[hm.brief].flat)}
    # the full colours in the left column, the pale ones in the right (a legend fills column by column)
    left = [(text, color) for i, (_, text, color) in enumerate(MAP_STATES) if i in seen]
    right = [(f"{text}, briefly", _pale(c)) for i, (_, text, c) in enumerate(MAP_STATES) if i in pale]
    if right:
        rows = max(len(left), len(right))
        left += [("", "")] * (rows - len(left))
        right += [("", "")] * (rows - len(right))
    shown = left + right
    ax.legend(
        [
            plt.Rectangle(
                (0, 0), 1, 1, facecolor=c or "none", edgecolor="#888", linewidth=0.5, visible=bool(c)
            )
            for _, c in shown
        ],
        [text for text, _ in shown],
        fontsize=FONT - 1,
        loc="upper center",
        bbox_to_anchor=(0.5, -0.7 / (0.85 * MAP_H)),
        ncol=2,
        frameon=False,
    )
    return _png(fig)


def ownership_text(data: PlotData, group: str, markers: int = 0) -> str:
    """The caption of the group's ownership chart: what a bar is, or for a health map what a cell is,
    and what its ``markers`` markers look like (numbered, or ticks past MANY_MARKERS)."""
    queues = {(r["topic"], r["queue"]) for r in data.intervals if r["group"] == group}
    what = "chart" if len(queues) <= MANY_QUEUES else "map"
    marks = (TICK_MARKERS_TEXT if markers > MANY_MARKERS else NUMBERED_MARKERS_TEXT).format(what=what)
    if what == "chart":
        return f"{OWNERSHIP_BASE_TEXT} {marks}"
    clock = _clock(data)
    span = max(clock.at_s(data.run_end), 0.001) - min(0.0, clock.at_s(data.run_start))
    per, _ = _map_shape(len(queues))
    text = MAP_TEXT.format(
        queues=f"{len(queues):,}",
        per="one queue" if per == 1 else f"{per} queues",
        col=f"{span / MAP_COLUMNS:.2g} s",
    )
    return f"{text} {marks}"


def plot_ownership(
    data: PlotData, group: str, markers: list[Marker], summary_group: dict[str, Any] | None = None
) -> str | None:
    """Gantt chart: one row per queue, one bar per ownership interval, coloured by consumer; paused
    stretches hatched; unavailable stretches as a strip under the bars, coloured by cause. A group of
    more than MANY_QUEUES queues gets its health map instead."""
    import matplotlib.pyplot as plt

    rows = [r for r in data.intervals if r["group"] == group]
    if not rows:
        return None
    if len({(r["topic"], r["queue"]) for r in rows}) > MANY_QUEUES:
        return plot_health_map(data, group, markers, summary_group)
    clock = _clock(data)
    queues = sorted({(r["topic"], r["queue"]) for r in rows}, key=_queue_sort_key)
    label = client_labels(rows)
    owners = sorted(label, key=lambda c: label[c])
    cmap = plt.get_cmap("tab10" if len(owners) <= 10 else "tab20")
    color = {c: cmap(i % cmap.N) for i, c in enumerate(owners)}
    y = {q: i for i, q in enumerate(queues)}
    many_topics = len(_real_topics(sorted({q[0] for q in queues}))) > 1
    x = clock.at_s
    fig_h = max(2.8, 0.3 * len(queues) + 1.4)
    fig, lane, ax = _figure(fig_h, markers)
    # Each owner of a queue gets its own lane inside the queue's row, so two owners at once show as two
    # parallel bars (overlap) rather than one bar hiding the other.
    lanes: dict[tuple[str, str], list[str]] = {}
    for r in rows:
        owners_of = lanes.setdefault((r["topic"], r["queue"]), [])
        if r["client_id"] not in owners_of:
            owners_of.append(r["client_id"])
    pauses = pause_spans(data)
    for r in rows:
        queue = (r["topic"], r["queue"])
        n, i = len(lanes[queue]), lanes[queue].index(r["client_id"])
        height = 0.72 / n
        mid = y[queue] - 0.44 + (i + 0.5) * height
        ax.barh(
            mid,
            max(x(r["end"]) - x(r["start"]), 0.0005),
            left=x(r["start"]),
            height=height * 0.92,
            color=color[r["client_id"]],
            alpha=0.85,
            edgecolor="black",
            linewidth=0.3,
        )
        for node, ps, pe in pauses:
            s, e = max(ps, r["start"]), min(pe, r["end"])
            if node == r["node"] and e > s:
                ax.barh(
                    mid,
                    x(e) - x(s),
                    left=x(s),
                    height=height * 0.92,
                    facecolor="white",
                    alpha=0.55,
                    hatch="////",
                    edgecolor="#444",
                    linewidth=0,
                )
    causes_seen: set[str] = set()
    for q in (summary_group or {}).get("unavailability", {}).get("queues", []):
        key = (q["topic"], q["queue"])
        if key not in y:
            continue
        for sp in q["spans"]:
            causes_seen.add(sp["cause"])
            ax.barh(
                y[key] + 0.36,
                sp["to_s"] - sp["from_s"],
                left=sp["from_s"],
                height=0.14,
                color=CAUSE_COLORS[sp["cause"]],
                linewidth=0,
            )
    ax.set_yticks(range(len(queues)))
    ax.set_yticklabels([_queue_label(t, q, many_topics) for t, q in queues], fontsize=FONT - 2)
    ax.tick_params(axis="x", labelsize=FONT - 1)
    ax.set_ylim(len(queues) - 0.5, -0.5)
    x_max = max(x(data.run_end), 0.001)
    ax.set_xlim(min(0.0, x(data.run_start)), x_max)
    _x_label(ax, clock)
    (lane or ax).set_title(f"{group}: who owned which queue, and when", fontsize=FONT + 1)
    _draw_markers(lane, ax, markers, clock, x_max, _notifies(summary_group))
    handles = [plt.Rectangle((0, 0), 1, 1, color=color[c]) for c in owners]
    names = [label[c] for c in owners]
    if pauses and any(node in group_nodes(data, group) for node, _, _ in pauses):
        handles.append(plt.Rectangle((0, 0), 1, 1, facecolor="white", hatch="////", edgecolor="#444"))
        names.append("paused (SIGSTOP)")
    for cause in CAUSES:
        if cause in causes_seen:
            handles.append(plt.Rectangle((0, 0), 1, 1, color=CAUSE_COLORS[cause]))
            names.append(f"unavailable: {CAUSE_TEXT[cause].split(' (')[0]}")
    ax.legend(
        handles,
        names,
        fontsize=FONT - 1,
        loc="upper center",
        bbox_to_anchor=(0.5, -0.7 / (0.85 * fig_h)),  # just under the axis label, whatever the height
        ncol=min(len(names), 3),
        frameon=False,
    )
    return _png(fig)


def _queue_label(topic: str, queue: str, many_topics: bool) -> str:
    """'b:3' style labels: the topic only when there are several; a retry topic as 'retry'."""
    if topic.startswith("%RETRY%"):
        return f"retry {queue}"
    return f"{topic} {queue}" if many_topics else queue


def _notifies(summary_group: dict[str, Any] | None) -> list[int]:
    return [m["ts_ms"] for m in (summary_group or {}).get("broker_markers", []) if m["kind"] == "notify_sent"]


def _per_second(n: int, bucket_ms: int) -> float:
    return n * 1000.0 / bucket_ms


def plot_rates(data: PlotData, group: str, markers: list[Marker]) -> str | None:
    """Messages processed per second by each consumer node (and sent, for comparison)."""
    rows = [r for r in data.rates if r["group"] == group]
    if not rows:
        return None
    clock = _clock(data)
    first = min(r["bucket"] for r in rows)
    last = max(r["bucket"] for r in rows)
    xs = list(range(first, last + 1))
    at = [clock.at_s(data.run_start + b * data.bucket_ms) for b in xs]
    fig, lane, ax = _figure(3.0, markers)
    sends = {r["bucket"]: r["n"] for r in data.sends if r["group"] == group}
    if sends:
        ax.plot(
            at,
            [_per_second(sends.get(b, 0), data.bucket_ms) for b in xs],
            color="lightgray",
            linewidth=2.5,
            label="sent (all producers)",
        )
    nodes = sorted({r["node"] for r in rows})
    title = f"{group}: consumption rate per consumer"
    if len(nodes) > MANY_NODES:  # one line each would be a tangle with a legend taller than a screen
        title = f"{group}: consumption rate of its {len(nodes):,} consumers together"
        total: dict[int, int] = {}
        for r in rows:
            total[r["bucket"]] = total.get(r["bucket"], 0) + r["n"]
        label = f"all {len(nodes):,} consumers together"
        ax.plot(at, [_per_second(total.get(b, 0), data.bucket_ms) for b in xs], linewidth=1.2, label=label)
        nodes = []
    for node in nodes:
        counts = {r["bucket"]: r["n"] for r in rows if r["node"] == node}
        # Buckets without a line are zeros (a paused or dead consumer), not gaps to draw across.
        ax.plot(at, [_per_second(counts.get(b, 0), data.bucket_ms) for b in xs], linewidth=1.2, label=node)
    _time_axes(data, lane, ax, markers, "messages / wall s", title)
    ax.legend(fontsize=FONT - 1, loc="upper center", bbox_to_anchor=(0.5, -0.3), ncol=4, frameon=False)
    return _png(fig)


def rate_text(data: PlotData, group: str) -> str:
    """The caption of the group's rate chart, which sums the nodes of a large group."""
    nodes = {r["node"] for r in data.rates if r["group"] == group}
    return RATE_TEXT if len(nodes) <= MANY_NODES else RATES_TEXT.format(nodes=f"{len(nodes):,}")


def _time_axes(data: PlotData, lane: Any, ax: Any, markers: list[Marker], ylabel: str, title: str) -> None:
    """The shared x axis of the time charts (RocketMQ seconds since t = 0), their markers and labels."""
    clock = _clock(data)
    x_max = max(clock.at_s(data.run_end), 0.001)
    ax.set_xlim(min(0.0, clock.at_s(data.run_start)), x_max)
    _draw_markers(lane, ax, markers, clock, x_max)
    _x_label(ax, clock)
    ax.set_ylabel(ylabel, fontsize=FONT)
    ax.tick_params(labelsize=FONT - 1)
    (lane or ax).set_title(title, fontsize=FONT + 1)


def plot_duplicates(data: PlotData, group: str, markers: list[Marker]) -> str | None:
    rows = sorted((r["bucket"], r["n"]) for r in data.duplicates if r["group"] == group)
    if not rows:
        return None
    clock = _clock(data)
    fig, lane, ax = _figure(2.4, markers)
    width = clock.rmq_ms(data.bucket_ms) / 1000.0
    ax.bar(
        [clock.at_s(data.run_start + b * data.bucket_ms) for b, _ in rows],
        [n for _, n in rows],
        width=width,
        align="edge",
        color="crimson",
    )
    _time_axes(data, lane, ax, markers, "duplicates", f"{group}: duplicate deliveries over time")
    return _png(fig)


def plot_convergence(entries: list[dict[str, Any]], group: str, clock: RunClock) -> str | None:
    import matplotlib.pyplot as plt

    if not entries:
        return None
    if len(entries) > MANY_MARKERS:
        return _plot_convergence_over_time(entries, group, clock)
    fig, ax = plt.subplots(figsize=(FIG_W, max(2.0, 0.34 * len(entries) + 1.0)))
    labels = [f"t = {clock.at_s(e['change_ms']):z.1f} s  {_short_cause(e['cause'])}" for e in entries]
    # a label too long for the margin loses the named targets of a many-action change first
    labels = [(re.sub(r" \([^)]*\)", "", t) if len(t) > 48 else t)[:48] for t in labels]
    values = [clock.rmq_ms(e["convergence_ms"]) / 1000 if e["converged"] else 0 for e in entries]
    top = max([*values, 0.001])
    colors = ["steelblue" if e["converged"] else "crimson" for e in entries]
    ax.barh(range(len(entries)), values, color=colors)
    for i, e in enumerate(entries):
        text = f"{values[i]:.2f} s ({e['convergence_ms']} ms wall)" if e["converged"] else "never whole again"
        ax.annotate(
            text,
            (values[i], i),
            xytext=(4, 0),
            textcoords="offset points",
            va="center",
            fontsize=FONT - 1,
            color="black" if e["converged"] else "crimson",
        )
    ax.set_yticks(range(len(entries)))
    ax.set_yticklabels(labels, fontsize=FONT - 1)
    ax.set_xlim(0, top * 1.6)
    ax.invert_yaxis()
    ax.tick_params(axis="x", labelsize=FONT - 1)
    ax.set_xlabel("RocketMQ seconds until the group was whole again", fontsize=FONT)
    ax.set_title(f"{group}: convergence after each change of membership", fontsize=FONT + 1)
    return _png(fig)


def _plot_convergence_over_time(entries: list[dict[str, Any]], group: str, clock: RunClock) -> str:
    """Past MANY_MARKERS changes a bar each would be a page tall: one dot per change at its time, its
    convergence on a log scale (from a millisecond to a minute are both common), never as a red cross."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(FIG_W - 1.4, 3.4))  # the legend beside it takes the rest
    done = [e for e in entries if e["converged"]]
    never = [e for e in entries if not e["converged"]]
    ys = [max(clock.rmq_ms(e["convergence_ms"]) / 1000, CONVERGENCE_FLOOR_S) for e in done]
    # ticks at powers of ten up to one at or above the slowest; "never" a decade above, set apart
    decade = 10.0 ** math.ceil(math.log10(max([*ys, 1.0])))
    ax.scatter([clock.at_s(e["change_ms"]) for e in done], ys, s=14, color="steelblue", label="whole again")
    ticks = [t for t in (0.001, 0.01, 0.1, 1, 10, 100, 1000, 10_000) if t <= decade]
    labels = [f"{t:g} s" if t >= 1 else f"{t * 1000:g} ms" for t in ticks]  # "10 ms", not 10⁻²
    if never:
        ax.scatter(
            [clock.at_s(e["change_ms"]) for e in never],
            [decade * 10] * len(never),
            s=40,
            marker="x",
            color="crimson",
            label="never whole again",
        )
        ax.axhline(decade * 10**0.5, color="#999", lw=0.8, ls="--")
        ticks, labels = [*ticks, decade * 10], [*labels, "never"]
    ax.set_yscale("log")
    ax.set_ylim(CONVERGENCE_FLOOR_S / 2, ticks[-1] * 2)
    ax.set_yticks(ticks, labels)
    ax.minorticks_off()
    # beside the axes: inside, it would hide the dots and crosses of the last minutes
    ax.legend(fontsize=FONT - 2, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    ax.tick_params(labelsize=FONT - 1)
    _x_label(ax, clock)
    ax.set_ylabel("RocketMQ time", fontsize=FONT)
    ax.set_title(
        f"{group}: convergence after each of {len(entries):,} changes of membership", fontsize=FONT + 1
    )
    return _png(fig)


CONVERGENCE_FLOOR_S = 0.001  # a change converged at once is drawn at a millisecond (a log scale has no 0)
CONVERGENCE_TEXT = (
    "For each start, stop or kill in the group: how long until every queue had exactly one live owner and "
    "every running consumer had rebalanced with the current member list. Red: never."
)
CONVERGENCE_DOTS_TEXT = (
    "For each of the group's starts, stops and kills, a dot at its time: how long until every queue had "
    "exactly one live owner and every running consumer had rebalanced with the current member list, on a "
    "log scale (under a millisecond drawn at one). Red crosses in the top row: never. Each change is "
    "listed in the convergence entries below."
)


def convergence_text(entries: list[dict[str, Any]]) -> str:
    return CONVERGENCE_DOTS_TEXT if len(entries) > MANY_MARKERS else CONVERGENCE_TEXT


MANY_ACTIONS = 6  # a change of this many actions or more is told by verb and count, not action by action
NAMED_TARGETS = 3  # how many of their targets such a summary names


def _many_actions(actions: list[tuple[str, str]]) -> str:
    """'start of 1,000 consumers (consumer-107, consumer-117, consumer-164 and 997 more)': actions of
    one instant by verb, in the order the verbs first come, each with its count and first targets."""
    by_verb: dict[str, list[str]] = {}
    for verb, target in actions:
        by_verb.setdefault(verb, []).append(target)
    parts = []
    for verb, targets in by_verb.items():
        kind = "consumer" if all(t.startswith("consumer") for t in targets) else "node"
        named = ", ".join(targets[:NAMED_TARGETS])
        rest = len(targets) - NAMED_TARGETS
        which = f"{named} and {rest:,} more" if rest > 0 else named
        parts.append(f"{verb} of {len(targets):,} {kind}{'s' if len(targets) > 1 else ''} ({which})")
    return "; ".join(parts)


def _short_cause(cause: str) -> str:
    """'start 127.0.0.1@123#456 on consumer-3' -> 'start consumer-3' (client ids are in summary.json);
    a cause of many actions (a group's start-up) by verb and count."""
    parts = []
    for one in cause.split("; "):
        words = one.split(" ")
        parts.append(f"{words[0]} {words[-1]}" if len(words) == 4 and words[2] == "on" else one)
    if len(parts) < MANY_ACTIONS:
        return "; ".join(parts)
    return _many_actions([(p.split(" ", 1)[0], p.split(" ", 1)[-1]) for p in parts])


# -- text ---------------------------------------------------------------------------------------------


def _real_topics(topics: list[str]) -> list[str]:
    """The topics producers send to (a group's %RETRY% topic only carries its own retries)."""
    return [t for t in topics if not t.startswith(("%RETRY%", "%DLQ%"))]


NEMESES_NAMED = 20  # the run's sentence names this many chaos actions; past it, counts by kind first


def narrative(summary: dict[str, Any], data: PlotData | None) -> list[str]:
    """Plain sentences about the run as a whole."""
    run = summary["run"]
    clock = _clock(data, summary)
    out = []
    if run["start_ms"] is not None and run["end_ms"] is not None:
        span = (run["end_ms"] - run["start_ms"]) / 1000
        scale = clock.time_scale
        lasted = (
            f"{span / scale:.1f} s of RocketMQ time ({span:.2f} s wall at time scale {scale:g})"
            if scale != 1
            else f"{span:.3f} s"
        )
        out.append(
            f"The run lasted {lasted} and logged {run['events']} events ({run['malformed_lines']} damaged or "
            "unreadable lines were skipped). Times are counted from the experiment's t = 0 (the start of its "
            "schedule), in RocketMQ seconds as in the experiment file, with wall seconds beside them."
        )
    groups = summary["groups"]
    if groups:
        names = ", ".join(sorted(groups))
        out.append(f"{len(groups)} consumer group(s) took part: {names}.")
    else:
        out.append("No consumer group appears in this run.")
    if data is not None and data.nemeses:
        actions = [f"{n['action']} {n['target']} at {_when(n['ts_ms'], clock)}" for n in data.nemeses]
        shown = "; ".join(actions[:NEMESES_NAMED])
        if len(actions) > NEMESES_NAMED:  # how many of each kind tells more than the first few
            kinds: dict[str, int] = {}
            for n in data.nemeses:
                kinds[n["action"]] = kinds.get(n["action"], 0) + 1
            shown = (
                ", ".join(f"{c:,} {a}" for a, c in kinds.items()) + f"; the first {NEMESES_NAMED}: {shown}"
            )
        out.append(
            f"The chaos runner wrote {len(actions):,} nemesis event(s) (a restart is written as a stop and a "
            f"start): {shown}."
        )
    elif data is not None:
        out.append("The chaos runner did nothing to the processes in this run.")
    return out


def duplicates_after(data: PlotData, group: str, markers: list[Marker]) -> list[tuple[Marker | None, int]]:
    """Duplicate deliveries attributed to the change they followed (the latest marker before them, to
    the width of a plot bucket); None for those before any change."""
    counts: dict[int, int] = {}
    changes = [m for m in markers if m.kind in ("nemesis", "channel_expired")]
    for r in data.duplicates:
        if r["group"] != group:
            continue
        end = data.run_start + (r["bucket"] + 1) * data.bucket_ms
        idx = max((i for i, m in enumerate(changes) if m.ts < end), default=-1)
        counts[idx] = counts.get(idx, 0) + r["n"]
    return [(changes[i] if i >= 0 else None, n) for i, n in sorted(counts.items())]


def group_story(
    name: str,
    g: dict[str, Any],
    clock: RunClock,
    orderly: bool,
    dups: list[tuple[Marker | None, int]] = (),  # type: ignore[assignment]
) -> list[str]:
    """Plain sentences about one group: what went wrong or right, with the numbers."""
    rmq = g.get("rocketmq_time") or {k: clock.rmq_ms(g[k]) for k in ("orphan_ms", "overlap_ms", "stalled_ms")}
    out = [
        f"{g['consumed_unique']} of the {g['sent']} messages sent to "
        f"{', '.join(_real_topics(g['topics'])) or 'no topic'} were consumed; {g['lost']} lost, "
        f"{g['duplicates']} extra deliveries of {g['duplicated_messages']} message(s)."
    ]
    if dups:
        out.append(_duplicates_by_change(dups, clock))
    un = g.get("unavailability")
    if un and un["total_ms"]:
        causes = ", ".join(
            f"{CAUSE_TEXT[c]} {_rmq_s(ms)}" for c, ms in un["by_cause_rocketmq_ms"].items() if ms
        )
        out.append(
            f"{len(un['queues'])} queue(s) were unavailable (messages waiting, nobody consuming them) for "
            f"{_rmq_s(un['total_rocketmq_ms'])} of RocketMQ time, summed over queues: {causes}."
        )
    if g["orphan_ms"]:
        out.append(
            f"Queues went without an owner for {_rmq_s(rmq['orphan_ms'])} ({g['orphan_ms']} ms wall), "
            "summed over queues."
        )
    if g["overlap_ms"]:
        out.append(
            f"Queues had two owners at once for {_rmq_s(rmq['overlap_ms'])} ({g['overlap_ms']} ms wall), "
            "summed over queues."
        )
    if g["stalled_ms"]:
        out.append(
            f"Queues were held only by paused consumers for {_rmq_s(rmq['stalled_ms'])} "
            f"({g['stalled_ms']} ms wall), summed over queues."
        )
    if len(g["convergence"]) > GROUP_CHANGES_OVER:
        out += _convergence_in_short(g["convergence"], clock)
    else:
        for e in g["convergence"]:
            when = _when(e["change_ms"], clock)
            cause = _short_cause(e["cause"])
            if e["converged"]:
                out.append(
                    f"After '{cause}' at {when} the group was whole again "
                    f"{_rmq_s(clock.rmq_ms(e['convergence_ms']))} later ({e['convergence_ms']} ms wall)."
                )
            else:
                out.append(
                    f"After '{cause}' at {when} the group never became whole again before the run ended."
                )
    reasons = []
    if g["lost"]:
        reasons.append(f"{g['lost']} message(s) were lost")
    if orderly:
        out.append(
            "The group consumed in ORDERLY mode, so one consumer at a time per queue and no going back."
        )
    if orderly and g["concurrent_consume_ms"]:
        reasons.append(f"two consumers processed one queue at once for {g['concurrent_consume_ms']} ms")
    if orderly and g["order_violations"]:
        reasons.append(f"{g['order_violations']} orderly deliveries went backwards")
    never = [e for e in g["convergence"] if not e["converged"]]
    if never:
        reasons.append(f"{len(never)} change(s) were never recovered from")
    if g["verdict"] == "fail":
        out.append("Verdict FAIL: " + ("; ".join(reasons) if reasons else "see the rules below") + ".")
    else:
        out.append(
            "Verdict OK: nothing was lost, order held where it had to, and every change was recovered from."
        )
    return out


def _duplicates_by_change(dups: list[tuple[Marker | None, int]], clock: RunClock) -> str:
    """The story's sentence on which change the extra deliveries followed; past GROUP_CHANGES_OVER
    changes, how many changes had any and the ones with the most."""
    named = [(m, n) for m, n in dups if m is not None]
    before = sum(n for m, n in dups if m is None)
    if len(dups) <= GROUP_CHANGES_OVER:
        parts = [
            f"{n} after {m.text} ({_when(m.ts, clock)})" if m else f"{n} before any change" for m, n in dups
        ]
        return "Extra deliveries by the change they followed: " + "; ".join(parts) + "."
    most = sorted(named, key=lambda mn: -mn[1])[:NAMED_TARGETS]
    text = f"Extra deliveries followed {len(named)} of the changes ({sum(n for _, n in named)} in all); "
    text += "the most " + ", ".join(f"{n} after {m.text} ({_when(m.ts, clock)})" for m, n in most)
    return text + (f"; {before} before any change." if before else ".")


def _convergence_in_short(entries: list[dict[str, Any]], clock: RunClock) -> list[str]:
    """Past GROUP_CHANGES_OVER changes of membership: how many the group recovered from and how fast
    (median, nine in ten, slowest), and the ones it never recovered from; each is in the chart."""
    done = [e for e in entries if e["converged"]]
    never = [e for e in entries if not e["converged"]]
    out = []
    if done:
        ms = sorted(clock.rmq_ms(e["convergence_ms"]) for e in done)
        slowest = max(done, key=lambda e: e["convergence_ms"])
        out.append(
            f"After {len(done)} of its {len(entries)} changes of membership the group was whole again: "
            f"half of them within {_short_s(ms[(len(ms) - 1) // 2])}, nine in ten within "
            f"{_short_s(ms[math.ceil(0.9 * len(ms)) - 1])}, the slowest {_short_s(ms[-1])} after "
            f"'{_short_cause(slowest['cause'])}' at {_when(slowest['change_ms'], clock)} (RocketMQ time; "
            "every change is in the convergence chart)."
        )
    if never:
        which = _first_named(
            never,
            lambda e: f"'{_short_cause(e['cause'])}' at {_when(e['change_ms'], clock)}",
            lambda rest: f"{len(rest)} more",
        )
        out.append(
            f"After {len(never)} of the {len(entries)} changes it never became whole again before the run "
            f"ended: {which}."
        )
    return out


# -- the answer to the experiment's question -----------------------------------------------------------


def _episodes(un: dict[str, Any], gap_s: float) -> list[dict[str, Any]]:
    """Per queue, unavailable spans closer than `gap_s` joined into one episode with its causes."""
    out = []
    for q in un.get("queues", []):
        cur: dict[str, Any] | None = None
        for sp in q["spans"]:
            if cur is not None and sp["from_s"] - cur["to_s"] <= gap_s:
                cur["to_s"] = sp["to_s"]
            else:
                cur = {
                    "topic": q.get("topic"),
                    "queue": q["queue"],
                    "from_s": sp["from_s"],
                    "to_s": sp["to_s"],
                    "causes": {},
                }
                out.append(cur)
            cur["causes"][sp["cause"]] = cur["causes"].get(sp["cause"], 0.0) + sp["to_s"] - sp["from_s"]
    return out


def answer_for_group(
    name: str,
    g: dict[str, Any],
    clock: RunClock,
    markers: list[Marker],
    dups: list[tuple[Marker | None, int]],
) -> list[str]:
    """One sentence per change the chaos runner made to the group: what it cost, in RocketMQ seconds,
    with the RocketMQ timer that explains it. Past GROUP_CHANGES_OVER changes, those with the same
    outcome share one sentence."""
    gap = IDLE_THRESHOLD_RMQ_MS / 1000
    episodes = _episodes(g.get("unavailability") or {}, gap)
    changes = [m for m in markers if m.kind == "nemesis" and not m.text.startswith(("resume", "start"))]
    expiries = [m for m in markers if m.kind == "channel_expired"]
    takeovers = [m for m in markers if m.kind == "lock_taken_over"]
    dup_of = {id(m): n for m, n in dups if m is not None}
    outcomes: list[tuple[str, float, str]] = []  # (change, t, what followed it)
    for i, m in enumerate(changes):
        at = clock.at_s(m.ts)
        until = clock.at_s(changes[i + 1].ts) if i + 1 < len(changes) else math.inf
        mine = [e for e in episodes if at - 0.5 <= e["from_s"] < until]
        text = ""  # what followed the change; the change itself is named when the sentences are made
        conv = [
            e
            for e in g["convergence"]
            if e["change_ms"] >= m.ts
            and e["cause"].startswith(("kill", "stop"))
            and clock.at_s(e["change_ms"]) < until
        ]
        if mine:
            longest = max(e["to_s"] - e["from_s"] for e in mine)
            causes: dict[str, float] = {}
            for e in mine:
                for c, v in e["causes"].items():
                    causes[c] = causes.get(c, 0.0) + v
            main = max(causes, key=lambda c: causes[c])
            share = ", ".join(
                f"{CAUSE_TEXT[c].split(' (')[0]} {v:.1f} s"
                for c, v in sorted(causes.items(), key=lambda kv: -kv[1])
                if v >= 0.05  # what rounds to 0.0 s says nothing
            )
            # a queue can wait more than once after one change (under POP, each message a hung
            # consumer popped waits for its revive): count queues, and the stretches when more
            queues = len({(e["topic"], e["queue"]) for e in mine})
            stretches = f" in {len(mine)} stretches" if len(mine) > queues else ""
            text += (
                f", {queues} queue(s) were unavailable{stretches} for up to {longest:.1f} s of RocketMQ "
                f"time (summed: {share})"
            )
            end = max(e["to_s"] for e in mine)
            if main == "lock_wait":
                took = [t for t in takeovers if at <= clock.at_s(t.ts) <= end + gap]
                text += (
                    ": the broker keeps a dead client's queue locks until they expire, 60 s after their "
                    "last renewal (every 20 s), and the others take the queues at their next rebalance "
                    "(every 20 s)"
                )
                if took:
                    text += f"; the locks were taken over at t = {clock.at_s(took[0].ts):z.1f} s"
            elif main == "owner_paused":
                exp = [x for x in expiries if at <= clock.at_s(x.ts) <= end + gap]
                notified = [
                    n
                    for n in g.get("broker_markers", [])
                    if n["kind"] == "notify_sent"
                    and n.get("detail") != "register"
                    and at <= n["at_s"] <= end + gap
                ]
                if exp or notified:
                    if exp:
                        e_at = clock.at_s(exp[0].ts)
                        text += (
                            f": the broker expired the paused consumer's channel at t = {e_at:z.1f} s "
                            f"({e_at - at:.1f} s after the pause; 120 s without a heartbeat, "
                            "checked every 10 s)"
                        )
                    if notified:
                        n = notified[0]
                        text += (
                            f"{';' if exp else ':'} {n.get('broker')} notified the group at "
                            f"t = {n['at_s']:z.1f} s ({n.get('detail')})"
                        )
                    else:
                        text += " and sent no NOTIFY"
                    text += (
                        f", and the others took its queues over at t = {end:z.1f} s (their next rebalance)"
                    )
                else:
                    text += (
                        ": the pause was shorter than the broker's 120 s channel expiry, so nobody took "
                        "the queues over until the consumer resumed"
                    )
            elif main == "no_owner" and g.get("mode") == "server-pop":
                # POP queues have no owner: what waited was popped and not acked
                revived = (g.get("pop") or {}).get("revived", 0)
                text += (
                    ": under POP nobody owns a queue; the messages that consumer had popped waited for "
                    f"their invisible time (60 s by default) until the broker revived them ({revived} "
                    "revive(s) in the run) for the others"
                )
            elif main == "no_owner":
                text += ": until the others' rebalance gave the queues a new owner"
            else:
                text += ": their owner kept them but consumed nothing"
        elif conv and all(e["converged"] for e in conv) and g.get("mode", "client") == "client":
            worst = max(clock.rmq_ms(e["convergence_ms"]) for e in conv) / 1000
            text += (
                f", the group was whole again within {worst:.1f} s of RocketMQ time (the broker notified "
                "the group at once) and no queue's messages waited longer than 3 s"
            )
        else:
            text += ", no queue's messages waited longer than 3 s of RocketMQ time"
        n = dup_of.get(id(m), 0)
        after = [x for x in expiries if x.ts > m.ts and (i + 1 >= len(changes) or x.ts < changes[i + 1].ts)]
        n_exp = sum(dup_of.get(id(x), 0) for x in after)
        resumes = [
            r
            for r in markers
            if r.kind == "nemesis"
            and r.text.startswith(("resume", "start"))
            and r.ts > m.ts
            and (i + 1 >= len(changes) or r.ts < changes[i + 1].ts)
        ]
        n_res = sum(dup_of.get(id(r), 0) for r in resumes)
        total = n + n_exp + n_res
        dup = f"; {_plural(total, 'duplicate delivery', 'duplicate deliveries')} followed"
        if n_res and resumes:
            dup += f" ({n_res} after '{resumes[0].text}')"
        outcomes.append(Outcome(m.text, at, text, total, dup))
    if len(outcomes) <= GROUP_CHANGES_OVER:
        return [f"{name}: {_after(o.what, o.at, o.text + o.dup)}" for o in outcomes]
    return [f"{name}: {sentence}" for sentence in _grouped(outcomes)]


GROUP_CHANGES_OVER = 6  # more changes than this: those with the same outcome share one sentence


@dataclass
class Outcome:
    """A change of the answer and what followed it: ``text`` the unavailability or convergence,
    ``dup`` the duplicate deliveries (``dups`` of them) as their own sentence tells them."""

    what: str
    at: float
    text: str
    dups: int
    dup: str


def _after(what: str, at: float, text: str) -> str:
    """The answer's sentence for one change and what followed it."""
    return f"after '{what}' at t = {at:z.1f} s{text}."


def _grouped(outcomes: list[Outcome]) -> list[str]:
    """One sentence per distinct outcome, in the order of its first change: a change whose outcome no
    other change shares keeps its own sentence; the others are counted, the first few named, and their
    duplicate deliveries summed (counts differ from change to change more than outcomes do)."""
    by_outcome: dict[str, list[Outcome]] = {}
    for o in outcomes:
        by_outcome.setdefault(o.text, []).append(o)
    out = []
    for text, changes in by_outcome.items():
        if len(changes) == 1:
            out.append(_after(changes[0].what, changes[0].at, text + changes[0].dup))
            continue
        named = _first_named(
            changes,
            lambda o: f"'{o.what}' at t = {o.at:z.1f} s",
            lambda rest: f"{len(rest)} more up to t = {rest[-1].at:z.1f} s",
        )
        total = sum(o.dups for o in changes)
        most = max(changes, key=lambda o: o.dups)
        dup = f"; {_plural(total, 'duplicate delivery', 'duplicate deliveries')} followed them in all"
        if total:
            dup += f", at most {most.dups} after one ('{most.what}' at t = {most.at:z.1f} s)"
        out.append(f"after each of {len(changes)} changes ({named}){text}{dup}.")
    return out


def _first_named(items: list[T], name: Callable[[T], str], rest: Callable[[list[T]], str]) -> str:
    """'a, b and c', or past NAMED_TARGETS + 1 items 'a, b, c and <rest of them>'."""
    shown = items if len(items) <= NAMED_TARGETS + 1 else items[:NAMED_TARGETS]
    names = [name(i) for i in shown] + ([rest(items[len(shown) :])] if len(items) > len(shown) else [])
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def _plural(n: int, one: str, many: str) -> str:
    return f"{n} {one}" if n == 1 else f"{n or 'no'} {many}"


def _capital(text: str) -> str:
    return text[:1].upper() + text[1:]


def answers(summary: dict[str, Any], data: PlotData | None) -> list[str]:
    """The experiment's question answered, one sentence per change, from summary.json's numbers."""
    if data is None:
        return []
    clock = _clock(data, summary)
    out = []
    for name, g in summary["groups"].items():
        markers = group_markers(data, name, g)
        said = answer_for_group(name, g, clock, markers, duplicates_after(data, name, markers))
        if len(summary["groups"]) == 1:  # the group's name adds nothing
            said = [_capital(x[len(name) + 2 :]) for x in said]
        out += said
    return out


MODE_TEXT = {
    "client": "client-side balancing (4.x)",
    "server-pull": "broker assigns queues, PULL (5.x)",
    "server-pop": "broker assigns, POP (5.x)",
}
MODES_TEXT = (
    "Each group's messages, whatever balances it. Longest wait: from a message's send to the group's "
    "first consumption of it (to the run's end when never consumed). Time to drain: from the last send "
    "until every sent message had been consumed (- when one was lost). Revived: messages the broker made "
    "visible again after their invisible time (POP only); longest revived wait: from such a message's "
    "first pop to its first consumption. Idle consumers: live consumers left without a queue for some "
    "time. Times in RocketMQ seconds. The verdict of a group whose queues the broker assigns comes from "
    "its messages (lost, order); its convergence is shown but not judged."
)


def modes_table(summary: dict[str, Any], clock: RunClock) -> list[str]:
    """The groups side by side, classic and RocketMQ 5 (EVENTS.md, proposed section): HTML parts, none
    when the summary has no `pop` figures."""
    groups = {n: g for n, g in summary["groups"].items() if g.get("pop") is not None}
    if not groups:
        return []
    esc = html.escape

    def secs(ms: int | None) -> str:
        return "-" if ms is None else f"{clock.rmq_ms(ms) / 1000:.1f}"

    head = (
        "group", "mode", "sent", "lost", "duplicates", "longest wait (s)", "time to drain (s)", "revived",
        "longest revived wait (s)", "invisible-time changes", "idle consumers", "verdict",
    )  # fmt: skip
    parts = [
        "<h2>Client-side balancing and POP side by side</h2>",
        f"<p><small>{esc(MODES_TEXT)}</small></p>",
    ]
    parts.append("<table><tr>" + "".join(f"<th>{h}</th>" for h in head) + "</tr>")
    for name, g in groups.items():
        pop, mode = g["pop"], g.get("mode", "client")
        revived = pop["revived"] if mode == "server-pop" else "-"
        cells = [
            f"<td>{esc(name)}</td>",
            f"<td title='{esc(MODE_TEXT.get(mode, mode))}'>{esc(mode)}</td>",
            *(f"<td class='num'>{v}</td>" for v in (g["sent"], g["lost"], g["duplicates"])),
            f"<td class='num'>{secs(pop['longest_wait_ms'])}</td>",
            f"<td class='num'>{secs(pop['time_to_drain_ms'])}</td>",
            f"<td class='num'>{revived}</td>",
            f"<td class='num'>{secs(pop['longest_revived_wait_ms']) if mode == 'server-pop' else '-'}</td>",
            f"<td class='num'>{pop['invisible_time_changes'] if mode == 'server-pop' else '-'}</td>",
            f"<td class='num'>{pop['idle_consumers']}</td>",
            f"<td class='{g['verdict']}'>{g['verdict'].upper()}</td>",
        ]
        parts.append("<tr>" + "".join(cells) + "</tr>")
    parts.append("</table>")
    return parts


def render_html(
    summary: dict[str, Any], data: PlotData | None, title: str, question: str | None = None
) -> str:
    clock = _clock(data, summary)
    esc = html.escape
    parts = [
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>",
        "<meta name='viewport' content='width=device-width, initial-scale=1'>",
        f"<title>{esc(title)}</title>",
        "<style>body{font-family:sans-serif;max-width:900px;margin:1.5em auto;padding:0 1em;color:#222;"
        "line-height:1.45}table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #ccc;"
        "padding:3px 8px;text-align:left;vertical-align:top}.ok{color:#060;font-weight:bold}"
        ".fail{color:#b00;font-weight:bold}img{width:100%;max-width:880px;border:1px solid #eee}"
        "small{color:#555}.num{text-align:right}.answer{background:#f3f6fb;border-left:4px solid #1f77b4;"
        "padding:.4em .9em}ol.marks{font-size:.92em}</style></head><body>",
        f"<h1>{esc(title)}</h1>",
    ]
    said = summary.get("answer") or answers(summary, data)
    if question or said:
        parts.append("<div class='answer'>")
        if question:
            parts.append(f"<p><b>Question:</b> {esc(question)}</p>")
        if said:
            parts.append("<p><b>Answer:</b> " + " ".join(esc(s) for s in said) + "</p>")
        parts.append("</div>")
    overall = "fail" if any(g["verdict"] == "fail" for g in summary["groups"].values()) else "ok"
    parts.append(f"<p>Overall verdict: <span class='{overall}'>{overall.upper()}</span></p>")
    parts.append("<h2>What happened</h2><ul>")
    parts += [f"<li>{esc(s)}</li>" for s in narrative(summary, data)]
    parts.append("</ul>")
    if summary["groups"]:
        parts.append("<h2>Metrics</h2><table><tr><th>metric</th>")
        parts += [f"<th>{esc(g)}</th>" for g in summary["groups"]]
        parts.append("<th>what it means</th></tr>")
        for key, meaning in METRICS.items():
            parts.append(f"<tr><td>{key}</td>")
            for g in summary["groups"].values():
                rmq = (g.get("rocketmq_time") or {}).get(key)
                cell = (
                    f"{g[key]}"
                    if rmq is None
                    else f"{_rmq_s(rmq)} RocketMQ<br><small>{g[key]} ms wall</small>"
                )
                parts.append(f"<td class='num'>{cell}</td>")
            parts.append(f"<td><small>{esc(meaning)}</small></td></tr>")
        parts.append("<tr><td>unavailable</td>")
        for g in summary["groups"].values():
            un = g.get("unavailability") or {}
            causes = "<br>".join(
                f"<small>{esc(CAUSE_TEXT[c])}: {_rmq_s(v)}</small>"
                for c, v in (un.get("by_cause_rocketmq_ms") or {}).items()
                if v
            )
            parts.append(f"<td class='num'>{_rmq_s(un.get('total_rocketmq_ms'))} RocketMQ<br>{causes}</td>")
        parts.append(f"<td><small>{esc(UNAVAILABLE_TEXT)}</small></td></tr>")
        parts.append("<tr><td>verdict</td>")
        parts += [
            f"<td class='{g['verdict']}'>{g['verdict'].upper()}</td>" for g in summary["groups"].values()
        ]
        parts.append(f"<td><small>{esc(VERDICT_RULES)}</small></td></tr></table>")
    parts += modes_table(summary, clock)
    for name, g in summary["groups"].items():
        parts.append(
            f"<h2>Group {esc(name)}: <span class='{g['verdict']}'>{g['verdict'].upper()}</span></h2><ul>"
        )
        orderly = data is not None and name in data.orderly
        markers = group_markers(data, name, g) if data is not None else []
        dups = duplicates_after(data, name, markers) if data is not None else []
        parts += [f"<li>{esc(s)}</li>" for s in group_story(name, g, clock, orderly, dups)]
        parts.append("</ul>")
        images: list[tuple[str, str | None, str]] = []
        if data is not None:
            images += [
                (
                    "Queue ownership",
                    plot_ownership(data, name, markers, g),
                    ownership_text(data, name, len(markers)),
                ),
                (
                    "Consumption rate",
                    plot_rates(data, name, markers),
                    rate_text(data, name),
                ),
                (
                    "Duplicates",
                    plot_duplicates(data, name, markers),
                    DUPLICATES_TEXT,
                ),
            ]
        images.append(
            (
                "Convergence",
                plot_convergence(g["convergence"], name, clock),
                convergence_text(g["convergence"]),
            )
        )
        for caption, png, explanation in images:
            if png:
                parts.append(f"<h3>{esc(caption)}</h3><p><small>{esc(explanation)}</small></p>")
                parts.append(f"<img alt='{esc(caption)}' src='data:image/png;base64,{png}'>")
                if caption == "Queue ownership" and markers:
                    many = len(markers) > MANY_MARKERS
                    if many:  # drawn as ticks, not numbered: the list is there on demand
                        parts.append(
                            f"<details><summary>the {len(markers):,} chaos actions and broker changes the "
                            "ticks above the charts mark</summary>"
                        )
                    parts.append("<ol class='marks'>")
                    parts += [f"<li>{esc(m.text)} at {esc(_when(m.ts, clock))}</li>" for m in markers]
                    parts.append("</ol>")
                    if many:
                        parts.append("</details>")
        parts.append("<details><summary>convergence entries (summary.json)</summary><pre>")
        parts.append(esc(json.dumps(g["convergence"], indent=1)))
        parts.append("</pre></details>")
    parts.append(f"<h2>How the verdict is decided</h2><p>{esc(VERDICT_RULES)}</p>")
    parts.append(
        "<p><small>Durations are RocketMQ time (wall milliseconds divided by the run's time scale) with the "
        "wall-clock milliseconds of the processes beside them; intervals include their start and exclude "
        "their end. Definitions: the project's event-log contract (EVENTS.md).</small></p>"
    )
    parts.append("</body></html>")
    return "".join(parts)


def write_report(
    path: str | os.PathLike[str],
    summary: dict[str, Any],
    data: PlotData | None,
    title: str,
    question: str | None = None,
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(render_html(summary, data, title, question))
