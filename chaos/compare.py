"""``rmq-chaos compare``: one experiment on the emulator and on an Apache engine, side by side.

The same experiment file runs with ``[cluster] engine = "emulator"`` and with an Apache engine, once per
seed, each run analysed by the plain-Python analysis (``pipeline.metrics_reference``); the table puts
each group's figures of both engines next to each other, every cell the value over the seeds
(``min..max`` when they differ), and says where they agree: the verdict and the counts of lost messages
must be equal, the other figures' ranges over the seeds must overlap.

The table itself (``compare_groups``, ``render``) is pure: it takes the summaries and knows no process.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# Figures compared exactly: a difference is a difference, whatever the spread.
EXACT = ("verdict", "lost")
# Figures compared by their range over the seeds.
RANGED = (
    "sent",
    "duplicates",
    "overlap_ms",
    "orphan_ms",
    "stalled_ms",
    "concurrent_consume_ms",
    "order_violations",
    "kill_convergence_ms",
    "unconverged",
    "rebalance_rounds",
)
FIGURES = EXACT + RANGED
# What each figure is, for the table's readers.
DESCRIPTIONS = {
    "verdict": "the group's verdict",
    "lost": "messages sent and never consumed",
    "sent": "messages sent to the group's topics",
    "duplicates": "deliveries beyond the first",
    "overlap_ms": "time two members held one queue",
    "orphan_ms": "time a queue had no owner",
    "stalled_ms": "time a queue's only owners were paused",
    "concurrent_consume_ms": "time two clients consumed one queue at once",
    "order_violations": "orderly messages consumed out of order",
    "kill_convergence_ms": "slowest convergence after a kill (RocketMQ ms)",
    "unconverged": "change points after which the group never converged",
    "rebalance_rounds": "rebalance rounds that changed a member's queues, per member",
}


def group_figures(group: Mapping[str, Any]) -> dict[str, Any]:
    """The compared figures of one group of a summary (``pipeline.metrics_reference.summarize``)."""
    out = {k: group.get(k) for k in FIGURES if k in group}
    entries = group.get("convergence") or []
    kills = [
        e.get("convergence_rocketmq_ms", e.get("convergence_ms"))
        for e in entries
        if str(e.get("cause", "")).startswith("kill ") and e.get("converged")
    ]
    out["kill_convergence_ms"] = max(kills) if kills else None
    out["unconverged"] = sum(1 for e in entries if not e.get("converged"))
    return out


def rebalance_rounds(events: Iterable[Mapping[str, Any]]) -> dict[str, float]:
    """group -> the rebalance rounds whose result changed a member's queues (``changed``, any of the
    group's topics), per consumer node of the group (a node's restarts count as one member)."""
    rounds: dict[str, int] = {}
    members: dict[str, set[str]] = {}
    for e in events:
        group = e.get("group")
        if e.get("event") == "consumer_started" and group:
            members.setdefault(str(group), set()).add(str(e.get("node")))
        elif e.get("event") == "rebalance" and group and e.get("changed"):
            rounds[str(group)] = rounds.get(str(group), 0) + 1
    return {g: round(rounds.get(g, 0) / len(nodes), 1) for g, nodes in members.items() if nodes}


def with_rebalance_rounds(summary: Mapping[str, Any], events: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """The summary with each group's ``rebalance_rounds`` (from the run's events) added."""
    per_group = rebalance_rounds(events)
    groups = {
        g: {**figures, "rebalance_rounds": per_group.get(g)}
        for g, figures in summary.get("groups", {}).items()
    }
    return {**summary, "groups": groups}


@dataclass(frozen=True)
class Cell:
    """One figure of one group on one engine, over the seeds."""

    values: tuple[Any, ...]

    @property
    def known(self) -> tuple[Any, ...]:
        return tuple(v for v in self.values if v is not None)

    def show(self) -> str:
        known = self.known
        if not known:
            return "-"
        if len(set(known)) == 1:
            return str(known[0])
        if all(isinstance(v, int | float) for v in known):
            return f"{min(known)}..{max(known)}"
        return "/".join(str(v) for v in known)


def agree(figure: str, a: Cell, b: Cell) -> bool | None:
    """Whether two engines agree on a figure (None when either has no value)."""
    if not a.known or not b.known:
        return None
    if figure in EXACT or not all(isinstance(v, int | float) for v in (*a.known, *b.known)):
        return set(a.known) == set(b.known)
    return min(a.known) <= max(b.known) and min(b.known) <= max(a.known)


def compare_groups(
    summaries: Mapping[str, Sequence[Mapping[str, Any]]],
) -> dict[str, dict[str, dict[str, Any]]]:
    """group -> figure -> {engine: [value per seed], "agree": bool | None} for the engines of
    ``summaries`` (engine -> the summaries of its runs, one per seed, in seed order)."""
    engines = list(summaries)
    groups = sorted({g for runs in summaries.values() for s in runs for g in s.get("groups", {})})
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for g in groups:
        per_engine = {
            e: [group_figures(s["groups"][g]) if g in s.get("groups", {}) else {} for s in runs]
            for e, runs in summaries.items()
        }
        rows: dict[str, dict[str, Any]] = {}
        for figure in FIGURES:
            row: dict[str, Any] = {e: [f.get(figure) for f in per_engine[e]] for e in engines}
            cells = [Cell(tuple(row[e])) for e in engines]
            row["agree"] = agree(figure, cells[0], cells[1]) if len(cells) == 2 else None
            rows[figure] = row
        out[g] = rows
    return out


def render(table: Mapping[str, Mapping[str, Mapping[str, Any]]], engines: Sequence[str]) -> str:
    """The side-by-side table as text: per group, a line per figure."""
    lines: list[str] = []
    width = max((len(f) for f in FIGURES), default=8)
    cols = [max(12, len(e)) for e in engines]
    for group, rows in table.items():
        head = f"{'group ' + group:<{width}}  " + "  ".join(
            f"{e:<{c}}" for e, c in zip(engines, cols, strict=True)
        )
        lines += [head + "  agree", "-" * (len(head) + 7)]
        for figure, row in rows.items():
            cells = [Cell(tuple(row[e])).show() for e in engines]
            mark = {True: "yes", False: "NO", None: "-"}[row.get("agree")]
            shown = "  ".join(f"{v:<{c}}" for v, c in zip(cells, cols, strict=True))
            lines.append(f"{figure:<{width}}  {shown}  {mark}")
        differ = [f for f, r in rows.items() if r.get("agree") is False]
        lines.append(
            f"{len(differ)} figure(s) differ: {', '.join(differ)}"
            if differ
            else "every compared figure agrees"
        )
        lines.append("")
    return "\n".join(lines)
