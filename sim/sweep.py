"""Sweeps: one experiment run simulated over a grid of parameter points and seeds.

A sweep file names a base experiment (a file, a shipped experiment, or an inline ``[experiment]``
table), fixed changes to it (``[set]``), the keys to vary (``[vary]``: lists, or ranges written
``{ from = A, to = B, step = S }``) and the seeds per point::

    name = "strategy-churn"
    question = "Which allocation strategy costs least under churn?"
    base = "churn-avg"            # a path (relative to this file) or a shipped experiment's name
    seeds = 3                     # seeds 1..3 at every point, or a list: seeds = [7, 11]

    [set]
    duration = 300

    [vary]
    consumers.strategy = ["AVG", "AVG_BY_CIRCLE", "CONSISTENT_HASH"]
    "consumers.1.count" = { from = 10, to = 30, step = 10 }

Keys are experiment keys, dotted; a number picks one table of an array of tables (1-based, as the
experiment's own messages count them), and without one every table of the array gets the value. Every
point is expanded and checked as an experiment before anything runs; a problem is reported at the line
of the sweep key that caused it (``file:line: problem``).

Everything here but ``run_task`` is pure. ``run_task`` runs one simulation where it is called (a Spark
task, see ``sim.sweep_run``), analyses it there (``pipeline.sweep_report.summarize_sweep_run``) and
writes its run directory with a completion marker, which is what makes a sweep resumable.
"""

from __future__ import annotations

import copy
import gc
import io
import itertools
import json
import math
import os
import re
import shutil
import sys
import time
import tomllib
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rmqlab.cli import SIM_SHELVES, shipped
from rmqlab.lab import experiment as lab_experiment
from rmqlab.lab.experiment import ExperimentError, KeyLines
from rmqlab.sim.sim_table import SimExperiment, parse

COMPLETE = "_complete.json"  # a finished run's marker (hidden from rmq-analyze's discovery)
ERROR = "_error.txt"  # why a run's simulation raised (the run is re-run on resume)
SIM_LOG = "_sim.log"  # what the simulator printed
SWEEP_JSON = "sweep.json"  # the expanded grid, at the root of the output folder
MAX_RUNS = 100_000
_SWEEP_KEYS = ("name", "question", "base", "seeds", "set", "vary", "experiment")
_RANGE_KEYS = {"from", "to", "step"}


@dataclass(frozen=True)
class Override:
    """A key of [set] or [vary]: its dotted name, path, line and the value(s) it takes."""

    key: str
    path: tuple[str | int, ...]  # ints: 0-based indexes into arrays of tables
    line: int | None
    values: tuple[Any, ...]


@dataclass(frozen=True)
class Point:
    """One parameter point: the varied keys' values and the experiment they make (with seed 0)."""

    index: int
    params: dict[str, Any]
    label: str  # the point's directory name

    def describe(self) -> str:
        return ", ".join(f"{k} = {_toml_value(v)}" for k, v in self.params.items()) or "(the base)"


@dataclass(frozen=True)
class RunSpec:
    """One simulation of the sweep: a point at a seed, and where it goes."""

    point: int
    seed: int
    rel: str  # POINT/seed-N, relative to the sweep's output folder
    text: str  # the experiment file of this run (the seed written in it)
    source: str
    name: str
    params: dict[str, Any]


@dataclass
class Sweep:
    name: str
    question: str
    source: str
    base_source: str
    base: dict[str, Any]
    seeds: tuple[int, ...]
    fixed: list[Override] = field(default_factory=list)
    axes: list[Override] = field(default_factory=list)
    points: list[Point] = field(default_factory=list)
    texts: dict[int, str] = field(default_factory=dict)  # point index -> experiment text (seed 0)

    def runs(self) -> list[RunSpec]:
        out = []
        for p in self.points:
            for seed in self.seeds:
                out.append(
                    RunSpec(
                        p.index,
                        seed,
                        f"{p.label}/seed-{seed}",
                        with_seed(self.texts[p.index], seed),
                        self.source,
                        f"{self.name}-{p.label}",
                        p.params,
                    )
                )
        return out

    def to_dict(self) -> dict[str, Any]:
        """What identifies the sweep's runs; a resumed sweep must have the same."""
        return {
            "name": self.name,
            "question": self.question,
            "source": self.source,
            "base": self.base_source,
            "seeds": list(self.seeds),
            "vary": {a.key: list(a.values) for a in self.axes},
            "set": {f.key: f.values[0] for f in self.fixed},
            "points": [{"label": p.label, "params": p.params} for p in self.points],
        }


