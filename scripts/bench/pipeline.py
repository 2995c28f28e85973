"""Benchmark of the analysis pipeline: events/s of the full analysis (rmq-analyze without the report)
against baselines measured in the same Spark session on the same files. Prints JSON on stdout.

Baselines: `scan_text` counts the lines (spark.read.text), `scan_json` parses every line with the
explicit event schema and counts the rows that have a ts_ms and an event (Spark's own JSON reader; it
prunes the other fields, so it reads two). Two more bound what any analysis that reads every field can
do: `scan_json_all` reads every field of the schema (a hash of all of them is summed, so none is pruned),
`scan_json_all_cached` keeps every field in Spark's compressed columnar cache (as an analysis that reads
the lines more than once must keep them) and counts the rows.
Goals: `analysis_s <= 3 * scan_json_s` at 5 M events; 10 M events in under 3 minutes; 300 runs of
30 k events in one application in under 5 minutes, with under 1 s added per run.

Many runs (`--runs N --run-events M`): N run directories with a manifest each, analysed as
`rmq-analyze ROOT --no-report` does (every summary, the runs table, index.html) in one application,
small runs in Spark tasks by the plain-Python reference unless `--analysis spark`, against a JSON scan
of all their files and against the analysis of one of them alone.

    python scripts/bench/pipeline.py                          # 1 M, 5 M, 10 M events and 300 x 30 k
    python scripts/bench/pipeline.py --events 1000000 --runs 0   # one size (repeatable), no many-run part
    python scripts/bench/pipeline.py --events 200000 --workdir runs/bench --keep   # reuse the runs
    python scripts/bench/pipeline.py --events 1000000 --runs 0 --summaries out/   # and keep the summaries

Wall times on a shared machine are noisy; the JVM's CPU seconds are reported next to them, with the
CPU seconds of PySpark's Python workers and of this process (the driver's Python) and the load average.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rmqlab.pipeline.contract import ALL_FIELDS
from rmqlab.pipeline.discover import discover, discover_runs
from rmqlab.pipeline.ingest import event_schema, load_json_run
from rmqlab.pipeline.metrics_spark import Analysis
from rmqlab.pipeline.runs import analyse_runs, write_outputs
from rmqlab.pipeline.session import SparkUnavailable, start_spark
from rmqlab.pipeline.synth import realistic_run

GOAL_RATIO = 3.0
GOAL_10M_S = 180.0
GOAL_MANY_S = 300.0
GOAL_PER_RUN_S = 1.0


def _proc_stat(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name (field 3 onwards), or None."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as fh:
            return fh.read().rsplit(")", 1)[1].split()
    except OSError:
        return None


def _descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (fields := _proc_stat(int(entry))) is not None:
            children.setdefault(int(fields[1]), []).append(int(entry))
    out, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


class Clock:
    """Wall time, the driver JVM's CPU time (local mode: the executors live in the same JVM), the CPU
    time of the JVM's child processes (PySpark's Python workers: their live processes and those they
    and the JVM reaped), this process' own CPU (the driver's Python) and the load average."""

    def __init__(self, spark: Any) -> None:
        try:
            self.pid: int | None = int(spark._jvm.java.lang.ProcessHandle.current().pid())
        except Exception:  # not a local JVM we can read
            self.pid = None
        self.tick = os.sysconf("SC_CLK_TCK")

    def cpu_s(self) -> float | None:
        fields = None if self.pid is None else _proc_stat(self.pid)
        return None if fields is None else (int(fields[11]) + int(fields[12])) / self.tick

    def workers_cpu_s(self) -> float | None:
        if self.pid is None or (own := _proc_stat(self.pid)) is None:
            return None
        ticks = int(own[13]) + int(own[14])  # the JVM's reaped children
        for pid in _descendants(self.pid):
            if (fields := _proc_stat(pid)) is not None:
                ticks += sum(int(f) for f in fields[11:15])
        return ticks / self.tick

    @staticmethod
    def driver_cpu_s() -> float:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return usage.ru_utime + usage.ru_stime

    def measure_all(self, fn: Callable[[], Any]) -> tuple[Any, float, float | None, dict[str, Any]]:
        """fn()'s result, wall s, JVM CPU s, and the workers' and driver's CPU s and the load average."""
        load0 = os.getloadavg()[0]
        cpu0, workers0, driver0, t0 = (
            self.cpu_s(),
            self.workers_cpu_s(),
            self.driver_cpu_s(),
            time.monotonic(),
        )
        result = fn()
        wall, cpu1, workers1, driver1 = (
            time.monotonic() - t0,
            self.cpu_s(),
            self.workers_cpu_s(),
            self.driver_cpu_s(),
        )
        more = {
            "python_workers_cpu_s": None
            if workers0 is None or workers1 is None
            else round(workers1 - workers0, 1),
            "driver_python_cpu_s": round(driver1 - driver0, 1),
            "load_1min": [round(load0, 1), round(os.getloadavg()[0], 1)],
        }
        return result, wall, None if cpu0 is None or cpu1 is None else cpu1 - cpu0, more


