"""``rmq-chaos``: run an experiment on a local cluster, list the shipped experiments, validate a file.

Exit codes of ``run``: 0 the verdict is ok, 1 it is not, 2 bad usage or a bad experiment file, 3 the
run itself failed (a process did not start, a broker did not answer), 130 interrupted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rmqlab.chaos.cleanup import add_clean_command
from rmqlab.chaos.handdriven import add_commands
from rmqlab.chaos.realclients import check_environment
from rmqlab.cli import (
    CHAOS_SHELVES,
    UnknownName,
    add_json,
    add_out,
    add_quiet,
    add_variant,
    command_parser,
    find_shipped,
    positive_float,
    positive_int,
    print_json,
    shipped,
    subcommand,
)
from rmqlab.lab import known
from rmqlab.lab.experiment import (
    CLIENT_NAMES,
    V5_CLIENTS,
    Experiment,
    ExperimentError,
    load,
    parse,
)
from rmqlab.lab.schedule import unfit_steps

if TYPE_CHECKING:
    from rmqlab.chaos.run import ChaosRun


def resolve(path_or_name: str, variant: str | None = None) -> Experiment:
    """An experiment from a file, a shipped one by name (``demo`` or ``demo.toml``), or a known problem
    (``known/NAME``) with the switches of its ``variant`` (default affected)."""
    try:
        if known.is_known(path_or_name):
            entry = known.find(path_or_name)
            variant = variant or known.DEFAULT_VARIANT
            if "processes" not in entry.needs:
                raise UnknownName(
                    f"known/{entry.name} runs simulated only ({', '.join(entry.needs)}): "
                    f"rmq-sim run known/{entry.name}"
                )
            text = known.experiment_text(entry, variant, sim=False)
            exp = parse(text, source=f"{known.KNOWN.label}/{entry.name}.toml", default_name=entry.name)
            return known.for_processes(entry, variant, exp)
        if variant is not None:
            raise UnknownName(f"--variant goes with a catalogue entry (known/NAME), not {path_or_name!r}")
        found = find_shipped(path_or_name, CHAOS_SHELVES)
    except UnknownName as e:
        raise ExperimentError(path_or_name, [(None, str(e))]) from None
    if found is not None:
        return parse(found.text, source=found.source, default_name=found.name)
    return load(Path(path_or_name))  # also reports a file that cannot be read


def _warnings(exp: Experiment) -> list[str]:
    out = []
    w = exp.workload
    if w is not None:
        need = w.count / w.rate
        have = exp.wall(exp.duration) + exp.wall(exp.drain_timeout) - exp.wall(w.start)
        if need > have:
            out.append(
                f"the producers need {need:.1f}s wall to send {w.count} messages at {w.rate:g}/s, "
                f"but the run and its drain last {have:.1f}s wall: raise duration or drain_timeout, "
                "or lower count"
            )
    if not exp.consumers:
        out.append("no [[consumers]]: nothing will be consumed")
    unfit = unfit_steps(exp.schedule())
    for step, state in unfit[:UNFIT_SHOWN]:
        out.append(
            f"{step.t:g}s {step.describe()}: the schedule before it leaves {step.target} {state}, so the "
            "runner will skip it"
        )
    if len(unfit) > UNFIT_SHOWN:
        out.append(f"... and {len(unfit) - UNFIT_SHOWN} more action(s) the runner will skip")
    return out


UNFIT_SHOWN = 10  # validate names this many actions that will be skipped


def cmd_validate(args: argparse.Namespace) -> int:
    try:
        exp = resolve(args.file)
        check_environment(exp)  # a real client this machine cannot run is a problem of the file's
    except ExperimentError as e:
        if args.json:
            print_json({"ok": False, "problems": str(e).splitlines()})
        print(e, file=sys.stderr)
        return 2
    if args.json:
        print_json(_validated(exp))
        return 0
    nodes = exp.nodes()
    roles: dict[str, list[str]] = {}
    for n, info in nodes.items():
        roles.setdefault(info.role, []).append(n)
    print(f"ok: {exp.name}" + (f" - {exp.question}" if exp.question else ""))
    print(
        f"time scale {exp.time_scale:g}: {exp.duration:g}s of RocketMQ time = "
        f"{exp.wall(exp.duration):.1f}s wall; seed {exp.seed}"
    )
    for role in ("namesrv", "broker", "producer", "consumer"):
        if role in roles:
            print(f"  {role}: {', '.join(roles[role])}")
    for c in exp.consumers:
        kind = "orderly" if c.orderly else "concurrent"
        joins = f", joining at {c.start:g}s" if c.start > 0 else ""
        balance = "POP through rmq-proxy" if c.client in V5_CLIENTS else c.strategy
        print(
            f"  group {c.group}: {c.count} x {kind} on {c.topic}, {balance}, consume {c.consume_ms} ms, "
            f"{CLIENT_NAMES[c.client]} ({', '.join(c.nodes)}){joins}"
        )
    if exp.engine != "emulator":
        print(
            f"  engine {exp.engine}: Apache RocketMQ's own name server and brokers (JVMs); Apache's Go "
            "producer sends the workload"
        )
    elif exp.real_clients() - set(V5_CLIENTS):
        print("  real clients keep RocketMQ's own timers; the servers open their native ports for them")
    if exp.real_clients() & set(V5_CLIENTS):
        print("  RocketMQ 5 clients keep their own timers; rmq-proxy serves them gRPC over the brokers")
    if exp.broker_flags():
        print(f"  broker flags: {' '.join(exp.broker_flags())}")
    if exp.has_slaves:
        print(
            "  slaves: "
            + ", ".join(f"{b} {exp.slave_count(b)}" for b in exp.brokers)
            + f" ({exp.broker_role})"
        )
    steps = exp.schedule()
    print(f"schedule ({len(steps)} action(s)):")
    for s in steps:
        print(f"  {s.t:8.1f}s (wall {exp.wall(s.t):7.2f}s)  {s.describe()}")
    for w in _warnings(exp):
        print(f"warning: {w}")
    return 0


def _validated(exp: Experiment) -> dict[str, Any]:
    """What validate prints, as data."""
    roles: dict[str, list[str]] = {}
    for n, info in exp.nodes().items():
        roles.setdefault(info.role, []).append(n)
    return {
        "ok": True,
        "name": exp.name,
        "question": exp.question,
        "time_scale": exp.time_scale,
        "duration_s": exp.duration,
        "wall_s": exp.wall(exp.duration),
        "seed": exp.seed,
        "nodes": roles,
        "groups": [
            {
                "group": c.group,
                "topic": c.topic,
                "count": c.count,
                "orderly": c.orderly,
                "client": c.client,
                "strategy": c.strategy,
                "consume_ms": c.consume_ms,
                "start_s": c.start,
                "nodes": list(c.nodes),
            }
            for c in exp.consumers
        ],
        "schedule": [
            {
                "t_s": st.t,
                "wall_s": exp.wall(st.t),
                "action": st.action,
                "target": st.target,
                "text": st.describe(),
            }
            for st in exp.schedule()
        ],
        "warnings": _warnings(exp),
    }


def cmd_list(args: argparse.Namespace) -> int:
    rows = []
    listed = []
    for name, entry in shipped(CHAOS_SHELVES).items():
        try:
            exp = parse(entry.text, source=entry.source, default_name=name)
            rows.append((name, f"{exp.wall(exp.duration):.0f}s", exp.question))
            listed.append(
                {
                    "name": name,
                    "source": entry.source,
                    "wall_s": exp.wall(exp.duration),
                    "duration_s": exp.duration,
                    "question": exp.question,
                    "valid": True,
                }
            )
        except ExperimentError as e:
            rows.append((name, "?", f"INVALID: {e}"))
            listed.append(
                {"name": name, "source": entry.source, "valid": False, "problems": str(e).splitlines()}
            )
    if args.json:
        print_json(listed)
        return 0
    width = max((len(r[0]) for r in rows), default=4)
    print(f"{'experiment':<{width}}  wall  question")
    for name, wall, question in rows:
        print(f"{name:<{width}}  {wall:>4}  {question}")
    print("\nrun one with: rmq-chaos run NAME (or a path to a .toml file)")
    return 0


def cmd_known(args: argparse.Namespace) -> int:
    rows = [entry.as_json() for entry in known.CATALOGUE]
    if args.json:
        print_json(rows)
        return 0
    for row in rows:
        issues = ", ".join(row["issues"]) or "no tracker issue (see the change)"
        print(f"known/{row['name']}")
        print(f"  {row['question']}")
        print(f"  issues: {issues}")
        print(f"  affected: {row['affected']}; fixed in {row['fixed_in']}: {row['change']}")
        print(f"  figure: {row['figure']} (the problem shows when it is above {row['shows_above']:g})")
        print(f"  runs: {', '.join(row['needs'])}; {row['command']}")
    print(f"\n{len(rows)} known problem(s); the docs' catalogue page shows what the lab measured")
    return 0


def _run_dir(exp: Experiment, out: str | None) -> Path:
    if out:
        return Path(out)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return Path("runs") / f"{exp.name}-{stamp}"


def cmd_run(args: argparse.Namespace) -> int:
    if not args.json:
        return _run(args)
    # --json: the runner's lines go to stderr, one JSON object to stdout, whatever the outcome.
    outcome: dict[str, Any] = {"experiment": args.file}
    rc = _run(args, outcome)
    print_json({**outcome, "exit_code": rc})
    return rc


def _run(args: argparse.Namespace, outcome: dict[str, Any] | None = None) -> int:
    from rmqlab.chaos.run import ChaosRun

    try:
        exp = resolve(args.file, args.variant)
    except ExperimentError as e:
        print(e, file=sys.stderr)
        return 2
    if outcome is not None:
        outcome["experiment"] = exp.name
    extra = None
    if known.is_known(args.file):
        variant = args.variant or known.DEFAULT_VARIANT
        extra = {"known": known.find(args.file).manifest(variant)}
        if outcome is not None:
            outcome.update(known=args.file, variant=variant)
    image = None
    if args.backend == "docker":  # before the local checks: a real client is the backend's problem here
        from rmqlab.chaos.container import BackendError, check_backend

        try:
            image = check_backend(exp, args.image)
        except BackendError as e:
            print(f"rmq-chaos: the docker backend cannot run {exp.name}: {e}", file=sys.stderr)
            return 2
    else:
        try:
            check_environment(exp)
        except ExperimentError as e:
            print(e, file=sys.stderr)
            return 2
        if exp.kernel_only_network_faults():
            print(
                "rmq-chaos: these network faults need --backend docker (the kernel's iptables; the local "
                "fault relay sits between one client and a server and cuts both ways): "
                f"{'; '.join(exp.kernel_only_network_faults())}",
                file=sys.stderr,
            )
            return 2
    run_dir = _run_dir(exp, args.out)
    if run_dir.exists() and any(run_dir.rglob("*.jsonl")):
        print(f"rmq-chaos: {run_dir} already holds a run's logs; choose another --out", file=sys.stderr)
        return 2
    for w in _warnings(exp):
        print(f"warning: {w}", file=sys.stderr)
    runner = ChaosRun(
        exp,
        run_dir,
        analyze=not args.no_analyze,
        ready_timeout_s=args.ready_timeout,
        image=image,
        out=sys.stderr if args.json else sys.stdout,
        quiet=args.quiet,
        metrics=args.metrics,
        manifest_extra=extra,
    )
    if outcome is not None:
        outcome["run_dir"] = str(run_dir)

    rc = _drive(runner)
    if outcome is not None and rc != 130:
        outcome.update(runner.result.as_json())
    return rc


def _drive(runner: ChaosRun) -> int:
    """Run a ChaosRun to its end on a loop of its own; a signal cancels it (exit code 130)."""

    async def main() -> int:
        task = asyncio.current_task()
        assert task is not None
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            loop.add_signal_handler(sig, task.cancel)
        try:
            result = await runner.run()
        except asyncio.CancelledError:
            return 130
        return result.exit_code

    with asyncio.Runner() as r:
        try:
            return r.run(main())
        except KeyboardInterrupt:
            return 130


def cmd_compare(args: argparse.Namespace) -> int:
    """Run experiments on combinations of broker and client, once per seed, and print the table."""
    from dataclasses import replace

    from rmqlab.chaos.compare import COMBOS, COMPARE_SET, combination, differing, parse_combos, render
    from rmqlab.chaos.process_cluster import check_engine_environment
    from rmqlab.chaos.realclients import RealClients

    try:
        combos = parse_combos(args.combos) if args.combos else tuple(COMBOS.values())
    except ValueError as e:
        print(f"rmq-chaos compare: {e}", file=sys.stderr)
        return 2
    names = list(dict.fromkeys([*args.files, *(COMPARE_SET if args.set else ())]))
    if not names:
        print(
            "rmq-chaos compare: name an experiment, or --set for the shipped comparison set", file=sys.stderr
        )
        return 2
    plans: dict[str, tuple[Experiment, dict[str, Experiment]]] = {}
    problems: list[str] = []
    checked: set[str] = set()
    clients = RealClients()
    for name in names:
        try:
            exp = resolve(name)
            apache = exp.engine if exp.engine != "emulator" else args.engine
            if apache == "emulator":
                print("rmq-chaos compare: --engine must name an Apache engine", file=sys.stderr)
                return 2
            variants = {}
            for combo in combos:
                try:
                    variants[combo.name] = combination(exp, combo, apache)
                except ExperimentError as e:
                    problems.append(str(e))
            for variant in variants.values():
                check_environment(variant, clients)
                if variant.engine != "emulator" and variant.engine not in checked:
                    check_engine_environment(variant, clients)
                    checked.add(variant.engine)
            plans[exp.name] = (exp, variants)
        except ExperimentError as e:
            problems.append(str(e))
    if problems:
        print("\n".join(problems), file=sys.stderr)
        return 2
    out = Path(args.out) if args.out else Path("runs") / f"compare-{time.strftime('%Y%m%d-%H%M%S')}"
    if not args.resume and out.exists() and any(out.rglob("*.jsonl")):
        print(
            f"rmq-chaos: {out} already holds runs' logs; choose another --out, or --resume", file=sys.stderr
        )
        return 2
    say = sys.stderr if args.json else sys.stdout
    doc: dict[str, Any] = {
        "engine": args.engine,
        "combos": [c.name for c in combos],
        "combinations": {c.name: {"broker": c.engine(args.engine), "client": c.client} for c in combos},
        "seeds_per_experiment": args.seeds,
        "experiments": {},
    }
    failed = False
    for name, (exp, variants) in plans.items():
        seeds = [exp.seed + i for i in range(args.seeds)]
        entry: dict[str, Any] = {
            "source": exp.source,
            "question": exp.question,
            "time_scale": exp.time_scale,
            "seeds": seeds,
            "engines": {c: v.engine for c, v in variants.items()},
            "runs": {c: [] for c in variants},
            "groups": {},
        }
        doc["experiments"][name] = entry
        summaries: dict[str, list[dict[str, Any]]] = {c: [] for c in variants}
        for seed in seeds:
            for combo, variant in variants.items():
                run_dir = out / name / f"{combo}-seed{seed}"
                rc, run = _compare_run(replace(variant, seed=seed), run_dir, args, say)
                if rc == 130:
                    return 130
                failed |= rc not in (0, 1)
                entry["runs"][combo].append(run)
                summaries[combo].append(_compare_summary(exp, run_dir, rc))
                _write_comparison(out, doc, name, summaries, exp.time_scale)
        if not args.json:
            print(f"\n{name} ({', '.join(f'seed {s}' for s in seeds)})", file=say)
            print(render(entry["groups"], list(variants)), file=say)
    if args.json:
        print_json(doc)
    else:
        print(f"written: {out / 'compare.json'}, {out / 'compare.md'}")
    if failed:
        return 3
    return 1 if any(differing(e["groups"]) for e in doc["experiments"].values()) else 0


def _compare_run(
    exp: Experiment, run_dir: Path, args: argparse.Namespace, say: Any
) -> tuple[int, dict[str, Any]]:
    """One run of a comparison (or, with --resume, the complete one its folder already holds): its exit
    code and its record (folder, wall seconds, load average before and after)."""
    import os
    import shutil

    from rmqlab.chaos.run import ChaosRun

    manifest = run_dir / "manifest.json"
    if args.resume and manifest.is_file():
        m = json.loads(manifest.read_text())
        if not m.get("errors") and not m.get("interrupted"):
            print(
                f"compare: {exp.name} seed {exp.seed} on {run_dir.name}: kept from before",
                file=say,
                flush=True,
            )
            record = run_dir / "compare-run.json"
            earlier = json.loads(record.read_text()) if record.is_file() else {}
            return 0, {
                "dir": str(run_dir),
                "wall_s": round((m["ended_ms"] - m["started_ms"]) / 1000, 1),
                **earlier,
                "kept": True,
            }
    if args.resume and run_dir.exists():
        aside = run_dir.with_name(run_dir.name + ".incomplete")
        shutil.rmtree(aside, ignore_errors=True)
        run_dir.rename(aside)
    print(
        f"compare: {exp.name} seed {exp.seed} on {run_dir.parent.name}/{run_dir.name} -> {run_dir}",
        file=say,
        flush=True,
    )
    load_before = os.getloadavg()[0]
    started = time.monotonic()
    runner = ChaosRun(
        exp, run_dir, analyze=False, quiet=True, out=sys.stderr, ready_timeout_s=args.ready_timeout
    )
    rc = _drive(runner)
    record = {
        "dir": str(run_dir),
        "wall_s": round(time.monotonic() - started, 1),
        "load_average": [round(load_before, 2), round(os.getloadavg()[0], 2)],
        "exit_code": rc,
    }
    if run_dir.is_dir():
        (run_dir / "compare-run.json").write_text(json.dumps(record, indent=2) + "\n")
    if rc not in (0, 1, 130):
        print(
            f"rmq-chaos compare: the run {run_dir} failed (exit code {rc}); the comparison goes on",
            file=sys.stderr,
        )
    return rc, record


def _compare_summary(exp: Experiment, run_dir: Path, rc: int) -> dict[str, Any]:
    """The summary of one run with its event figures; a failed run's groups have the verdict 'run failed'."""
    from rmqlab.chaos.compare import before_teardown, with_event_figures
    from rmqlab.pipeline.metrics_reference import load_run, summarize

    if rc not in (0, 1):
        return {"groups": {c.group: {"verdict": "run failed"} for c in exp.consumers}}
    events, malformed = load_run(run_dir)
    events = before_teardown(events)
    return with_event_figures(summarize(events, malformed), (e.rec for e in events), exp.time_scale)


