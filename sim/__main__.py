"""``rmq-sim``: run an experiment simulated (one process, virtual time, seeded), or replay a simulated run.

Exit codes: ``run`` as ``rmq-chaos run`` (0 verdict ok, 1 fail, 2 bad input, 3 the run did not complete);
``replay`` 0 when every event file is identical, 1 when one differs, 2 on bad input; ``sweep`` 0 when
every run passed, 1 when some run failed (listed with its replay command), 2 on bad input (a bad sweep
file, an output folder of another sweep, no Spark), 130 when interrupted (run it again to resume);
``shrink`` 0 when the smaller experiment is written, 1 when the run did not fail, 2 on bad input.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from rmqlab.cli import (
    SIM_SHELVES,
    SWEEPS,
    UnknownName,
    add_json,
    add_master,
    add_quiet,
    add_variant,
    command_parser,
    find_shipped,
    print_json,
    subcommand,
)
from rmqlab.lab import known
from rmqlab.lab.experiment import ExperimentError
from rmqlab.pipeline.contract import CHECKS
from rmqlab.sim.rundir import RunDirError, read_sim_run
from rmqlab.sim.sim_table import SimExperiment, load, parse
from rmqlab.sim.wire import WIRES

if TYPE_CHECKING:
    from rmqlab.sim.sim_cluster import SimResult

HASH_SEED = "0"


def resolve(path_or_name: str, variant: str | None = None) -> SimExperiment:
    """An experiment file, a shipped experiment by name, or a catalogue entry (``known/NAME``) with the
    switches of its ``variant`` (default affected)."""
    try:
        if known.is_known(path_or_name):
            entry = known.find(path_or_name)
            text = known.experiment_text(entry, variant or known.DEFAULT_VARIANT, sim=True)
            return parse(text, source=f"{known.KNOWN.label}/{entry.name}.toml", default_name=entry.name)
        if variant is not None:
            raise UnknownName(f"--variant goes with a catalogue entry (known/NAME), not {path_or_name!r}")
        found = find_shipped(path_or_name, SIM_SHELVES)
    except UnknownName as e:
        raise ExperimentError(path_or_name, [(None, str(e))]) from None
    if found is not None:
        return parse(found.text, source=found.source, default_name=found.name)
    return load(Path(path_or_name))


def seed_arg(text: str) -> int:
    try:
        return int(text, 10)
    except ValueError:
        raise argparse.ArgumentTypeError(f"the seed must be an integer, got {text!r}") from None


def with_wire(sx: SimExperiment, wire: str | None) -> SimExperiment:
    """``--wire`` over the file's ``[sim] wire`` (both give the same events; bytes checks the codec)."""
    if wire is None:
        return sx
    return sx.with_settings(dataclasses.replace(sx.sim, wire=wire))


