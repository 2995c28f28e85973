"""Benchmark of rmq-sim: simulated RocketMQ seconds per wall second, events per wall second and peak
memory for one group of 10, 100 and 1,000 consumers (10,000 with --huge) on 4 queues per consumer, with
a steady workload and a consumer killed and one restarted every minute. Prints JSON on stdout.

Baseline, in the same run: the 10-consumer experiment as real processes (rmq-chaos, time scale 0.05)
and the very same file simulated, both in RocketMQ seconds per wall second.

    python scripts/bench/sim.py                        # 10, 100, 1000 consumers, 600 s of RocketMQ time
    python scripts/bench/sim.py --sizes 100 --seconds 3600
    python scripts/bench/sim.py --huge --no-baseline --limit 1800   # adds 10,000 consumers, 30 min cap
    python scripts/bench/sim.py --sizes 1000 --goal --no-baseline    # the goal case: an hour of 1,000
    python scripts/bench/sim.py --sizes 100 --no-baseline --wire bytes   # frames through the codec
    python scripts/bench/sim.py --sizes 1000 --seconds 120 --steady 600 --no-baseline  # steady state

A simulation past ``--limit`` wall seconds is killed and reported with its last progress line. Each
result carries the load average before and after it: wall time on a shared machine says little, CPU
seconds more.

Each simulation runs in its own process (``python -m rmqlab.sim run``), so its CPU time and peak RSS are its
own. The goals (not asserted anywhere): an hour of 1,000 consumers in under 2 minutes of wall time, and a
100-consumer experiment at least 1,000 times faster than real time.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def experiment(consumers: int, seconds: float, time_scale: float = 1.0, rate: float | None = None) -> str:
    """One group, 4 queues per consumer over two brokers, kill and restart every minute."""
    queues = 4 * consumers
    queues += queues % 2
    rate = rate if rate is not None else max(5.0, consumers / 10)
    count = int(rate * seconds * 0.9) or 1  # rate: messages per RocketMQ second
    return f"""\
name = "bench-{consumers}"
question = "benchmark"
time_scale = {time_scale}
duration = {seconds}
seed = 1
drain_timeout = {max(120.0, seconds / 4)}

[cluster]
brokers = 2

[[topics]]
name = "BenchTopic"
queues = {queues}

[[consumers]]
group = "GID_bench"
topic = "BenchTopic"
count = {consumers}
consume_ms = 1

[workload]
rate = {rate / time_scale if time_scale != 1 else rate}
count = {count}

[[nemesis]]
action = "kill"
target = "consumer:random"
every = 60

[[nemesis]]
action = "restart"
target = "consumer:next"
every = 60
from = 30
"""


def _events(run_dir: Path) -> int:
    n = 0
    for f in run_dir.rglob("*.jsonl"):
        with open(f, "rb") as fh:
            n += sum(1 for _ in fh)
    return n


def _child(cmd: list[str], env: dict[str, str], cwd: Path, limit_s: float | None = None) -> dict[str, Any]:
    """Run a command; its wall time, CPU seconds and peak RSS (from wait4, this child only). Past
    ``limit_s`` of wall time it is killed, and ``"killed_at_limit"`` says so."""
    t0 = time.monotonic()
    killed = False
    with open(cwd / "output.txt", "wb") as out:
        p = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT)
        while True:
            pid, status, usage = os.wait4(p.pid, os.WNOHANG)
            if pid:
                break
            if limit_s is not None and time.monotonic() - t0 > limit_s and not killed:
                p.kill()
                killed = True
            time.sleep(0.2)
    p.returncode = os.waitstatus_to_exitcode(status)
    return {
        "rc": p.returncode,
        "killed_at_limit": killed,
        "wall_s": round(time.monotonic() - t0, 2),
        "cpu_s": round(usage.ru_utime + usage.ru_stime, 2),
        "peak_rss_mb": round(usage.ru_maxrss / 1024, 1),
    }


def _no_run(r: dict[str, Any], d: Path) -> dict[str, Any] | None:
    """The result of a command that ended without a run (the experiment refused, a crash): its exit
    code and the end of its output, instead of a missing manifest's traceback."""
    if (d / "run" / "manifest.json").exists():
        return None
    lines = (d / "output.txt").read_text(errors="replace").strip().splitlines()
    return {**r, "error": "the command ended without a run directory", "output_tail": lines[-5:]}


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


