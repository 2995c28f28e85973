"""The report's data: what the pictures and the written account of one run are drawn from, already
small (ownership intervals, nemesis actions, per-bucket counts, collected from Spark to the driver, or
built by the plain-Python reference), and what both read from it (the run's clock, its markers, pauses
and duplicate deliveries by change). Nothing here draws: it imports no matplotlib, so the Spark analysis
and the reference can use it without the plotting stack.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from rmqlab.pipeline.unavailability import RunClock


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


# -- what the pictures and the written account both read ----------------------------------------------


def clock_of(data: PlotData | None, summary: dict[str, Any] | None = None) -> RunClock:
    if data is not None and data.clock is not None:
        return data.clock
    run = (summary or {}).get("run", {})
    start = data.run_start if data is not None else (run.get("start_ms") or 0)
    return RunClock(run.get("t0_ms") or start, run.get("time_scale") or 1.0)


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


ACTION_COLORS = {
    "kill": "#d62728",
    "stop": "#ff7f0e",
    "start": "#2ca02c",
    "pause": "#9467bd",
    "resume": "#17becf",
}
BROKER_MARKS = {
    "channel_expired": ("channel expired (no NOTIFY)", "#8c564b"),
    "lock_taken_over": ("broker lock taken over", "#e377c2"),
}


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


def group_nodes(data: PlotData, group: str) -> set[str]:
    """Nodes of the group's consumers (from its ownership intervals and consumption lines)."""
    nodes = {r["node"] for r in data.intervals if r["group"] == group and r["node"]}
    return nodes | {r["node"] for r in data.rates if r["group"] == group}


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


def regressions_after(
    entries: list[dict[str, Any]], markers: list[Marker]
) -> list[tuple[Marker | None, list[dict[str, Any]]]]:
    """A group's offset regressions (summary.json's `offset_regressions`) by the change they followed:
    the latest chaos action or channel expiry at or before each; None for those before any change."""
    changes = [m for m in markers if m.kind in ("nemesis", "channel_expired")]
    by_change: dict[int, list[dict[str, Any]]] = {}
    for e in entries:
        idx = max((i for i, m in enumerate(changes) if m.ts <= e["change_ms"]), default=-1)
        by_change.setdefault(idx, []).append(e)
    return [(changes[i] if i >= 0 else None, es) for i, es in sorted(by_change.items())]


def regression_text(entries: list[dict[str, Any]]) -> str:
    """'the committed offsets of 3 queue(s) moved back 4 time(s) (by up to 12 offsets), and 30
    deliveries were of those offsets again' for a group's (or one change's) regressions."""
    queues = len({(e["topic"], e["queue"]) for e in entries})
    deepest = max(e["from"] - e["to"] for e in entries)
    again = sum(e["redelivered"] for e in entries)
    times = f" {len(entries)} times" if len(entries) > queues else ""
    text = (
        f"the committed offset of {queues} queue{'s' if queues > 1 else ''} moved back{times} (by up to "
        f"{deepest} offset{'s' if deepest > 1 else ''})"
    )
    return text + (
        f" and {again} deliver{'ies' if again != 1 else 'y'} of those offsets came again"
        if again
        else " and nothing was delivered again because of it"
    )


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


def short_cause(cause: str) -> str:
    """'start 127.0.0.1@123#456 on consumer-3' -> 'start consumer-3' (client ids are in summary.json);
    a cause of many actions (a group's start-up) by verb and count."""
    parts = []
    for one in cause.split("; "):
        words = one.split(" ")
        parts.append(f"{words[0]} {words[-1]}" if len(words) == 4 and words[2] == "on" else one)
    if len(parts) < MANY_ACTIONS:
        return "; ".join(parts)
    return _many_actions([(p.split(" ", 1)[0], p.split(" ", 1)[-1]) for p in parts])


def real_topics(topics: list[str]) -> list[str]:
    """The topics producers send to (a group's %RETRY% topic only carries its own retries)."""
    return [t for t in topics if not t.startswith(("%RETRY%", "%DLQ%"))]
