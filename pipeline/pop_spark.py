"""The Spark side of ``pipeline.pop_reference``: the per-message part (sends, first consumptions, pops,
revives) as DataFrame joins and aggregates, so it scales with the run; the consumers' lifecycle lines are
few and go through the same plain function as the reference (``consumer_metrics``).

``rmq-analyze`` computes it in its own Spark application from the events it has loaded, for one run or
a root of many (`add_pop_metrics`, `add_pop_metrics_of_runs`): every group of summary.json gets its
``mode`` and its ``pop`` figures. ``python -m rmqlab.pipeline.pop_spark RUN_DIR [--master URL]`` writes
``modes.json`` as ``pipeline.pop_reference`` does."""

from __future__ import annotations

import argparse
import os
import sys
from collections import defaultdict
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from rmqlab.pipeline.discover import RunDir, RunDirError, RunFile, discover
from rmqlab.pipeline.ingest import (
    ORDER_COLUMNS,
    QUALIFIED_COLUMNS,
    RUN_SEP,
    file_map,
    load_json_run,
    run_prefix,
)
from rmqlab.pipeline.pop_reference import (
    LIFECYCLE_EVENTS,
    add_modes,
    assemble,
    consumer_metrics,
    message_defaults,
    write,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

# Lines outside the contract's table that the comparison reads.
POP_EVENTS = ("schedule_started", "message_popped", "message_revived", "invisible_time_changed")
_POP_SCHEMA = (
    "ts_ms BIGINT, event STRING, node STRING, role STRING, `group` STRING, client_id STRING, "
    "topic STRING, msg_id STRING, time_scale DOUBLE"
)
_EMPTY_RUN = {"start_ms": None, "end_ms": None, "time_scale": 1.0, "t0_ms": None}


def _pop_lines(spark: SparkSession, files: list[RunFile], owners: list[int] | None = None) -> DataFrame:
    """The POP lines (only lines that mention one of their names are parsed), as the reference loads
    them: a line whose common fields are missing or mistyped is left out. With `owners` (the run index
    of every file), names carry their run's prefix as in `pipeline.ingest.load_json_runs`."""
    import pyspark.sql.functions as F

    hit = None
    for name in POP_EVENTS:
        cond = F.instr("value", f'"{name}"') > 0
        hit = cond if hit is None else hit | cond
    reader = spark.read.text([f.path for f in files])
    lines = reader.where(hit).select("value", F.col("_metadata.file_path").alias("file_path"))
    if owners is not None:
        lines = lines.join(F.broadcast(file_map(spark, files, reader.inputFiles(), owners)), "file_path")
    else:
        lines = lines.withColumn("run", F.lit(None).cast("int"))
    parsed = (
        lines.select(F.from_json("value", _POP_SCHEMA).alias("j"), "run")
        .select("j.*", "run")
        .where(
            F.col("ts_ms").isNotNull()
            & F.col("event").isin(*POP_EVENTS)
            & F.col("node").isNotNull()
            & F.col("role").isNotNull()
        )
    )
    if owners is None:
        return parsed.drop("run")
    prefix = F.concat(F.col("run").cast("string"), F.lit(RUN_SEP))
    return parsed.select(
        *[F.concat(prefix, F.col(c)).alias(c) if c in QUALIFIED_COLUMNS else F.col(c) for c in parsed.columns]
    ).drop("run")


def mode_metrics_of(
    ev: DataFrame,
    pop: DataFrame,
    spans: dict[str, tuple[int | None, int | None]],
    prefix_of: Callable[[str], str],
    lifecycle: list[dict[str, Any]] | None = None,
) -> dict[str, dict[str, Any]]:
    """``pop_metrics.mode_metrics`` of every run of a loaded event table, by run prefix: `ev` the typed
    events (with `allocated`, `pull` and `pop`), `pop` their POP lines, `spans` each run's (start, end)
    by prefix and `prefix_of` a (qualified) name's run prefix ("" for a single run). `lifecycle`: the
    rows of `LIFECYCLE_EVENTS` with their order columns when already collected (the analysis' control
    rows), else collected here."""
    pop = pop.persist()  # one scan of the files: the POP lines are read by four jobs below
    try:
        return _mode_metrics_of(ev, pop, spans, prefix_of, lifecycle)
    finally:
        pop.unpersist()


def _mode_metrics_of(
    ev: DataFrame,
    pop: DataFrame,
    spans: dict[str, tuple[int | None, int | None]],
    prefix_of: Callable[[str], str],
    lifecycle: list[dict[str, Any]] | None,
) -> dict[str, dict[str, Any]]:
    import pyspark.sql.functions as F

    spark = ev.sparkSession
    clocks = {p: (start, 1.0) for p, (start, _end) in spans.items()}
    for row in pop.where(F.col("event") == "schedule_started").orderBy("ts_ms").collect():
        clocks[prefix_of(row["node"])] = (row["ts_ms"], float(row["time_scale"] or 1.0))

    if lifecycle is None:
        lifecycle_cols = ["ts_ms", "event", "node", "group", "client_id", "topic", "action", "target"]
        lists = [F.col(c) if c in ev.columns else F.lit(None).alias(c) for c in ("allocated", "pull", "pop")]
        lifecycle = [
            r.asDict()
            for r in ev.where(F.col("event").isin(*LIFECYCLE_EVENTS))
            .select(*lifecycle_cols, *lists, *ORDER_COLUMNS)
            .collect()
        ]
    by_run: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in sorted(lifecycle, key=lambda r: tuple(r[c] for c in ORDER_COLUMNS)):
        if r["event"] in LIFECYCLE_EVENTS:
            p = prefix_of(r["node"])
            # names as the run wrote them (a topic's %RETRY% prefix must show), one run at a time
            by_run[p].append({k: _bare(v, p) if k in QUALIFIED_COLUMNS else v for k, v in r.items()})
    consumers: dict[str, dict[str, Any]] = {}
    for p, run_rows in by_run.items():
        end = spans.get(p, (None, None))[1]
        if end is not None:
            for g, c in consumer_metrics(run_rows, end).items():
                consumers[p + g] = {**c, "topics": [p + t for t in c["topics"]]}

    topics = spark.createDataFrame(
        [(g, t, spans[prefix_of(g)][1]) for g, c in consumers.items() for t in c["topics"]] or [("", "", 0)],
        "group string, topic string, run_end bigint",
    ).where(F.col("group") != "")
    sends = (
        ev.where(F.col("event") == "message_sent")
        .groupBy("topic", "msg_id")
        .agg(F.min("ts_ms").alias("sent_ts"))
        .join(F.broadcast(topics), "topic")
        .select("group", "msg_id", "sent_ts", "run_end")
    )
    consumed = (
        ev.where((F.col("event") == "message_consumed") & F.col("group").isNotNull())
        .groupBy("group", "msg_id")
        .agg(F.min("ts_ms").alias("first_ts"), F.count("*").alias("n"))
    )
    per_sent = (
        sends.join(consumed, ["group", "msg_id"], "left")
        .groupBy("group")
        .agg(
            F.count("*").alias("sent"),
            F.count("first_ts").alias("consumed_unique"),
            F.count_if(F.col("first_ts").isNull()).alias("lost"),
            F.max(F.coalesce("first_ts", "run_end") - F.col("sent_ts")).alias("longest_wait_ms"),
            F.max("first_ts").alias("last_first"),
            F.max("sent_ts").alias("last_sent"),
        )
    )
    dups = consumed.groupBy("group").agg(F.sum(F.col("n") - 1).alias("duplicates"))
    named = F.col("group").isNotNull() & F.col("msg_id").isNotNull()
    pops = (
        pop.where((F.col("event") == "message_popped") & named)
        .groupBy("group", "msg_id")
        .agg(F.min("ts_ms").alias("pop_ts"))
    )
    revives = pop.where((F.col("event") == "message_revived") & named)
    rev_counts = revives.groupBy("group").agg(
        F.count("*").alias("revived"), F.countDistinct("msg_id").alias("revived_messages")
    )
    rev_wait = (
        revives.select("group", "msg_id")
        .distinct()
        .join(pops, ["group", "msg_id"])
        .join(consumed, ["group", "msg_id"])
        .groupBy("group")
        .agg(F.max(F.col("first_ts") - F.col("pop_ts")).alias("longest_revived_wait_ms"))
    )
    changes = (
        pop.where((F.col("event") == "invisible_time_changed") & F.col("group").isNotNull())
        .groupBy("group")
        .agg(F.count("*").alias("invisible_time_changes"))
    )
    per_group = per_sent
    for table in (dups, rev_counts, rev_wait, changes):  # one small table, one job
        per_group = per_group.join(table, "group", "full")
    messages: dict[str, dict[str, Any]] = {g: message_defaults() for g in consumers}
    for r in per_group.collect():
        m = messages.setdefault(r["group"], message_defaults())
        if r["sent"] is not None:
            m.update(
                sent=r["sent"],
                consumed_unique=r["consumed_unique"],
                lost=r["lost"],
                longest_wait_ms=r["longest_wait_ms"] or 0,
            )
            if r["sent"] and not r["lost"]:
                m["time_to_drain_ms"] = r["last_first"] - r["last_sent"]
        if r["duplicates"] is not None:
            m["duplicates"] = int(r["duplicates"])
        if r["revived"] is not None:
            m.update(revived=r["revived"], revived_messages=r["revived_messages"])
        if r["longest_revived_wait_ms"] is not None:
            m["longest_revived_wait_ms"] = r["longest_revived_wait_ms"]
        if r["invisible_time_changes"] is not None:
            m["invisible_time_changes"] = r["invisible_time_changes"]

    out: dict[str, dict[str, Any]] = {}
    for p, (start, end) in spans.items():
        if end is None:
            out[p] = {"run": dict(_EMPTY_RUN), "groups": {}}
            continue
        bare = {
            g.removeprefix(p): {**c, "topics": [t.removeprefix(p) for t in c["topics"]]}
            for g, c in consumers.items()
            if prefix_of(g) == p
        }
        msgs = {g.removeprefix(p): m for g, m in messages.items() if prefix_of(g) == p}
        t0, scale = clocks[p]
        out[p] = assemble({"start_ms": start, "end_ms": end, "time_scale": scale, "t0_ms": t0}, bare, msgs)
    return out


def _bare(value: Any, prefix: str) -> Any:
    return value.removeprefix(prefix) if isinstance(value, str) else value


def _single(_name: str) -> str:
    return ""


def _prefix(name: str) -> str:
    return name[: name.index(RUN_SEP) + 1]


def mode_metrics_spark(spark: SparkSession, run_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """``pop_metrics.mode_metrics`` of a run directory, computed with Spark."""
    files = discover(run_dir)
    if not files:
        raise RunDirError(f"no *.jsonl event files under {os.fspath(run_dir)!r}")
    loaded = load_json_run(spark, run_dir, columns=None)
    try:
        spans = {"": (loaded.stats.start_ms, loaded.stats.end_ms)}
        return mode_metrics_of(loaded.events, _pop_lines(spark, files), spans, _single)[""]
    finally:
        loaded.release()


def add_pop_metrics(summary: dict[str, Any], analysis: Any, run_dir: str | os.PathLike[str] | None) -> None:
    """Every group of a single run's summary gets its `mode` and `pop` (EVENTS.md, proposed section);
    `pop` is null when no group of the run is server-assigned (a classic run costs no Spark work here)
    or without the run's JSON lines (a Parquet copy)."""
    modes = {g: analysis.control.mode(g) for g in analysis.control.groups}
    result = None
    if run_dir is not None and analysis.control.server_assigned & analysis.control.groups:
        spans = {"": (analysis.stats.start_ms, analysis.stats.end_ms)}
        pop = _pop_lines(analysis.ev.sparkSession, discover(run_dir))
        result = mode_metrics_of(analysis.ev, pop, spans, _single, analysis.control_rows)[""]
    add_modes(summary, modes, result)


def add_pop_metrics_of_runs(summaries: dict[str, dict[str, Any]], analysis: Any, runs: list[RunDir]) -> None:
    """add_pop_metrics for every run of an analysis of many runs (summaries by run prefix, names
    unqualified), in one set of Spark jobs for the runs with a server-assigned group."""
    control = analysis.control
    wanted = {_prefix(g) for g in control.server_assigned & control.groups}
    chosen = [(i, run) for i, run in enumerate(runs) if run_prefix(i) in wanted]
    results: dict[str, dict[str, Any]] = {}
    if chosen:
        files = [f for _i, run in chosen for f in run.files]
        owners = [i for i, run in chosen for _ in run.files]
        spans = {run_prefix(i): (analysis.runs[run_prefix(i)].start_ms, analysis.runs[run_prefix(i)].end_ms)
                 for i, _run in chosen}  # fmt: skip
        pop = _pop_lines(analysis.ev.sparkSession, files, owners)
        results = mode_metrics_of(analysis.ev, pop, spans, _prefix, analysis.control_rows)
    for p, summary in summaries.items():
        modes = {g.removeprefix(p): control.mode(g) for g in control.groups if g.startswith(p)}
        add_modes(summary, modes, results.get(p))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m rmqlab.pipeline.pop_spark",
        description="pipeline.pop_metrics with Spark: writes modes.json into the run directory.",
    )
    p.add_argument("run_dir", help="a run directory (its *.jsonl event logs)")
    p.add_argument("--out", default=None, help="where to write modes.json (default: the run directory)")
    p.add_argument("--master", default="local[2]", help="Spark master (default local[2])")
    args = p.parse_args(argv)
    if not os.path.isdir(args.run_dir):
        print(f"pop_spark: {args.run_dir}: not a directory", file=sys.stderr)
        return 2
    from rmqlab.pipeline.session import start_spark

    handle = start_spark(args.master)
    try:
        result = mode_metrics_spark(handle.spark, args.run_dir)
    finally:
        handle.stop()
    write(result, args.out or os.path.join(args.run_dir, "modes.json"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
