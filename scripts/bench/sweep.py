"""Benchmark of rmq-sim sweep: N runs of a 10-consumer, 10-minute (RocketMQ time) experiment simulated
as Spark tasks and analysed, in local mode. Prints JSON on stdout.

The goal (not asserted anywhere): 1,000 runs in under 10 minutes on a 2-core machine. The sweep is one
point with N seeds, so every run costs the same; the JSON gives the wall time and the CPU seconds of the
whole process tree (the driver, Spark's JVM and its Python workers) for the tasks (simulation and the
run's analysis) and the driver's tables apart, the tasks' own CPU split into simulation and analysis, and
what 1,000 runs would take at the measured rate when fewer were run.

Baselines, in the same run: one run of the same experiment with ``rmq-sim run --no-analyze`` in its own
process (the simulation alone), and ``rmq-analyze`` on the sweep's output (the Spark analysis of many
runs, which the sweep used for every run before its tasks analysed their own runs; skip it with
``--no-spark-baseline``).

The driver's share at 1,000 runs is measured, not extrapolated (``--driver-runs``, default 1,000): the
sweep's first run is copied (hard links, a marker per copy) into a tree of that many finished runs, and
``rmq-sim sweep`` on it only starts Spark, gathers the tasks' summaries and writes the tables. The task
phase's CPU per run comes from the sweep itself: the process tree's CPU between the driver's note that
Spark has started and its note that every task has ended.

    python scripts/bench/sweep.py                 # 1,000 runs
    python scripts/bench/sweep.py --runs 40       # fewer, extrapolated (and the driver's part at 1,000)
    python scripts/bench/sweep.py --sweep sweeps/broker-policies.toml   # time any sweep file
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from rmqlab.sim.sweep import to_toml

ROOT = Path(__file__).resolve().parents[2]

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

    def now(self) -> float:
        """The total as of now (``total`` is as of the last sample, up to a period ago)."""
        self._sample()
        return self.total()

    def stop(self) -> float:
        self._stop.set()
        self._thread.join()
        return self.total()


# The driver's notes that mark its phases: Spark has started; every task has ended.
SPARK_STARTED = "] spark: "
TASKS_ENDED = "analysed in their"


def _timed(cmd: list[str], mark: str | None = None) -> dict[str, Any]:
    """Run a command; its wall time, its process tree's CPU, and where `mark` first shows in its output
    (``at``, ``cpu_at``), and where the driver's note that Spark started does (``spark_at``,
    ``spark_cpu_at``)."""
    env = dict(os.environ, PYTHONHASHSEED="0")
    env.pop("SPARK_CONF_DIR", None)
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    cpu = TreeCpu(proc.pid).start()
    marks: dict[str, Any] = {}
    lines = []
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.append(line.rstrip())
        if mark is not None and mark in line and "at" not in marks:
            marks.update(at=time.monotonic() - t0, cpu_at=cpu.now())
        if SPARK_STARTED in line and "spark_at" not in marks:
            marks.update(spark_at=time.monotonic() - t0, spark_cpu_at=cpu.now())
    rc = proc.wait()
    total_cpu = cpu.stop()
    return {"exit": rc, "wall_s": time.monotonic() - t0, "cpu_s": total_cpu, **marks, "tail": lines[-6:]}


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


def run_sweep(path: Path, out: Path) -> dict[str, Any]:
    # the driver's note that starts its analysis: every task has ended by then
    got = _timed([sys.executable, "-m", "rmqlab.sim", "sweep", str(path), "--out", str(out)], TASKS_ENDED)
    wall, total_cpu = got["wall_s"], got["cpu_s"]
    markers = [json.loads(p.read_text()) for p in out.glob("*/seed-*/_complete.json")]
    sim_cpu = sum(m["cpu_seconds"] for m in markers)
    analysis_cpu = sum(m.get("analysis_cpu_seconds", 0.0) for m in markers)
    start = got.get("at", wall)
    return {
        "exit": got["exit"],
        "wall_s": round(wall, 1),
        "cpu_s": total_cpu,
        "tasks_wall_s": round(start, 1),
        "tasks_cpu_s": got.get("cpu_at"),
        "tables_wall_s": round(wall - start, 1),
        "tables_cpu_s": round(total_cpu - got.get("cpu_at", total_cpu), 2),
        "spark_start_wall_s": _round(got.get("spark_at"), 1),
        "spark_start_cpu_s": got.get("spark_cpu_at"),
        "simulation_cpu_s_in_tasks": round(sim_cpu, 2),
        "analysis_cpu_s_in_tasks": round(analysis_cpu, 2),
        "runs_analysed_in_tasks": sum(1 for m in markers if "queue_moves" in m),
        "tail": got["tail"],
    }


def driver_only(out: Path, tmp: Path, runs: int) -> dict[str, Any]:
    """rmq-sim sweep over `runs` finished copies of the sweep's first run: Spark's start and the driver's
    gathering and tables, without a simulation."""
    from rmqlab.sim.sweep import COMPLETE, parse_sweep
    from rmqlab.sim.sweep_run import prepare

    first = min(out.glob(f"*/seed-*/{COMPLETE}")).parent
    marker = json.loads((first / COMPLETE).read_text())
    root, path = tmp / "driver", tmp / "driver.toml"
    path.write_text(sweep_file(runs))
    sweep = parse_sweep(path.read_text(), str(path))
    prepare(sweep, root)
    for spec in sweep.runs():
        copy = root / spec.rel
        shutil.copytree(first, copy, copy_function=os.link, ignore=shutil.ignore_patterns(COMPLETE))
        (copy / COMPLETE).write_text(json.dumps({**marker, "run": spec.rel, "seed": spec.seed}))
    got = _timed([sys.executable, "-m", "rmqlab.sim", "sweep", str(path), "--out", str(root)], TASKS_ENDED)
    start = got.get("at", got["wall_s"])
    return {
        "runs": runs,
        "exit": got["exit"],
        "wall_s": round(got["wall_s"], 1),
        "cpu_s": got["cpu_s"],
        "spark_start_wall_s": round(start, 1),
        "spark_start_cpu_s": got.get("cpu_at"),
        "tables_wall_s": round(got["wall_s"] - start, 1),
        "tables_cpu_s": round(got["cpu_s"] - got.get("cpu_at", got["cpu_s"]), 2),
    }


def spark_analysis(out: Path, tmp: Path) -> dict[str, Any]:
    """rmq-analyze on the sweep's output: the Spark analysis of many runs, timed the same way."""
    got = _timed(
        [sys.executable, "-m", "rmqlab.pipeline", str(out), "--out", str(tmp / "spark"), "--no-report"]
    )
    return {"exit": got["exit"], "wall_s": round(got["wall_s"], 1), "cpu_s": got["cpu_s"]}


