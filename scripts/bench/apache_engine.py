"""Benchmark of the apache-* engines' start: seconds from the first spawn until the name server knows
every broker, and the resident memory (VmRSS) of the name server and each broker, against our own engine
started the same way in the same run (``rmq-namesrv``, then the brokers once it answers). Prints JSON on
stdout. Goal: both brokers registered in under 15 s.

Each round starts every engine once, in turn (so that a busy machine slows them alike), and stops it
before the next. "Registered" is asked of the name server over the native protocol: GET_BROKER_CLUSTER_INFO
for Apache's, and for ours (which serves no cluster info) the route of a topic every broker creates at its
start. Memory is read when all are registered and again after ``--settle`` seconds; the CPU seconds the
members used until registered are given too (wall times on a shared machine are noisy; the load average
is reported).

    python scripts/bench/apache_engine.py                       # 3 rounds, apache-4.9.7, apache-5, ours
    python scripts/bench/apache_engine.py --rounds 1 --engines apache-4.9.7 ours
    python scripts/bench/apache_engine.py --broker-heap-mb 96 --jvm-option=-Xss256k   # a variant
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rmqlab.interop.apache.engine import (
    Cluster,
    Environment,
    Heaps,
    StoreSizes,
    broker_names,
    check_environment,
    plan_cluster,
    route_brokers,
    rss_kb,
    wait_until,
)

GOAL_S = 15.0
OURS = "ours"
BENCH_TOPIC = "BenchTopic"


def cpu_seconds(pid: int) -> float | None:
    """User and system CPU seconds of a live process (/proc/<pid>/stat)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks


def run_apache(
    env: Environment, work: Path, brokers: int, settle: float, heaps: Heaps, extra: list[str], cds: bool
) -> dict:
    plan = plan_cluster(env, work, brokers, heaps=heaps, cds=cds)
    cds_state = "off" if not cds else "written" if any(m.cds and m.cds.dump for m in plan.members) else "used"
    if extra:
        # A variant's options go before the class path, after the engine's own.
        for m in plan.members:
            cp = m.argv.index("-cp")
            m.argv[cp:cp] = extra
    cluster = Cluster(plan)
    try:
        timings = cluster.start(timeout=120)
        pids = {name: r.pid for name, r in cluster.running.items()}
        out: dict[str, Any] = {
            "registered_s": round(timings["all"], 2),
            "namesrv_up_s": round(timings["namesrv"], 2),
            "broker_registered_s": {b.name: round(timings[b.name], 2) for b in plan.brokers},
            "rss_kb_registered": cluster.rss(),
            "cpu_s_registered": {n: cpu_seconds(p) for n, p in pids.items()},
            "class_data_archive": cds_state,
        }
        time.sleep(settle)
        out["rss_kb_settled"] = cluster.rss()
    finally:
        t = time.monotonic()
        codes = cluster.stop()
        stop_s = time.monotonic() - t
    out["stop_s"] = round(stop_s, 2)
    out["exit_codes"] = codes
    out["clean_shutdown"] = all(not (b.dir / "store" / "abort").exists() for b in plan.brokers)
    return out


class Child:
    def __init__(self, argv: list[str], out: Path) -> None:
        self._out = open(out, "w")  # noqa: SIM115 (closed in stop)
        self.out = out
        self.popen = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=self._out, text=True)

    def ready(self, timeout: float = 30.0) -> str:
        assert self.popen.stdout is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            line = self.popen.stdout.readline()
            if line.startswith("READY"):
                return line.split(None, 1)[1].strip()
            if not line and self.popen.poll() is not None:
                break
        raise RuntimeError(f"not ready: {self.out.read_text()[-2000:]}")

    def stop(self) -> int | None:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
        try:
            return self.popen.wait(20)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            return self.popen.wait(5)
        finally:
            self._out.close()


