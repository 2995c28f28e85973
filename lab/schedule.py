"""The nemesis schedule: when each [[nemesis]] entry acts and on which node, its undo after ``for``, and
the random picks drawn again where the schedule before them left the node unable to take the action.

Pure and seeded: the same entries, nodes and seed give the same steps, whichever backend runs them.
"""

from __future__ import annotations

import math
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

# Actions undone after `for` seconds, and by what.
UNDO = {
    "pause": "resume",
    "hang": "unhang",
    "stop": "start",
    "kill": "start",
    "failover": "start",  # the master comes back
    "latency": "heal",
    "blackhole": "heal",
    "reset": "heal",
    "loss": "heal",
}


@dataclass(frozen=True)
class NemesisSpec:
    """A [[nemesis]] table: an action on targets at one or more times."""

    index: int  # 1-based position in the file
    line: int | None
    action: str
    target: str  # a node name or "<role>:<selector>"
    group: str | None
    at: tuple[float, ...]
    every: float | None
    start: float | None
    until: float | None
    times: int | None
    random_count: int | None
    for_s: float | None
    params: dict[str, Any] = field(default_factory=dict)
    peer_given: bool = False  # the other end of a network fault was given as `peer` (any node)


@dataclass(frozen=True)
class NodeInfo:
    """One process of the experiment: its node name, role and (consumers) group, topic and client."""

    node: str
    role: str
    group: str | None = None
    topic: str | None = None
    client: str | None = None  # consumers only: one of CLIENTS


@dataclass(frozen=True)
class Step:
    """One nemesis action of the expanded schedule, at ``t`` lab seconds after the cluster is up."""

    t: float
    action: str
    target: str
    target_role: str
    group: str | None
    params: dict[str, Any]
    source: int  # index of the [[nemesis]] entry
    # A ``random`` pick: the nodes it was drawn from (on its first step only) and which occurrence of
    # its entry it is (on its undo too), so that live_random_targets can draw again and move both.
    choices: tuple[str, ...] = field(default=(), compare=False, repr=False)
    occurrence: int = field(default=-1, compare=False, repr=False)

    def describe(self) -> str:
        extra = " ".join(f"{k}={v}" for k, v in sorted(self.params.items()) if k != "fault_id")
        return f"{self.action} {self.target}" + (f" ({extra})" if extra else "")


def candidates(target: str, group: str | None, nodes: dict[str, NodeInfo]) -> list[str]:
    """The nodes a target (a node name or ROLE:SELECTOR) may name, in node order."""
    if ":" not in target:
        return [target] if target in nodes else []
    role, _, _sel = target.partition(":")
    out = [
        n
        for n, info in nodes.items()
        if info.role == role and (group is None or role != "consumer" or info.group == group)
    ]
    return sorted(out, key=node_order)


def node_order(node: str) -> tuple[str, int]:
    m = re.fullmatch(r"(.*?)-(\d+)", node)
    return (m.group(1), int(m.group(2))) if m else (node, 0)


def nemesis_times(n: NemesisSpec, seed: int, duration: float) -> list[float]:
    """When a [[nemesis]] entry acts (lab seconds); ``random`` times are drawn from the seed."""
    if n.at:
        return sorted(n.at)
    end = min(n.until if n.until is not None else duration, duration)
    if n.every is not None:
        out = []
        t = n.start if n.start is not None else n.every
        while t < end - 1e-9 and (n.times is None or len(out) < n.times):
            out.append(round(t, 6))
            t += n.every
        return out
    if n.random_count is not None:
        lo = n.start if n.start is not None else 0.0
        rng = random.Random(f"{seed}:nemesis:{n.index}:times")
        return sorted(round(rng.uniform(lo, end), 3) for _ in range(n.random_count))
    return []


def pick_targets(target: str, nodes: list[str], k: int, rng: random.Random) -> list[str]:
    """The node(s) the k-th occurrence acts on: ``random`` draws one of ``nodes``, ``next`` takes them
    in turn, ``all`` (or a node name) all of them."""
    selector = target.partition(":")[2] if ":" in target else None
    if selector == "random":
        return [rng.choice(nodes)]
    if selector == "next":
        return [nodes[k % len(nodes)]]
    return nodes