def baseline(tmp: Path) -> dict[str, Any]:
    exp = tmp / "bench-one.toml"
    exp.write_text(to_toml({**EXPERIMENT, "seed": 1}))
    env = dict(os.environ, PYTHONHASHSEED="0")
    t0 = time.monotonic()
    before = os.times()
    subprocess.run(
        [
            sys.executable,
            "-m",
            "rmqlab.sim",
            "run",
            str(exp),
            "--no-analyze",
            "--quiet",
            "--out",
            str(tmp / "one"),
        ],
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
    p.add_argument(
        "--no-spark-baseline", action="store_true", help="do not time rmq-analyze on the sweep's output"
    )
    p.add_argument(
        "--driver-runs",
        type=int,
        default=1000,
        help="time the driver's part over this many finished copies of a run (0: skip; default 1000)",
    )
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
        load_after = os.getloadavg()
        spark = None if args.no_spark_baseline else spark_analysis(out, tmp)
        driver = driver_only(out, tmp, args.driver_runs) if args.driver_runs and args.sweep is None else None
    result: dict[str, Any] = {
        "benchmark": "rmq-sim sweep, local mode",
        "sweep": str(args.sweep) if args.sweep else "one point: 10 consumers, 600 s RocketMQ time, N seeds",
        "runs": runs,
        "cores": os.cpu_count(),
        "load_average_before": [round(x, 2) for x in load_before],
        "load_average_after_sweep": [round(x, 2) for x in load_after],
        **measured,
        "baseline_one_run_rmq_sim_run": base,
        "baseline_rmq_analyze_of_the_sweep_output": spark,
        "driver_only": driver,
    }
    if runs and measured["exit"] in (0, 1):
        tasks = measured["simulation_cpu_s_in_tasks"] + measured["analysis_cpu_s_in_tasks"]
        result["per_run_cpu_s_in_tasks"] = {
            "simulation": round(measured["simulation_cpu_s_in_tasks"] / runs, 3),
            "analysis": round(measured["analysis_cpu_s_in_tasks"] / runs, 3),
        }
        if spark is not None:
            result["per_run_cpu_s_rmq_analyze"] = round(spark["cpu_s"] / runs, 3)
        if runs < 1000:
            # Spark's start is paid once; the tasks and the tables grow with the runs.
            result["extrapolated_1000_runs_wall_s"] = round(
                (measured["tasks_wall_s"] + measured["tables_wall_s"]) * 1000 / runs, 0
            )
            total_cpu = (measured["tasks_cpu_s"] or 0) + measured["tables_cpu_s"]
            result["extrapolated_1000_runs_cpu_s"] = round(total_cpu * 1000 / runs, 0)
        # what the tasks alone need, spread over every core: a lower bound for the whole sweep
        result["lower_bound_1000_runs_wall_s_idle_cores"] = round(
            tasks * 1000 / runs / (os.cpu_count() or 1), 0
        )
        if driver is not None and driver["exit"] == 0 and measured["tasks_cpu_s"] is not None:
            # the task phase (from the driver's note that Spark started to its note that the tasks ended,
            # in the same run) grows with the runs; the driver-only run is Spark's start and the tables
            # at its number of runs
            started = measured["spark_start_cpu_s"]
            if started is None:  # no note seen: Spark's start as the driver-only run measured it
                started = driver["spark_start_cpu_s"] or 0
            per_run = (measured["tasks_cpu_s"] - started) / runs
            result["task_phase_cpu_s_per_run"] = round(per_run, 3)
            estimate = driver["cpu_s"] + per_run * driver["runs"]
            result[f"estimated_{driver['runs']}_runs_cpu_s"] = round(estimate, 0)
            result[f"estimated_{driver['runs']}_runs_wall_s_idle_cores"] = round(
                estimate / (os.cpu_count() or 1), 0
            )
        result["extrapolation_note"] = (
            "linear in the runs; an upper bound, as Spark's start and warm-up do not grow with the runs. "
            "Under load, the CPU figures are the ones to compare; the lower bound is the tasks' own CPU "
            "(simulation and analysis) on idle cores; the estimate adds the task phase's measured CPU "
            "per run (Spark's start taken out) to the driver-only run at that many runs"
        )
    result["goal"] = "1,000 runs simulated and analysed in under 600 s on 2 cores"
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