def _write_comparison(
    out: Path, doc: dict[str, Any], name: str, summaries: dict[str, list[dict[str, Any]]], time_scale: float
) -> None:
    """compare.json and compare.md as the runs so far make them (written after every run)."""
    from rmqlab.chaos.compare import compare_groups, render_markdown

    doc["experiments"][name]["groups"] = compare_groups(summaries, time_scale)
    out.mkdir(parents=True, exist_ok=True)
    (out / "compare.json").write_text(json.dumps(doc, indent=2) + "\n")
    (out / "compare.md").write_text(render_markdown(doc))


COMPARE_EXIT_CODES = {
    0: "every compared figure agrees on every combination",
    1: "some figure differs (the table says which)",
    2: "bad usage, or an experiment that cannot run on a combination (each problem as FILE:LINE: message)",
    3: "a run failed (a process did not start, a broker did not answer); the others ran, the table says "
    "'run failed' for it",
    130: "interrupted",
}
RUN_EXIT_CODES = {
    0: "the verdict is ok",
    1: "the verdict is not ok",
    2: "bad usage or a bad experiment file",
    3: "the run itself failed (a process did not start, a broker did not answer)",
    130: "interrupted",
}
EXIT_CODES = {
    0: "ok (run: the verdict is ok)",
    1: "run: the verdict is not ok",
    2: "bad usage, a bad or unknown experiment file",
    3: "run: the run itself failed; clean: the container engine cannot be reached",
    130: "interrupted",
}