def event_files(run_dir: Path) -> dict[str, str]:
    """Every event file of a run (relative path -> SHA-256 of its bytes)."""
    out = {}
    for p in sorted(run_dir.rglob("*.jsonl")):
        rel = p.relative_to(run_dir).as_posix()
        if not any(part.startswith((".", "_")) for part in Path(rel).parts):
            out[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def _simulate(
    sx: SimExperiment,
    run_dir: Path,
    seed: int | None,
    quiet: bool,
    out: TextIO | None = None,
    manifest_extra: dict[str, Any] | None = None,
) -> tuple[int, SimResult]:
    from rmqlab.sim.sim_cluster import SimCluster

    out = out or sys.stdout
    cluster = SimCluster(sx, run_dir, seed=seed, progress=not quiet, out=out, manifest_extra=manifest_extra)
    result = cluster.run()
    rate = result.sim_seconds / result.wall_seconds if result.wall_seconds > 0 else float("inf")
    print(
        f"simulated {result.sim_seconds:.1f}s in {result.wall_seconds:.1f}s wall ({rate:.0f}x), "
        f"{result.events} events; verdict from live counts: {result.quick_verdict.upper()}",
        file=out,
    )
    for e in result.errors:
        print(f"error: {e.splitlines()[0]}", file=out)
    if result.skipped:
        print(f"{len(result.skipped)} nemesis action(s) skipped (see manifest.json)", file=out)
    if result.errors:
        return 3, result
    return (0 if result.quick_verdict == "ok" else 1), result


def _analyze(run_dir: Path, out: TextIO | None = None, quiet: bool = False) -> int | None:
    """rmq-analyze of the run (summary.json, report.html, timeline.html); with ``quiet`` its verdict
    lines are not shown (the quick verdict said them)."""
    from rmqlab.lab.runner import pipeline_available

    out = out or sys.stdout
    if not pipeline_available():
        print("analysis skipped: the pipeline extra (pyspark) is not installed", file=out)
        return None
    if quiet:
        print("writing summary.json and the report (rmq-analyze) ...", file=out, flush=True)
        argv = [sys.executable, "-m", "rmqlab.pipeline", str(run_dir), "--quiet"]
        return subprocess.call(argv, stdout=subprocess.DEVNULL)
    print("analysing the run (python -m rmqlab.pipeline) ...", file=out, flush=True)
    return subprocess.call([sys.executable, "-m", "rmqlab.pipeline", str(run_dir)], stdout=out)


def _quick_verdict(run_dir: Path, out: TextIO) -> dict[str, Any] | None:
    """The verdict at once, by the plain-Python analysis, for a run small enough (else None, and why)."""
    from rmqlab.pipeline.discover import clock_word
    from rmqlab.pipeline.quick import RunTooLarge, quick_summary, verdict_lines

    ended = time.monotonic()
    try:
        summary = quick_summary(run_dir)
    except RunTooLarge as exc:
        print(f"no quick verdict: {exc}", file=out, flush=True)
        return None
    if summary is None:
        return None
    for line in verdict_lines(summary, clock_word(run_dir)):
        print(line, file=out)
    print(
        f"(said {time.monotonic() - ended:.1f} s after the run ended; the report follows)",
        file=out,
        flush=True,
    )
    return summary


def cmd_run(args: argparse.Namespace) -> int:
    out = sys.stderr if args.json else sys.stdout
    outcome: dict[str, Any] = {"experiment": args.file}
    rc = _run(args, out, outcome)
    if args.json:
        print_json({**outcome, "exit_code": rc})
    return rc


def _run(args: argparse.Namespace, out: TextIO, outcome: dict[str, Any]) -> int:
    try:
        sx = resolve(args.file, args.variant)
    except ExperimentError as e:
        print(e, file=sys.stderr)
        return 2
    extra = None
    if known.is_known(args.file):
        variant = args.variant or known.DEFAULT_VARIANT
        extra = {"known": known.find(args.file).manifest(variant)}
        outcome.update(known=args.file, variant=variant)
    sx = with_wire(sx, args.wire)
    seed = sx.exp.seed if args.seed is None else args.seed
    run_dir = (
        Path(args.out)
        if args.out
        else Path("runs") / f"{sx.exp.name}-sim{seed}-{time.strftime('%Y%m%d-%H%M%S')}"
    )
    outcome.update(experiment=sx.exp.name, seed=seed, run_dir=str(run_dir))
    if run_dir.exists() and any(run_dir.rglob("*.jsonl")):
        print(f"rmq-sim: {run_dir} already holds a run's logs; choose another --out", file=sys.stderr)
        return 2
    rc, result = _simulate(sx, run_dir, seed, args.quiet, out, extra)
    outcome.update(
        verdict=result.quick_verdict,
        verdict_source="live counts",
        simulated_s=result.sim_seconds,
        events=result.events,
        errors=list(result.errors),
        skipped_actions=len(result.skipped),
        report=None,
        summary=None,
    )
    if rc != 3 and not args.no_analyze:
        quick = _quick_verdict(run_dir, out)
        arc = _analyze(run_dir, out, quiet=quick is not None)
        if arc is not None:
            rc = arc if arc in (0, 1) else 3
            if arc in (0, 1):
                outcome.update(verdict="ok" if arc == 0 else "fail", verdict_source="analysis")
            else:
                outcome["errors"].append(f"the analysis failed (rmq-analyze exited with {arc})")
            for name in ("report", "summary"):
                path = run_dir / ("report.html" if name == "report" else "summary.json")
                outcome[name] = str(path) if path.is_file() else None
            if quick is not None and outcome["summary"] is not None:
                from rmqlab.pipeline.quick import disagreement

                why = disagreement(quick, json.loads(Path(outcome["summary"]).read_text()))
                if why is not None:  # the same definitions twice: a difference is a bug, never hidden
                    print(f"error: {why}", file=out)
                    outcome["errors"].append(why)
                    rc = 3
            for name in ("report", "summary"):
                if outcome[name] is not None:
                    print(f"{name}: {outcome[name]}", file=out)
    print(f"run directory: {run_dir}", file=out)
    return rc


def cmd_replay(args: argparse.Namespace) -> int:
    run_dir = Path(args.run_dir)
    try:
        sx, seed = read_sim_run(run_dir)
    except RunDirError as e:
        print(f"rmq-sim: {e}", file=sys.stderr)
        return 2
    sx = with_wire(sx, args.wire)
    original = event_files(run_dir)
    tmp = None
    if args.out:
        out = Path(args.out)
        if out.exists() and any(out.rglob("*.jsonl")):
            print(f"rmq-sim: {out} already holds a run's logs; choose another --out", file=sys.stderr)
            return 2
    else:
        tmp = tempfile.mkdtemp(prefix="rmq-sim-replay-")
        out = Path(tmp) / "replay"
    try:
        print(f"replaying {run_dir} (seed {seed}) into {out}")
        _simulate(sx, out, seed, quiet=True)
        again = event_files(out)
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    differ = sorted(f for f in set(original) | set(again) if original.get(f) != again.get(f))
    if not differ:
        print(f"identical: {len(original)} event files, byte for byte")
        return 0
    print(f"DIFFERENT: {len(differ)} of {len(set(original) | set(again))} event files differ:")
    for f in differ[:20]:
        where = (
            "only in the original"
            if f not in again
            else "only in the replay"
            if f not in original
            else "differs"
        )
        print(f"  {f}: {where}")
    return 1


def cmd_sweep(args: argparse.Namespace) -> int:
    from rmqlab.sim.sweep import load_sweep, parse_sweep
    from rmqlab.sim.sweep_run import SweepMismatch, run_sweep

    try:
        found = find_shipped(args.file, (SWEEPS,), what="sweep")
        sweep = load_sweep(args.file) if found is None else parse_sweep(found.text, found.source)
    except UnknownName as e:
        print(f"rmq-sim: {e}", file=sys.stderr)
        return 2
    except ExperimentError as e:
        print(e, file=sys.stderr)
        return 2
    out = Path(args.out) if args.out else Path("runs") / f"sweep-{sweep.name}"
    if args.dry_run:
        for point in sweep.points:
            print(f"{point.label}: {point.describe()}")
        runs = len(sweep.runs())
        print(f"{len(sweep.points)} point(s) x seeds {list(sweep.seeds)} = {runs} runs into {out}")
        return 0
    from rmqlab.pipeline.session import SparkUnavailable

    try:
        result = run_sweep(sweep, out, master=args.master, show_progress=not args.quiet)
    except (SweepMismatch, SparkUnavailable) as e:
        print(f"rmq-sim: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        from rmqlab.sim.sweep import read_marker

        done = sum(read_marker(out / s.rel) is not None for s in sweep.runs())
        print(
            f"rmq-sim: interrupted with {done} of {len(sweep.runs())} runs finished; the same command "
            "runs the others",
            file=sys.stderr,
        )
        return 130

    print(
        f"sweep {sweep.name}: {result.runs} runs ({result.resumed} finished before, {result.ran} run now), "
        f"simulated in {result.simulate_wall_s:.1f} s, analysed in {result.analyse_wall_s:.1f} s"
    )
    for f in result.failed_runs:
        print(f"failing run {f['run']}: {f['why']}\n  {f['command']}")
    print(f"sweep table: {out / 'sweep.parquet'}, {out / 'sweep.csv'}")
    print(f"report:      {out / 'sweep.html'}")
    return 1 if result.failed_runs else 0


def cmd_shrink(args: argparse.Namespace) -> int:
    from rmqlab.sim.shrink import NothingToShrink, Shrinker, ShrinkError, render, size, target_of

    run_dir = Path(args.run_dir)
    try:
        target = target_of(run_dir, args.reason)
    except RunDirError as e:
        print(f"rmq-sim: {e}", file=sys.stderr)
        return 2
    except NothingToShrink as e:
        print(f"rmq-sim: {e}", file=sys.stderr)
        return 1
    except ShrinkError as e:
        print(f"rmq-sim: {e}", file=sys.stderr)
        return 2
    out = Path(args.out) if args.out else run_dir.parent / f"{run_dir.name}-shrunk.toml"
    shrinker = Shrinker(
        target.doc,
        target.seed,
        target.group,
        target.kind,
        origin=f"{run_dir.name}: seed {target.seed}, group {target.group} fails the {target.kind} check",
        budget=args.budget,
        say=(lambda _line: None) if args.quiet else lambda line: print(line, flush=True),
    )
    start = size(target.doc)
    print(
        f"shrinking {run_dir} (seed {target.seed}): group {target.group} fails the {target.kind} check; "
        f"{', '.join(f'{k} {v}' for k, v in start.items())}; budget {args.budget} candidates",
        flush=True,
    )
    doc = shrinker.run()
    out.parent.mkdir(parents=True, exist_ok=True)
    doc = {**doc, "name": f"{target.name}-shrunk"}
    out.write_text(render(doc, target.seed, shrinker.origin), encoding="utf-8")
    end = size(doc)
    print(
        f"{shrinker.candidates} candidates simulated, {shrinker.kept} kept"
        + (" (budget spent)" if shrinker.candidates >= args.budget else "")
    )
    print("before: " + ", ".join(f"{k} {v}" for k, v in start.items()))
    print("after:  " + ", ".join(f"{k} {end[k]}" for k in start))
    print(f"smallest failing experiment: {out}")
    print(f"  rmq-sim run {out}")
    if "sim" not in doc:
        print(f"  rmq-chaos run {out}")
    return 0


def budget_arg(text: str) -> int:
    try:
        n = int(text, 10)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"the budget must be a number of candidates >= 1, got {text!r}")
    return n


WIRE_HELP = (
    "frames on the in-memory network: command objects (the default, faster) or bytes through the real "
    "msgpack codec; the event logs are the same (default: the file's [sim] wire)"
)


def build_parser() -> argparse.ArgumentParser:
    p = command_parser(
        "rmq-sim",
        "Run a chaos experiment simulated: the real broker, name server and client code in one "
        "process on a virtual clock and an in-memory network, reproducible from a seed.",
        {
            0: "run: the verdict is ok; replay: identical; sweep: every run passed; shrink: written",
            1: "run: not ok; replay: a file differs; sweep: some run failed; shrink: the run did not fail",
            2: "bad usage or input (a bad or unknown experiment or sweep file, no Spark for a sweep)",
            3: "run: the run did not complete",
            130: "interrupted (a sweep resumes when started again)",
        },
    )
    sub = p.add_subparsers(dest="command", required=True, metavar="run|replay|sweep|shrink")
    run = subcommand(
        sub,
        "run",
        "simulate an experiment file (or a shipped experiment by name)",
        {
            0: "the verdict is ok",
            1: "it is not",
            2: "bad usage or a bad experiment file",
            3: "the run did not complete (or its analysis failed)",
        },
    )
    run.add_argument(
        "file",
        metavar="EXPERIMENT",
        help="a .toml file, the name of a shipped experiment, or a known problem (known/NAME; see "
        "rmq-chaos known)",
    )
    add_variant(run)
    run.add_argument("--seed", type=seed_arg, default=None, help="seed (default: the file's 'seed')")
    run.add_argument(
        "--out", default=None, metavar="DIR", help="run directory (default runs/NAME-simSEED-TIME)"
    )
    run.add_argument("--no-analyze", action="store_true", help="skip rmq-analyze; verdict from live counts")
    add_quiet(run)
    run.add_argument("--wire", choices=WIRES, default=None, help=WIRE_HELP)
    add_json(run, "the verdict, exit code and output paths")
    run.set_defaults(func=cmd_run)
    rep = subcommand(
        sub,
        "replay",
        "re-run a simulated run from its manifest and compare the event files",
        {0: "every event file is identical", 1: "one differs", 2: "bad input"},
    )
    rep.add_argument("run_dir", metavar="RUN_DIR")
    rep.add_argument(
        "--out", default=None, metavar="DIR", help="keep the replay here (default: a temporary dir)"
    )
    rep.add_argument("--wire", choices=WIRES, default=None, help=WIRE_HELP)
    rep.set_defaults(func=cmd_replay)
    sw = subcommand(
        sub,
        "sweep",
        "simulate a grid of parameter points x seeds as Spark tasks, then analyse every run",
        {
            0: "every run passed",
            1: "some run failed (listed with its replay command)",
            2: "bad input (a bad sweep file, an output folder of another sweep, no Spark)",
            130: "interrupted (run it again to resume)",
        },
        description="Run a sweep file: every (point, seed) simulated as a Spark task, every run analysed in "
        "the same Spark application; writes sweep.html, sweep.parquet/csv and runs.parquet/csv. Started "
        "again with the same --out, it runs only what is not finished.",
    )
    sw.add_argument("file", metavar="SWEEP", help="a sweep .toml file, or the name of a shipped sweep")
    add_master(sw, "Spark master URL (default local[*])")
    sw.add_argument("--out", default=None, metavar="DIR", help="output folder (default runs/sweep-NAME)")
    sw.add_argument("--dry-run", action="store_true", help="check the file and list the runs; run nothing")
    add_quiet(sw)
    sw.set_defaults(func=cmd_sweep)
    sh = subcommand(
        sub,
        "shrink",
        "search for a smaller experiment that still fails a failing simulated run's verdict",
        {0: "the smaller experiment is written", 1: "the run did not fail", 2: "bad input"},
        description="Simulate smaller variants of a failing simulated run (fewer consumers, fewer nemesis "
        "actions, a shorter duration, fewer queues and messages) with its seed, analyse each in plain "
        "Python, keep a variant when the same check still fails, and write the smallest as an experiment "
        "file.",
    )
    sh.add_argument("run_dir", metavar="RUN_DIR", help="a simulated run whose verdict failed")
    sh.add_argument(
        "--out", default=None, metavar="FILE", help="experiment file to write (default RUN_DIR-shrunk.toml)"
    )
    sh.add_argument(
        "--budget", type=budget_arg, default=200, metavar="N", help="candidates to simulate at most (200)"
    )
    sh.add_argument(
        "--reason",
        choices=CHECKS,
        default=None,
        help="the failing check to keep (default: the run's most severe: lost, orderly, not-converged)",
    )
    add_quiet(sh)
    sh.set_defaults(func=cmd_shrink)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args))


def entry() -> int:
    """The console script: string hashes (and so set order) must not change between runs of one seed."""
    if os.environ.get("PYTHONHASHSEED") != HASH_SEED:
        env = {**os.environ, "PYTHONHASHSEED": HASH_SEED}
        os.execve(sys.executable, [sys.executable, "-P", "-m", "rmqlab.sim", *sys.argv[1:]], env)
    return main()


if __name__ == "__main__":
    sys.exit(entry())
