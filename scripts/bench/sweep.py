"""Benchmark of rmq-sim sweep: N runs of a 10-consumer, 10-minute (RocketMQ time) experiment simulated
as Spark tasks and analysed, in local mode. Prints JSON on stdout.

The goal (not asserted anywhere): 1,000 runs in under 10 minutes on a 2-core machine. The sweep is one
point with N seeds, so every run costs the same; the JSON gives the wall time and the CPU seconds of the
whole process tree (the driver, Spark's JVM and its Python workers) for the simulation and the analysis
apart, and what 1,000 runs would take at the measured rate when fewer were run.

Baseline, in the same run: one run of the same experiment with ``rmq-sim run --no-analyze`` in its own
process, so that the per-run cost inside Spark can be compared with a plain simulation.

    python scripts/bench/sweep.py                 # 1,000 runs
    python scripts/bench/sweep.py --runs 40       # fewer, extrapolated
    python scripts/bench/sweep.py --sweep sweeps/broker-policies.toml   # time any sweep file
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from sim.sweep import to_toml  # noqa: E402

TICKS = os.sysconf("SC_CLK_TCK")

EXPERIMENT: dict[str, Any] = {
    "name": "bench-sweep",
    "question": "benchmark",
    "time_scale": 1,
    "duration": 600,
    "drain_timeout": 120,
    "cluster": {"brokers": 2},
    "topics": [{"name": "BenchTopic", "queues": 40}],
    "consumers": [{"group": "GID_bench", "topic": "BenchTopic", "count": 10, "consume_ms": 1}],
    "workload": {"rate": 5, "count": 2700},
    "nemesis": [
        {"action": "kill", "target": "consumer:random", "every": 60},
        {"action": "restart", "target": "consumer:next", "every": 60, "from": 30},
    ],
}


def sweep_file(runs: int) -> str:
    """One point (the experiment above), ``runs`` seeds."""
    return to_toml({"name": "bench-sweep", "seeds": runs, "experiment": EXPERIMENT})


class TreeCpu:
    """CPU seconds (user + sys) of a process and all its descendants, sampled from /proc: each process
    counts with the largest value seen, so processes that live longer than the sampling period count."""

    def __init__(self, root: int, period: float = 0.5) -> None:
        self.root, self.period = root, period
        self.seen: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _sample(self) -> None:
        parents: dict[int, int] = {}
        times: dict[int, float] = {}
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/stat", encoding="ascii", errors="replace") as fh:
                    fields = fh.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            parents[int(entry)] = int(fields[1])
            times[int(entry)] = (int(fields[11]) + int(fields[12])) / TICKS
        tree = {self.root}
        grew = True
        while grew:
            grew = False
            for pid, ppid in parents.items():
                if ppid in tree and pid not in tree:
                    tree.add(pid)
                    grew = True
        for pid in tree:
            if pid in times:
                self.seen[pid] = max(self.seen.get(pid, 0.0), times[pid])

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._sample()
            self._stop.wait(self.period)

    def start(self) -> TreeCpu:
        self._thread.start()
        return self

    def total(self) -> float:
        return round(sum(self.seen.values()), 2)

    def stop(self) -> float:
        self._stop.set()
        self._thread.join()
        return self.total()


def run_sweep(path: Path, out: Path) -> dict[str, Any]:
    env = dict(os.environ, PYTHONHASHSEED="0")
    env.pop("SPARK_CONF_DIR", None)
    t0 = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "sim", "sweep", str(path), "--out", str(out)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    cpu = TreeCpu(proc.pid).start()
    marks: dict[str, float] = {}
    lines = []
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.append(line.rstrip())
        if "analysing" in line and "analysis_start" not in marks:
            marks["analysis_start"] = time.monotonic() - t0
            marks["cpu_at_analysis_start"] = cpu.total()
    rc = proc.wait()
    total_cpu = cpu.stop()
    wall = time.monotonic() - t0
    sim_cpu = sum(json.loads(p.read_text())["cpu_seconds"] for p in out.glob("*/seed-*/_complete.json"))
    start = marks.get("analysis_start", wall)
    return {
        "exit": rc,
        "wall_s": round(wall, 1),
        "cpu_s": total_cpu,
        "simulate_wall_s": round(start, 1),
        "simulate_cpu_s": marks.get("cpu_at_analysis_start"),
        "analyse_wall_s": round(wall - start, 1),
        "analyse_cpu_s": round(total_cpu - marks.get("cpu_at_analysis_start", total_cpu), 2),
        "simulation_cpu_s_in_tasks": round(sim_cpu, 2),
        "tail": lines[-6:],
    }


def baseline(tmp: Path) -> dict[str, Any]:
    exp = tmp / "bench-one.toml"
    exp.write_text(to_toml({**EXPERIMENT, "seed": 1}))
    env = dict(os.environ, PYTHONHASHSEED="0")
    t0 = time.monotonic()
    before = os.times()
    subprocess.run(
        [sys.executable, "-m", "sim", "run", str(exp), "--no-analyze", "--quiet", "--out", str(tmp / "one")],
        env=env,
        check=True,
        capture_output=True,
    )
    after = os.times()
    cpu = after.children_user - before.children_user + after.children_system - before.children_system
    return {"wall_s": round(time.monotonic() - t0, 2), "cpu_s": round(cpu, 2)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=1000, help="runs of the 10-consumer experiment (default 1000)")
    p.add_argument("--sweep", type=Path, default=None, help="time this sweep file instead")
    p.add_argument("--keep", type=Path, default=None, help="keep the output here (default: a temp dir)")
    args = p.parse_args()
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="rmq-bench-sweep-") as tmp_name:
        tmp = Path(tmp_name)
        out = args.keep or tmp / "out"
        if args.sweep is not None:
            path, runs = args.sweep, None
        else:
            path, runs = tmp / "bench-sweep.toml", args.runs
            path.write_text(sweep_file(args.runs))
        base = baseline(tmp) if args.sweep is None else None
        measured = run_sweep(path, out)
    result: dict[str, Any] = {
        "benchmark": "rmq-sim sweep, local mode",
        "sweep": str(args.sweep) if args.sweep else "one point: 10 consumers, 600 s RocketMQ time, N seeds",
        "runs": runs,
        "cores": os.cpu_count(),
        "load_average_before": [round(x, 2) for x in load_before],
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
        **measured,
        "baseline_one_run_rmq_sim_run": base,
    }
    if runs and runs < 1000 and measured["exit"] in (0, 1):
        per_run = measured["simulate_wall_s"] / runs
        # Spark's start is paid once; the simulation and the analysis grow with the runs.
        result["extrapolated_1000_runs_wall_s"] = round(
            per_run * 1000 + measured["analyse_wall_s"] * 1000 / runs, 0
        )
        total_cpu = (measured["simulate_cpu_s"] or 0) + measured["analyse_cpu_s"]
        result["extrapolated_1000_runs_cpu_s"] = round(total_cpu * 1000 / runs, 0)
        # what the simulations alone need, spread over every core: a lower bound for the whole sweep
        result["lower_bound_1000_runs_wall_s_idle_cores"] = round(
            measured["simulation_cpu_s_in_tasks"] * 1000 / runs / (os.cpu_count() or 1), 0
        )
        result["extrapolation_note"] = (
            "linear in the runs for both phases; an upper bound for the analysis, whose fixed cost "
            "(JVM warm-up, job scheduling) does not grow with the runs. Under load, the CPU figures are the "
            "ones to compare; the lower bound is the tasks' simulation CPU alone on idle cores"
        )
    result["goal"] = "1,000 runs simulated and analysed in under 600 s on 2 cores"
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
