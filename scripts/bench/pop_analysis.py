"""Benchmark of what the POP figures add to rmq-analyze: `add_pop_metrics_of_runs` (the `pop metrics`
stage) against the stages it sits beside, measured in the same Spark session on the same runs: the
metrics (`Analysis.summaries`) and the unavailability (`add_rocketmq_time_of_runs`). Prints JSON on
stdout: wall seconds and the JVM's CPU seconds of each (best of `--repeat`), and the load average.

    python scripts/bench/pop_analysis.py ROOT     # ROOT: run directories, e.g. of the pop-vs-classic
                                                  # experiments (rmq-chaos run NAME --out ROOT/NAME)
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
from pathlib import Path
from typing import Any

from rmqlab.pipeline.availability_spark import AVAILABILITY_COLUMNS, add_rocketmq_time_of_runs
from rmqlab.pipeline.discover import discover_runs
from rmqlab.pipeline.ingest import load_json_runs
from rmqlab.pipeline.metrics_spark import Analysis
from rmqlab.pipeline.pop_spark import add_pop_metrics_of_runs
from rmqlab.pipeline.session import SparkUnavailable, start_spark


def _clock_class() -> Any:
    """The pipeline benchmark's Clock (wall and JVM CPU seconds), loaded from its file."""
    spec = importlib.util.spec_from_file_location("bench_pipeline", Path(__file__).parent / "pipeline.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.Clock


def measure_once(clock: Any, loaded: Any, runs: list[Any]) -> dict[str, tuple[float, float | None]]:
    """(wall s, JVM CPU s) of each stage of one analysis of the loaded runs, in the order rmq-analyze
    runs them."""
    analysis = Analysis(loaded.events, next(iter(loaded.stats.values())), runs=loaded.stats)
    summaries, wall, cpu = clock.measure(analysis.summaries)
    out = {"metrics": (wall, cpu)}
    _, wall, cpu = clock.measure(lambda: add_rocketmq_time_of_runs(summaries, analysis, runs))
    out["unavailability"] = (wall, cpu)
    _, wall, cpu = clock.measure(lambda: add_pop_metrics_of_runs(summaries, analysis, runs))
    out["pop_metrics"] = (wall, cpu)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("root", help="a root of run directories")
    p.add_argument("--repeat", type=int, default=2, help="measurements of each stage (best kept)")
    p.add_argument("--master", default=None)
    args = p.parse_args(argv)
    runs, _bad = discover_runs(Path(args.root))
    if not runs:
        print(f"pop_analysis: no run directory under {args.root!r}", file=sys.stderr)
        return 2
    try:
        handle = start_spark(args.master)
    except SparkUnavailable as exc:
        print(f"pop_analysis: {exc}", file=sys.stderr)
        return 2
    clock = _clock_class()(handle.spark)
    best: dict[str, tuple[float, float | None]] = {}
    try:
        loaded = load_json_runs(handle.spark, runs, AVAILABILITY_COLUMNS)
        try:
            for _ in range(args.repeat):
                for name, (wall, cpu) in measure_once(clock, loaded, runs).items():
                    if name not in best or wall < best[name][0]:
                        best[name] = (wall, cpu)
        finally:
            loaded.release()
    finally:
        handle.stop()
    out = {
        "runs": len(runs),
        "events": sum(s.events for s in loaded.stats.values()),
        "load_average": os.getloadavg(),
        "stages": {
            n: {"s": round(w, 2), "cpu_s": None if c is None else round(c, 1)} for n, (w, c) in best.items()
        },
    }
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