# -- reading a sweep file -----------------------------------------------------------------------------


def load_sweep(path: str | Path) -> Sweep:
    p = Path(path)
    return parse_sweep(lab_experiment.read_text(p), str(p))


def parse_sweep(text: str, source: str = "<sweep>") -> Sweep:
    """The sweep with every point expanded and checked, or ExperimentError with every problem."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        m = re.search(r"\(at line (\d+), column (\d+)\)", str(e))
        msg = re.sub(r"\s*\(at line \d+, column \d+\)", "", str(e))
        raise ExperimentError(source, [(int(m.group(1)) if m else None, f"not valid TOML: {msg}")]) from None
    lines = KeyLines(text)
    problems: list[tuple[int | None, str]] = []

    def err(path: tuple[Any, ...], msg: str) -> None:
        problems.append((lines.line_of(path), msg))

    for key in data:
        if key not in _SWEEP_KEYS:
            err((key,), f"unknown key '{key}' (a sweep file has: {', '.join(_SWEEP_KEYS)})")
    name = data.get("name", Path(source).stem if not source.startswith("<") else "sweep")
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_.-]{1,100}", name):
        err(("name",), f"name: must be 1-100 letters, digits, '_', '-' or '.', got {name!r}")
        name = "sweep"
    question = data.get("question", "")
    if not isinstance(question, str):
        err(("question",), f"question: must be a string, got {question!r}")
        question = ""
    seeds = _seeds(data.get("seeds", 1), err)
    base, base_source = _base(data, source, err)
    fixed = _overrides(data.get("set", {}), ("set",), lines, err, single=True)
    axes = _overrides(data.get("vary", {}), ("vary",), lines, err, single=False)
    seen: dict[tuple[Any, ...], str] = {}
    for o in (*fixed, *axes):
        if o.path in seen:
            err((o.key,), f"{o.key}: set twice (also as {seen[o.path]})")
        seen[o.path] = o.key
    total = math.prod(len(a.values) for a in axes) * max(len(seeds), 1)
    if total > MAX_RUNS:
        err(("vary",), f"vary: the grid has {total} runs; at most {MAX_RUNS} in one sweep")
    if problems or base is None:
        raise ExperimentError(source, problems or [(None, "no base experiment")])
    sweep = Sweep(name, question, source, base_source, base, seeds, fixed, axes)
    _expand(sweep, lines, data)
    return sweep


def _seeds(value: Any, err: Any) -> tuple[int, ...]:
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 1:
            err(("seeds",), f"seeds: must be >= 1, got {value}")
            return ()
        return tuple(range(1, value + 1))
    if (
        isinstance(value, list)
        and value
        and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
    ):
        if len(set(value)) != len(value):
            err(("seeds",), "seeds: a seed is listed twice")
        return tuple(value)
    err(("seeds",), f"seeds: a number of seeds per point or a list of seeds (integers), got {value!r}")
    return ()


def _base(data: dict[str, Any], source: str, err: Any) -> tuple[dict[str, Any] | None, str]:
    """The base experiment's TOML data, checked on its own (its problems name its own lines)."""
    inline = data.get("experiment")
    ref = data.get("base")
    if (inline is None) == (ref is None):
        err(
            ("base",), "give the base experiment either as base = FILE (or a shipped name) or as [experiment]"
        )
        return None, ""
    if inline is not None:
        if not isinstance(inline, dict):
            err(("experiment",), "experiment: must be a table ([experiment])")
            return None, ""
        return inline, f"{source} [experiment]"
    if not isinstance(ref, str):
        err(("base",), f"base: must be a file name or a shipped experiment's name, got {ref!r}")
        return None, ""
    near = Path(source).parent / ref if not source.startswith("<") else Path(ref)
    found = shipped(SIM_SHELVES).get(ref.removesuffix(".toml")) if "/" not in ref else None
    if near.is_file():
        text, base_source = lab_experiment.read_text(near), str(near)
    elif found is not None:
        base_source, text = found.source, found.text
    else:
        err(("base",), f"base: no experiment file {str(near)!r} and no shipped experiment named {ref!r}")
        return None, ""
    parse(text, source=base_source)  # its own problems, with its own file and lines
    return tomllib.loads(text), base_source


