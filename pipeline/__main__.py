"""rmq-analyze: turn a run directory of event logs into summary.json, report.html and a verdict, or a
root of many run directories into each run's outputs plus a runs table and index.html, in one Spark
application.

Exit codes: 0 every group's verdict is ok, 1 some verdict is fail (or, for a root of runs, a run
directory was skipped), 2 usage or input errors (no run directory, no events, Java or pyspark missing).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rmqlab.cli import Progress, add_master, add_quiet, command_parser, positive_float, positive_int
from rmqlab.pipeline.discover import RunDirError, RunFile, clock_word
from rmqlab.pipeline.quick import failed_groups, verdict_lines
from rmqlab.pipeline.session import DEFAULT_MASTER, SparkHandle, SparkUnavailable, start_spark
from rmqlab.pipeline.small_runs import ANALYSIS_CHOICES, SMALL_RUN_BYTES


def build_parser() -> argparse.ArgumentParser:
    p = command_parser(
        "rmq-analyze",
        "Analyse a run directory of event logs (EVENTS.md): summary.json, report.html, verdict.",
        {
            0: "every group's verdict is ok",
            1: "some verdict is fail (for a root of runs: or a run directory was skipped)",
            2: "usage or input errors (no run directory, no events, Java or pyspark missing)",
        },
        note="rmq-analyze ingest RUN_DIR --out DIR writes a Parquet copy (partitioned by event) for "
        "large runs; analyse it with --format parquet.",
    )
    p.add_argument(
        "run_dir",
        help="run directory (*.jsonl files, any depth), a root of many run directories (each with its "
        "manifest.json or *.jsonl files, at any depth) or, with --format parquet, a copy",
    )
    p.add_argument(
        "--out",
        help="where to write summary.json and report.html (default: the run directory); for a root of "
        "runs, where each run's outputs (under its relative path), runs.parquet, runs.csv and index.html go",
    )
    add_master(
        p, f"Spark master URL (default {DEFAULT_MASTER}, or under spark-submit the master it was given)"
    )
    p.add_argument(
        "--format", choices=("json", "parquet"), default="json", help="input format (default json)"
    )
    p.add_argument("--no-report", action="store_true", help="write summary.json only")
    add_quiet(p)
    p.add_argument(
        "--time-scale",
        type=positive_float,
        help="the run's time scale (default: the chaos runner's, from the events; else 1)",
    )
    p.add_argument(
        "--after",
        metavar="FILE",
        help="start Spark now, then wait until FILE exists before reading the run (the chaos runner "
        "starts the analysis this way while the experiment runs, so that Spark is warm at its end)",
    )
    p.add_argument(
        "--analysis",
        choices=ANALYSIS_CHOICES,
        default="auto",
        help="for a root of runs: 'auto' (default) analyses each run up to --small-run-bytes of event "
        "files in a Spark task by the plain-Python reference and larger runs by the Spark analysis; "
        "'spark' or 'reference' analyses every run that way",
    )
    p.add_argument(
        "--small-run-bytes",
        type=positive_int,
        default=SMALL_RUN_BYTES,
        metavar="N",
        help=f"largest run (bytes of its event files) analysed in a task with --analysis auto "
        f"(default {SMALL_RUN_BYTES}, {SMALL_RUN_BYTES // 2**20} MiB)",
    )
    return p


def build_ingest_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="rmq-analyze ingest", description="Write a Parquet copy of a run's events."
    )
    p.add_argument("run_dir")
    p.add_argument("--out", required=True, help="directory for the Parquet copy")
    add_master(p, f"Spark master URL (default {DEFAULT_MASTER})")
    add_quiet(p)
    return p


def _fail(msg: str) -> int:
    print(f"rmq-analyze: error: {msg}", file=sys.stderr)
    return 2


def _unsafe_output(run_dir: Path, out: Path) -> str | None:
    """Why writing the Parquet copy to `out` could destroy data (it replaces the folder), or None."""
    run, dest = run_dir.resolve(), out.resolve()
    if dest == run or dest in run.parents:
        return f"--out {str(out)!r} would replace the run directory itself; choose another folder"
    if run in dest.parents:
        return f"--out {str(out)!r} is inside the run directory; choose a folder outside it"
    if dest.exists() and any(dest.iterdir()) and not (dest / "_ingest.json").is_file():
        return f"--out {str(out)!r} is a non-empty folder that is not a Parquet copy; refusing to replace it"
    return None


def ingest(argv: list[str]) -> int:
    args = build_ingest_parser().parse_args(argv)
    progress = Progress(enabled=not args.quiet, prefix="rmq-analyze")
    problem = _unsafe_output(Path(args.run_dir), Path(args.out))
    if problem:
        return _fail(problem)
    try:
        handle = start_spark(args.master)
    except SparkUnavailable as exc:
        return _fail(str(exc))
    try:
        from rmqlab.pipeline.ingest import load_json_run, write_parquet

        with progress.stage("read") as info:
            run = load_json_run(handle.spark, args.run_dir, columns=None)
            info["info"] = f"{run.stats.events} events, {run.stats.malformed_lines} malformed lines"
        with progress.stage("write parquet"):
            write_parquet(run.events, run.stats, args.out, os.fspath(args.run_dir))
        print(f"parquet copy: {args.out}")
        return 0
    except RunDirError as exc:
        return _fail(str(exc))
    finally:
        handle.stop()


def _wait_for(path: Path, poll_s: float = 0.05) -> bool:
    """Wait until `path` exists; False when the process that started us went away first."""
    parent = os.getppid()
    while not path.exists():
        if os.getppid() != parent:
            return False
        time.sleep(poll_s)
    return True


def _warm_up(spark: Any) -> None:
    """Run the whole analysis once on a tiny simulated run, so that the JVM has loaded, compiled and
    generated the code of every stage before the real run arrives."""
    from rmqlab.pipeline.availability_spark import AVAILABILITY_COLUMNS, add_rocketmq_time
    from rmqlab.pipeline.ingest import load_json_run
    from rmqlab.pipeline.metrics_spark import Analysis
    from rmqlab.pipeline.pop_spark import add_pop_metrics
    from rmqlab.pipeline.report_data import collect_plot_data
    from rmqlab.pipeline.synth import realistic_run

    with tempfile.TemporaryDirectory(prefix="rmq-analyze-warm-") as tmp:
        realistic_run(tmp, events=1500, seed=1)
        run = load_json_run(spark, tmp, columns=AVAILABILITY_COLUMNS)
        analysis = Analysis(run.events, run.stats)
        try:
            summary = analysis.summary()
            clock = add_rocketmq_time(summary, analysis, tmp)
            add_pop_metrics(summary, analysis, tmp)
            collect_plot_data(analysis, clock=clock)
        finally:
            analysis.close()
            run.release()


def first_event_line(files: list[RunFile]) -> tuple[str, int] | None:
    """(file, line number) of the first well-formed event line, or None when the files hold none: a
    folder of anything else is rejected before Spark starts. Lines that cannot be JSON objects are
    skipped without decoding them."""
    from rmqlab.pipeline.metrics_reference import iter_lines, parse_line

    for run_file in files:
        for number, text in iter_lines(run_file.path):
            if text.lstrip(" \t").startswith("{") and parse_line(text) is not None:
                return run_file.rel, number
    return None


def _check_input(args: argparse.Namespace) -> str | None:
    """Why the input cannot be analysed (checked before Spark's work), or None."""
    try:
        if args.format == "json":
            from rmqlab.pipeline.discover import discover

            files = discover(args.run_dir)
            if not files:
                return f"no *.jsonl event files under {args.run_dir!r}"
            if first_event_line(files) is None:
                return f"no well-formed event lines in {args.run_dir!r} (see EVENTS.md)"
        else:
            from rmqlab.pipeline.ingest import check_parquet_copy

            check_parquet_copy(args.run_dir)
    except RunDirError as exc:
        return str(exc)
    return None


SMALL_INPUT_BYTES = 64 * 1024 * 1024


def _fit_partitions(spark: Any, args: argparse.Namespace) -> None:
    """A small run (an experiment's few MB) gets one shuffle partition per core: more only add task
    waves of milliseconds each to the analysis' many small stages."""
    if not spark.sparkContext.master.startswith("local") or args.format != "json":
        return
    from rmqlab.pipeline.discover import discover

    size = sum(os.path.getsize(f.path) for f in discover(args.run_dir))
    if size < SMALL_INPUT_BYTES:
        spark.conf.set("spark.sql.shuffle.partitions", str(spark.sparkContext.defaultParallelism))


def _write_summary(out_dir: Path, summary: dict[str, Any]) -> None:
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")


def _experiment(run_dir: str) -> tuple[str | None, str | None]:
    """The experiment's name and question from the chaos runner's manifest.json, when there is one."""
    try:
        manifest = json.loads((Path(run_dir) / "manifest.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None, None
    if not isinstance(manifest, dict):
        return None, None
    name, question = manifest.get("name"), manifest.get("question")
    return (name if isinstance(name, str) else None), (question if isinstance(question, str) else None)


def _known(run_dir: str) -> dict[str, Any] | None:
    """A catalogue entry's record in the manifest (its report says first whether the problem appeared)."""
    try:
        manifest = json.loads((Path(run_dir) / "manifest.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    known = manifest.get("known") if isinstance(manifest, dict) else None
    return known if isinstance(known, dict) else None


def _engine(run_dir: str) -> str | None:
    """The Apache engine that ran the run, from its manifest (None: the emulator, or no manifest)."""
    from rmqlab.pipeline.report_story import manifest_engine

    try:
        manifest = json.loads((Path(run_dir) / "manifest.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return manifest_engine(manifest)


def _start_spark(master: str | None, progress: Progress) -> SparkHandle | int:
    """The session, or exit status 2 with the reason printed when Spark cannot start."""
    try:
        with progress.stage("start spark") as info:
            handle = start_spark(master)
            info["info"] = handle.spark.sparkContext.master
    except SparkUnavailable as exc:
        return _fail(str(exc))
    return handle


def analyze_root(args: argparse.Namespace) -> int:
    """Many runs, one Spark application: bad run directories are reported and skipped."""
    from rmqlab.pipeline.discover import discover_runs

    progress = Progress(enabled=not args.quiet, prefix="rmq-analyze")
    root = Path(args.run_dir)
    out_dir = Path(args.out or args.run_dir)
    try:
        runs, bad = discover_runs(root)
    except RunDirError as exc:
        return _fail(str(exc))
    for b in bad:
        print(f"rmq-analyze: skipping run {b.rel!r}: {b.problem}", file=sys.stderr)
    if not runs:
        return _fail(
            f"no *.jsonl event files under {args.run_dir!r} (no run directory with a manifest.json or "
            "event files of its own)"
        )
    progress.note(f"{len(runs)} run(s) found" + (f", {len(bad)} skipped" if bad else ""))
    handle = _start_spark(args.master, progress)
    if isinstance(handle, int):
        return handle
    try:
        from rmqlab.pipeline.runs import write_outputs
        from rmqlab.pipeline.small_runs import analyse_root

        result = analyse_root(
            handle.spark,
            runs,
            bad,
            plots=not args.no_report,
            progress=progress,
            analysis=args.analysis,
            small_run_bytes=args.small_run_bytes,
        )
        for b in result.bad:
            if b not in bad:  # its task could not analyse it
                print(f"rmq-analyze: skipping run {b.rel!r}: {b.problem}", file=sys.stderr)
        with progress.stage("write outputs") as info:
            out_dir.mkdir(parents=True, exist_ok=True)
            failures = write_outputs(
                handle.spark,
                result,
                out_dir,
                reports=not args.no_report,
                title=f"Runs under {root.resolve().name}",
            )
            info["info"] = f"{len(result.runs)} run(s)"
    finally:
        handle.stop()
    failed_runs = 0
    bad = result.bad
    runs = result.runs
    for run in runs:
        summary = result.summaries[run.rel]
        failed = sorted(g for g, v in summary["groups"].items() if v["verdict"] != "ok")
        failed_runs += bool(failed)
        note = "" if summary["run"]["events"] else "  (no well-formed events)"
        print(f"{run.rel}: {'FAIL (' + ', '.join(failed) + ')' if failed else 'OK'}{note}")
        if run.rel in failures:
            print(f"rmq-analyze: {run.rel}: {failures[run.rel]}", file=sys.stderr)
    print(f"runs table: {out_dir / 'runs.parquet'}, {out_dir / 'runs.csv'}")
    print(f"index:      {out_dir / 'index.html'}")
    print(
        f"verdict: {len(runs) - failed_runs} run(s) OK, {failed_runs} FAIL"
        + (f", {len(bad)} skipped" if bad else "")
    )
    return 1 if failed_runs or bad else 0


def analyze(args: argparse.Namespace) -> int:
    if args.format == "json" and not args.after:  # --after: the run directory is still being written
        from rmqlab.pipeline.discover import is_run_dir

        root = Path(args.run_dir)
        if root.is_dir() and not is_run_dir(root):
            return analyze_root(args)
    progress = Progress(enabled=not args.quiet, prefix="rmq-analyze")
    out_dir = Path(args.out or args.run_dir)
    # Input errors are reported before paying for a Spark start (unless asked to start it early).
    if args.after:
        # Started beside a running experiment: its processes' timers come first (2 cores are common).
        with contextlib.suppress(OSError):
            os.nice(10)
    else:
        problem = _check_input(args)
        if problem:
            return _fail(problem)
    try:
        with progress.stage("start spark") as info:
            handle = start_spark(args.master)
            info["info"] = handle.spark.sparkContext.master
    except SparkUnavailable as exc:
        return _fail(str(exc))
    try:
        if args.after:
            with progress.stage("warm up"):
                _warm_up(handle.spark)
            with progress.stage("wait for the run"):
                if not _wait_for(Path(args.after)):
                    return _fail(f"gave up waiting for {args.after!r}: the process that started us is gone")
            problem = _check_input(args)
            if problem:
                return _fail(problem)
        if handle.owned:  # a session we were handed (tests share one) keeps its settings
            _fit_partitions(handle.spark, args)
        from rmqlab.pipeline.availability_spark import AVAILABILITY_COLUMNS, add_rocketmq_time
        from rmqlab.pipeline.ingest import load_json_run, load_parquet_run
        from rmqlab.pipeline.metrics_spark import Analysis

        with progress.stage("read events") as info:
            load = load_json_run if args.format == "json" else load_parquet_run
            run = load(handle.spark, args.run_dir, columns=AVAILABILITY_COLUMNS)
            info["info"] = f"{run.stats.events} events, {run.stats.malformed_lines} malformed lines"
        if run.stats.events == 0:
            run.release()
            return _fail(f"no well-formed event lines in {args.run_dir!r}")
        analysis: Analysis | None = None
        try:
            with progress.stage("metrics") as info:
                analysis = Analysis(run.events, run.stats)
                summary = analysis.summary()
                info["info"] = f"{len(summary['groups'])} group(s)"
            with progress.stage("unavailability"):
                side_dir = args.run_dir if args.format == "json" else None
                clock = add_rocketmq_time(summary, analysis, side_dir, args.time_scale)
                clock = dataclasses.replace(clock, kind=clock_word(args.run_dir))
            with progress.stage("pop metrics"):
                from rmqlab.pipeline.pop_spark import add_pop_metrics

                add_pop_metrics(summary, analysis, side_dir)
            out_dir.mkdir(parents=True, exist_ok=True)
            from rmqlab.pipeline.report_story import answers

            # without the report's plot data only a known problem's first sentence is said
            engine = _engine(args.run_dir)
            summary["answer"] = answers(summary, None, _known(args.run_dir), engine)
            if args.no_report:
                _write_summary(out_dir, summary)
            else:
                from rmqlab.pipeline.report_data import collect_plot_data
                from rmqlab.pipeline.report_page import write_report

                with progress.stage("report"):
                    data = collect_plot_data(analysis, clock=clock)
                    summary["answer"] = answers(summary, data, _known(args.run_dir), engine)
                    _write_summary(out_dir, summary)
                    name, question = _experiment(args.run_dir)
                    title = f"Run {Path(args.run_dir).resolve().name}" + (f" ({name})" if name else "")
                    write_report(out_dir / "report.html", summary, data, title, question)
                with progress.stage("timeline"):
                    from rmqlab.pipeline import timeline

                    timeline.write(
                        out_dir, data, summary, args.run_dir if args.format == "json" else None, title
                    )
        finally:
            if analysis is not None:
                analysis.close()
            run.release()
    except RunDirError as exc:
        return _fail(str(exc))
    finally:
        handle.stop()
    return print_verdict(summary, out_dir, not args.no_report, clock_word(args.run_dir))


def print_verdict(summary: dict[str, Any], out_dir: Path, report: bool, clock: str = "wall") -> int:
    """The verdict lines and where the outputs are; ``clock`` names the time of the durations (``wall``,
    or ``simulated``)."""
    lines = verdict_lines(summary, clock)
    verdict = lines.pop()
    print("\n".join(lines))
    print(f"summary: {out_dir / 'summary.json'}")
    if report:
        print(f"report:  {out_dir / 'report.html'}")
        print(f"timeline: {out_dir / 'timeline.html'} (trace: {out_dir / 'trace.json'})")
    print(verdict)
    return 1 if failed_groups(summary) else 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "ingest":
        return ingest(argv[1:])
    return analyze(build_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
