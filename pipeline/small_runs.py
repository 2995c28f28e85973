"""Many runs of a root: the small ones analysed inside Spark tasks by the plain-Python reference, the
large ones by the columnar Spark analysis (`pipeline.runs.analyse_runs`), in one application.

A Spark analysis costs a fixed couple of seconds of jobs and stages whatever the size of a run, which
dominates a root of hundreds of small runs. The reference (`pipeline.metrics_reference` with the RocketMQ-time
additions of `pipeline.availability_reference`) computes the same summary, and the tests hold the two
equal; it holds a run's events in memory, so only runs up to `SMALL_RUN_BYTES` of event files go this
way. One Spark job spreads the small runs over tasks (several runs per task, the run is the key), each
task returns every run's summary and report data; a run whose analysis fails in its task is reported
and skipped like a bad run directory.
"""

from __future__ import annotations

import atexit
import math
import os
import shutil
import tempfile
import zipfile
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import rmqlab
from rmqlab.pipeline.discover import BadRun, RunDir, clock_word
from rmqlab.pipeline.report_data import MAX_INTERVALS, MAX_NEMESES, PlotData, pick_bucket_ms
from rmqlab.pipeline.report_story import answers, manifest_engine

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from rmqlab.cli import Progress
    from rmqlab.pipeline.metrics_reference import RunModel
    from rmqlab.pipeline.runs import RootResult
    from rmqlab.pipeline.unavailability import RunClock

# Runs up to this many bytes of event files are analysed by the reference in a task. Measured
# (scripts/bench/reference_memory.py, runs of 31 k to 294 k events): the reference grows a Python
# process by about 1.9 KB per event, 7.7 bytes per byte of event file, so a 64 MiB run (about 250 k
# events) peaks near 0.5 GiB in its worker, two of which run at once on a 2-core machine.
SMALL_RUN_BYTES = 64 * 1024 * 1024
ANALYSIS_CHOICES = ("auto", "spark", "reference")
TASKS_PER_CORE = 3  # a few tasks per core, so that a task of larger runs does not leave a core idle


def run_bytes(run: RunDir) -> int:
    """Bytes of a run's event files (0 for a file that went away: its task reports it)."""
    total = 0
    for f in run.files:
        try:
            total += os.path.getsize(f.path)
        except OSError:
            pass
    return total


def split_by_size(
    runs: list[RunDir], analysis: str, small_run_bytes: int = SMALL_RUN_BYTES
) -> tuple[list[tuple[RunDir, int]], list[RunDir]]:
    """((run, bytes) of the runs for the reference in tasks, runs for the Spark analysis) by `analysis`:
    `auto` by size, `spark` or `reference` every run."""
    if analysis not in ANALYSIS_CHOICES:
        raise ValueError(f"analysis must be one of {ANALYSIS_CHOICES}, not {analysis!r}")
    small: list[tuple[RunDir, int]] = []
    large: list[RunDir] = []
    for run in runs:
        if analysis == "spark":
            large.append(run)
            continue
        size = run_bytes(run)
        if analysis == "reference" or size <= small_run_bytes:
            small.append((run, size))
        else:
            large.append(run)
    return small, large


def deal(sized: list[tuple[RunDir, int]], tasks: int) -> list[list[RunDir]]:
    """The runs dealt into at most `tasks` lists of about equal bytes (largest first, each to the
    lightest list), every list in run order."""
    bins: list[tuple[int, int, list[RunDir]]] = [(0, i, []) for i in range(max(1, min(tasks, len(sized))))]
    for run, size in sorted(sized, key=lambda rs: (-rs[1], rs[0].rel)):
        load, i, members = min(bins, key=lambda b: (b[0], b[1]))
        members.append(run)
        bins[i] = (load + size, i, members)
    return [sorted(members, key=lambda r: r.rel) for _load, _i, members in bins if members]