def build_parser() -> argparse.ArgumentParser:
    p = command_parser(
        "rmq-chaos",
        "Break a local RocketMQ-emulator cluster on a schedule and get a verdict.",
        EXIT_CODES,
    )
    sub = p.add_subparsers(
        dest="command", required=True, metavar="run|compare|list|known|validate|nemesis|wait|clean"
    )
    run = subcommand(sub, "run", "run an experiment file (or a shipped experiment by name)", RUN_EXIT_CODES)
    run.add_argument(
        "file",
        metavar="EXPERIMENT",
        help="a .toml file, the name of a shipped experiment, or a known problem (known/NAME; see "
        "rmq-chaos known)",
    )
    add_variant(run)
    add_out(run, "run directory (default runs/NAME-TIMESTAMP)")
    run.add_argument("--no-analyze", action="store_true", help="skip the pipeline; verdict from live counts")
    run.add_argument(
        "--ready-timeout",
        type=positive_float,
        default=60.0,
        metavar="S",
        help="seconds a process may take to be READY (default 60)",
    )
    run.add_argument(
        "--backend",
        choices=("local", "docker"),
        default="local",
        help="run every node as a local process (default) or in its own container of the lab's image",
    )
    run.add_argument(
        "--image",
        default="rocketmq-rebalance-lab:latest",
        metavar="NAME",
        help="the image of the docker backend (scripts/docker/build_image.sh builds it)",
    )
    run.add_argument(
        "--metrics",
        action="store_true",
        help="every name server, broker and consumer of ours serves live metrics in Prometheus text "
        "(local processes; the endpoints are printed once the cluster is up)",
    )
    add_quiet(run, "no progress or step lines: only the verdict, the report and the run directory")
    add_json(run, "the verdict, exit code and output paths")
    run.set_defaults(func=cmd_run)
    lst = subcommand(sub, "list", "the shipped experiments and the question each answers", {0: "listed"})
    add_json(lst, "the experiments (a JSON list)")
    lst.set_defaults(func=cmd_list)
    kn = subcommand(
        sub,
        "known",
        "the catalogue of RocketMQ's known rebalancing problems the lab reproduces",
        {0: "listed"},
    )
    add_json(kn, "the catalogue (a JSON list)")
    kn.set_defaults(func=cmd_known)
    val = subcommand(
        sub,
        "validate",
        "check an experiment file and print its expanded schedule",
        {0: "the file is valid", 2: "it is not (each problem as FILE:LINE: message)"},
    )
    val.add_argument("file", metavar="EXPERIMENT")
    add_json(val, "the checked experiment and its schedule, or its problems")
    val.set_defaults(func=cmd_validate)
    cmp = subcommand(
        sub,
        "compare",
        "run experiments on combinations of broker (the emulator's, Apache's) and client (ours, Apache's "
        "Java client) and print the figures side by side",
        COMPARE_EXIT_CODES,
    )
    cmp.add_argument(
        "files",
        nargs="*",
        metavar="EXPERIMENT",
        help="a .toml file, or the name of a shipped experiment (any number)",
    )
    cmp.add_argument(
        "--set",
        action="store_true",
        help="the shipped comparison set (after the EXPERIMENTs named, if any)",
    )
    cmp.add_argument(
        "--combos",
        default=None,
        metavar="LIST",
        help="comma-separated combinations of broker and client: emulator+python, emulator+java, "
        "apache+java, apache+python (default all four, in that order; the first is the reference)",
    )
    cmp.add_argument(
        "--engine",
        default="apache-4.9.7",
        metavar="ENGINE",
        help="the Apache engine of the apache+ combinations when a file names none (default apache-4.9.7; "
        "or apache-5)",
    )
    cmp.add_argument(
        "--seeds",
        type=positive_int,
        default=3,
        help="runs per combination, seeds SEED, SEED+1, ... (default 3)",
    )
    add_out(cmp, "folder of the runs, compare.json and compare.md (default runs/compare-TIMESTAMP)")
    cmp.add_argument(
        "--resume",
        action="store_true",
        help="keep the complete runs --out already holds (and rebuild the table from them); run the rest",
    )
    cmp.add_argument(
        "--ready-timeout",
        type=positive_float,
        default=60.0,
        metavar="S",
        help="seconds a process may take to be READY (default 60)",
    )
    add_json(cmp, "the comparison as JSON (also written to compare.json)")
    cmp.set_defaults(func=cmd_compare)
    add_commands(sub)
    add_clean_command(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
