"""``rmq-sim sweep``'s driver: every (point, seed) simulated and analysed as a Spark task, then the runs'
summaries gathered (a run without one analysed by Spark in the same application) and the sweep's
tables and report written.

Runs land in OUT/POINT/seed-N. A run is finished when its directory holds the completion marker
(``sim.sweep.COMPLETE``); an interrupted sweep started again with the same file and output folder runs
only the others. The driver shows progress from those markers (the tasks write them where the driver
can see them: local mode, or a cluster sharing the output folder).
"""

from __future__ import annotations

import gc
import json
import os
import sys
import threading
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, TextIO

from rmqlab import cli
from rmqlab.sim.sweep import COMPLETE, SWEEP_JSON, RunSpec, Sweep, read_marker, run_task

# The sweep's JVM only schedules tasks, passes each task's few bytes and writes two small tables: the
# simulations and their analysis run in Python. C1 alone compiles that at a fraction of C2's cost, and one
# garbage collector thread is enough. Measured here (local mode, CPU seconds of the process tree):
# Spark's start 10.6-10.7 -> 6.2-6.5, the idle JVM 0.006-0.02 -> 0.005 a second, the first Parquet
# table 5.6 -> 3.1-3.6.
SWEEP_JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
SWEEP_SPARK_CONF = {
    "spark.driver.extraJavaOptions": SWEEP_JVM_OPTIONS,
    "spark.executor.extraJavaOptions": SWEEP_JVM_OPTIONS,  # a cluster's executors do the same little
}


class SweepMismatch(Exception):
    """The output folder holds another sweep's runs."""


@dataclass
class SweepResult:
    runs: int = 0
    resumed: int = 0  # finished before this invocation
    ran: int = 0
    failed_runs: list[dict[str, Any]] = field(default_factory=list)  # crashed / error / verdict fail
    outcomes: dict[str, dict[str, Any]] = field(default_factory=dict)  # by run rel
    simulate_wall_s: float = 0.0
    analyse_wall_s: float = 0.0


def _identity(d: dict[str, Any]) -> dict[str, Any]:
    """What must match for a folder to be resumed: the grid and the seeds, not where the file lives."""
    return {k: v for k, v in d.items() if k not in ("source", "question", "base")}