def plot_data(model: RunModel, clock: RunClock, max_intervals: int = MAX_INTERVALS) -> PlotData:
    """The report's plot data of one run from its reference model: what `pipeline.report_data`'s Spark
    collection gathers (intervals that last, nemeses, consumption and send rates, duplicates per bucket,
    orderly groups), in the same order."""
    from rmqlab.pipeline.contract import ORDERLY

    events = model.events
    start = events[0].ts if events else 0
    end = model.run_end if events else 0
    data = PlotData(start, end, pick_bucket_ms(end - start), clock=clock)
    node_of = {c: min(nodes) for c, nodes in model.client_nodes.items() if nodes}
    lasting = sorted(
        (iv for iv in model.intervals if iv.end > iv.start),
        key=lambda iv: (iv.start, iv.group, iv.client, iv.topic, iv.queue),
    )
    if len(lasting) > max_intervals:
        data.intervals_cut_at = lasting[max_intervals].start
    for iv in lasting[:max_intervals]:
        data.intervals.append(
            {
                "group": iv.group,
                "client_id": iv.client,
                "node": node_of.get(iv.client),
                "topic": iv.topic,
                "queue": iv.queue,
                "start": iv.start,
                "end": iv.end,
            }
        )
    nemeses = [e for e in events if e.event == "nemesis"]  # event order, then stably by time
    for e in sorted(nemeses, key=lambda e: e.ts)[:MAX_NEMESES]:
        data.nemeses.append({"ts_ms": e.ts, "action": e.get("action"), "target": e.get("target")})
    width = data.bucket_ms

    def bucket(ts: int) -> int:
        return (ts - start) // width

    rates: dict[tuple[str, str, int], int] = defaultdict(int)
    per_bucket: dict[tuple[str, int], int] = defaultdict(int)
    for g in sorted(model.groups):
        first: dict[str, int] = {}
        for e in model.consumed_lines(g):
            client = e.get("client_id")
            b = bucket(e.ts)
            rates[(g, node_of.get(client, client), b)] += 1
            per_bucket[(g, b)] += 1
            msg = e.get("msg_id")
            if msg not in first or e.ts < first[msg]:
                first[msg] = e.ts
            if e.get("mode") == ORDERLY:
                data.orderly.add(g)
        for ts in first.values():
            per_bucket[(g, bucket(ts))] -= 1
    sends: dict[tuple[str, int], int] = defaultdict(int)
    groups_of: dict[str, list[str]] = defaultdict(list)
    for g, topics in model.group_topics.items():
        for t in topics:
            groups_of[t].append(g)
    for e in events:
        if e.event == "message_sent":
            for g in groups_of.get(e.get("topic"), ()):
                sends[(g, bucket(e.ts))] += 1
    data.rates = [{"group": g, "node": n, "bucket": b, "n": c} for (g, n, b), c in sorted(rates.items())]
    data.duplicates = [{"group": g, "bucket": b, "n": n} for (g, b), n in sorted(per_bucket.items()) if n > 0]
    data.sends = [{"group": g, "bucket": b, "n": n} for (g, b), n in sorted(sends.items())]
    return data


def analyse_run(run: RunDir, plots: bool) -> tuple[dict[str, Any], PlotData | None]:
    """summary.json (with its answer) and the report's plot data of one run, in plain Python."""
    from rmqlab.pipeline.availability_reference import side_events, summarize_with_rocketmq_time
    from rmqlab.pipeline.metrics_reference import RunModel, load_files
    from rmqlab.pipeline.unavailability import run_clock

    events, malformed = load_files(run.files)
    model = RunModel(events)
    summary = summarize_with_rocketmq_time(events, malformed, None, model)
    data = None
    if plots:
        start = events[0].ts if events else None
        clock = replace(run_clock(side_events(events), start, None), kind=clock_word(run.path))
        data = plot_data(model, clock)
    known = run.manifest.get("known")
    engine = manifest_engine(run.manifest)
    summary["answer"] = answers(summary, data, known if isinstance(known, dict) else None, engine)
    return summary, data


def _analyse_task(runs: Iterable[list[RunDir]], plots: bool) -> Iterator[tuple[str, Any, Any, str | None]]:
    """A task's outcomes: (run, summary, plot data, None), or (run, None, None, why) when it failed."""
    for batch in runs:
        for run in batch:
            try:
                summary, data = analyse_run(run, plots)
            except Exception as exc:  # one run's failure (unreadable file, memory) skips that run only
                yield run.rel, None, None, f"analysis failed: {type(exc).__name__}: {exc}"
                continue
            yield run.rel, summary, data, None


