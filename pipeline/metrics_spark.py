"""The EVENTS.md metrics per group: the control plane from `pipeline.control`, the message lines in Spark.

The control events (routes, rebalances, queue changes, starts, stops, nemeses) are few whatever the
message volume: they are collected once, together with the (group, client, node) triples of the
consumption lines, and `pipeline.control` computes ownership intervals, liveness, pauses, the
ownership metrics and convergence from them. The message lines never leave Spark: they are
hash-partitioned once by (group, topic, queue) and every per-queue window and aggregate reuses that
partitioning; the control plane reaches them as small broadcast tables. Only per-group results (and the
control events) reach the driver, in a handful of Spark jobs whatever the number of runs.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from rmqlab.pipeline import control
from rmqlab.pipeline.contract import GROUP_METRICS, OFFSET_OBSERVATIONS, ORDERLY, SLAVE_OFFSET_SYNC, verdict
from rmqlab.pipeline.ingest import ORDER_COLUMNS, RUN_SEP, RunStats

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

G, C, T, Q = "group", "client_id", "topic", "queue"
CONTROL_EVENTS = control.CONTROL_EVENTS
# What the control plane reads of a control event.
_CONTROL_COLUMNS = (
    "event", "group", "client_id", "node", "topic", "broker", "queue_id", "queues", "cid_all",
    "cid_all_digest", "action", "target", *ORDER_COLUMNS,
)  # fmt: skip
_CONSUMER_NODE = "_consumer_node"  # marks the (group, client, node) rows of consumption lines
_ORDERLY_LINE = "_orderly_line"
_UNBOUNDED_BEFORE = -(2**63)  # Window.unboundedPreceding without importing pyspark


def _f() -> Any:
    import pyspark.sql.functions as F

    return F


def _window(*keys: str) -> Any:
    from pyspark.sql import Window

    return Window.partitionBy(*keys)


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


def length_where(segments: DataFrame, cond: Any, keys: list[str], name: str) -> DataFrame:
    """Sum of b - a over segments meeting cond, per keys."""
    F = _f()
    return segments.where(cond).groupBy(*keys).agg(F.sum(F.col("b") - F.col("a")).alias(name))


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
        self._ends = (
            {prefix: st.end_ms if st.end_ms is not None else 0 for prefix, st in runs.items()}
            if runs is not None
            else None
        )
        # One job: the control events and the (group, client, node) triples of the consumption lines.
        # (The allocations of rebalance lines too, when loaded: the unavailability reads them.)
        optional = [c for c in ("allocated", "pull", "pop") if c in events.columns]
        wanted = [*_CONTROL_COLUMNS, *optional]
        ctl = events.where(F.col("event").isin(*CONTROL_EVENTS)).select(*wanted)
        # The triples come with their topic and whether the line was ORDERLY: the orderly groups are
        # known from this job, not from a scan and shuffle of the lines of their own.
        triples = (
            events.where(F.col("event") == "message_consumed")
            .select(G, C, "node", T, (F.col("mode") == ORDERLY).alias(_ORDERLY_LINE))
            .distinct()
            .withColumn("event", F.lit(_CONSUMER_NODE))
        )
        rows = [r.asDict() for r in ctl.unionByName(triples, allowMissingColumns=True).collect()]
        self.control_rows = [r for r in rows if r["event"] != _CONSUMER_NODE]
        for r in self.control_rows:
            del r[_ORDERLY_LINE]
        consumer_lines = [r for r in rows if r["event"] == _CONSUMER_NODE]
        consumer_nodes = [(r[G], r[C], r["node"]) for r in consumer_lines]
        self._consuming: dict[str, set[str]] = defaultdict(set)  # group -> clients with a consumption
        for r in consumer_lines:
            self._consuming[r[G]].add(r[C])
        self.control = control.build(self.control_rows, consumer_nodes, self.run_end_of)
        spark = events.sparkSession
        pairs = sorted((g, t) for g, ts in self.control.group_topics.items() for t in ts)
        self.group_topics = spark.createDataFrame(pairs, "`group` string, topic string")
        # A server-assigned group's consumptions of revived copies name the pop retry topic.
        retry = control.pop_retry_topics(self.control, self.unqualified)
        schema = "`group` string, topic string"
        consumed_topics = spark.createDataFrame(pairs + retry, schema) if retry else self.group_topics
        consumed_pairs = {*pairs, *retry}
        self._orderly = {r[G] for r in consumer_lines if r[_ORDERLY_LINE] and (r[G], r[T]) in consumed_pairs}
        queue = F.concat(F.col("broker"), F.lit(":"), F.col("queue_id").cast("string")).alias(Q)
        # The big one: consumption lines of the group topics (not cached: a cheap scan of the cached
        # lines, of the columns read only), hash-partitioned once by queue. Every per-queue window and
        # aggregate below is keyed by a superset of (group, topic, queue), which that partitioning
        # already satisfies, so the windows of each metric add no shuffle of
        # the lines. (With many runs, the qualified group carries the run.)
        self.consumed_lines = events.where(F.col("event") == "message_consumed").join(
            F.broadcast(consumed_topics), [G, T], "left_semi"
        )
        self.consumed = self.consumed_lines.select(
            G, C, T, queue, "msg_id", "queue_offset", "started_ms", "mode", *ORDER_COLUMNS
        ).repartition(G, T, Q)

    def run_end_of(self, group: str) -> int:
        """The end of the run a (qualified) group belongs to."""
        if self._ends is None:
            return self.run_end
        return self._ends[group[: group.index(RUN_SEP) + 1]]

    def unqualified(self, name: str) -> str:
        """A name as the lines wrote it (cid_all and its digest never carry the run prefix)."""
        if self._ends is None:
            return name
        return name[name.index(RUN_SEP) + 1 :]

    def close(self) -> None:
        """Nothing is cached beyond the loaded events (kept for the callers' symmetry with them)."""

    def intervals_df(self) -> DataFrame:
        """The ownership intervals as a small Spark table (group, client_id, topic, queue, start, end)."""
        return self.ev.sparkSession.createDataFrame(
            [(iv.group, iv.client_id, iv.topic, iv.queue, iv.start, iv.end) for iv in self.control.intervals],
            "`group` string, client_id string, topic string, queue string, start bigint, `end` bigint",
        )

    # -- message counts -----------------------------------------------------------------------------

    def message_counts(self) -> DataFrame:
        F = _f()
        sent = (
            self.ev.where(F.col("event") == "message_sent")
            .select(T, "msg_id")
            .join(F.broadcast(self.group_topics), T)
            .select(G, "msg_id", F.lit(1).alias("s"), F.lit(0).alias("n"))
        )
        # Straight from the lines, not the copy partitioned by queue: one shuffle by message id, of the
        # lines as they are. A message id has a line or two per group, so a partial aggregate before the
        # shuffle would only build a hash map of every line; partitioned first, the aggregate is one
        # step after the shuffle.
        consumed = self.consumed_lines.select(G, "msg_id", F.lit(0).alias("s"), F.lit(1).alias("n"))
        per_msg = (
            sent.unionByName(consumed)
            .repartition("msg_id")
            .groupBy(G, "msg_id")
            .agg(F.max("s").alias("s"), F.sum("n").alias("n"))
        )
        return per_msg.groupBy(G).agg(
            F.sum("s").alias("sent"),
            F.count_if(F.col("n") > 0).alias("consumed_unique"),
            F.count_if((F.col("s") == 1) & (F.col("n") == 0)).alias("lost"),
            F.sum(F.greatest(F.col("n") - 1, F.lit(0))).alias("duplicates"),
            F.count_if(F.col("n") >= 2).alias("duplicated_messages"),
        )

    # -- consumption metrics ------------------------------------------------------------------------

    def concurrent_consume(self) -> DataFrame:
        """concurrent_consume_ms per group: time two or more distinct clients consume the same queue."""
        F = _f()
        keys = [G, T, Q, C]
        spans = self.consumed.where(F.col("started_ms") < F.col("ts_ms")).select(
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
        lines = self.consumed.where(F.col("mode") == ORDERLY)
        iv = self.intervals_df().select(
            G, C, T, Q, F.col("start").alias("iv_start"), F.col("end").alias("iv_end")
        )
        inside = lines.join(F.broadcast(iv), [G, C, T, Q]).where(
            (F.col("iv_start") <= F.col("ts_ms")) & (F.col("ts_ms") < F.col("iv_end"))
        )
        w = _window(G, C, T, Q, "iv_start").orderBy(*ORDER_COLUMNS).rowsBetween(_UNBOUNDED_BEFORE, -1)
        highest = F.max("queue_offset").over(w)
        flagged = inside.withColumn("bad", highest.isNotNull() & (F.col("queue_offset") <= highest))
        return flagged.groupBy(G).agg(F.count_if("bad").alias("order_violations"))

    def orderly(self) -> set[str]:
        """Groups with ORDERLY consumption lines (of their group topics)."""
        return self._orderly

    # -- offset regressions -------------------------------------------------------------------------

    def _bare_node(self) -> Any:
        """The `node` column as the line wrote it (with many runs, without the run prefix)."""
        F = _f()
        return F.col("node") if self._ends is None else F.split(F.col("node"), RUN_SEP, 2).getItem(1)

    def offset_regressions(self) -> dict[str, list[dict[str, Any]]]:
        """EVENTS.md's offset regressions per (qualified) group, in event order, each with the deliveries
        it explains (`redelivered`). The offset lines are few next to the message lines (one per change
        of a committed offset, one per queue taken); only the regressions reach the driver."""
        F = _f()
        committed = F.col("event") == "offset_committed"
        node = self._bare_node()
        value = F.when(committed, F.col(OFFSET_OBSERVATIONS["offset_committed"])).otherwise(
            F.col(OFFSET_OBSERVATIONS["mq_added"])
        )
        observed = (
            self.ev.where(F.col("event").isin(*OFFSET_OBSERVATIONS))
            .join(F.broadcast(self.group_topics), [G, T], "left_semi")
            .select(
                G,
                T,
                F.concat(
                    F.coalesce(F.col("broker"), node),
                    F.lit(":"),
                    F.col("queue_id").cast("string"),
                ).alias(Q),
                value.alias("value"),
                "event",
                node.alias("by"),
                *ORDER_COLUMNS,
            )
        )
        before = F.lag("value").over(_window(G, T, Q).orderBy(*ORDER_COLUMNS))
        rows = (
            observed.withColumn("before", before)
            .where(F.col("value") < F.col("before"))
            .select(G, T, Q, "before", "value", "event", "by", *ORDER_COLUMNS)
            .collect()
        )
        if not rows:
            return {}
        rows.sort(key=lambda r: tuple(r[c] for c in ORDER_COLUMNS))
        spark = self.ev.sparkSession
        regs = spark.createDataFrame(
            [
                (i, r[G], r[T], r[Q], r["value"], r["before"], *(r[c] for c in ORDER_COLUMNS))
                for i, r in enumerate(rows)
            ],
            "reg int, `group` string, topic string, queue string, lo bigint, hi bigint, "
            + ", ".join(f"r_{c} bigint" for c in ORDER_COLUMNS),
        )
        # The deliveries of a regression's range after it, each given to the latest such regression of
        # its queue (the ids follow the event order)...
        inside = self.consumed.join(F.broadcast(regs), [G, T, Q]).where(
            _later(ORDER_COLUMNS, [f"r_{c}" for c in ORDER_COLUMNS])
            & (F.col("queue_offset") >= F.col("lo"))
            & (F.col("queue_offset") < F.col("hi"))
        )
        lines = inside.groupBy(G, "msg_id", *ORDER_COLUMNS).agg(F.max("reg").alias("reg"))
        # ... that repeat a delivery of the same message to the group earlier in the event order.
        earlier = self.consumed_lines.select(
            F.col(G).alias("e_group"),
            F.col("msg_id").alias("e_msg"),
            *[F.col(c).alias(f"e_{c}") for c in ORDER_COLUMNS],
        )
        repeats = lines.join(
            earlier,
            (F.col(G) == F.col("e_group"))
            & (F.col("msg_id") == F.col("e_msg"))
            & _later(ORDER_COLUMNS, [f"e_{c}" for c in ORDER_COLUMNS]),
            "left_semi",
        )
        counts = {r["reg"]: r["n"] for r in repeats.groupBy("reg").agg(F.count("*").alias("n")).collect()}
        out: dict[str, list[dict[str, Any]]] = {}
        for i, r in enumerate(rows):
            out.setdefault(r[G], []).append(
                {
                    "change_ms": r["ts_ms"],
                    "topic": r[T],
                    "queue": r[Q],
                    "from": r["before"],
                    "to": r["value"],
                    "event": r["event"],
                    "node": r["by"],
                    "redelivered": counts.get(i, 0),
                }
            )
        return out

    def slave_offset_regressions(self) -> dict[str, list[dict[str, Any]]]:
        """EVENTS.md's slave offset regressions per (qualified) group, in event order: the `offset_synced`
        lines that put an older offset over a slave's own (a few per sync at most reach the driver)."""
        F = _f()
        rows = (
            self.ev.where(
                (F.col("event") == SLAVE_OFFSET_SYNC)
                & (F.col("offset") >= 0)
                & (F.col("offset") < F.col("prev_offset"))
            )
            .join(F.broadcast(self.group_topics), [G, T], "left_semi")
            .select(
                G,
                T,
                F.concat(F.col("broker"), F.lit(":"), F.col("queue_id").cast("string")).alias(Q),
                "offset",
                "prev_offset",
                self._bare_node().alias("by"),
                *ORDER_COLUMNS,
            )
            .collect()
        )
        rows.sort(key=lambda r: tuple(r[c] for c in ORDER_COLUMNS))
        out: dict[str, list[dict[str, Any]]] = {}
        for r in rows:
            out.setdefault(r[G], []).append(
                {
                    "change_ms": r["ts_ms"],
                    "topic": r[T],
                    "queue": r[Q],
                    "from": r["prev_offset"],
                    "to": r["offset"],
                    "node": r["by"],
                }
            )
        return out

    # -- summary -------------------------------------------------------------------------------------

    def group_metrics(self) -> DataFrame:
        """The metrics of the message lines per group, as one small table."""
        out = self.message_counts()
        for part in (self.concurrent_consume(), self.order_violations()):
            out = out.join(part, G, "full")
        return out

    def _group_entries(self) -> dict[str, dict[str, Any]]:
        """summary.json's group entries by (qualified) group name; per-group rows are all that is
        collected."""
        m = self.control
        own = control.ownership_metrics(m, self.run_end_of)
        conv = control.convergence(m, self.control_rows, self.run_end_of, self.unqualified)
        lines: dict[str, Mapping[str, Any]] = {r[G]: r.asDict() for r in self.group_metrics().collect()}
        regressions = self.offset_regressions()
        clients: dict[str, set[str]] = defaultdict(set)  # the group's clients, of its consumer events
        for g, c in m.group_clients:
            clients[g].add(c)
        slave_regressions = self.slave_offset_regressions()
        groups: dict[str, dict[str, Any]] = {}
        for g in sorted(m.groups):
            row = {**lines.get(g, {}), **own[g]}
            entry: dict[str, Any] = {"topics": sorted(m.group_topics.get(g, ()))}
            for name in GROUP_METRICS:
                entry[name] = int(row.get(name) or 0)
            silent = clients.get(g, set()) - self._consuming.get(g, set())
            entry["consumers_without_messages"] = len(silent)
            entry["convergence"] = conv.get(g, [])
            entry["offset_regressions"] = regressions.get(g, [])
            entry["regression_redelivered"] = sum(r["redelivered"] for r in entry["offset_regressions"])
            entry["slave_offset_regressions"] = slave_regressions.get(g, [])
            entry["verdict"] = verdict(
                lost=entry["lost"],
                orderly=g in self._orderly,
                concurrent_consume_ms=entry["concurrent_consume_ms"],
                order_violations=entry["order_violations"],
                convergence=entry["convergence"],
                server_assigned=g in m.server_assigned,
            )
            groups[g] = entry
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
            for regression in (*entry["offset_regressions"], *entry["slave_offset_regressions"]):
                regression["topic"] = regression["topic"].removeprefix(prefix)
            per_run[prefix][name.removeprefix(prefix)] = entry
        return {prefix: _summary_of(self.runs[prefix], groups) for prefix, groups in per_run.items()}


def _later(cols: tuple[str, ...] | list[str], than: list[str]) -> Any:
    """The line of the columns `cols` comes after the one of `than` in the event order (compared as
    tuples, left to right)."""
    F = _f()
    cond = F.lit(False)
    for a, b in reversed(list(zip(cols, than, strict=True))):
        cond = (F.col(a) > F.col(b)) | ((F.col(a) == F.col(b)) & cond)
    return cond


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