WIRE: list[str] = []  # --wire: how frames cross the simulator's network (default: its own default)


def simulate(text: str, work: Path, label: str, limit_s: float | None = None) -> dict[str, Any]:
    d = work / label
    d.mkdir(parents=True)
    (d / "exp.toml").write_text(text)
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    load = _load()
    cmd = [sys.executable, "-m", "rmqlab.sim", "run", "exp.toml", "--out", "run", "--no-analyze", *WIRE]
    r = _child(cmd, env, d, limit_s)
    r["load_avg_before_after"] = [load, _load()]
    if r["killed_at_limit"]:
        # how far it got: the last progress line, and the events written so far
        lines = (d / "output.txt").read_text(errors="replace").strip().splitlines()
        return {**r, "last_progress": lines[-1] if lines else "", "events_so_far": _events(d / "run")}
    if (failed := _no_run(r, d)) is not None:
        return failed
    manifest = json.loads((d / "run" / "manifest.json").read_text())
    sim_ms = manifest["ended_ms"] - manifest["started_ms"]
    scale = manifest["time_scale"]
    events = _events(d / "run")
    rocketmq_s = sim_ms / 1000 / scale
    return {
        **r,
        "rocketmq_seconds": round(rocketmq_s, 1),
        "rocketmq_s_per_wall_s": round(rocketmq_s / r["wall_s"], 1),
        "rocketmq_s_per_cpu_s": round(rocketmq_s / r["cpu_s"], 1) if r["cpu_s"] else None,
        "events": events,
        "events_per_wall_s": round(events / r["wall_s"]),
        "events_per_cpu_s": round(events / r["cpu_s"]) if r["cpu_s"] else None,
        "drained": manifest["drained"],
        "errors": manifest["errors"],
    }


def real(text: str, work: Path) -> dict[str, Any]:
    d = work / "real"
    d.mkdir(parents=True)
    (d / "exp.toml").write_text(text)
    load = _load()
    r = _child(
        [sys.executable, "-m", "rmqlab.chaos", "run", "exp.toml", "--out", str(d / "run"), "--no-analyze"],
        dict(os.environ),
        d,
    )
    r["load_avg_before_after"] = [load, _load()]
    if (failed := _no_run(r, d)) is not None:
        return failed
    manifest = json.loads((d / "run" / "manifest.json").read_text())
    scale = manifest["time_scale"]
    rocketmq_s = (manifest["ended_ms"] - manifest["started_ms"]) / 1000 / scale
    events = _events(d / "run")
    return {
        **r,
        "note": "cpu_s includes the roles' processes (the supervisor reaps them); peak_rss_mb is the largest",
        "rocketmq_seconds": round(rocketmq_s, 1),
        "rocketmq_s_per_wall_s": round(rocketmq_s / r["wall_s"], 1),
        "rocketmq_s_per_cpu_s": round(rocketmq_s / r["cpu_s"], 1) if r["cpu_s"] else None,
        "events": events,
        "events_per_wall_s": round(events / r["wall_s"]),
        "drained": manifest["drained"],
    }