def ensure_run(workdir: Path, events: int) -> tuple[Path, dict[str, Any], float]:
    """A synthetic run of about `events` lines, generated once per size and seed."""
    run_dir = workdir / f"run-{events}"
    marker = run_dir / "_facts.json"  # '_' files are not part of the run
    if marker.is_file():
        return run_dir, json.loads(marker.read_text()), 0.0
    shutil.rmtree(run_dir, ignore_errors=True)
    t0 = time.monotonic()
    facts = realistic_run(run_dir, events=events)
    took = time.monotonic() - t0
    marker.write_text(json.dumps(facts))
    return run_dir, facts, took


def bench_size(
    spark: Any, clock: Clock, workdir: Path, events: int, repeat: int, summaries: Path | None = None
) -> dict[str, Any]:
    run_dir, facts, generate_s = ensure_run(workdir, events)
    files = [f.path for f in discover(run_dir)]
    size = sum(Path(f).stat().st_size for f in files)

    def scan_text() -> int:
        return spark.read.text(files).count()

    def scan_json() -> int:
        df = spark.read.schema(event_schema()).json(files)
        return df.where("ts_ms IS NOT NULL AND event IS NOT NULL").count()

    def scan_json_all() -> int:
        import pyspark.sql.functions as F

        df = spark.read.schema(event_schema()).json(files)
        row = df.agg(F.count("*").alias("n"), F.sum(F.hash(*ALL_FIELDS)).alias("h")).first()
        return int(row["n"])

    def scan_json_all_cached() -> int:
        from pyspark.storagelevel import StorageLevel

        df = spark.read.schema(event_schema()).json(files).select(*ALL_FIELDS)
        df = df.persist(StorageLevel.MEMORY_AND_DISK)
        try:
            return df.count()
        finally:
            df.unpersist(blocking=True)

    def analysis() -> tuple[dict[str, Any], float, float]:
        t0 = time.monotonic()
        run = load_json_run(spark, run_dir)
        t1 = time.monotonic()
        analysis = Analysis(run.events, run.stats)
        try:
            summary = analysis.summary()
        finally:
            analysis.close()
            run.release()
        return summary, t1 - t0, time.monotonic() - t1

    best: dict[str, tuple[float, float | None, dict[str, Any]]] = {}
    counts: dict[str, int] = {}  # rows each scan counted
    summary: dict[str, Any] = {}
    split = (0.0, 0.0)
    for _ in range(repeat):
        for name, fn in (
            ("scan_text", scan_text),
            ("scan_json", scan_json),
            ("scan_json_all", scan_json_all),
            ("scan_json_all_cached", scan_json_all_cached),
            ("analysis", analysis),
        ):
            result, wall, cpu, more = clock.measure_all(fn)
            if name == "analysis":
                summary, ingest_s, metrics_s = result
            else:
                counts[name] = result
            if name not in best or wall < best[name][0]:
                best[name] = (wall, cpu, more)
                if name == "analysis":
                    split = (ingest_s, metrics_s)
    n = summary["run"]["events"]
    if summaries is not None:  # to check that a change of the analysis keeps its results
        summaries.mkdir(parents=True, exist_ok=True)
        (summaries / f"summary-{events}.json").write_text(json.dumps(summary, indent=2) + "\n")

    def entry(name: str, count: int) -> dict[str, Any]:
        wall, cpu, more = best[name]
        return {
            "s": round(wall, 2),
            "cpu_s": None if cpu is None else round(cpu, 1),
            "events_per_s": round(count / wall),
            **more,
        }

    ratio = best["analysis"][0] / best["scan_json"][0]
    return {
        "events": n,
        "lines": counts["scan_text"],
        "json_rows": counts["scan_json"],
        "bytes": size,
        "generate_s": round(generate_s, 1),
        **{name: entry(name, count) for name, count in counts.items()},
        "analysis": {**entry("analysis", n), "ingest_s": round(split[0], 2), "metrics_s": round(split[1], 2)},
        "ratio_analysis_over_scan_json": round(ratio, 2),
        "ratio_analysis_over_scan_text": round(best["analysis"][0] / best["scan_text"][0], 2),
        "ratio_analysis_over_scan_json_all": round(best["analysis"][0] / best["scan_json_all"][0], 2),
        # What reading every field once and keeping it costs, against the goal's scan: no analysis that
        # reads every field and its lines more than once gets below this ratio.
        "ratio_scan_json_all_cached_over_scan_json": round(
            best["scan_json_all_cached"][0] / best["scan_json"][0], 2
        ),
        "groups": {g: v["verdict"] for g, v in summary["groups"].items()},
        "run_facts": {k: v for k, v in facts.items() if isinstance(v, int | float | str)},
    }


