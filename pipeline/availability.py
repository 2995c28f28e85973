"""Per-queue unavailability, the broker's changes and the run's clock, with Spark (see
`pipeline.unavailability` for the definitions).

Spark reduces the message lines to the few spans that matter (waits longer than the idle threshold,
merged per queue; quiet stretches inside them); those, the ownership intervals of the affected queues,
pauses, liveness and allocations are collected and classified on the driver.
"""

from __future__ import annotations

import os
from collections import defaultdict
from typing import TYPE_CHECKING, Any

from pipeline.discover import discover
from pipeline.ingest import ANALYSIS_COLUMNS
from pipeline.unavailability import (
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


def read_side_events(spark: SparkSession, run_dir: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The few lines of the chaos runner and the broker that the contract's table leaves out: only lines
    that mention one of their names are parsed."""
    import pyspark.sql.functions as F

    files = [f.path for f in discover(run_dir)]
    if not files:
        return []
    lines = spark.read.text(files)
    hit = None
    for name in SIDE_EVENTS:
        cond = F.instr("value", f'"{name}"') > 0
        hit = cond if hit is None else hit | cond
    rows = (
        lines.where(hit)
        .select(F.from_json("value", _SIDE_SCHEMA).alias("j"))
        .select("j.*")
        .where(F.col("ts_ms").isNotNull() & F.col("event").isin(*SIDE_EVENTS))
        .collect()
    )
    return [r.asDict() for r in rows]


def _waiting(analysis: Any, threshold_ms: int) -> DataFrame:
    """Per (group, topic, queue): the union of the message waits longer than the threshold."""
    import pyspark.sql.functions as F
    from pyspark.sql import Window

    t = analysis.t
    queue = F.concat(F.col("broker"), F.lit(":"), F.col("queue_id").cast("string")).alias(Q)
    sent = (
        analysis.ev.where(F.col("event") == "message_sent")
        .select(T, queue, "msg_id", "ts_ms")
        .join(F.broadcast(t.group_topics), T)
        .groupBy(G, "msg_id")
        .agg(F.min_by(F.struct(T, Q), "ts_ms").alias("k"), F.min("ts_ms").alias("s"))
    )
    first = t.consumed.groupBy(G, "msg_id").agg(F.min("ts_ms").alias("c"))
    waits = (
        sent.join(first, [G, "msg_id"], "left")
        .select(
            G,
            F.col("k.topic").alias(T),
            F.col("k.queue").alias(Q),
            "s",
            F.coalesce("c", F.lit(analysis.run_end)).alias("e"),
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


def _quiet(analysis: Any, waiting: DataFrame, threshold_ms: int) -> DataFrame:
    """Stretches longer than the threshold inside the waiting spans without a consumption of the queue."""
    import pyspark.sql.functions as F
    from pyspark.sql import Window

    spans = F.broadcast(waiting.withColumnRenamed("s", "ws").withColumnRenamed("e", "we"))
    lines = analysis.t.consumed.select(G, T, Q, "ts_ms")
    inside = lines.join(spans, [G, T, Q]).where(
        (F.col("ts_ms") > F.col("ws")) & (F.col("ts_ms") < F.col("we"))
    )
    points = (
        inside.select(G, T, Q, "ws", "we", "ts_ms")
        .unionByName(
            waiting.select(G, T, Q, F.col("s").alias("ws"), F.col("e").alias("we"), F.col("s").alias("ts_ms"))
        )
        .unionByName(
            waiting.select(G, T, Q, F.col("s").alias("ws"), F.col("e").alias("we"), F.col("e").alias("ts_ms"))
        )
        .distinct()
    )
    w = Window.partitionBy(G, T, Q, "ws").orderBy("ts_ms")
    return (
        points.withColumn("prev", F.lag("ts_ms").over(w))
        .where(F.col("ts_ms") - F.col("prev") > threshold_ms)
        .select(G, T, Q, F.col("prev").alias("s"), F.col("ts_ms").alias("e"))
    )


def collect_inputs(
    analysis: Any, clock: RunClock
) -> tuple[dict[str, dict[tuple[str, str], QueueInputs]], dict[str, GroupInputs]]:
    """The classification's inputs, per group."""
    import pyspark.sql.functions as F

    threshold = clock.idle_threshold_ms
    t = analysis.t
    waiting = _waiting(analysis, threshold).localCheckpoint(eager=True)
    queues: dict[str, dict[tuple[str, str], QueueInputs]] = defaultdict(dict)
    for r in waiting.collect():
        queues[r[G]].setdefault((r[T], r[Q]), QueueInputs()).waiting.append((r["s"], r["e"]))
    if not queues:
        return {}, {}
    for r in _quiet(analysis, waiting, threshold).collect():
        queues[r[G]][(r[T], r[Q])].quiet.append((r["s"], r["e"]))
    keys = waiting.select(G, T, Q).distinct()
    for r in t.intervals.join(F.broadcast(keys), [G, T, Q]).collect():
        queues[r[G]][(r[T], r[Q])].owners.append((r[C], r["start"], r["end"]))
    groups: dict[str, GroupInputs] = {g: GroupInputs() for g in queues}
    members = {(r[G], r[C]) for r in t.group_clients.collect()}
    pauses: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for r in t.client_pauses.collect():
        pauses[r[C]].append((r["start"], r["end"]))
    for g, c in members:
        if g in groups and c in pauses:
            groups[g].pauses[c] = sorted(pauses[c])
    for r in t.live.collect():
        if r[G] in groups:
            groups[r[G]].live.setdefault(r[C], []).append((r["start"], r["end"]))
    if "allocated" not in analysis.ev.columns:
        rebalances = []
    else:
        rebalances = (
            analysis.ev.where((F.col("event") == "rebalance") & F.col("allocated").isNotNull())
            .select(G, C, T, "allocated", "ts_ms", "fidx", "blk", "rid")
            .orderBy("ts_ms", "fidx", "blk", "rid")
            .collect()
        )
    for r in rebalances:
        if r[G] in groups:
            groups[r[G]].rebalances.setdefault((r[C], r[T]), []).append(
                (r["ts_ms"], frozenset(r["allocated"]))
            )
    waiting.unpersist()
    return queues, groups


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
    node_of = {r[C]: r["node"] for r in analysis.t.client_nodes.collect()}
    markers = {g: broker_markers(side, g, node_of) for g in summary["groups"]}
    extend_summary(summary, clock, availability, markers)
    return clock