def steady(n: int, long_s: float, short: dict[str, Any], work: Path, limit: float | None) -> dict[str, Any]:
    """The longer run of ``n`` consumers, and the CPU its extra minutes cost: both runs start and end
    alike (the registrations, then the teardown), so the difference is the steady state's."""
    longer = simulate(experiment(n, long_s), work, f"n{n}-steady", limit)
    print(f"{n} consumers, {long_s:g} s: {longer}", file=sys.stderr, flush=True)
    result: dict[str, Any] = {"run": longer}
    if all("error" not in r and not r.get("killed_at_limit") for r in (short, longer)):
        minutes = (longer["rocketmq_seconds"] - short["rocketmq_seconds"]) / 60
        result["cpu_s_per_rocketmq_minute"] = round((longer["cpu_s"] - short["cpu_s"]) / minutes, 2)
    return result


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", type=int, nargs="+", default=[10, 100, 1000], help="group sizes")
    p.add_argument("--huge", action="store_true", help="also 10,000 consumers")
    p.add_argument("--seconds", type=float, default=600, help="RocketMQ seconds per simulation (default 600)")
    p.add_argument("--no-baseline", action="store_true", help="skip the real-process baseline")
    p.add_argument(
        "--goal",
        action="store_true",
        help="also the goal case itself: 1,000 consumers for 3,600 RocketMQ seconds (long)",
    )
    p.add_argument(
        "--steady",
        type=float,
        default=None,
        metavar="SECONDS",
        help="also run each size for this many RocketMQ seconds and report the CPU seconds per RocketMQ "
        "minute between the two runs: the steady state, without the start-up and the teardown",
    )
    p.add_argument("--limit", type=float, default=None, help="kill a simulation after this many wall seconds")
    p.add_argument("--workdir", default=None, help="keep the runs here (default: a temporary folder)")
    p.add_argument(
        "--wire",
        choices=("objects", "bytes"),
        default=None,
        help="frames as command objects or through the msgpack codec (rmq-sim run --wire)",
    )
    args = p.parse_args()
    if args.wire:
        WIRE[:] = ["--wire", args.wire]
    sizes = sorted(set(args.sizes + ([10_000] if args.huge else [])))
    work = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="rmq-bench-sim-"))
    work.mkdir(parents=True, exist_ok=True)
    os.chdir(ROOT)
    out: dict[str, Any] = {
        "benchmark": "sim",
        "seconds": args.seconds,
        "cpus": os.cpu_count(),
        "wire": args.wire or "default",
        "sizes": {},
    }
    if not args.no_baseline:
        small = experiment(10, 600, time_scale=0.05, rate=5)
        out["baseline"] = {
            "real_processes": real(small, work),
            "simulated": simulate(small, work, "baseline-sim"),
        }
        b = out["baseline"]
        for unit in ("wall", "cpu"):
            key = f"rocketmq_s_per_{unit}_s"
            b[f"sim_over_real_per_{unit}_s"] = round(b["simulated"][key] / b["real_processes"][key], 1)
    if args.steady is not None and args.steady <= args.seconds:
        p.error(f"--steady must be longer than --seconds ({args.seconds:g})")
    for n in sizes:
        out["sizes"][str(n)] = simulate(experiment(n, args.seconds), work, f"n{n}", args.limit)
        print(f"{n} consumers: {out['sizes'][str(n)]}", file=sys.stderr, flush=True)
        if args.steady is not None:
            short = out["sizes"][str(n)]
            short["steady"] = steady(n, args.steady, short, work, args.limit)
    if args.goal:
        goal = out["goal_hour_1000"] = simulate(experiment(1000, 3600), work, "goal", args.limit)
        print(f"goal case: {goal}", file=sys.stderr, flush=True)
        if not goal["killed_at_limit"] and "error" not in goal:
            out["goal_hour_1000_under_120s_wall"] = goal["wall_s"] < 120
            out["goal_hour_1000_under_120s_cpu"] = goal["cpu_s"] < 120
    # Wall time on a shared machine depends on the neighbours; CPU seconds are reported beside it.
    hundred = out["sizes"].get("100")
    if hundred and not hundred["killed_at_limit"] and "error" not in hundred:
        out["goal_100_consumers_1000x"] = hundred["rocketmq_s_per_wall_s"] >= 1000
        out["goal_100_consumers_1000x_per_cpu_s"] = (hundred["rocketmq_s_per_cpu_s"] or 0) >= 1000
    thousand = out["sizes"].get("1000")
    if thousand and not thousand["killed_at_limit"] and "error" not in thousand:
        # an hour at the measured rate (the experiment may be shorter than an hour)
        out["projected_hour_1000_consumers_wall_s"] = round(3600 / thousand["rocketmq_s_per_wall_s"], 1)
        out["goal_hour_1000_under_120s"] = out["projected_hour_1000_consumers_wall_s"] < 120
        if thousand["rocketmq_s_per_cpu_s"]:
            out["projected_hour_1000_consumers_cpu_s"] = round(3600 / thousand["rocketmq_s_per_cpu_s"], 1)
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
