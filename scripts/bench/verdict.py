"""Benchmark: seconds from the end of an experiment to its verdict. Prints JSON on stdout.

`rmq-chaos run` says the verdict the moment the run ends, from the plain-Python analysis
(`quick_verdict_after_run_end_s`; goal: 2 s), while the Spark analysis, started together with the
cluster so that Spark is up when the experiment ends, writes summary.json and the report
(`verdict_after_run_end_s`, the time the runner prints when that analysis is done). The baseline,
measured on the same run directory right after: a cold `python -m rmqlab.pipeline RUN_DIR` (a new JVM).

    python scripts/bench/verdict.py                     # the demo, once
    python scripts/bench/verdict.py --repeat 3 --experiment kill-one-of-four
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

GOAL_S = 2.0
DONE = re.compile(r"analysis done ([0-9.]+) s after the run ended")
QUICK = re.compile(r"plain-Python analysis, ([0-9.]+) s after the run ended")


def measure(experiment: str, workdir: Path) -> dict[str, Any]:
    run_dir = workdir / f"{experiment}-{int(time.time() * 1000)}"
    t0 = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "rmqlab.chaos", "run", experiment, "--out", str(run_dir)],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    total = time.monotonic() - t0
    found = DONE.search(done.stdout)
    if found is None:
        raise SystemExit(
            f"rmq-chaos run {experiment} did not report its analysis:\n{done.stdout}{done.stderr}"
        )
    said = QUICK.search(done.stdout)
    quick = float(said.group(1)) if said else None
    t1 = time.monotonic()
    cold = subprocess.run(
        [sys.executable, "-m", "rmqlab.pipeline", str(run_dir), "--out", str(workdir / "cold"), "--quiet"],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    cold_s = time.monotonic() - t1
    events = json.loads((run_dir / "summary.json").read_text())["run"]["events"]
    return {
        "experiment": experiment,
        "events": events,
        "exit_code": done.returncode,
        "run_and_analysis_s": round(total, 1),
        "verdict_after_run_end_s": float(found.group(1)),
        "baseline_cold_analysis_s": round(cold_s, 1),
        "baseline_exit_code": cold.returncode,
        "quick_verdict_after_run_end_s": quick,
        "goal_s": GOAL_S,
        "goal_met": quick is not None and quick <= GOAL_S,
    }


def main() -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--experiment", default="demo")
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument("--workdir", help="where the runs go (default: a temporary folder)")
    args = p.parse_args()
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="rmq-bench-verdict-"))
    workdir.mkdir(parents=True, exist_ok=True)
    load_before = os.getloadavg()[0]  # the machine's load says how far the numbers can be trusted
    results = [measure(args.experiment, workdir) for _ in range(args.repeat)]
    report = {"cpus": os.cpu_count(), "load_1m_before": load_before, "load_1m_after": os.getloadavg()[0]}
    print(json.dumps({**report, "runs": results}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
