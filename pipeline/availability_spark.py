"""Per-queue unavailability, the broker's changes and the run's clock, with Spark (see
`pipeline.unavailability` for the definitions).

Spark reduces the message lines to the few spans that matter (waits longer than the idle threshold,
merged per queue; quiet stretches inside them); those, the ownership intervals of the affected queues,
pauses, liveness and allocations are collected and classified on the driver.
"""

from __future__ import annotations

import os
from collections import defaultdict
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from rmqlab.pipeline.discover import RunDir, clock_word, discover
from rmqlab.pipeline.ingest import ANALYSIS_COLUMNS, RUN_SEP, run_prefix
from rmqlab.pipeline.unavailability import (
    SIDE_EVENTS,
    GroupAvailability,
    GroupInputs,
    QueueInputs,
    RunClock,
    broker_markers,
    classify_group,
    extend_summary,
    run_clock,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

G, C, T, Q = "group", "client_id", "topic", "queue"
# The metrics' columns plus the allocations of `rebalance` lines.
AVAILABILITY_COLUMNS = (*ANALYSIS_COLUMNS, "allocated")
_SIDE_SCHEMA = (
    "ts_ms BIGINT, event STRING, node STRING, `group` STRING, client_id STRING, reason STRING, "
    "cause STRING, previous_client_id STRING, topic STRING, broker STRING, queue_id BIGINT, "
    "time_scale DOUBLE"
)


def _side_lines(spark: SparkSession, files: list[str]) -> DataFrame:
    """The lines of `files` that mention one of the side events, parsed (plus the line's file path)."""
    import pyspark.sql.functions as F

    hit = None
    for name in SIDE_EVENTS:
        cond = F.instr("value", f'"{name}"') > 0
        hit = cond if hit is None else hit | cond
    return (
        spark.read.text(files)
        .where(hit)
        .select(F.from_json("value", _SIDE_SCHEMA).alias("j"), F.col("_metadata.file_path").alias("_path"))
        .select("j.*", "_path")
        .where(F.col("ts_ms").isNotNull() & F.col("event").isin(*SIDE_EVENTS))
    )


def read_side_events(spark: SparkSession, run_dir: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The few lines of the chaos runner and the broker that the contract's table leaves out: only lines
    that mention one of their names are parsed."""
    files = [f.path for f in discover(run_dir)]
    if not files:
        return []
    rows = _side_lines(spark, files).drop("_path").collect()
    return [r.asDict() for r in rows]


def read_side_events_of_runs(spark: SparkSession, runs: list[RunDir]) -> list[list[dict[str, Any]]]:
    """The side events of every run (by index in `runs`), from one scan of all their files."""
    from urllib.parse import unquote, urlsplit

    owner = {f.path: i for i, run in enumerate(runs) for f in run.files}
    out: list[list[dict[str, Any]]] = [[] for _ in runs]
    if not owner:
        return out
    for r in _side_lines(spark, list(owner)).collect():
        row = r.asDict()
        index = owner.get(unquote(urlsplit(row.pop("_path")).path))
        if index is not None:
            out[index].append(row)
    for rows in out:
        rows.sort(key=lambda r: r["ts_ms"])
    return out


def _waiting(analysis: Any, threshold_ms: int) -> DataFrame:
    """Per (group, topic, queue): the union of the message waits longer than the threshold."""
    import pyspark.sql.functions as F
    from pyspark.sql import Window

    queue = F.concat(F.col("broker"), F.lit(":"), F.col("queue_id").cast("string")).alias(Q)
    sent = (
        analysis.ev.where(F.col("event") == "message_sent")
        .select(T, queue, "msg_id", "ts_ms")
        .join(F.broadcast(analysis.group_topics), T)
        .groupBy(G, "msg_id")
        .agg(F.min_by(F.struct(T, Q), "ts_ms").alias("k"), F.min("ts_ms").alias("s"))
    )
    first = analysis.consumed.groupBy(G, "msg_id").agg(F.min("ts_ms").alias("c"))
    run_end = F.lit(analysis.run_end)
    if analysis.runs is not None:  # each group's own run's end
        ends = {g: analysis.run_end_of(g) for g in analysis.control.groups}
        run_end = F.element_at(F.create_map(*[F.lit(x) for kv in sorted(ends.items()) for x in kv]), F.col(G))
    waits = (
        sent.join(first, [G, "msg_id"], "left")
        .select(
            G,
            F.col("k.topic").alias(T),
            F.col("k.queue").alias(Q),
            "s",
            F.coalesce("c", run_end).alias("e"),
        )
        .where(F.col("e") - F.col("s") > threshold_ms)
    )
    # Gaps and islands: a wait starts a new span when it begins after every earlier one ended.
    w = Window.partitionBy(G, T, Q).orderBy("s", "e")
    reach = F.max("e").over(w.rowsBetween(Window.unboundedPreceding, -1))
    flagged = waits.withColumn("new", F.when(reach.isNull() | (F.col("s") > reach), 1).otherwise(0))
    numbered = flagged.withColumn("island", F.sum("new").over(w.rowsBetween(Window.unboundedPreceding, 0)))
    return (
        numbered.groupBy(G, T, Q, "island").agg(F.min("s").alias("s"), F.max("e").alias("e")).drop("island")
    )


def _quiet(analysis: Any, waiting: list[tuple[str, str, str, int, int]], threshold_ms: int) -> DataFrame:
    """Stretches longer than the threshold inside the waiting spans without a consumption of the queue."""
    import pyspark.sql.functions as F
    from pyspark.sql import Window

    spark = analysis.ev.sparkSession
    spans_df = spark.createDataFrame(
        waiting, "`group` string, topic string, queue string, ws bigint, we bigint"
    )
    lines = analysis.consumed.select(G, T, Q, "ts_ms")
    inside = lines.join(F.broadcast(spans_df), [G, T, Q]).where(
        (F.col("ts_ms") > F.col("ws")) & (F.col("ts_ms") < F.col("we"))
    )
    bounds = spark.createDataFrame(
        [(g, t, q, s, e, x) for g, t, q, s, e in waiting for x in (s, e)],
        "`group` string, topic string, queue string, ws bigint, we bigint, ts_ms bigint",
    )
    points = inside.select(G, T, Q, "ws", "we", "ts_ms").unionByName(bounds).distinct()
    w = Window.partitionBy(G, T, Q, "ws").orderBy("ts_ms")
    return (
        points.withColumn("prev", F.lag("ts_ms").over(w))
        .where(F.col("ts_ms") - F.col("prev") > threshold_ms)
        .select(G, T, Q, F.col("prev").alias("s"), F.col("ts_ms").alias("e"))
    )


def collect_inputs(
    analysis: Any, clock: RunClock | None = None, clocks: dict[str, RunClock] | None = None
) -> tuple[dict[str, dict[tuple[str, str], QueueInputs]], dict[str, GroupInputs]]:
    """The classification's inputs, per (qualified) group: the waits from Spark, the rest from the
    control plane. `clocks` gives each run's clock by run prefix (many runs), else `clock` is the one."""
    threshold = _threshold(analysis, clock, clocks)
    waiting = [(r[G], r[T], r[Q], r["s"], r["e"]) for r in _waiting(analysis, threshold).collect()]
    queues: dict[str, dict[tuple[str, str], QueueInputs]] = defaultdict(dict)
    for g, t, q, s, e in waiting:
        queues[g].setdefault((t, q), QueueInputs()).waiting.append((s, e))
    if not queues:
        return {}, {}
    if clocks is not None:  # the threshold differs by run: keep each run's own
        waiting = [w for w in waiting if w[4] - w[3] > _group_threshold(w[0], clocks)]
    for r in _quiet(analysis, waiting, threshold).collect():
        if clocks is None or r["e"] - r["s"] > _group_threshold(r[G], clocks):
            queues[r[G]][(r[T], r[Q])].quiet.append((r["s"], r["e"]))
    m = analysis.control
    for iv in m.intervals:
        q = queues.get(iv.group, {}).get((iv.topic, iv.queue))
        if q is not None:
            q.owners.append((iv.client_id, iv.start, iv.end))
    groups: dict[str, GroupInputs] = {g: GroupInputs() for g in queues}
    for g, c in m.group_clients:
        if g in groups and c in m.client_pauses:
            groups[g].pauses[c] = sorted(m.client_pauses[c])
    for (g, c), spans in m.live.items():
        if g in groups:
            groups[g].live.setdefault(c, []).extend(spans)
    for r in m.rebalances:
        if r[G] in groups and r.get("allocated") is not None:
            groups[r[G]].rebalances.setdefault((r[C], r[T]), []).append(
                (r["ts_ms"], frozenset(r["allocated"]))
            )
    return queues, groups


def _group_threshold(group: str, clocks: dict[str, RunClock]) -> int:
    return clocks[group[: group.index(RUN_SEP) + 1]].idle_threshold_ms


def _threshold(analysis: Any, clock: RunClock | None, clocks: dict[str, RunClock] | None) -> int:
    """The idle threshold Spark filters with: the run's, or the least of all runs' (each run's own is
    applied afterwards)."""
    if clocks:
        return min(c.idle_threshold_ms for c in clocks.values())
    assert clock is not None
    return clock.idle_threshold_ms


def add_rocketmq_time(
    summary: dict[str, Any],
    analysis: Any,
    run_dir: str | os.PathLike[str] | None,
    time_scale: float | None = None,
) -> RunClock:
    """Extend summary.json with the RocketMQ-time fields, unavailability and the broker's changes."""
    spark = analysis.ev.sparkSession
    side = read_side_events(spark, run_dir) if run_dir is not None else []
    clock = run_clock(side, analysis.stats.start_ms, time_scale)
    queues, groups = collect_inputs(analysis, clock)
    availability: dict[str, GroupAvailability] = {
        g: classify_group(queues[g], groups[g], clock.idle_threshold_ms) for g in queues
    }
    node_of = analysis.control.node_of()
    markers = {g: broker_markers(side, g, node_of) for g in summary["groups"]}
    extend_summary(summary, clock, availability, markers)
    return clock


def _strip_group(
    prefix: str, queues: dict[tuple[str, str], QueueInputs], g: GroupInputs
) -> tuple[dict[tuple[str, str], QueueInputs], GroupInputs]:
    """One group's classification inputs with the run prefix taken off every name."""

    def bare(name: str) -> str:
        return name.removeprefix(prefix)

    qs = {
        (bare(t), q): QueueInputs(i.waiting, i.quiet, [(bare(c), s, e) for c, s, e in i.owners])
        for (t, q), i in queues.items()
    }
    return qs, GroupInputs(
        {bare(c): v for c, v in g.pauses.items()},
        {bare(c): v for c, v in g.live.items()},
        {(bare(c), bare(t)): v for (c, t), v in g.rebalances.items()},
    )


def add_rocketmq_time_of_runs(
    summaries: dict[str, dict[str, Any]], analysis: Any, runs: list[RunDir]
) -> dict[str, RunClock]:
    """add_rocketmq_time for every run of an analysis of many runs (summaries by run prefix, names
    unqualified): one scan for the side events, one set of Spark jobs for the waits of all runs.
    Returns each run's clock by prefix."""
    spark = analysis.ev.sparkSession
    side = read_side_events_of_runs(spark, runs)
    clocks = {
        run_prefix(i): replace(
            run_clock(side[i], analysis.runs[run_prefix(i)].start_ms, None), kind=clock_word(runs[i].path)
        )
        for i in range(len(runs))
    }
    queues, groups = collect_inputs(analysis, clocks=clocks)
    node_of = analysis.control.node_of()
    for i in range(len(runs)):
        prefix = run_prefix(i)
        clock = clocks[prefix]
        availability: dict[str, GroupAvailability] = {}
        for g in queues:
            if g.startswith(prefix):
                qs, gi = _strip_group(prefix, queues[g], groups[g])
                availability[g.removeprefix(prefix)] = classify_group(qs, gi, clock.idle_threshold_ms)
        nodes = {
            c.removeprefix(prefix): n.removeprefix(prefix) for c, n in node_of.items() if c.startswith(prefix)
        }
        summary = summaries[prefix]
        markers = {g: broker_markers(side[i], g, nodes) for g in summary["groups"]}
        extend_summary(summary, clock, availability, markers)
    return clocks