def _flatten(table: dict[str, Any], prefix: tuple[str, ...]) -> list[tuple[tuple[str, ...], Any]]:
    """Dotted keys of [set]/[vary] (TOML nests them into tables) down to their values."""
    out: list[tuple[tuple[str, ...], Any]] = []
    for key, value in table.items():
        path = (*prefix, key)
        if isinstance(value, dict) and not (value and set(value) <= _RANGE_KEYS and "from" in value):
            out += _flatten(value, path)
        else:
            out.append((path, value))
    return out


def _overrides(
    table: Any, where: tuple[str, ...], lines: KeyLines, err: Any, *, single: bool
) -> list[Override]:
    if not isinstance(table, dict):
        err(where, f"{where[0]}: must be a table ([{where[0]}])")
        return []
    out = []
    for path, value in _flatten(table, where):
        key = ".".join(path[1:])  # a quoted key may hold dots too: "consumers.1.count"
        line = lines.line_of(path)
        if key == "seed":
            err(path, f"{where[0]}.seed: the seeds are the sweep's 'seeds'")
            continue
        target: list[str | int] = []
        for part in key.split("."):
            if part.isdigit():
                if int(part) < 1:
                    err(path, f"{where[0]}.{key}: array indexes count from 1")
                    break
                target.append(int(part) - 1)
            else:
                target.append(part)
        else:
            if single:
                out.append(Override(key, tuple(target), line, (value,)))
                continue
            values = _values(value, f"vary.{key}", path, err)
            if values:
                out.append(Override(key, tuple(target), line, values))
    return out


def _values(value: Any, where: str, path: tuple[str, ...], err: Any) -> tuple[Any, ...]:
    """A [vary] key's values: a non-empty list, or a range table (inclusive of 'to' when on a step)."""
    if isinstance(value, list):
        if not value:
            err(path, f"{where}: an empty list varies nothing")
        elif len({_toml_value(v) for v in value}) != len(value):
            err(path, f"{where}: a value is listed twice")
        return tuple(value)
    if isinstance(value, dict):
        lo, hi, step = value.get("from"), value.get("to"), value.get("step", 1)
        nums = (lo, hi, step)
        if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in nums):
            err(path, f"{where}: a range is {{ from = A, to = B, step = S }} with numbers, got {value!r}")
            return ()
        assert isinstance(lo, int | float) and isinstance(hi, int | float) and isinstance(step, int | float)
        if step <= 0 or hi < lo:
            err(path, f"{where}: a range needs step > 0 and to >= from, got {value!r}")
            return ()
        count = math.floor((hi - lo) / step + 1e-9) + 1
        if count > MAX_RUNS:
            err(path, f"{where}: the range has {count} values")
            return ()
        whole = all(isinstance(v, int) for v in nums)
        return tuple(lo + i * step if whole else round(lo + i * step, 9) for i in range(count))
    err(path, f"{where}: give a list of values or a range {{ from = A, to = B, step = S }}, got {value!r}")
    return ()


# -- expanding the grid ---------------------------------------------------------------------------------


def _apply(data: dict[str, Any], path: tuple[str | int, ...], value: Any) -> list[tuple[str | int, ...]]:
    """Set ``path`` to ``value`` in ``data`` (every table of an array when no index is given); returns the
    concrete paths set. Raises ValueError when the path does not lead to a key."""
    out: list[tuple[str | int, ...]] = []

    def walk(node: Any, rest: tuple[str | int, ...], done: tuple[str | int, ...]) -> None:
        part, tail = rest[0], rest[1:]
        if isinstance(node, list):
            if isinstance(part, int):
                if part >= len(node) or not isinstance(node[part], dict):
                    raise ValueError(
                        f"the base has {len(node)} [[{_show_path(done)}]] table(s), not {part + 1}"
                    )
                walk(node[part], tail, (*done, part))
                return
            if not node:
                raise ValueError(f"the base has no [[{_show_path(done)}]] table")
            for i, item in enumerate(node):
                if not isinstance(item, dict):
                    raise ValueError(f"{_show_path(done)} is not an array of tables")
                walk(item, rest, (*done, i))
            return
        if not isinstance(node, dict) or isinstance(part, int):
            raise ValueError(f"{_show_path(done) or 'the experiment'} is not an array of tables")
        if not tail:
            node[part] = copy.deepcopy(value)
            out.append((*done, part))
            return
        if part not in node:
            node[part] = {}
        walk(node[part], tail, (*done, part))

    walk(data, path, ())
    return out


def _show_path(path: tuple[str | int, ...]) -> str:
    return "".join(f"[{p + 1}]" if isinstance(p, int) else ("." if i else "") + p for i, p in enumerate(path))


