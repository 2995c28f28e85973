"""Benchmark of the analysis: events/s of the full analysis against a baseline in the same run
(Spark reading and counting the same files), on synthetic runs of the given sizes. Prints JSON.

    python scripts/bench/pipeline.py                     # 1 M and 5 M events
    python scripts/bench/pipeline.py --events 200000     # one smaller size
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# Run as a script, this file's folder comes first on sys.path and its name would shadow the package.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

from pipeline.ingest import load_json_run  # noqa: E402
from pipeline.metrics import Analysis  # noqa: E402
from pipeline.session import SparkUnavailable, start_spark  # noqa: E402
from pipeline.synth import realistic_run  # noqa: E402

GOAL_RATIO = 4.0  # full analysis within 4x of the scan baseline


def bench_size(spark: Any, events: int, workdir: Path) -> dict[str, Any]:
    run_dir = workdir / f"run-{events}"
    t0 = time.monotonic()
    facts = realistic_run(run_dir, events=events)
    generated_s = time.monotonic() - t0
    files = [str(p) for p in run_dir.rglob("*.jsonl")]
    size = sum(Path(f).stat().st_size for f in files)

    t0 = time.monotonic()
    lines = spark.read.text(files).count()  # the baseline: read every line once
    scan_s = time.monotonic() - t0

    t0 = time.monotonic()
    run = load_json_run(spark, run_dir)
    summary = Analysis(run.events, run.stats).summary()
    run.release()
    analysis_s = time.monotonic() - t0
    return {
        "events": summary["run"]["events"],
        "lines": lines,
        "bytes": size,
        "generate_s": round(generated_s, 2),
        "scan_s": round(scan_s, 2),
        "scan_events_per_s": round(lines / scan_s),
        "analysis_s": round(analysis_s, 2),
        "analysis_events_per_s": round(summary["run"]["events"] / analysis_s),
        "ratio_analysis_over_scan": round(analysis_s / scan_s, 2),
        "groups": {g: v["verdict"] for g, v in summary["groups"].items()},
        "facts": {k: v for k, v in facts.items() if isinstance(v, int | float | str)},
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--events", type=int, action="append", help="synthetic run size (repeatable)")
    p.add_argument("--master", default="local[*]")
    p.add_argument("--keep", action="store_true", help="keep the generated runs")
    args = p.parse_args(argv)
    sizes = args.events or [1_000_000, 5_000_000]
    if any(n <= 0 for n in sizes):
        p.error("--events must be > 0")
    try:
        handle = start_spark(args.master, app_name="rmq-bench-pipeline")
    except SparkUnavailable as exc:
        print(f"bench: {exc}", file=sys.stderr)
        return 2
    workdir = Path(tempfile.mkdtemp(prefix="rmq-bench-pipeline-"))
    results = []
    try:
        # A small warm-up so JVM start-up and first-job costs do not land on the first measured size.
        bench_size(handle.spark, 2_000, workdir)
        for n in sizes:
            results.append(bench_size(handle.spark, n, workdir))
            print(json.dumps(results[-1]), file=sys.stderr, flush=True)
    finally:
        handle.stop()
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    worst = max(r["ratio_analysis_over_scan"] for r in results)
    out = {
        "master": args.master,
        "results": results,
        "goal": {"max_ratio_analysis_over_scan": GOAL_RATIO, "worst": worst, "met": worst <= GOAL_RATIO},
    }
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
