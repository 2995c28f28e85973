"""Benchmark: seconds from the end of a run to its printed verdict, against the Spark analysis of the same
run. Prints JSON on stdout.

Each experiment is simulated first (``rmq-sim run NAME --no-analyze``: the run directory a user's run
leaves, in seconds rather than minutes, so every shipped experiment fits in one bounded run). Then, in
a fresh Python process, what ``rmq-sim run`` and ``rmq-chaos run`` do the moment a run ends: the
plain-Python analysis (`pipeline.quick`) reads the run and prints the verdict lines. The figure
(``verdict_after_run_end_s``) counts that process's imports too, which the runner's own process has
partly paid already, so it is an upper bound; its peak memory is ``peak_rss_mib``. The baseline,
measured right after on the same run directory: a cold Spark analysis (``python -m rmqlab.pipeline
RUN_DIR``, a new JVM), which is what gave the verdict before and still writes summary.json and the
report -- by default for the demo only, as each costs tens of seconds (``--baseline all`` for every
experiment). An experiment the simulator refuses (real RocketMQ clients, a durable broker store) is
listed as skipped, with rmq-sim's reason. Goal (not asserted anywhere): the verdict within 2 s of the
run's end.

    python scripts/bench/verdict.py                          # the demo and every shipped experiment
    python scripts/bench/verdict.py --experiment demo --experiment sim-1000 --baseline all
    python scripts/bench/verdict.py --processes              # the demo as real processes (rmq-chaos run)

``--processes`` measures the demo as real processes instead: ``rmq-chaos run`` prints how long after
the run's end its plain-Python verdict and its Spark analysis (started with the cluster) came; the
baseline is a cold Spark analysis of the same run directory. Every step has a time limit
(``--limit``); a step past it is recorded as timed out and the benchmark goes on.
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

from rmqlab.cli import CHAOS_SHELVES, shipped
from rmqlab.pipeline.quick import QUICK_RUN_EVENTS

GOAL_S = 2.0
DONE = re.compile(r"analysis done ([0-9.]+) s after the run ended")
QUICK = re.compile(r"plain-Python analysis, ([0-9.]+) s after the run ended")

# What a runner does once the run's files are closed, timed from before the imports.
QUICK_VERDICT = """
import json, resource, sys, time
t0 = time.monotonic()
from rmqlab.pipeline.discover import clock_word
from rmqlab.pipeline.quick import RunTooLarge, quick_summary, verdict_lines
out = {}
try:
    summary = quick_summary(sys.argv[1], max_events=int(sys.argv[2]))
    lines = verdict_lines(summary, clock_word(sys.argv[1]))
    print("\\n".join(lines), file=sys.stderr, flush=True)
    out.update(verdict=lines[-1], events=summary["run"]["events"])
except RunTooLarge as exc:
    out["too_large"] = str(exc)