def _label(index: int, params: dict[str, Any]) -> str:
    parts = [f"p{index:03d}"]
    for key, value in params.items():
        short = next((s for s in reversed(key.split(".")) if not s.isdigit()), key)
        text = value if isinstance(value, str) else _toml_value(value)
        parts.append(re.sub(r"[^A-Za-z0-9._]+", "-", f"{short}-{text}").strip("-"))
    return "_".join(parts)[:100]


def _expand(sweep: Sweep, lines: KeyLines, data: dict[str, Any]) -> None:
    """Every point's experiment, checked; problems reported at the sweep key that caused them."""
    problems: dict[tuple[int | None, str], None] = {}
    axes = sweep.axes
    for index, combo in enumerate(itertools.product(*(a.values for a in axes)), 1):
        params = {a.key: v for a, v in zip(axes, combo, strict=True)}
        point = Point(index, params, _label(index, params))
        doc = copy.deepcopy(sweep.base)
        doc.pop("seed", None)
        touched: list[tuple[Override, Any, list[tuple[str | int, ...]]]] = []
        failed = False
        for o, value in [(f, f.values[0]) for f in sweep.fixed] + list(zip(axes, combo, strict=True)):
            try:
                touched.append((o, value, _apply(doc, o.path, value)))
            except ValueError as e:
                problems[(o.line, f"{o.key}: {e}")] = None
                failed = True
        if failed:
            continue
        text = render_point(sweep, point, doc)
        try:
            parse(with_seed(text, 0), source=sweep.source, default_name=sweep.name)
        except ExperimentError as e:
            for _line, msg in e.problems:
                problems[_blame(msg, touched, sweep, lines, data, point)] = None
            continue
        sweep.points.append(point)
        sweep.texts[index] = text
    if problems:
        raise ExperimentError(sweep.source, list(problems))


def _where_path(msg: str) -> tuple[str | int, ...]:
    """("consumers", 0, "count") from a message that starts "consumers[1].count: ..."."""
    head = msg.split(":", 1)[0].strip()
    out: list[str | int] = []
    for name, index in re.findall(r"([A-Za-z0-9_-]+)|\[(\d+)\]", head):
        out.append(int(index) - 1 if index else name)
    return tuple(out)


def _blame(
    msg: str,
    touched: list[tuple[Override, Any, list[tuple[str | int, ...]]]],
    sweep: Sweep,
    lines: KeyLines,
    data: dict[str, Any],
    point: Point,
) -> tuple[int | None, str]:
    where = _where_path(msg)
    for o, value, paths in reversed(touched):
        for p in paths:
            n = min(len(p), len(where))
            if n and p[:n] == where[:n]:
                return o.line, f"{o.key} = {_toml_value(value)}: {msg}"
    at = ("experiment", *where) if "experiment" in data else ("base",)
    line = lines.line_of(at) or next((a.line for a in sweep.axes), None)
    return line, f"point {point.label} ({point.describe()}): {msg}"


# -- experiment text ---------------------------------------------------------------------------------------


def with_seed(text: str, seed: int) -> str:
    """An experiment text with its seed: rendered points keep the seed on a line of its own."""
    return text.replace("\nseed = 0\n", f"\nseed = {seed}\n", 1)


def render_point(sweep: Sweep, point: Point, doc: dict[str, Any]) -> str:
    head = [
        f"# Sweep {sweep.name}, point {point.label}: {point.describe()}",
        f"# (base: {sweep.base_source}; written by rmq-sim sweep, replay with rmq-sim replay)",
    ]
    doc = dict(doc)
    doc["seed"] = 0
    return "\n".join(head) + "\n" + to_toml(doc)


def to_toml(doc: dict[str, Any]) -> str:
    """TOML text of a parsed experiment: scalars first, then tables, then arrays of tables (whose own
    sub-tables are written inline). tomllib reads back the same data."""
    out: list[str] = []

    def section(table: dict[str, Any], prefix: str, inline_tables: bool) -> None:
        for key, value in table.items():
            if inline_tables or (not _is_table(value) and not _is_table_array(value)):
                out.append(f"{_key(key)} = {_toml_value(value)}")
        if inline_tables:
            return
        for key, value in table.items():
            if _is_table(value):
                name = f"{prefix}{_key(key)}"
                out.append(f"\n[{name}]")
                section(value, f"{name}.", False)
        for key, value in table.items():
            if _is_table_array(value):
                name = f"{prefix}{_key(key)}"
                for item in value:
                    out.append(f"\n[[{name}]]")
                    section(item, f"{name}.", True)

    section(doc, "", False)
    return "\n".join(out) + "\n"