def run_ours(work: Path, brokers: int, settle: float) -> dict:
    """rmq-namesrv with a native port, then the brokers (each creating BENCH_TOPIC) once it answers."""
    work.mkdir(parents=True, exist_ok=True)
    py = sys.executable
    children: dict[str, Child] = {}
    try:
        t0 = time.monotonic()
        ns_argv = [py, "-m", "rmqlab.broker.namesrv_main", "--port", "0", "--remoting-port", "0"]
        ns_argv += ["--log-file", str(work / "namesrv.jsonl")]
        children["namesrv"] = Child(ns_argv, work / "namesrv.err")
        primary, _, native = children["namesrv"].ready().partition(" native=")
        namesrv_up = time.monotonic() - t0
        names = broker_names(brokers)
        for name in names:
            argv = [py, "-m", "rmqlab.broker", "--port", "0", "--remoting-port", "0", "--namesrv", primary]
            argv += ["--broker-name", name, "--node", name, "--create-topic", BENCH_TOPIC]
            argv += ["--log-file", str(work / f"{name}.jsonl")]
            children[name] = Child(argv, work / f"{name}.err")
        wait_until(
            "our brokers in the route",
            lambda: set(names) <= set(route_brokers(native, BENCH_TOPIC, 1.0)),
            60,
            interval=0.05,
        )
        registered = time.monotonic() - t0
        pids = {n: c.popen.pid for n, c in children.items()}
        out: dict[str, Any] = {
            "registered_s": round(registered, 2),
            "namesrv_up_s": round(namesrv_up, 2),
            "rss_kb_registered": {n: rss_kb(p) for n, p in pids.items()},
            "cpu_s_registered": {n: cpu_seconds(p) for n, p in pids.items()},
        }
        time.sleep(settle)
        out["rss_kb_settled"] = {n: rss_kb(p) for n, p in pids.items()}
    finally:
        t = time.monotonic()
        codes = {n: c.stop() for n, c in reversed(children.items())}
        stop_s = time.monotonic() - t
    out["stop_s"] = round(stop_s, 2)
    out["exit_codes"] = codes
    return out


def summary(runs: list[dict]) -> dict:
    """Medians over the rounds (and the slowest start)."""
    reg = [r["registered_s"] for r in runs]
    out: dict[str, Any] = {
        "registered_s_median": round(statistics.median(reg), 2),
        "registered_s_max": max(reg),
    }
    for key in ("rss_kb_registered", "rss_kb_settled"):
        members = runs[0][key]
        out[key + "_median"] = {
            m: int(statistics.median(r[key][m] for r in runs if r[key].get(m) is not None)) for m in members
        }
    out["goal_met"] = max(reg) < GOAL_S
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--brokers", type=int, default=2)
    p.add_argument("--engines", nargs="+", default=["apache-4.9.7", "apache-5", OURS])
    p.add_argument("--settle", type=float, default=10.0, help="seconds before the second memory reading")
    p.add_argument("--broker-heap-mb", type=int, default=Heaps().broker_mb)
    p.add_argument("--namesrv-heap-mb", type=int, default=Heaps().namesrv_mb)
    p.add_argument("--jvm-option", action="append", default=[], help="an extra JVM option (a variant)")
    p.add_argument("--no-cds", action="store_true", help="no class-data archives")
    p.add_argument(
        "--warmup",
        type=int,
        default=1,
        help="untimed starts of each engine first (the page cache, and the class-data archives written)",
    )
    p.add_argument("--workdir", default=None, help="keep the runs' folders here (default: a temp dir)")
    args = p.parse_args()

    heaps = Heaps(args.namesrv_heap_mb, args.broker_heap_mb)
    envs = {e: check_environment(e) for e in args.engines if e != OURS}
    work = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="apache-engine-bench-"))
    results: dict[str, list[dict]] = {e: [] for e in args.engines}
    load_start = os.getloadavg()
    try:
        for rnd in range(-args.warmup, args.rounds):
            for engine in args.engines:
                where = work / f"{engine}-{rnd}"
                if engine == OURS:
                    run = run_ours(where, args.brokers, args.settle)
                else:
                    run = run_apache(
                        envs[engine],
                        where,
                        args.brokers,
                        args.settle,
                        heaps,
                        args.jvm_option,
                        not args.no_cds,
                    )
                run["loadavg_1m"] = round(os.getloadavg()[0], 2)
                label = f"round {rnd + 1}" if rnd >= 0 else "warm-up"
                print(f"{label} {engine}: registered in {run['registered_s']} s", file=sys.stderr)
                if rnd >= 0:
                    results[engine].append(run)
    finally:
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)
    some_env = next(iter(envs.values()), None)
    report = {
        "goal_registered_s": GOAL_S,
        "brokers": args.brokers,
        "rounds": args.rounds,
        "machine": {
            "cpus": os.cpu_count(),
            "loadavg_start": [round(x, 2) for x in load_start],
            "loadavg_end": [round(x, 2) for x in os.getloadavg()],
            "java": some_env.java if some_env else None,
            "java_major": some_env.java_major if some_env else None,
        },
        "settings": {
            "heaps_mb": dataclasses.asdict(heaps),
            "store_sizes": dataclasses.asdict(StoreSizes()),
            "extra_jvm_options": args.jvm_option,
            "class_data_archives": not args.no_cds,
            "warmup_starts": args.warmup,
        },
        "engines": {
            e: {
                "version": envs[e].engine.version if e in envs else "rmqlab",
                "summary": summary(runs),
                "runs": runs,
            }
            for e, runs in results.items()
        },
    }
    json.dump(report, sys.stdout, indent=2, sort_keys=True)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
