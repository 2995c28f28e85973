"""``rmq-sim shrink``: search for a smaller experiment that fails the verdict for the same reason.

A simulated run is a pure function of its experiment and seed, so a failing run can be shrunk as
property-based testing shrinks an input: change the experiment one step smaller (fewer consumers, fewer
nemesis actions, a shorter duration, fewer queues or messages), simulate it with the same seed, analyse
it with the plain-Python twin of ``rmq-analyze`` (``pipeline.metrics_reference``), and keep the
change when the verdict still fails with the same failing check. Greedy: the passes repeat until none
makes progress or the budget of candidates is spent.
"""

from __future__ import annotations

import copy
import dataclasses
import io
import math
import shutil
import tempfile
import tomllib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rmqlab.client.client_config import ConsumerConfig
from rmqlab.lab.experiment import ExperimentError
from rmqlab.pipeline.contract import CHECKS
from rmqlab.sim.rundir import read_sim_run
from rmqlab.sim.sim_table import SimExperiment, parse
from rmqlab.sim.sweep import to_toml

DEFAULT_BUDGET = 200
_REBALANCE_WAIT_INTERVAL = next(
    f.default for f in dataclasses.fields(ConsumerConfig) if f.name == "rebalance_wait_interval"
)


class ShrinkError(Exception):
    """The run cannot be shrunk for the failure asked for."""


class NothingToShrink(ShrinkError):
    """The run's verdict did not fail."""


def failing_kinds(run_dir: Path) -> dict[str, set[str]]:
    """Group -> the verdict checks it fails, from the run's event logs (plain-Python analysis)."""
    from rmqlab.pipeline.contract import failing_checks
    from rmqlab.pipeline.metrics_reference import RunModel, load_run

    events, _malformed = load_run(run_dir)
    model = RunModel(events)
    out: dict[str, set[str]] = {}
    for group in sorted(model.groups):
        s = model.group_summary(group)
        failed = failing_checks(
            lost=s["lost"],
            orderly=model.is_orderly(group),
            concurrent_consume_ms=s["concurrent_consume_ms"],
            order_violations=s["order_violations"],
            convergence=s["convergence"],
            server_assigned=group in model.server_assigned,
        )
        if failed:
            out[group] = set(failed)
    return out


def size(doc: dict[str, Any]) -> dict[str, int]:
    """What shrinking makes smaller, as printed in the progress lines."""
    workload = doc.get("workload") or {}
    return {
        "consumers": sum(int(c.get("count", 1)) for c in doc.get("consumers", [])),
        "actions": len(doc.get("nemesis", [])) + len((doc.get("sim") or {}).get("gc", [])),
        "duration": math.ceil(float(doc.get("duration", 0))),
        "queues": sum(int(t.get("queues", 0)) for t in doc.get("topics", [])),
        "messages": int(workload.get("count", 0)) if isinstance(workload, dict) else 0,
    }


def describe(doc: dict[str, Any]) -> str:
    return ", ".join(f"{k} {v}" for k, v in size(doc).items())


def render(doc: dict[str, Any], seed: int, origin: str) -> str:
    """The experiment file of a candidate: its seed written in, where it came from in a comment."""
    doc = {**doc, "seed": seed}
    head = f"# Written by rmq-sim shrink from {origin}\n# ({describe(doc)}); run it with this seed.\n"
    return head + to_toml(doc)


def simulate(sx: SimExperiment) -> tuple[dict[str, set[str]], str | None]:
    """Simulate a candidate in a temporary directory: its failing checks by group, and the first error of
    a run that did not complete (None when it did)."""
    from rmqlab.sim.sim_cluster import SimCluster

    tmp = Path(tempfile.mkdtemp(prefix="rmq-sim-shrink-"))
    try:
        result = SimCluster(sx, tmp / "run", out=io.StringIO(), progress=False).run()
        if result.errors:
            return {}, result.errors[0].splitlines()[0]
        return failing_kinds(tmp / "run"), None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@dataclass