def ensure_runs(workdir: Path, runs: int, events: int) -> tuple[Path, float]:
    """`runs` small runs with a manifest each (a sweep over consumers and queues), generated once."""
    root = workdir / f"runs-{runs}x{events}"
    marker = root / "_done"
    if marker.is_file():
        return root, 0.0
    shutil.rmtree(root, ignore_errors=True)
    t0 = time.monotonic()
    for i in range(runs):
        consumers, queues = 3 + i % 3, 4 * (1 + i % 4)
        run_dir = root / f"sweep-{i:04d}"
        realistic_run(run_dir, events=events, seed=i, consumers=consumers, queues=queues)
        manifest = {"name": "bench-sweep", "seed": i, "params": {"consumers": consumers, "queues": queues}}
        (run_dir / "manifest.json").write_text(json.dumps(manifest))
    marker.write_text("")
    return root, time.monotonic() - t0


def analyse_root_of(spark: Any, runs: list[Any], bad: list[Any], analysis: str) -> Any:
    """rmq-analyze ROOT's analysis; the Spark analysis of every run where this code has no other."""
    from rmqlab import pipeline

    # the package's own folder decides (code from before the small runs' route has no such module)
    if not Path(pipeline.__file__).with_name("small_runs.py").is_file():
        return analyse_runs(spark, runs, bad, plots=False)
    from rmqlab.pipeline.small_runs import analyse_root

    return analyse_root(spark, runs, bad, plots=False, analysis=analysis)


