"""Benchmark of what the emulator saves: one experiment run by ``rmq-chaos run`` on our engine and on
Apache's (``[cluster] engine = "apache-4.9.7"``, and ``"apache-5"``), with the same clients, in the same
benchmark run. Prints JSON on stdout.

Per engine and round it measures, for the name server and the brokers:

* start-up: seconds from the name server's ``process_spawned`` to the last broker's ``process_ready`` in
  the run's ``chaos.jsonl`` (a broker of ours is ready when it serves; an Apache broker once the name
  server routes the experiment's topics to it, so both include creating the topics);
* resident memory (VmRSS, /proc/PID/status): the largest reading over the run, and the last one;
* CPU seconds (utime + stime, /proc/PID/stat) used from the spawn to the last reading before the member
  stopped, i.e. over the whole run including its start.

A sampler thread reads /proc every ``--interval`` seconds, so the last fraction of an interval before a
member exits is not counted (the CPU of a stopping JVM is undercounted by at most that). An Apache member
runs under a small Python launcher (``python -m rmqlab.interop.apache.member``); the JVM is counted as the
member and the launcher apart (``launcher_*``), since running RocketMQ needs only the JVM. The consumers are
measured the same way (a Java consumer's resident memory is one of the issue's goals). The workload on
Apache's engine is sent by Apache's Go producer, on ours by the lab's producer.

    python scripts/bench/engine_cost.py                        # java-kill-one-of-four, 2 rounds, 3 engines
    python scripts/bench/engine_cost.py --rounds 1 --engines emulator apache-4.9.7
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rmqlab.chaos.__main__ import resolve
from rmqlab.interop.apache.engine import rss_kb

EMULATOR = "emulator"
SERVER_ROLES = ("namesrv", "broker")
TICKS = os.sysconf("SC_CLK_TCK")


def proc_stat(pid: int) -> tuple[int, str, float] | None:
    """(parent pid, command name, CPU seconds) of a live process."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    head, _, rest = text.rpartition(")")
    comm = head.split("(", 1)[1]
    fields = rest.split()
    return int(fields[1]), comm, (int(fields[11]) + int(fields[12])) / TICKS


@dataclass
class Reading:
    """What the sampler saw of one process."""

    node: str
    role: str
    comm: str
    launcher: bool  # the Python launcher of an Apache member (its JVM is the member)
    cpu_s: float = 0.0
    rss_kb_max: int = 0
    rss_kb_last: int = 0