def prepare(sweep: Sweep, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    path = out / SWEEP_JSON
    mine = sweep.to_dict()
    if path.is_file():
        try:
            theirs = json.loads(path.read_text(encoding="utf-8"))
        except ValueError as e:
            raise SweepMismatch(f"{path} is not valid JSON ({e})") from None
        if not isinstance(theirs, dict) or _identity(theirs) != _identity(mine):
            raise SweepMismatch(
                f"{out} holds the runs of another sweep (its {SWEEP_JSON} differs from this file's grid); "
                "choose another --out or remove the folder"
            )
    elif any(out.iterdir()):
        raise SweepMismatch(f"{out} is not empty and holds no {SWEEP_JSON}; choose another --out")
    path.write_text(json.dumps(mine, indent=2) + "\n", encoding="utf-8")


def _cost(spec: RunSpec, sweep: Sweep) -> float:
    """A rough cost, to start the longest runs first (so that the last wave is short)."""
    import tomllib

    doc = tomllib.loads(spec.text)
    consumers = sum(int(c.get("count", 1)) for c in doc.get("consumers", []))
    return float(doc.get("duration", 0)) * (1 + consumers)


class Progress(cli.Progress):
    """Runs done, failed, and the time left, from the completion markers."""

    def __init__(self, stream: TextIO, total: int, resumed: int, failed_before: int, enabled: bool) -> None:
        super().__init__(stream, enabled=enabled, prefix="rmq-sim sweep")
        self.total = total
        self.resumed, self.failed_before = resumed, failed_before
        self.t0 = time.monotonic()
        self.last: tuple[int, int] | None = None
        self.last_print = 0.0

    def update(
        self, done: int, failed: int, force: bool = False, cost_done: float = 0, cost_left: float = 0
    ) -> None:
        """`cost_done`/`cost_left`: the estimated cost of this invocation's finished and unfinished runs,
        so that the time left counts the cheap runs that come last as cheap."""
        now = time.monotonic()
        if (done, failed) == self.last and (force or now - self.last_print < 30):
            return
        if not force and now - self.last_print < 2:
            return
        self.last, self.last_print = (done, failed), now
        elapsed = now - self.t0
        left = self.total - done
        eta = f", about {_duration(elapsed / cost_done * cost_left)} left" if cost_done > 0 and left else ""
        self.note(
            f"{done}/{self.total} runs done ({failed} failed"
            + (f", {self.resumed} from before" if self.resumed else "")
            + f"), {_duration(elapsed)} elapsed{eta}"
        )


def _duration(s: float) -> str:
    return f"{s:.0f} s" if s < 120 else f"{s / 60:.1f} min"


def _failed(outcome: dict[str, Any] | None) -> bool:
    return outcome is not None and (outcome.get("status") != "ok" or outcome.get("quick_verdict") != "ok")


def task_batches(ordered: list[RunSpec], costs: dict[str, float], slots: int) -> list[list[RunSpec]]:
    """The runs, costliest first, cut into Spark tasks. Each task costs Spark tens of ms of CPU in local
    mode (400 empty tasks took 14 CPU s on 2 loaded cores, the same 400 items in 2 tasks 0.1 s), so runs
    share tasks: each takes runs in order until it holds a (2 x slots)th of the cost not yet given out.
    The first tasks are long, the last ones hold one run each: the last wave stays short and no core
    waits at the end for one long task."""
    batches: list[list[RunSpec]] = []
    left = sum(costs[s.rel] for s in ordered)
    i = 0
    while i < len(ordered):
        share = left / (2 * max(1, slots))
        batch, cost = [ordered[i]], costs[ordered[i].rel]
        i += 1
        while i < len(ordered) and cost + costs[ordered[i].rel] <= share:
            cost += costs[ordered[i].rel]
            batch.append(ordered[i])
            i += 1
        batches.append(batch)
        left -= cost
    return batches


def run_batch(specs: list[RunSpec], out_dir: str) -> list[dict[str, Any]]:
    """One Spark task: its runs one after the other (each writes its own marker, so progress and resume
    still go run by run).

    Before each run, what the worker holds (its modules, PySpark's, the outcomes so far) is collected
    once and frozen out of the garbage collector's sight, so that the collection at the run's end
    (``run_task``) walks the run's own objects only: 30-40 ms of collector CPU less per run, measured."""
    outcomes = []
    try:
        for spec in specs:
            gc.collect()  # the last run's leftovers first: frozen, a cycle would never be collected
            gc.freeze()
            outcomes.append(run_task(spec, out_dir))
    finally:
        gc.unfreeze()
    return outcomes


def simulate(
    spark: Any, sweep: Sweep, out: Path, progress: Progress, specs: list[RunSpec], poll_s: float = 1.0
) -> dict[str, dict[str, Any]]:
    """Run the specs as Spark tasks (``task_batches``: the costliest first); outcomes by run."""
    sc = spark.sparkContext
    progress.t0 = time.monotonic()  # the time left counts from the first task, not the Spark start
    costs = {s.rel: _cost(s, sweep) for s in specs}
    ordered = sorted(specs, key=lambda s: -costs[s.rel])
    batches = task_batches(ordered, costs, sc.defaultParallelism)
    task = partial(run_batch, out_dir=str(out.resolve()))
    outcomes: dict[str, dict[str, Any]] = {}
    seen: dict[str, dict[str, Any]] = {}  # markers of this invocation's runs
    error: list[BaseException] = []

    def collect() -> None:
        try:
            sc.setJobDescription(
                f"rmq-sim sweep {sweep.name}: {len(ordered)} simulations in {len(batches)} tasks"
            )
            for o in sc.parallelize(batches, len(batches)).flatMap(task).collect():
                outcomes[o["run"]] = o
        except BaseException as e:  # reported by the driver's thread
            error.append(e)

    worker = threading.Thread(target=collect, name="sweep-collect", daemon=True)
    worker.start()
    try:
        while worker.is_alive():
            # each unfinished run's marker is looked for (about 10 us when absent): with a thousand
            # runs left, every 5 s
            worker.join(max(poll_s, (len(specs) - len(seen)) / 200))
            # a marker, once written, does not change: only the unfinished runs' are read again
            for s in specs:
                if s.rel not in seen and (marker := read_marker(out / s.rel)) is not None:
                    seen[s.rel] = marker
            done, failed = len(seen), sum(map(_failed, seen.values()))
            cost_done = sum(costs[rel] for rel in seen)
            progress.update(
                progress.resumed + done,
                progress.failed_before + failed,
                cost_done=cost_done,
                cost_left=sum(costs.values()) - cost_done,
            )
    except KeyboardInterrupt:
        sc.cancelAllJobs()
        worker.join(30)
        raise
    if error:
        raise error[0]
    return outcomes


def run_sweep(
    sweep: Sweep,
    out: Path,
    *,
    master: str | None = None,
    stream: TextIO | None = None,
    show_progress: bool = True,
) -> SweepResult:
    """Simulate what is not finished yet, analyse every run, write the sweep's tables and report."""
    from rmqlab.pipeline.session import start_spark

    stream = stream if stream is not None else sys.stderr
    prepare(sweep, out)
    specs = sweep.runs()
    before = {s.rel: m for s in specs if (m := read_marker(out / s.rel)) is not None}
    pending = [s for s in specs if s.rel not in before]
    result = SweepResult(runs=len(specs), resumed=len(before), ran=len(pending))
    progress = Progress(stream, len(specs), len(before), sum(map(_failed, before.values())), show_progress)
    progress.note(
        f"{sweep.name}: {len(sweep.points)} point(s) x {len(sweep.seeds)} seed(s) = {len(specs)} runs"
        + (f"; {len(before)} finished before, {len(pending)} to run" if before else "")
        + f"; output {out}"
    )
    # Simulations are reproducible only with the string hash fixed (DESIGN.md); Spark hands the driver's
    # PYTHONHASHSEED to its Python workers.
    os.environ["PYTHONHASHSEED"] = "0"
    t0 = time.monotonic()
    handle = start_spark(master, app_name=f"rmq-sim-sweep-{sweep.name}", conf=SWEEP_SPARK_CONF)
    try:
        progress.note(f"spark: {handle.spark.sparkContext.master}")
        new = simulate(handle.spark, sweep, out, progress, pending) if pending else {}
        result.outcomes = {**before, **new}
        progress.update(len(specs), sum(_failed(o) for o in result.outcomes.values()), force=True)
        result.simulate_wall_s = time.monotonic() - t0
        t1 = time.monotonic()
        from rmqlab.pipeline.sweep_report import analyse_sweep

        result.failed_runs = analyse_sweep(
            handle.spark, out, sweep.to_dict(), result.outcomes, progress.note, show_progress
        )
        result.analyse_wall_s = time.monotonic() - t1
    finally:
        handle.stop()
    return result


__all__ = ["COMPLETE", "SweepMismatch", "SweepResult", "prepare", "run_sweep"]