def bench_many(
    spark: Any, clock: Clock, workdir: Path, runs: int, events: int, analysis: str
) -> dict[str, Any]:
    root, generate_s = ensure_runs(workdir, runs, events)
    found, bad = discover_runs(root)
    files = [f.path for r in found for f in r.files]
    out = workdir / "many-out"

    def scan_json() -> int:
        df = spark.read.schema(event_schema()).json(files)
        return df.where("ts_ms IS NOT NULL AND event IS NOT NULL").count()

    def many() -> int:
        result = analyse_root_of(spark, found, bad, analysis)
        write_outputs(spark, result, out, reports=False, title="bench")
        return sum(s["run"]["events"] for s in result.summaries.values())

    def one() -> int:
        result = analyse_root_of(spark, found[:1], [], analysis)
        return sum(s["run"]["events"] for s in result.summaries.values())

    n, many_s, many_cpu, many_more = clock.measure_all(many)
    _, one_s, one_cpu, one_more = clock.measure_all(one)
    _rows, scan_s, scan_cpu, scan_more = clock.measure_all(scan_json)
    shutil.rmtree(out, ignore_errors=True)
    added = (many_s - one_s) / max(len(found) - 1, 1)

    def cpu(value: float | None) -> float | None:
        return None if value is None else round(value, 1)

    from rmqlab import pipeline

    routed = Path(pipeline.__file__).with_name("small_runs.py").is_file()
    return {
        "runs": len(found),
        "events": n,
        "analysis_path": analysis if routed else "spark",
        "generate_s": round(generate_s, 1),
        "analysis": {"s": round(many_s, 2), "cpu_s": cpu(many_cpu), **many_more},
        "one_run": {"s": round(one_s, 2), "cpu_s": cpu(one_cpu), **one_more},
        "added_s_per_run": round(added, 3),
        "scan_json": {"s": round(scan_s, 2), "cpu_s": cpu(scan_cpu), **scan_more},
        "ratio_analysis_over_scan_json": round(many_s / scan_s, 2),
        "goals": {"under_s": GOAL_MANY_S, "per_run_s": GOAL_PER_RUN_S,
                  "met": many_s < GOAL_MANY_S and added < GOAL_PER_RUN_S},
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--events", type=int, action="append", help="synthetic run size (repeatable)")
    p.add_argument("--master", default="local[*]")
    p.add_argument("--repeat", type=int, default=1, help="measure each size n times, keep the best")
    p.add_argument("--workdir", help="where the generated runs live (default: a temporary folder)")
    p.add_argument("--keep", action="store_true", help="keep the generated runs for the next time")
    p.add_argument("--summaries", help="write each size's summary (summary-EVENTS.json) into this folder")
    p.add_argument("--runs", type=int, default=300, help="many-run part: number of runs (0: skip it)")
    p.add_argument("--run-events", type=int, default=30_000, help="many-run part: events per run")
    p.add_argument(
        "--analysis",
        choices=("auto", "spark", "reference"),
        default="auto",
        help="many-run part: how rmq-analyze ROOT analyses the runs (its --analysis)",
    )
    args = p.parse_args(argv)
    sizes = args.events or [1_000_000, 5_000_000, 10_000_000]
    if any(n <= 0 for n in sizes) or args.repeat < 1 or args.runs < 0 or args.run_events <= 0:
        p.error("--events, --repeat and --run-events must be > 0, --runs >= 0")
    workdir = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="rmq-bench-pipeline-"))
    workdir.mkdir(parents=True, exist_ok=True)
    try:
        handle = start_spark(args.master, app_name="rmq-bench-pipeline")
    except SparkUnavailable as exc:
        print(f"bench: {exc}", file=sys.stderr)
        return 2
    results = []
    try:
        spark = handle.spark
        clock = Clock(spark)
        # Warm-up: the JVM's first jobs (class loading, code generation) should not land on a measurement.
        bench_size(spark, clock, workdir, 2_000, 1)
        for n in sizes:
            summaries = Path(args.summaries) if args.summaries else None
            results.append(bench_size(spark, clock, workdir, n, args.repeat, summaries))
            print(json.dumps(results[-1]), file=sys.stderr, flush=True)
        many = (
            bench_many(spark, clock, workdir, args.runs, args.run_events, args.analysis)
            if args.runs
            else None
        )
        if many:
            print(json.dumps(many), file=sys.stderr, flush=True)
        master = spark.sparkContext.master
        cores = spark.sparkContext.defaultParallelism
    finally:
        handle.stop()
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    worst = max(r["ratio_analysis_over_scan_json"] for r in results)
    big = [r["analysis"]["s"] for r in results if r["events"] >= 9_500_000]
    print(
        json.dumps(
            {
                "master": master,
                "parallelism": cores,
                "results": results,
                "many_runs": many,
                "goal": {
                    "max_ratio_analysis_over_scan_json": GOAL_RATIO,
                    "worst": worst,
                    "met": worst <= GOAL_RATIO,
                    "10m_events_s": big[0] if big else None,
                    "10m_met": bool(big) and big[0] < GOAL_10M_S,
                },
            },
            indent=2,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