def expand_schedule(
    nemeses: Sequence[NemesisSpec], nodes: dict[str, NodeInfo], seed: int, duration: float
) -> list[Step]:
    """The [[nemesis]] entries' actions on the experiment's nodes in time order; deterministic for a
    given seed."""
    steps: list[Step] = []
    for n in nemeses:
        rng = random.Random(f"{seed}:nemesis:{n.index}:targets")
        matching = candidates(n.target, n.group, nodes)
        drawn = tuple(matching) if n.target.endswith(":random") else ()
        for k, t in enumerate(nemesis_times(n, seed, duration)):
            for target in pick_targets(n.target, matching, k, rng):
                info = nodes[target]
                group = info.group if info.role == "consumer" else None
                params = dict(n.params)
                if n.action == "fault":
                    if n.group is not None:
                        params["group"] = n.group
                    if n.for_s is not None:
                        params["for"] = n.for_s
                steps.append(Step(t, n.action, target, info.role, group, params, n.index, drawn, k))
                undo = UNDO.get(n.action)
                if n.for_s is not None and undo:
                    undo_params = {"broker": params["broker"]} if "broker" in params else {}
                    steps.append(
                        Step(t + n.for_s, undo, target, info.role, group, undo_params, n.index, (), k)
                    )
    steps.sort(key=lambda s: (s.t, s.source))
    return live_random_targets(steps, nodes, seed)


# What a process action needs of its target (the supervisor refuses it otherwise, and the runner skips
# it): a node is running, paused or down, and a running one may have a hung listener. A restart takes
# a node in any state, and any other action any node.
_NEEDS = {
    "kill": ("running", "paused"),
    "stop": ("running", "paused"),
    "failover": ("running", "paused"),
    "pause": ("running",),
    "hang": ("running",),
    "unhang": ("hung",),
    "start": ("down",),
    "resume": ("paused",),
}


class NodeStates:
    """What the schedule so far has done to each node, fed its steps in time order."""

    def __init__(self) -> None:
        self._state: dict[str, str] = {}
        self._hung: set[str] = set()
        self._back_at: dict[str, float] = {}  # restarted nodes: running again from then

    def at(self, node: str, t: float) -> str:
        """running, hung (running with a hung listener), paused or down."""
        if t < self._back_at.get(node, -math.inf):
            return "down"
        state = self._state.get(node, "running")
        return "hung" if state == "running" and node in self._hung else state

    def fits(self, step: Step, node: str | None = None) -> bool:
        needs = _NEEDS.get(step.action)
        state = self.at(node or step.target, step.t)
        # a hung listener's process runs: what a running node takes, a hung one takes too
        return needs is None or state in needs or (state == "hung" and "running" in needs)

    def apply(self, step: Step) -> None:
        a, node = step.action, step.target
        if a in ("kill", "stop", "restart", "failover"):
            self._state[node] = "down" if a != "restart" else "running"
            self._hung.discard(node)
            if a == "restart":
                self._back_at[node] = step.t + float(step.params.get("down", 0.0))
        elif a in ("start", "resume"):
            self._state[node] = "running"
        elif a == "pause":
            self._state[node] = "paused"
        elif a == "hang":
            self._hung.add(node)
        elif a == "unhang":
            self._hung.discard(node)


def live_random_targets(steps: list[Step], nodes: dict[str, NodeInfo], seed: int) -> list[Step]:
    """``random`` means a node the action can act on: a random pick that the schedule before it has
    left in the wrong state (killed and not started again, already paused, ...) is drawn again from
    the nodes in the right state, with its undo; a pick that was fine is kept, so a schedule without
    such a pick is unchanged. With no node in the right state the pick stays (the runner skips it).
    ``steps`` in time order."""
    states = NodeStates()
    moved: dict[tuple[int, int], str] = {}  # (entry, occurrence) -> the target drawn again
    out = []
    for step in steps:
        key = (step.source, step.occurrence)
        if key in moved and not step.choices:  # the undo of a pick drawn again follows it
            step = replace(step, target=moved[key])
        elif step.choices and not states.fits(step):
            live = [n for n in step.choices if states.fits(step, n)]
            if live:
                rng = random.Random(f"{seed}:nemesis:{step.source}:{step.occurrence}:again")
                target = rng.choice(live)
                info = nodes[target]
                group = info.group if info.role == "consumer" else None
                moved[key] = target
                step = replace(step, target=target, target_role=info.role, group=group)
        if states.fits(step):  # the runner skips what does not: it changes nothing
            states.apply(step)
        out.append(step)
    return out


def unfit_steps(steps: list[Step]) -> list[tuple[Step, str]]:
    """The actions the schedule before them leaves unable to act on their target (the runner will skip
    them), each with the state its target will be in."""
    states = NodeStates()
    out = []
    for step in steps:
        if states.fits(step):
            states.apply(step)
        else:
            out.append((step, states.at(step.target, step.t)))
    return out