def _is_table(v: Any) -> bool:
    return isinstance(v, dict)


def _is_table_array(v: Any) -> bool:
    return isinstance(v, list) and bool(v) and all(isinstance(x, dict) for x in v)


def _key(k: str) -> str:
    return k if re.fullmatch(r"[A-Za-z0-9_-]+", k) else json.dumps(k)


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if not math.isfinite(v):
            return "inf" if v > 0 else "-inf" if v < 0 else "nan"
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{_key(k)} = {_toml_value(x)}" for k, x in v.items()) + " }"
    raise TypeError(f"cannot write {type(v).__name__} as TOML")


# -- one run (a Spark task) -------------------------------------------------------------------------------


def read_marker(run_dir: Path) -> dict[str, Any] | None:
    try:
        data = json.loads((run_dir / COMPLETE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def run_task(spec: RunSpec, out_dir: str) -> dict[str, Any]:
    """Simulate one run into OUT/POINT/seed-N unless it is already complete; returns its outcome.

    A directory without the marker is an interrupted run: it is removed and the run starts over. The
    marker is written last (renamed into place), so a complete marker means complete files."""
    run_dir = Path(out_dir) / spec.rel
    done = read_marker(run_dir)
    if done is not None:
        return {**done, "resumed": True}
    if run_dir.exists():
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True)
    from rmqlab.sim.sim_cluster import SimCluster

    printed = io.StringIO()
    cpu0, wall0 = time.process_time(), time.monotonic()
    outcome: dict[str, Any] = {"run": spec.rel, "point": spec.point, "seed": spec.seed}

    def unraisable(u: Any) -> None:
        # A killed virtual process's coroutines may end at garbage collection, after the run's loop is
        # closed; what they report goes to this run's log, not to the sweep's console.
        printed.write(f"unraisable exception in {u.object!r}: {u.exc_type.__name__}: {u.exc_value}\n")

    hook, sys.unraisablehook = sys.unraisablehook, unraisable
    try:
        sx: SimExperiment = parse(spec.text, source=spec.source, default_name=spec.name)
        # rmq-analyze takes a run's parameters from "params" when there is one: the sweep's varied keys
        extra = {"params": spec.params, "sweep": {"point": spec.point, "rel": spec.rel}}
        result = SimCluster(sx, run_dir, out=printed, progress=False, manifest_extra=extra).run()
    except Exception:
        (run_dir / SIM_LOG).write_text(printed.getvalue(), encoding="utf-8")
        (run_dir / ERROR).write_text(traceback.format_exc(), encoding="utf-8")
        return {**outcome, "status": "crashed", "error": traceback.format_exc().strip().splitlines()[-1]}
    finally:
        gc.collect()
        sys.unraisablehook = hook
    (run_dir / SIM_LOG).write_text(printed.getvalue(), encoding="utf-8")
    sim_cpu, sim_wall = time.process_time() - cpu0, time.monotonic() - wall0
    # The analysis builds a few objects per event, nearly all alive until it ends: the collector's 75 or
    # so passes during it found about 30 objects in all (measured); the next run's start collects them.
    collecting = gc.isenabled()
    gc.disable()
    try:
        from rmqlab.pipeline.sweep_report import summarize_sweep_run

        # the run's summary.json, analysed here by the plain-Python twin of rmq-analyze
        outcome["queue_moves"] = summarize_sweep_run(run_dir)
    except Exception:  # the sweep's driver analyses this run in Spark instead
        outcome["analysis_error"] = traceback.format_exc().strip().splitlines()[-1]
    finally:
        if collecting:
            gc.enable()
    outcome.update(
        status="error" if result.errors else "ok",
        error=result.errors[0].splitlines()[0] if result.errors else None,
        quick_verdict=result.quick_verdict,
        events=result.events,
        sim_seconds=round(result.sim_seconds, 3),
        wall_seconds=round(sim_wall, 3),
        cpu_seconds=round(sim_cpu, 3),
        analysis_cpu_seconds=round(time.process_time() - cpu0 - sim_cpu, 3),
        hash_seed=os.environ.get("PYTHONHASHSEED"),
    )
    tmp = run_dir / f"{COMPLETE}.tmp"
    tmp.write_text(json.dumps(outcome, sort_keys=True), encoding="utf-8")
    os.replace(tmp, run_dir / COMPLETE)
    return outcome
