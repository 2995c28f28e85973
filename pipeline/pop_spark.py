"""The Spark side of ``pipeline.pop_metrics``: the per-message part (sends, first consumptions, pops,
revives) as DataFrame joins and aggregates, so it scales with the run; the consumers' lifecycle lines are
few and go through the same plain function as the reference (``consumer_metrics``).

``python -m pipeline.pop_spark RUN_DIR [--master URL]`` writes ``modes.json`` as ``pipeline.pop_metrics``
does."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from pipeline.discover import RunDirError, discover
from pipeline.ingest import load_json_run
from pipeline.pop_metrics import LIFECYCLE_EVENTS, assemble, consumer_metrics, message_defaults, write

# Lines outside the contract's table that the comparison reads.
POP_EVENTS = ("schedule_started", "assignment", "message_popped", "message_revived", "invisible_time_changed")
_POP_SCHEMA = (
    "ts_ms BIGINT, event STRING, node STRING, role STRING, `group` STRING, client_id STRING, "
    "topic STRING, msg_id STRING, time_scale DOUBLE, pull ARRAY<STRING>, pop ARRAY<STRING>"
)


def _pop_lines(spark: Any, files: list[str]) -> Any:
    """The POP lines (only lines that mention one of their names are parsed), as the reference loads
    them: a line whose common fields are missing or mistyped is left out."""
    import pyspark.sql.functions as F

    hit = None
    for name in POP_EVENTS:
        cond = F.instr("value", f'"{name}"') > 0
        hit = cond if hit is None else hit | cond
    return (
        spark.read.text(files)
        .where(hit)
        .select(F.from_json("value", _POP_SCHEMA).alias("j"))
        .select("j.*")
        .where(
            F.col("ts_ms").isNotNull()
            & F.col("event").isin(*POP_EVENTS)
            & F.col("node").isNotNull()
            & F.col("role").isNotNull()
        )
    )


def mode_metrics_spark(spark: Any, run_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """``pop_metrics.mode_metrics`` of a run directory, computed with Spark."""
    import pyspark.sql.functions as F

    files = [f.path for f in discover(run_dir)]
    if not files:
        raise RunDirError(f"no *.jsonl event files under {os.fspath(run_dir)!r}")
    loaded = load_json_run(spark, run_dir, columns=None)
    try:
        ev = loaded.events
        pop = _pop_lines(spark, files)
        start, end = loaded.stats.start_ms, loaded.stats.end_ms
        if end is None:
            return {"run": {"start_ms": None, "end_ms": None, "time_scale": 1.0, "t0_ms": None}, "groups": {}}
        t0, scale = start, 1.0
        for row in pop.where(F.col("event") == "schedule_started").orderBy("ts_ms").collect():
            t0, scale = row["ts_ms"], float(row["time_scale"] or 1.0)

        lifecycle_cols = ["ts_ms", "event", "node", "group", "client_id", "topic", "action", "target"]
        rows = [
            r.asDict()
            for r in ev.where(F.col("event").isin(*LIFECYCLE_EVENTS))
            .select(*lifecycle_cols, F.col("allocated"), F.lit(None).cast("array<string>").alias("pull"))
            .withColumn("pop", F.col("pull"))
            .unionByName(
                pop.where(F.col("event") == "assignment").select(
                    "ts_ms",
                    "event",
                    "node",
                    "group",
                    "client_id",
                    "topic",
                    F.lit(None).cast("string").alias("action"),
                    F.lit(None).cast("string").alias("target"),
                    F.lit(None).cast("array<string>").alias("allocated"),
                    "pull",
                    "pop",
                )
            )
            .orderBy("ts_ms", "event", "client_id", "topic")
            .collect()
        ]
        consumers = consumer_metrics(rows, end)

        topics = spark.createDataFrame(
            [(g, t) for g, c in consumers.items() for t in c["topics"]] or [("", "")],
            "group string, topic string",
        ).where(F.col("group") != "")
        sends = (
            ev.where(F.col("event") == "message_sent")
            .groupBy("topic", "msg_id")
            .agg(F.min("ts_ms").alias("sent_ts"))
            .join(topics, "topic")
            .select("group", "msg_id", "sent_ts")
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
                F.max(F.coalesce(F.col("first_ts"), F.lit(end)) - F.col("sent_ts")).alias("longest_wait_ms"),
                F.max("first_ts").alias("last_first"),
                F.max("sent_ts").alias("last_sent"),
            )
        )
        dups = consumed.groupBy("group").agg(F.sum(F.col("n") - 1).alias("duplicates"))
        pops = (
            pop.where(
                (F.col("event") == "message_popped")
                & F.col("group").isNotNull()
                & F.col("msg_id").isNotNull()
            )
            .groupBy("group", "msg_id")
            .agg(F.min("ts_ms").alias("pop_ts"))
        )
        revives = pop.where(
            (F.col("event") == "message_revived") & F.col("group").isNotNull() & F.col("msg_id").isNotNull()
        )
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
        messages: dict[str, dict[str, Any]] = {}

        def part(group: str) -> dict[str, Any]:
            return messages.setdefault(group, message_defaults())

        for g in consumers:
            part(g)
        for r in per_sent.collect():
            m = part(r["group"])
            m.update(
                sent=r["sent"],
                consumed_unique=r["consumed_unique"],
                lost=r["lost"],
                longest_wait_ms=r["longest_wait_ms"] or 0,
            )
            if r["sent"] and not r["lost"]:
                m["time_to_drain_ms"] = r["last_first"] - r["last_sent"]
        for r in dups.collect():
            part(r["group"])["duplicates"] = int(r["duplicates"] or 0)
        for r in rev_counts.collect():
            part(r["group"]).update(revived=r["revived"], revived_messages=r["revived_messages"])
        for r in rev_wait.collect():
            part(r["group"])["longest_revived_wait_ms"] = r["longest_revived_wait_ms"] or 0
        for r in changes.collect():
            part(r["group"])["invisible_time_changes"] = r["invisible_time_changes"]
        run = {"start_ms": start, "end_ms": end, "time_scale": scale, "t0_ms": t0}
        return assemble(run, consumers, messages)
    finally:
        loaded.release()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m pipeline.pop_spark",
        description="pipeline.pop_metrics with Spark: writes modes.json into the run directory.",
    )
    p.add_argument("run_dir", help="a run directory (its *.jsonl event logs)")
    p.add_argument("--out", default=None, help="where to write modes.json (default: the run directory)")
    p.add_argument("--master", default="local[2]", help="Spark master (default local[2])")
    args = p.parse_args(argv)
    if not os.path.isdir(args.run_dir):
        print(f"pop_spark: {args.run_dir}: not a directory", file=sys.stderr)
        return 2
    from pipeline.session import start_spark

    handle = start_spark(args.master)
    try:
        result = mode_metrics_spark(handle.spark, args.run_dir)
    finally:
        handle.stop()
    write(result, args.out or os.path.join(args.run_dir, "modes.json"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