class Shrinker:
    """The greedy search over experiment documents (tomllib's dicts)."""

    doc: dict[str, Any]
    seed: int
    group: str
    kind: str
    origin: str
    budget: int = DEFAULT_BUDGET
    say: Callable[[str], None] = print
    run_candidate: Callable[[SimExperiment], tuple[dict[str, set[str]], str | None]] = simulate
    candidates: int = 0
    kept: int = 0
    tried: set[str] = field(default_factory=set)

    def fails(self, doc: dict[str, Any]) -> bool:
        """True when the candidate is a valid experiment that fails for the same reason."""
        text = render(doc, self.seed, self.origin)
        if text in self.tried:
            return False
        self.tried.add(text)
        try:
            sx = parse(text, source="<candidate>", default_name=str(doc.get("name", "shrunk")))
            sx.schedule()
        except ExperimentError:
            return False  # e.g. a nemesis naming a consumer that is gone
        self.candidates += 1
        kinds, error = self.run_candidate(sx)
        ok = error is None and self.kind in kinds.get(self.group, set())
        found = "; ".join(f"{g}: {'+'.join(sorted(k))}" for g, k in kinds.items())
        verdict = f"did not complete ({error})" if error else f"FAIL ({found})" if kinds else "ok"
        self.say(
            f"candidate {self.candidates}: {describe(doc)}: verdict {verdict}" + (" -> kept" if ok else "")
        )
        return ok

    def try_each(self, candidates: Iterator[dict[str, Any]]) -> bool:
        """Keep the first candidate (each is smaller than `doc`) that still fails; True when one was kept."""
        for cand in candidates:
            if self.candidates >= self.budget:
                return False
            if self.fails(cand):
                self.doc = cand
                self.kept += 1
                return True
        return False

    def run(self) -> dict[str, Any]:
        passes = (self._consumers, self._actions, self._duration, self._queues, self._messages)
        progress = True
        while progress and self.candidates < self.budget:
            progress = False
            for make in passes:
                while self.candidates < self.budget and self.try_each(make(self.doc)):
                    progress = True
        return self.doc

    # -- the passes: each yields variants of `doc`, the most ambitious first --------------------------

    @staticmethod
    def _consumers(doc: dict[str, Any]) -> Iterator[dict[str, Any]]:
        return _fewer(doc, "consumers", "count", 1)

    @staticmethod
    def _actions(doc: dict[str, Any]) -> Iterator[dict[str, Any]]:
        """Nemesis entries and [[sim.gc]] entries: each alone, then halves."""
        refs = [("nemesis", i) for i in range(len(doc.get("nemesis", [])))]
        refs += [("gc", i) for i in range(len((doc.get("sim") or {}).get("gc", [])))]

        def without(drop: list[tuple[str, int]]) -> dict[str, Any]:
            d = copy.deepcopy(doc)
            for kind, i in sorted(drop, reverse=True):
                table = d if kind == "nemesis" else d["sim"]
                del table[kind][i]
                if not table[kind]:
                    del table[kind]
            if d.get("sim") == {}:
                del d["sim"]  # an empty [sim] table would keep the file from rmq-chaos
            return d

        for ref in refs:
            yield without([ref])
        half = len(refs) // 2
        if half >= 1 and len(refs) > 2:
            yield without(refs[:half])
            yield without(refs[half:])

    @staticmethod
    def _duration(doc: dict[str, Any]) -> Iterator[dict[str, Any]]:
        """Cut the tail after the last action, down to one rebalance interval after it (so that a run
        cut short does not fail to converge only because no rebalance round came after the change)."""
        try:
            sx = parse(to_toml(doc), source="<candidate>")
            last = max((s.t for s in sx.schedule()), default=0.0)
        except ExperimentError:
            return
        settings = sx.sim.consumer_settings()
        interval_ms = settings.get("rebalance_wait_interval", _REBALANCE_WAIT_INTERVAL)
        duration = float(doc.get("duration", 0))
        floor = math.ceil(last + interval_ms / 1000)
        seen = set()
        for frac in (0.0, 0.5, 0.75):
            new = math.ceil(floor + (duration - floor) * frac)
            if floor <= new < duration and new not in seen:
                seen.add(new)
                d = copy.deepcopy(doc)
                d["duration"] = new
                yield d

    @staticmethod
    def _queues(doc: dict[str, Any]) -> Iterator[dict[str, Any]]:
        """A topic left out (not valid while a consumer subscribes to it), then fewer queues."""
        return _fewer(doc, "topics", "queues", 0)

    @staticmethod
    def _messages(doc: dict[str, Any]) -> Iterator[dict[str, Any]]:
        workload = doc.get("workload")
        if not isinstance(workload, dict) or "count" not in workload:
            return
        for m in _down(int(workload["count"])):
            d = copy.deepcopy(doc)
            d["workload"]["count"] = m
            yield d


def _down(n: int) -> list[int]:
    """Smaller sizes to try for n, the smallest first: 1, half, one less."""
    return [m for m in sorted({1, n // 2, n - 1}) if 1 <= m < n]


def _fewer(doc: dict[str, Any], array: str, key: str, default: int) -> Iterator[dict[str, Any]]:
    """Variants of an array of tables: one entry left out (while more than one is left), then one
    entry's `key` made smaller."""
    entries = doc.get(array, [])
    for i in range(len(entries) if len(entries) > 1 else 0):
        d = copy.deepcopy(doc)
        del d[array][i]
        yield d
    for i, entry in enumerate(entries):
        for m in _down(int(entry.get(key, default))):
            d = copy.deepcopy(doc)
            d[array][i][key] = m
            yield d


@dataclass
class Target:
    """What a failing run gives the search: its experiment, seed and the failure to keep."""

    doc: dict[str, Any]
    seed: int
    group: str
    kind: str
    name: str


def target_of(run_dir: Path, kind: str | None = None) -> Target:
    """The experiment, seed and failure of a simulated run; ShrinkError when there is nothing to shrink."""
    sx, seed = read_sim_run(run_dir)
    failing = failing_kinds(run_dir)
    if not failing:
        raise NothingToShrink(f"{run_dir}: the run's verdict did not fail: nothing to shrink")
    wanted = [kind] if kind else list(CHECKS)
    for k in wanted:
        for group, kinds in failing.items():
            if k in kinds:
                doc = tomllib.loads(sx.exp.text)
                return Target(doc, seed, group, k, sx.exp.name)
    found = "; ".join(f"{g}: {', '.join(sorted(k))}" for g, k in failing.items())
    raise ShrinkError(f"{run_dir}: no group fails the {kind} check (failing: {found})")