_SHIPPED: set[str] = set()  # applications whose executors were sent this package


def ship_package(sc: Any) -> None:
    """Send the analysis's code (``rmqlab``'s root modules and ``rmqlab.pipeline``) to a cluster's
    executors as a zip on their Python path (local mode's workers import the driver's). A driver that
    imports it from a zip itself got it with spark-submit's --py-files, which sends it to the executors
    too."""
    package = Path(__file__).resolve().parent
    root = Path(rmqlab.__file__).resolve().parent
    if sc.master.startswith("local") or not package.is_dir() or sc.applicationId in _SHIPPED:
        return
    folder = tempfile.mkdtemp(prefix="rmq-analyze-py-")
    atexit.register(shutil.rmtree, folder, True)
    archive = Path(folder) / "rmqlab.zip"
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as zf:
        for source in sorted(root.glob("*.py")):
            zf.write(source, f"rmqlab/{source.name}")
        for source in sorted(package.glob("*.py")):
            zf.write(source, f"rmqlab/pipeline/{source.name}")
    sc.addPyFile(str(archive))
    _SHIPPED.add(sc.applicationId)


def analyse_in_tasks(
    spark: SparkSession, sized: list[tuple[RunDir, int]], plots: bool
) -> tuple[dict[str, dict[str, Any]], dict[str, PlotData], dict[str, str]]:
    """Summaries and plot data of the runs by the reference, in one Spark job; and the runs whose
    analysis failed, with why."""
    sc = spark.sparkContext
    ship_package(sc)
    batches = deal(sized, TASKS_PER_CORE * sc.defaultParallelism)
    outcomes = (
        sc.parallelize(batches, len(batches)).mapPartitions(lambda part: _analyse_task(part, plots)).collect()
    )
    summaries: dict[str, dict[str, Any]] = {}
    data: dict[str, PlotData] = {}
    failed: dict[str, str] = {}
    for rel, summary, plot, why in outcomes:
        if why is not None:
            failed[rel] = why
            continue
        summaries[rel] = summary
        if plot is not None:
            data[rel] = plot
    return summaries, data, failed


def analyse_root(
    spark: SparkSession,
    runs: list[RunDir],
    bad: list[BadRun],
    *,
    plots: bool = True,
    progress: Progress | None = None,
    analysis: str = "auto",
    small_run_bytes: int = SMALL_RUN_BYTES,
) -> RootResult:
    """Every run of a root in one application: small runs by the reference in Spark tasks, large ones
    by the Spark analysis of many runs. Runs whose task failed join `bad` (reported, skipped)."""
    from contextlib import nullcontext

    from rmqlab.pipeline.runs import RootResult, analyse_runs

    small, large = split_by_size(runs, analysis, small_run_bytes)
    result = RootResult(list(runs), list(bad))
    if small:
        stage = progress.stage("small runs in tasks") if progress is not None else nullcontext({})
        with stage as info:
            summaries, data, failed = analyse_in_tasks(spark, small, plots)
            size = sum(s for _r, s in small)
            info["info"] = f"{len(small)} run(s), {size / 2**20:.1f} MiB, {len(summaries)} analysed" + (
                f", {len(failed)} failed" if failed else ""
            )
        result.summaries.update(summaries)
        result.plot_data.update(data)
        for rel, why in sorted(failed.items()):
            result.bad.append(BadRun(rel, why))
        result.runs = [r for r in result.runs if r.rel not in failed]
    if large:
        if progress is not None and small:
            over = math.ceil(small_run_bytes / 2**20)
            progress.note(f"{len(large)} large run(s) (over {over} MiB) by the Spark analysis")
        by_spark = analyse_runs(spark, large, [], plots=plots, progress=progress)
        result.summaries.update(by_spark.summaries)
        result.plot_data.update(by_spark.plot_data)
    result.bad.sort(key=lambda b: b.rel)
    return result
