"""The EVENTS.md metrics per group as Spark DataFrame code.

Everything is built from the typed event table of `pipeline.ingest` with window functions over interval
boundaries; only per-group results (and small tables for the plots) reach the driver.

Recurring building blocks:
- state machines over ordered on/off events (ownership, liveness, pauses): an "on" row opens a period
  when the row before it (same key, event order) is absent or "off"; an "off" row closes one when the
  row before it is "on". The kept rows alternate on/off, so lead() gives each period's end.
- sweeps: +1/-1 deltas at period bounds, summed per time and accumulated in time order, give how many
  periods are open on each segment [t, next t).

The control events (routes, rebalances, queue changes, starts, stops, nemeses) are few; they live in one
partition (`coalesce(1)` after unions), where windows, aggregates and joins need no shuffle, so the many
small steps of the convergence and ownership checks cost few Spark stages. The message lines keep their
partitions and are only joined with broadcast copies of small tables.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pipeline.contract import (
    CLOSING_ACTIONS,
    CONSUMER_GROUP_EVENTS,
    GROUP_METRICS,
    ORDERLY,
    UNPAUSING_ACTIONS,
    verdict,
)
from pipeline.ingest import ORDER_COLUMNS, RUN_SEP, RunStats, free

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

INF = 2**63 - 1  # "never ends" for open periods (Long.MaxValue)
G, C, T, Q = "group", "client_id", "topic", "queue"
CONTROL_EVENTS = (
    "topic_route",
    "rebalance",
    "mq_added",
    "mq_removed",
    "consumer_started",
    "consumer_stopped",
    "nemesis",
)
_UNBOUNDED_BEFORE = -(2**63)  # Window.unboundedPreceding / unboundedFollowing without importing pyspark
_UNBOUNDED_AFTER = 2**63 - 1


def _f() -> Any:
    import pyspark.sql.functions as F

    return F


def _window(*keys: str) -> Any:
    from pyspark.sql import Window

    return Window.partitionBy(*keys)


def digest_of_ids(ids: Column) -> Column:
    """EVENTS.md's cid_all_digest of an array of client ids (distinct, sorted by code point, since
    Spark compares strings by their UTF-8 bytes, joined by newlines, SHA-256 in lowercase hex)."""
    F = _f()
    return F.sha2(F.array_join(F.array_sort(F.array_distinct(ids)), "\n"), 256)


def periods(rows: DataFrame, keys: list[str], end_default: Column) -> DataFrame:
    """Periods (keys, start, end) of an on/off state machine.

    `rows` has the keys, the order columns and `on` (true: switch on, false: switch off). A period starts
    at an "on" row whose previous row (event order) is missing or "off", and ends at the first later
    "off" row, or at `end_default`.
    """
    F = _f()
    w = _window(*keys).orderBy(*ORDER_COLUMNS)
    prev = F.col("prev")
    kept = rows.withColumn("prev", F.lag("on").over(w)).where(
        (F.col("on") & (prev.isNull() | ~prev)) | (~F.col("on") & prev)
    )
    return (
        kept.withColumn("end", F.lead("ts_ms").over(w))
        .where("on")
        .select(*keys, F.col("ts_ms").alias("start"), F.coalesce(F.col("end"), end_default).alias("end"))
    )


def sweep(deltas: DataFrame, keys: list[str], counters: list[str]) -> DataFrame:
    """Segments (keys, a, b, counters...) from delta rows (keys, t, counters... as +/-1 changes).

    Every counter on segment [a, b) is the sum of its deltas at times <= a. The last row of a key has
    b = null (no later change; counters are back to zero there when every period closed).
    """
    F = _f()
    agg = deltas.groupBy(*keys, "t").agg(*[F.sum(c).alias(c) for c in counters])
    w = _window(*keys).orderBy("t")
    return agg.select(
        *keys,
        F.col("t").alias("a"),
        F.lead("t").over(w).alias("b"),
        *[F.sum(c).over(w.rowsBetween(_UNBOUNDED_BEFORE, 0)).alias(c) for c in counters],
    )


def period_deltas(df: DataFrame, keys: list[str], counter: str, others: list[str]) -> DataFrame:
    """+1 at start, -1 at end of each period, as delta rows for `sweep` (other counters 0)."""
    F = _f()
    bounds = F.array(
        F.struct(F.col("start").alias("t"), F.lit(1).alias("d")),
        F.struct(F.col("end").alias("t"), F.lit(-1).alias("d")),
    )
    return df.select(*keys, F.explode(bounds).alias("x")).select(
        *keys, F.col("x.t").alias("t"), F.col("x.d").alias(counter), *[F.lit(0).alias(o) for o in others]
    )


def one(df: DataFrame) -> DataFrame:
    """Keep a small table in a single partition (no shuffle needed downstream)."""
    return df.coalesce(1)


def gathered(df: DataFrame) -> DataFrame:
    """A small result of big data, moved into one partition by a shuffle. (coalesce(1) would pull the
    whole upstream stage, say a window over millions of lines, into a single task.)"""
    return df.repartition(1)


def jn(left: DataFrame, right: DataFrame, on: Any, how: str = "inner") -> DataFrame:
    """Join of small single-partition tables; the result is marked single-partition again (the planner
    does not infer it for a join's output and would shuffle the next join otherwise)."""
    return one(left.join(right, on, how))


def length_where(segments: DataFrame, cond: Column, keys: list[str], name: str) -> DataFrame:
    """Sum of b - a over segments meeting cond, per keys."""
    F = _f()
    return segments.where(cond).groupBy(*keys).agg(F.sum(F.col("b") - F.col("a")).alias(name))


@dataclass
class Tables:
    """Small derived tables shared by several metrics (all Spark DataFrames)."""

    groups: DataFrame  # group
    group_topics: DataFrame  # group, topic
    universe: DataFrame  # group, topic, queue
    client_nodes: DataFrame  # client_id, node
    group_clients: DataFrame  # group, client_id
    intervals: DataFrame  # group, client_id, topic, queue, start, end (end > start)
    live: DataFrame  # group, client_id, start, end (end INF when never closed)
    client_pauses: DataFrame  # client_id, start, end (disjoint, end INF when never resumed)
    consumed: DataFrame  # message_consumed lines of the group topics (+ queue)


class Analysis:
    """All metrics of one run, or of many runs at once; `run_end` is the largest ts_ms of a run.

    Many runs: `events` come from `load_json_runs` (names qualified by run) and `runs` maps each run's
    prefix to its statistics; `stats` is then unused and `summaries()` gives one summary per run.
    """

    def __init__(self, events: DataFrame, stats: RunStats, runs: dict[str, RunStats] | None = None) -> None:
        F = _f()
        self.ev = events
        self.stats = stats
        self.runs = runs
        self.run_end = stats.end_ms if stats.end_ms is not None else 0
        self._kept: list[DataFrame] = []
        self.ends: DataFrame | None = None
        if runs is not None:
            rows = [(prefix, st.end_ms if st.end_ms is not None else 0) for prefix, st in runs.items()]
            self.ends = one(events.sparkSession.createDataFrame(rows, "_rp string, run_end bigint"))
        # The control events are few; keeping them apart spares the big message lines every re-scan.
        self.ctl = self._keep(events.where(F.col("event").isin(*CONTROL_EVENTS)))
        self.t = self._tables()

    # Joins between small tables are inner joins with unique keys, never semi joins: the optimizer
    # pushes a semi join below coalesce(1), and the join would then need a shuffle again.

    def _keep(self, df: DataFrame) -> DataFrame:
        """Materialise a table used by several metrics (one small job): it is computed once, and the
        plans built on it stay short, which matters because every DataFrame call re-analyses its plan."""
        df = df.localCheckpoint(eager=True)
        self._kept.append(df)
        # A checkpointed scan does not report its single partition to the planner; coalesce(1) does.
        return one(df)

    def close(self) -> None:
        """Free the materialised tables."""
        for df in self._kept:
            free(df)
        self._kept.clear()

    def _with_run_end(self, df: DataFrame) -> DataFrame:
        """df (with a group column) plus `run_end`, the end of the group's run."""
        F = _f()
        if self.ends is None:
            return df.withColumn("run_end", F.lit(self.run_end).cast("bigint"))
        prefix = F.concat(F.substring_index(F.col(G), RUN_SEP, 1), F.lit(RUN_SEP))
        return jn(df.withColumn("_rp", prefix), self.ends, "_rp").drop("_rp")

    def _unqualified(self, ids: Column) -> Column:
        """Client ids as the lines wrote them (cid_all and its digest never carry the run prefix)."""
        F = _f()
        if self.ends is None:
            return ids
        return F.transform(ids, lambda x: F.regexp_replace(x, f"^[0-9]+{RUN_SEP}", ""))

    # -- shared tables --------------------------------------------------------------------------------

    def _of(self, *names: str) -> DataFrame:
        F = _f()
        source = self.ctl if set(names) <= set(CONTROL_EVENTS) else self.ev
        return source.where(F.col("event").isin(*names))

    def _tables(self) -> Tables:
        F = _f()
        k = self._keep
        queue = F.concat(F.col("broker"), F.lit(":"), F.col("queue_id").cast("string")).alias(Q)
        # (group, client, node) of the consumer events; the consumption lines are reduced first.
        control_kinds = [e for e in CONSUMER_GROUP_EVENTS if e in CONTROL_EVENTS]
        from_lines = gathered(self._of("message_consumed").select(G, C, "node").distinct())
        gcn = k(one(self._of(*control_kinds).select(G, C, "node").unionByName(from_lines)).distinct())
        groups = gcn.select(G).distinct()
        group_clients = gcn.select(G, C).distinct()
        routes = self._of("topic_route")
        client_nodes = one(gcn.select(C, "node").unionByName(routes.select(C, "node"))).distinct()
        group_topics = self._of("rebalance").select(G, T).distinct()
        topic_queues = routes.select(T, F.explode("queues").alias(Q)).distinct()
        universe = jn(group_topics, topic_queues, T)
        never = F.lit(INF).cast("bigint")

        # Ownership: mq_added opens, mq_removed / consumer_stopped / kill or stop of the node closes.
        mq = jn(self._of("mq_added", "mq_removed"), group_topics, [G, T]).select(
            G, C, T, queue, *ORDER_COLUMNS, (F.col("event") == "mq_added").alias("on")
        )
        keys = mq.where("on").select(G, C, T, Q).distinct()
        stops = self._of("consumer_stopped").select(C, *ORDER_COLUMNS)
        closing = self._of("nemesis").where(F.col("action").isin(*CLOSING_ACTIONS))
        node_kills = jn(closing.select(F.col("target").alias("node"), *ORDER_COLUMNS), client_nodes, "node")
        deaths = one(stops.unionByName(node_kills.drop("node")))  # client_id + order: the client is gone
        closers = jn(deaths, keys, C).withColumn("on", F.lit(False))
        owning = self._with_run_end(one(mq.unionByName(closers.select(mq.columns))))
        intervals = periods(owning, [G, C, T, Q], F.col("run_end"))
        intervals = k(intervals.where(F.col("end") > F.col("start")))

        # Liveness per (group, client): consumer_started on; consumer_stopped / kill or stop of its node off.
        starts = self._of("consumer_started").select(G, C, *ORDER_COLUMNS, F.lit(True).alias("on"))
        ends = jn(deaths, starts.select(G, C).distinct(), C).withColumn("on", F.lit(False))
        live = k(periods(one(starts.unionByName(ends.select(starts.columns))), [G, C], never))

        # Pauses per node: pause on; resume / kill / stop off. A client is paused when one of its nodes is.
        toggles = (
            self._of("nemesis")
            .where(F.col("action").isin("pause", *UNPAUSING_ACTIONS))
            .select(F.col("target").alias("node"), *ORDER_COLUMNS, (F.col("action") == "pause").alias("on"))
        )
        node_pauses = periods(toggles, ["node"], never)
        per_client = jn(node_pauses, client_nodes, "node").select(C, "start", "end")
        merged = sweep(period_deltas(per_client, [C], "n", []), [C], ["n"])
        client_pauses = k(merged.where("n > 0").select(C, F.col("a").alias("start"), F.col("b").alias("end")))

        # The big one: consumption lines of the group topics (not cached: a cheap scan), hash-partitioned
        # once by queue. Every per-queue window and aggregate below is keyed by a superset of
        # (group, topic, queue), which that partitioning already satisfies, so they add no shuffle of
        # the lines; and within one query the exchange is computed once for all of them. (With many
        # runs, the qualified group carries the run.)
        consumed = (
            self._of("message_consumed")
            .join(F.broadcast(group_topics), [G, T], "left_semi")
            .select(G, C, T, queue, "msg_id", "queue_offset", "started_ms", "mode", *ORDER_COLUMNS)
            .repartition(G, T, Q)
        )
        return Tables(
            groups,
            group_topics,
            universe,
            client_nodes,
            group_clients,
            intervals,
            live,
            client_pauses,
            consumed,
        )

    # -- message counts -----------------------------------------------------------------------------

    def message_counts(self) -> DataFrame:
        F = _f()
        sent = (
            self._of("message_sent")
            .select(T, "msg_id")
            .join(F.broadcast(self.t.group_topics), T)
            .select(G, "msg_id", F.lit(1).alias("s"), F.lit(0).alias("n"))
        )
        consumed = self.t.consumed.select(G, "msg_id", F.lit(0).alias("s"), F.lit(1).alias("n"))
        per_msg = (
            sent.unionByName(consumed).groupBy(G, "msg_id").agg(F.max("s").alias("s"), F.sum("n").alias("n"))
        )
        return per_msg.groupBy(G).agg(
            F.sum("s").alias("sent"),
            F.count_if(F.col("n") > 0).alias("consumed_unique"),
            F.count_if((F.col("s") == 1) & (F.col("n") == 0)).alias("lost"),
            F.sum(F.greatest(F.col("n") - 1, F.lit(0))).alias("duplicates"),
            F.count_if(F.col("n") >= 2).alias("duplicated_messages"),
        )

    # -- ownership metrics --------------------------------------------------------------------------

    def ownership_metrics(self) -> DataFrame:
        """overlap_ms, orphan_ms, stalled_ms per group."""
        F = _f()
        qkeys = [G, T, Q]
        iv = self.t.intervals
        # Paused parts of each ownership interval (the client's pause segments are disjoint).
        cp = self.t.client_pauses.withColumnRenamed("start", "ps").withColumnRenamed("end", "pe")
        # Orphan time counts only while some consumer of the group is live: the group's live spans,
        # clipped to [T0, run_end), laid over every queue of its universe.
        t0 = jn(self._of("mq_added"), self.t.group_topics, [G, T]).groupBy(G).agg(F.min("ts_ms").alias("t0"))
        group_live = sweep(period_deltas(self.t.live, [G], "n", []), [G], ["n"]).where("n > 0")
        live_spans = self._with_run_end(jn(group_live, t0, G)).select(
            G,
            F.greatest("a", "t0").alias("start"),
            F.least(F.coalesce("b", F.lit(INF)), F.col("run_end")).alias("end"),
        )
        live_spans = jn(live_spans.where(F.col("end") > F.col("start")), self.t.universe, G)
        pieces = (
            jn(iv, cp, C)
            .where((F.col("ps") < F.col("end")) & (F.col("pe") > F.col("start")))
            .select(
                *qkeys,
                F.greatest("start", "ps").alias("start"),
                F.least("end", "pe").alias("end"),
            )
        )
        counters = ["n_open", "n_paused", "n_live"]
        deltas = (
            period_deltas(iv.select(*qkeys, "start", "end"), qkeys, "n_open", ["n_paused", "n_live"])
            .unionByName(period_deltas(pieces, qkeys, "n_paused", ["n_open", "n_live"]))
            .unionByName(
                period_deltas(
                    live_spans.select(*qkeys, "start", "end"), qkeys, "n_live", ["n_open", "n_paused"]
                )
            )
        )
        seg = sweep(one(deltas), qkeys, counters)
        length = F.col("b") - F.col("a")
        per_queue = seg.groupBy(*qkeys).agg(
            F.sum(F.when(F.col("n_open") >= 2, length).otherwise(0)).alias("overlap_ms"),
            F.sum(
                F.when((F.col("n_open") >= 1) & (F.col("n_open") == F.col("n_paused")), length).otherwise(0)
            ).alias("stalled_ms"),
            F.sum(F.when((F.col("n_open") == 0) & (F.col("n_live") >= 1), length).otherwise(0)).alias(
                "orphan_ms"
            ),
        )
        return per_queue.groupBy(G).agg(
            F.sum("overlap_ms").alias("overlap_ms"),
            F.sum("stalled_ms").alias("stalled_ms"),
            F.sum("orphan_ms").alias("orphan_ms"),
        )

    # -- consumption metrics ------------------------------------------------------------------------

    def concurrent_consume(self) -> DataFrame:
        """concurrent_consume_ms per group: time two or more distinct clients consume the same queue."""
        F = _f()
        keys = [G, T, Q, C]
        spans = self.t.consumed.where(F.col("started_ms") < F.col("ts_ms")).select(
            *keys, F.col("started_ms").alias("s"), F.col("ts_ms").alias("e")
        )
        # Union of one client's spans on a queue (islands): a span starts a new island when it begins
        # after every earlier span (sorted by start) has ended.
        w = _window(*keys).orderBy("s", "e")
        prev_end = F.max("e").over(w.rowsBetween(_UNBOUNDED_BEFORE, -1))
        flagged = spans.withColumn("new", F.when(prev_end.isNull() | (F.col("s") > prev_end), 1).otherwise(0))
        islands = (
            flagged.withColumn("island", F.sum("new").over(w.rowsBetween(_UNBOUNDED_BEFORE, 0)))
            .groupBy(*keys, "island")
            .agg(F.min("s").alias("start"), F.max("e").alias("end"))
        )
        qkeys = [G, T, Q]
        seg = sweep(period_deltas(islands.select(*qkeys, "start", "end"), qkeys, "n", []), qkeys, ["n"])
        return length_where(seg, F.col("n") >= 2, [G], "concurrent_consume_ms")

    def order_violations(self) -> DataFrame:
        F = _f()
        lines = self.t.consumed.where(F.col("mode") == ORDERLY)
        iv = self.t.intervals.select(
            G, C, T, Q, F.col("start").alias("iv_start"), F.col("end").alias("iv_end")
        )
        inside = lines.join(F.broadcast(iv), [G, C, T, Q]).where(
            (F.col("iv_start") <= F.col("ts_ms")) & (F.col("ts_ms") < F.col("iv_end"))
        )
        w = _window(G, C, T, Q, "iv_start").orderBy(*ORDER_COLUMNS).rowsBetween(_UNBOUNDED_BEFORE, -1)
        highest = F.max("queue_offset").over(w)
        flagged = inside.withColumn("bad", highest.isNotNull() & (F.col("queue_offset") <= highest))
        return flagged.groupBy(G).agg(F.count_if("bad").alias("order_violations"))

    def orderly_groups(self) -> DataFrame:
        F = _f()
        return (
            self.t.consumed.where(F.col("mode") == ORDERLY)
            .select(G)
            .distinct()
            .withColumn("orderly", F.lit(True))
        )

    # -- convergence ---------------------------------------------------------------------------------

    def change_points(self) -> DataFrame:
        """(group, change_ms, cause): one row per distinct millisecond, causes joined."""
        F = _f()
        own = self._of("consumer_started", "consumer_stopped").select(
            G,
            "ts_ms",
            F.concat(
                F.when(F.col("event") == "consumer_started", F.lit("start ")).otherwise(F.lit("stop ")),
                F.col(C),
                F.lit(" on "),
                F.col("node"),
            ).alias("cause"),
        )
        group_nodes = jn(self.t.group_clients, self.t.client_nodes, C).select(G, "node").distinct()
        kill_lines = (
            self._of("nemesis")
            .where(F.col("action") == "kill")
            .select(F.col("target").alias("node"), "ts_ms")
        )
        kills = jn(kill_lines, group_nodes, "node").select(
            G, "ts_ms", F.concat(F.lit("kill "), F.col("node")).alias("cause")
        )
        return (
            one(own.unionByName(kills))
            .groupBy(G, "ts_ms")
            .agg(F.array_join(F.array_sort(F.collect_set("cause")), "; ").alias("cause"))
            .withColumnRenamed("ts_ms", "change_ms")
        )

    def convergence_timeline(self) -> DataFrame:
        """(group, t, conv): whether the group is converged from t until its next row."""
        F = _f()
        tb = self.t
        qkeys = [G, T, Q]
        # Condition 1, per universe queue: exactly one open interval, and its owner live.
        iv = jn(tb.intervals, tb.universe, qkeys)
        lv = tb.live.withColumnRenamed("start", "ls").withColumnRenamed("end", "le")
        live_pieces = (
            jn(iv, lv, [G, C])
            .where((F.col("ls") < F.col("end")) & (F.col("le") > F.col("start")))
            .select(*qkeys, F.greatest("start", "ls").alias("start"), F.least("end", "le").alias("end"))
        )
        deltas = period_deltas(iv.select(*qkeys, "start", "end"), qkeys, "n_open", ["n_live"]).unionByName(
            period_deltas(live_pieces, qkeys, "n_live", ["n_open"])
        )
        seg = sweep(one(deltas), qkeys, ["n_open", "n_live"])
        ok = seg.where((F.col("n_open") == 1) & (F.col("n_live") == 1) & F.col("b").isNotNull()).select(
            *qkeys, F.col("a").alias("start"), F.col("b").alias("end")
        )
        ok_deltas = period_deltas(ok, [G], "d_ok", ["d_bad"])

        # Condition 2, per (group, live client, group topic): active (live, not paused) clients need a
        # latest rebalance whose cid_all equals the live set.
        cp = jn(tb.client_pauses, tb.live.select(G, C).distinct(), C)
        act_seg = sweep(
            one(
                period_deltas(tb.live, [G, C], "n_live", ["n_paused"]).unionByName(
                    period_deltas(cp, [G, C], "n_paused", ["n_live"])
                )
            ),
            [G, C],
            ["n_live", "n_paused"],
        )
        act_changes = act_seg.select(
            G, C, F.col("a").alias("t"), ((F.col("n_live") > 0) & (F.col("n_paused") == 0)).alias("act")
        )
        bounds = one(
            tb.live.select(G, F.col("start").alias("t")).unionByName(
                tb.live.where(F.col("end") < INF).select(G, F.col("end").alias("t"))
            )
        ).distinct()
        live_sets = (
            jn(bounds, lv, G, "left")
            .groupBy(G, "t")
            .agg(
                digest_of_ids(
                    self._unqualified(
                        F.collect_set(
                            F.when((F.col("ls") <= F.col("t")) & (F.col("t") < F.col("le")), F.col(C))
                        )
                    )
                ).alias("sset")
            )
        )
        pairs = jn(tb.live.select(G, C).distinct(), tb.group_topics, G)
        rw = _window(G, C, T, "ts_ms").orderBy(*[F.col(c).desc() for c in ORDER_COLUMNS])
        rebal = (
            self._of("rebalance")
            .withColumn("k", F.row_number().over(rw))
            .where("k = 1")
            .select(
                G,
                C,
                T,
                F.col("ts_ms").alias("t"),
                F.coalesce(digest_of_ids(F.col("cid_all")), F.col("cid_all_digest")).alias("rset"),
            )
        )
        empty = F.lit(None).cast("string")
        changes = one(
            jn(act_changes, pairs, [G, C])
            .select(G, C, T, "t", "act", empty.alias("rset"), empty.alias("sset"))
            .unionByName(
                jn(rebal, pairs, [G, C, T]).select(
                    G, C, T, "t", F.lit(None).cast("boolean").alias("act"), "rset", empty.alias("sset")
                )
            )
            .unionByName(
                jn(live_sets, pairs, G).select(
                    G, C, T, "t", F.lit(None).cast("boolean").alias("act"), empty.alias("rset"), "sset"
                )
            )
        )
        merged = changes.groupBy(G, C, T, "t").agg(
            F.first("act", ignorenulls=True).alias("act"),
            F.first("rset", ignorenulls=True).alias("rset"),
            F.first("sset", ignorenulls=True).alias("sset"),
        )
        pw = _window(G, C, T).orderBy("t")
        upto = pw.rowsBetween(_UNBOUNDED_BEFORE, 0)
        state = merged.select(
            G,
            C,
            T,
            "t",
            F.coalesce(F.last("act", ignorenulls=True).over(upto), F.lit(False)).alias("act"),
            F.last("rset", ignorenulls=True).over(upto).alias("rset"),
            F.coalesce(F.last("sset", ignorenulls=True).over(upto), digest_of_ids(F.array())).alias("sset"),
        )
        bad = state.select(
            G,
            C,
            T,
            "t",
            F.when(F.col("act") & (F.col("rset").isNull() | (F.col("rset") != F.col("sset"))), 1)
            .otherwise(0)
            .alias("bad"),
        )
        bad_deltas = bad.select(
            G,
            "t",
            F.lit(0).alias("d_ok"),
            (F.col("bad") - F.coalesce(F.lag("bad").over(pw), F.lit(0))).alias("d_bad"),
            F.lit(0).alias("d_live"),
        )
        # Live consumers of the group (an empty group is converged); ends at INF never happen.
        live_deltas = one(
            tb.live.select(G, F.col("start").alias("t"), F.lit(1).alias("d_live")).unionByName(
                tb.live.where(F.col("end") < INF).select(
                    G, F.col("end").alias("t"), F.lit(-1).alias("d_live")
                )
            )
        ).select(G, "t", F.lit(0).alias("d_ok"), F.lit(0).alias("d_bad"), "d_live")

        # Group timeline: converged while nobody is live, or every universe queue is ok and no pair is bad.
        sizes = tb.universe.groupBy(G).agg(F.count("*").alias("n_universe"))
        timeline = one(
            ok_deltas.select(G, "t", "d_ok", "d_bad", F.lit(0).alias("d_live"))
            .unionByName(bad_deltas)
            .unionByName(live_deltas)
        )
        agg = timeline.groupBy(G, "t").agg(*[F.sum(d).alias(d) for d in ("d_ok", "d_bad", "d_live")])
        tw = _window(G).orderBy("t").rowsBetween(_UNBOUNDED_BEFORE, 0)
        running = agg.select(
            G,
            "t",
            F.sum("d_ok").over(tw).alias("n_ok"),
            F.sum("d_bad").over(tw).alias("n_bad"),
            F.sum("d_live").over(tw).alias("n_live"),
        )
        whole = (F.col("n_ok") == F.coalesce(F.col("n_universe"), F.lit(0))) & (F.col("n_bad") == 0)
        return jn(running, sizes, G, "left").select(
            G,
            "t",
            ((F.col("n_live") == 0) | whole).alias("conv"),
        )

    def convergence(self) -> DataFrame:
        """(group, change_ms, cause, converged, convergence_ms) for every change point."""
        F = _f()
        sizes = self.t.universe.groupBy(G).agg(F.count("*").alias("n_universe"))
        cps = self.change_points()
        timeline = self.convergence_timeline()
        rows = timeline.select(
            G, "t", F.lit(0).alias("kind"), "conv", F.lit(None).cast("string").alias("cause")
        )
        rows = one(
            rows.unionByName(
                cps.select(
                    G,
                    F.col("change_ms").alias("t"),
                    F.lit(1).alias("kind"),
                    F.lit(None).cast("boolean").alias("conv"),
                    "cause",
                )
            )
        )
        rows = self._with_run_end(rows)
        w = _window(G).orderBy("t", "kind")
        conv_at = F.last(F.when(F.col("kind") == 0, F.col("conv")), ignorenulls=True).over(
            w.rowsBetween(_UNBOUNDED_BEFORE, 0)
        )
        next_conv = F.first(
            F.when((F.col("kind") == 0) & F.col("conv") & (F.col("t") <= F.col("run_end")), F.col("t")),
            ignorenulls=True,
        ).over(w.rowsBetween(0, _UNBOUNDED_AFTER))
        marked = rows.select(G, "t", "kind", "cause", conv_at.alias("conv_at"), next_conv.alias("next_conv"))
        out = jn(marked.where("kind = 1"), sizes, G, "left")
        # Before any timeline row nobody has been live: an empty group is converged.
        at_t0 = F.coalesce(F.col("conv_at"), F.lit(True))
        ms = F.when(at_t0, F.lit(0)).otherwise(F.col("next_conv") - F.col("t"))
        return out.select(
            G,
            F.col("t").alias("change_ms"),
            "cause",
            ms.isNotNull().alias("converged"),
            ms.cast("bigint").alias("convergence_ms"),
        )

    # -- summary -------------------------------------------------------------------------------------

    def group_metrics(self) -> DataFrame:
        F = _f()
        out = self.t.groups
        for part in (
            self.message_counts(),
            self.ownership_metrics(),
            self.concurrent_consume(),
            self.order_violations(),
            self.orderly_groups(),
        ):
            out = jn(out, gathered(part), G, "left")
        topics = self.t.group_topics.groupBy(G).agg(F.array_sort(F.collect_list(T)).alias("topics"))
        return jn(out, topics, G, "left")

    def _group_entries(self) -> dict[str, dict[str, Any]]:
        """summary.json's group entries by (qualified) group name; per-group rows are all that is
        collected."""
        groups: dict[str, dict[str, Any]] = {}
        for row in self.group_metrics().collect():
            entry: dict[str, Any] = {"topics": list(row["topics"] or [])}
            for name in GROUP_METRICS:
                entry[name] = int(row[name] or 0)
            entry["convergence"] = []
            entry["_orderly"] = bool(row["orderly"])
            groups[row[G]] = entry
        for row in self.convergence().orderBy(G, "change_ms").collect():
            groups[row[G]]["convergence"].append(
                {
                    "change_ms": int(row["change_ms"]),
                    "cause": row["cause"],
                    "converged": bool(row["converged"]),
                    "convergence_ms": None if row["convergence_ms"] is None else int(row["convergence_ms"]),
                }
            )
        for entry in groups.values():
            orderly = entry.pop("_orderly")
            entry["verdict"] = verdict(
                lost=entry["lost"],
                orderly=orderly,
                concurrent_consume_ms=entry["concurrent_consume_ms"],
                order_violations=entry["order_violations"],
                convergence=entry["convergence"],
            )
        return groups

    def summary(self) -> dict[str, Any]:
        """summary.json of a single run as a dict."""
        return _summary_of(self.stats, self._group_entries())

    def summaries(self) -> dict[str, dict[str, Any]]:
        """summary.json of every run (by run prefix), names unqualified, from one set of Spark jobs."""
        assert self.runs is not None, "summaries() is for an analysis of many runs"
        per_run: dict[str, dict[str, dict[str, Any]]] = {prefix: {} for prefix in self.runs}
        for name, entry in self._group_entries().items():
            prefix = name[: name.index(RUN_SEP) + 1]
            entry["topics"] = sorted(t.removeprefix(prefix) for t in entry["topics"])
            for change in entry["convergence"]:
                change["cause"] = change["cause"].replace(prefix, "")
            per_run[prefix][name.removeprefix(prefix)] = entry
        return {prefix: _summary_of(self.runs[prefix], groups) for prefix, groups in per_run.items()}


def _summary_of(stats: RunStats, groups: dict[str, dict[str, Any]]) -> dict[str, Any]:
    return {
        "run": {
            "events": stats.events,
            "malformed_lines": stats.malformed_lines,
            "start_ms": stats.start_ms,
            "end_ms": stats.end_ms,
        },
        "groups": dict(sorted(groups.items())),
    }