out["verdict_s"] = round(time.monotonic() - t0, 3)
out["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
print(json.dumps(out))
"""


def step(argv: list[str], limit: float) -> tuple[subprocess.CompletedProcess[str] | None, float]:
    """A command and its wall seconds; None when it ran past ``limit`` seconds (then killed)."""
    t0 = time.monotonic()
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=limit)
    except subprocess.TimeoutExpired:
        return None, time.monotonic() - t0
    return done, time.monotonic() - t0


def measure_simulated(
    experiment: str, workdir: Path, baseline: bool, max_events: int, limit: float
) -> dict[str, Any]:
    run_dir = workdir / experiment
    out: dict[str, Any] = {"experiment": experiment, "run": "simulated"}
    sim, sim_s = step(
        [
            sys.executable,
            "-m",
            "rmqlab.sim",
            "run",
            experiment,
            "--out",
            str(run_dir),
            "--no-analyze",
            "--quiet",
        ],
        limit,
    )
    out["simulate_s"] = round(sim_s, 1)
    if sim is not None and sim.returncode == 2:  # the simulator refuses it (real clients, a durable store)
        lines = [line for line in sim.stderr.splitlines() if line.strip()]
        return {**out, "skipped": lines[-1] if lines else "rmq-sim run refused the experiment"}
    if sim is None or sim.returncode not in (0, 1):
        why = (
            "timed out"
            if sim is None
            else f"exit {sim.returncode}: {(sim.stderr or sim.stdout).strip()[-300:]}"
        )
        return {**out, "error": f"rmq-sim run: {why}"}
    quick, _ = step([sys.executable, "-c", QUICK_VERDICT, str(run_dir), str(max_events)], limit)
    if quick is None or quick.returncode != 0:
        why = "timed out" if quick is None else quick.stderr.strip()[-300:]
        return {**out, "error": f"quick verdict: {why}"}
    said = json.loads(quick.stdout.splitlines()[-1])
    out.update(
        events=said.get("events"),
        verdict=said.get("verdict"),
        too_large=said.get("too_large"),
        verdict_after_run_end_s=said["verdict_s"],
        peak_rss_mib=said["peak_rss_mib"],
        goal_met="verdict" in said and said["verdict_s"] <= GOAL_S,
    )
    if baseline:
        spark_out = workdir / "spark" / experiment
        cold, cold_s = step(
            [sys.executable, "-m", "rmqlab.pipeline", str(run_dir), "--out", str(spark_out), "--quiet"], limit
        )
        out["baseline_spark_analysis_s"] = round(cold_s, 1)
        out["baseline_exit_code"] = None if cold is None else cold.returncode
        if cold is not None and cold.returncode in (0, 1):
            spark_verdict = "verdict: OK" if cold.returncode == 0 else "verdict: FAIL"
            out["baseline_agrees"] = (out["verdict"] or "").startswith(spark_verdict)
    return out


def measure_processes(experiment: str, workdir: Path, limit: float) -> dict[str, Any]:
    run_dir = workdir / f"{experiment}-processes"
    done, total = step(
        [sys.executable, "-m", "rmqlab.chaos", "run", experiment, "--out", str(run_dir)], limit
    )
    out: dict[str, Any] = {
        "experiment": experiment,
        "run": "processes",
        "run_and_analysis_s": round(total, 1),
    }
    if done is None:
        return {**out, "error": "rmq-chaos run timed out"}
    found, said = DONE.search(done.stdout), QUICK.search(done.stdout)
    if found is None:
        return {**out, "error": f"rmq-chaos run did not report its analysis: {done.stdout[-500:]}"}
    quick = float(said.group(1)) if said else None
    cold, cold_s = step(
        [sys.executable, "-m", "rmqlab.pipeline", str(run_dir), "--out", str(workdir / "cold"), "--quiet"],
        limit,
    )
    return {
        **out,
        "events": json.loads((run_dir / "summary.json").read_text())["run"]["events"],
        "exit_code": done.returncode,
        "verdict_after_run_end_s": quick,
        "spark_analysis_after_run_end_s": float(found.group(1)),
        "baseline_spark_analysis_s": round(cold_s, 1),
        "baseline_exit_code": None if cold is None else cold.returncode,
        "goal_met": quick is not None and quick <= GOAL_S,
    }


def main() -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument(
        "--experiment",
        action="append",
        help="a shipped experiment (rmq-sim's names; repeatable; default: the demo and every shipped "
        "chaos experiment)",
    )
    p.add_argument(
        "--baseline",
        action="append",
        help="experiments whose run also gets the cold Spark analysis (repeatable, 'all', 'none'; "
        "default: demo)",
    )
    p.add_argument("--max-events", type=int, default=QUICK_RUN_EVENTS, help="the quick verdict's limit")
    p.add_argument("--limit", type=float, default=900.0, help="seconds allowed to each step")
    p.add_argument("--processes", action="store_true", help="the demo (or --experiment) as real processes")
    p.add_argument("--workdir", help="where the runs go (default: a temporary folder)")
    args = p.parse_args()
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="rmq-bench-verdict-"))
    workdir.mkdir(parents=True, exist_ok=True)
    names = args.experiment or ["demo", *(n for n in shipped(CHAOS_SHELVES) if n != "demo")]
    wanted = set(args.baseline or ["demo"])
    load_before = os.getloadavg()[0]  # the machine's load says how far the numbers can be trusted
    results = []
    for name in names:
        if args.processes:
            result = measure_processes(name, workdir, args.limit)
        else:
            base = "all" in wanted or name in wanted
            result = measure_simulated(name, workdir, base, args.max_events, args.limit)
        result["load_1m"] = os.getloadavg()[0]
        print(json.dumps(result), file=sys.stderr, flush=True)  # progress: one line per experiment
        results.append(result)
    said = [r["verdict_after_run_end_s"] for r in results if r.get("verdict_after_run_end_s") is not None]
    measured = [r for r in results if "skipped" not in r]
    report = {
        "cpus": os.cpu_count(),
        "load_1m_before": load_before,
        "load_1m_after": os.getloadavg()[0],
        "goal_s": GOAL_S,
        "quick_run_events": args.max_events,
        "slowest_verdict_s": max(said, default=None),
        "goal_met_by_all_measured": bool(measured) and all(r.get("goal_met") for r in measured),
        "measured": len(measured),
        "skipped": len(results) - len(measured),
        "runs": results,
    }
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