@dataclass
class Sampler:
    """Reads the run's ``chaos.jsonl`` for the processes the supervisor spawned and /proc for their
    trees, every ``interval`` seconds, until stopped."""

    run_dir: Path
    interval: float
    readings: dict[int, Reading] = field(default_factory=dict)
    spawned: dict[int, tuple[str, str]] = field(default_factory=dict)  # pid -> (node, role)
    _offset: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)

    def _read_spawns(self) -> None:
        path = self.run_dir / "chaos.jsonl"
        try:
            with open(path, encoding="utf-8") as f:
                f.seek(self._offset)
                chunk = f.read()
        except OSError:
            return
        complete = chunk[: chunk.rfind("\n") + 1]
        self._offset += len(complete.encode("utf-8"))
        for line in complete.splitlines():
            if '"process_spawned"' in line:
                r = json.loads(line)
                self.spawned[int(r["pid"])] = (r["target"], r["target_role"])

    def sample(self) -> None:
        self._read_spawns()
        if not self.spawned:
            return
        children: dict[int, list[int]] = {}
        stats: dict[int, tuple[int, str, float]] = {}
        for entry in os.scandir("/proc"):
            if entry.name.isdigit():
                st = proc_stat(int(entry.name))
                if st is not None:
                    stats[int(entry.name)] = st
                    children.setdefault(st[0], []).append(int(entry.name))
        for root, (node, role) in self.spawned.items():
            if root not in stats:
                continue
            tree, todo = [], [root]
            while todo:
                pid = todo.pop()
                tree.append(pid)
                todo.extend(children.get(pid, ()))
            has_jvm = any(stats[p][1] == "java" for p in tree if p in stats)
            for pid in tree:
                if pid not in stats:
                    continue
                _ppid, comm, cpu = stats[pid]
                rss = rss_kb(pid)
                if rss is None:
                    continue
                r = self.readings.get(pid)
                if r is None:
                    r = self.readings[pid] = Reading(node, role, comm, launcher=False)
                r.comm = comm
                # Sticky: the JVM may exit before its launcher, or not be started yet.
                r.launcher = r.launcher or (role in SERVER_ROLES and has_jvm and comm != "java")
                r.cpu_s = cpu
                r.rss_kb_max = max(r.rss_kb_max, rss)
                r.rss_kb_last = rss

    def run(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def stop(self) -> None:
        self._stop.set()


def with_engine_line(text: str, engine: str) -> str:
    """The experiment file's text with ``[cluster] engine`` set to ``engine``."""
    text = re.sub(r"(?m)^engine\s*=.*\n", "", text)
    if re.search(r"(?m)^\[cluster\]\s*$", text):
        return re.sub(r"(?m)^\[cluster\]\s*$", f'[cluster]\nengine = "{engine}"', text, count=1)
    return text.rstrip("\n") + f'\n\n[cluster]\nengine = "{engine}"\n'


def startup_s(run_dir: Path) -> float | None:
    """From the name server's first spawn to the last first-ready of a broker."""
    first: dict[tuple[str, str], int] = {}
    for line in (run_dir / "chaos.jsonl").read_text(encoding="utf-8").splitlines():
        r = json.loads(line)
        if r.get("event") in ("process_spawned", "process_ready") and r.get("target_role") in SERVER_ROLES:
            first.setdefault((r["event"], r["target"]), r["ts_ms"])
    spawned_ns = [ts for (ev, node), ts in first.items() if ev == "process_spawned" and node == "namesrv"]
    ready = [ts for (ev, node), ts in first.items() if ev == "process_ready" and node != "namesrv"]
    if not spawned_ns or not ready:
        return None
    return round((max(ready) - min(spawned_ns)) / 1000, 2)


def one_run(source_text: str, engine: str, work: Path, interval: float) -> dict[str, Any]:
    exp_file = work / f"{engine}.toml"
    exp_file.write_text(with_engine_line(source_text, engine), encoding="utf-8")
    run_dir = work / f"{engine}-run"
    cmd = [sys.executable, "-m", "rmqlab.chaos", "run", str(exp_file), "--out", str(run_dir), "-q"]
    cmd += ["--no-analyze"]
    sampler = Sampler(run_dir, interval)
    thread = threading.Thread(target=sampler.run, daemon=True)
    t0 = time.monotonic()
    thread.start()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        stdout, stderr = proc.communicate()
    except BaseException:
        # Interrupted: the run stops its processes on SIGTERM; it must not outlive the benchmark.
        proc.terminate()
        proc.wait(120)
        raise
    finally:
        sampler.stop()
        thread.join()
    wall = time.monotonic() - t0
    if proc.returncode not in (0, 1):
        raise RuntimeError(f"{engine}: rmq-chaos run exited {proc.returncode}:\n{stderr[-3000:]}")
    members: dict[str, dict[str, Any]] = {}
    for r in sampler.readings.values():
        m = members.setdefault(
            r.node,
            {"role": r.role, "rss_kb_max": 0, "cpu_s": 0.0, "launcher_rss_kb_max": 0, "launcher_cpu_s": 0.0},
        )
        prefix = "launcher_" if r.launcher else ""
        m[prefix + "rss_kb_max"] += r.rss_kb_max  # one process per node and kind (restarts aside)
        m[prefix + "cpu_s"] = round(m[prefix + "cpu_s"] + r.cpu_s, 2)
        if not r.launcher:
            m.setdefault("process", r.comm)
    servers = {n: m for n, m in members.items() if m["role"] in SERVER_ROLES}
    return {
        "exit_code": proc.returncode,
        "verdict_line": next((ln for ln in stdout.splitlines() if ln.startswith("verdict")), None),
        "wall_s": round(wall, 1),
        "startup_s": startup_s(run_dir),
        "servers_rss_kb_max": sum(m["rss_kb_max"] for m in servers.values()),
        "servers_cpu_s": round(sum(m["cpu_s"] for m in servers.values()), 2),
        "members": dict(sorted(members.items())),
    }


def summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    def med(key: str) -> float:
        return round(statistics.median(r[key] for r in runs if r[key] is not None), 2)

    consumers = [
        m["rss_kb_max"]
        for r in runs
        for m in r["members"].values()
        if m["role"] == "consumer" and m.get("process") == "java"
    ]
    return {
        "startup_s_median": med("startup_s"),
        "servers_rss_mb_median": round(med("servers_rss_kb_max") / 1024, 1),
        "servers_cpu_s_median": med("servers_cpu_s"),
        "java_consumer_rss_mb_max": round(max(consumers) / 1024, 1) if consumers else None,
    }


def _interrupt(_signum: int, _frame: object) -> None:
    raise KeyboardInterrupt


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("experiment", nargs="?", default="java-kill-one-of-four", help="a shipped name or a file")
    p.add_argument("--engines", nargs="+", default=[EMULATOR, "apache-4.9.7", "apache-5"])
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--interval", type=float, default=0.5, help="seconds between /proc readings")
    p.add_argument("--workdir", default=None, help="keep the runs here (default: a temp dir, removed)")
    args = p.parse_args()

    # SIGTERM unwinds like ^C: the running experiment is stopped and the temp dir removed.
    signal.signal(signal.SIGTERM, _interrupt)
    exp = resolve(args.experiment)
    work = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="engine-cost-"))
    results: dict[str, list[dict[str, Any]]] = {e: [] for e in args.engines}
    load_start = os.getloadavg()
    try:
        for rnd in range(args.rounds):
            for engine in args.engines:  # engines in turn, so a busy machine slows them alike
                where = work / f"round{rnd + 1}"
                where.mkdir(parents=True, exist_ok=True)
                run = one_run(exp.text, engine, where, args.interval)
                run["loadavg_1m"] = round(os.getloadavg()[0], 2)
                results[engine].append(run)
                print(
                    f"round {rnd + 1} {engine}: start-up {run['startup_s']} s, servers "
                    f"{run['servers_rss_kb_max'] // 1024} MB, {run['servers_cpu_s']} CPU s",
                    file=sys.stderr,
                )
    finally:
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)
    summaries = {e: summary(r) for e, r in results.items()}
    base = summaries.get(EMULATOR)
    ratios = {}
    if base:
        for e, s in summaries.items():
            if e != EMULATOR:
                ratios[e] = {
                    k: round(s[k] / base[k], 1)
                    for k in ("startup_s_median", "servers_rss_mb_median", "servers_cpu_s_median")
                    if base[k]
                }
    report = {
        "experiment": exp.name,
        "rounds": args.rounds,
        "interval_s": args.interval,
        "machine": {
            "cpus": os.cpu_count(),
            "loadavg_start": [round(x, 2) for x in load_start],
            "loadavg_end": [round(x, 2) for x in os.getloadavg()],
        },
        "baseline": EMULATOR,
        "summary": summaries,
        "ratio_to_emulator": ratios,
        "engines": results,
    }
    json.dump(report, sys.stdout, indent=2, sort_keys=True)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
