"""``rmq-chaos compare``: experiments on four combinations of broker and client, side by side.

A combination is a broker (the emulator's, or Apache's of an ``apache-*`` engine) and the client every
consumer of the experiment runs (the lab's Python client, or Apache's Java push consumer of
rocketmq-client 4.9.8): ``emulator+python``, ``emulator+java``, ``apache+java``, ``apache+python``. Each
experiment runs on each chosen combination once per seed, each run analysed by the plain-Python analysis
(``pipeline.metrics_reference``); the table puts each group's figures of the combinations next to each
other, every cell the values over the seeds (``min..max`` when they differ), and says where they agree:
the verdict and the count of lost messages must be equal, the other figures' ranges over the seeds must
overlap.

The runs are analysed up to the runner's ``teardown`` (``before_teardown``). Three figures are not in
the analysis's summary and are derived here from the run's events
(``event_figures``): rebalance rounds per member, the window after a pause (past the channel expiry)
until the other members hold the paused one's queues, and an orderly group's take-over after a kill.
Every time is in RocketMQ milliseconds (wall milliseconds divided by the experiment's time scale), so
that the combinations compare at one scale.

The table itself (``compare_groups``, ``render``, ``render_markdown``) and the choice of combinations
(``parse_combos``, ``with_client``, ``combination``) are pure: they know no process.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Final, Protocol, TypeVar

from rmqlab.lab.experiment import (
    CLIENT_NAMES,
    REAL_CLIENT_MIN_TIME_SCALE,
    Experiment,
    ExperimentError,
    KeyLines,
    Problems,
    with_engine,
)

# -- combinations ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Combo:
    """A broker and the client every consumer runs."""

    name: str
    broker: str  # "emulator", or "apache": the comparison's Apache engine
    client: str  # a client of lab.experiment.CLIENTS

    def engine(self, apache: str) -> str:
        return "emulator" if self.broker == "emulator" else apache


COMBOS: Final[dict[str, Combo]] = {
    c.name: c
    for c in (
        Combo("emulator+python", "emulator", "python"),
        Combo("emulator+java", "emulator", "java"),
        Combo("apache+java", "apache", "java"),
        Combo("apache+python", "apache", "python"),
    )
}

# The shipped comparison set (``rmq-chaos compare --set``), cheapest first, so that an interrupted
# comparison has its short experiments whole.
COMPARE_SET: Final = (
    "java-kill-one-of-four",
    "compare-seed-different-subscriptions",
    "compare-broker-kill-restart",
    "compare-rolling-restart",
    "java-kill-orderly-consumer",
    "compare-pause-past-channel-expiry",
)


def parse_combos(text: str) -> tuple[Combo, ...]:
    """The combinations a comma-separated list names, in its order; ValueError naming the valid ones."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    valid = ", ".join(COMBOS)
    if not names:
        raise ValueError(f"--combos names no combination: use some of {valid}")
    unknown = [n for n in names if n not in COMBOS]
    if unknown:
        raise ValueError(
            f"--combos: unknown combination(s) {', '.join(repr(n) for n in unknown)}: use some of {valid}"
        )
    return tuple(COMBOS[n] for n in dict.fromkeys(names))


def with_client(exp: Experiment, client: str) -> Experiment:
    """The experiment with every consumer running ``client``, checked as if its file said so:
    ExperimentError at the lines of what that client cannot do."""
    pr = Problems(KeyLines(exp.text))
    name = CLIENT_NAMES[client]
    real = client != "python"
    for i, c in enumerate(exp.consumers):
        if not real:
            continue
        if c.broadcast:
            pr.add(
                ("consumers", i, "broadcast"),
                f"consumers[{i + 1}].broadcast: the lab runs {name} in clustering mode only",
            )
        if c.consume_from == "timestamp":
            pr.add(
                ("consumers", i, "consume_from"),
                f'consumers[{i + 1}].consume_from: the lab starts {name} from "first" or "last" only',
            )
        if c.assignment != "client":
            pr.add(
                ("consumers", i, "assignment"),
                f"consumers[{i + 1}].assignment: {name} balances its queues in the client",
            )
    if real and exp.time_scale < REAL_CLIENT_MIN_TIME_SCALE:
        pr.add(
            ("time_scale",),
            f"time_scale: must be >= {REAL_CLIENT_MIN_TIME_SCALE:g} for {name}, got {exp.time_scale:g}: it "
            "heartbeats every 30 s and renews locks every 20 s whatever the time scale",
        )
    if pr.items:
        raise ExperimentError(exp.source, pr.items)
    return replace(exp, consumers=tuple(replace(c, client=client) for c in exp.consumers))


def combination(exp: Experiment, combo: Combo, apache: str) -> Experiment:
    """The experiment on a combination (``apache``: the Apache engine); ExperimentError, each problem
    prefixed with the combination, when it cannot run there."""
    try:
        return with_engine(with_client(exp, combo.client), combo.engine(apache))
    except ExperimentError as e:
        raise ExperimentError(
            e.source, [(line, f"combination {combo.name}: {msg}") for line, msg in e.problems]
        ) from None


# -- figures ---------------------------------------------------------------------------------------------

# Figures compared exactly: a difference is a difference, whatever the spread.
EXACT = ("verdict", "lost")
# Figures compared by their range over the seeds.
RANGED = (
    "duplicates",
    "kill_convergence_ms",
    "expiry_window_ms",
    "orderly_takeover_ms",
    "rebalance_rounds",
    "sent",
    "overlap_ms",
    "orphan_ms",
    "stalled_ms",
    "concurrent_consume_ms",
    "order_violations",
    "unconverged",
)
FIGURES = EXACT + RANGED
# The figures of the short (markdown) table.
HEADLINE = (
    "verdict",
    "lost",
    "duplicates",
    "kill_convergence_ms",
    "expiry_window_ms",
    "orderly_takeover_ms",
    "rebalance_rounds",
)
# The summary's figures in wall milliseconds, turned into RocketMQ milliseconds.
_WALL_MS = ("overlap_ms", "orphan_ms", "stalled_ms", "concurrent_consume_ms")
# What each figure is, for the table's readers.
DESCRIPTIONS = {
    "verdict": "the group's verdict",
    "lost": "messages sent and never consumed",
    "duplicates": "deliveries beyond the first",
    "kill_convergence_ms": "slowest convergence after a kill of a member (RocketMQ ms)",
    "expiry_window_ms": "from a pause until other members held every queue the paused one held: the "
    "orphan window of a consumer silent past the channel expiry (RocketMQ ms)",
    "orderly_takeover_ms": "orderly group: from a kill until other members consumed from every queue the "
    "killed one held (RocketMQ ms)",
    "rebalance_rounds": "rebalance rounds that changed a member's queues, per member",
    "sent": "messages sent to the group's topics",
    "overlap_ms": "time two members held one queue (RocketMQ ms)",
    "orphan_ms": "time a queue had no owner (RocketMQ ms)",
    "stalled_ms": "time a queue's only owners were paused (RocketMQ ms)",
    "concurrent_consume_ms": "time two clients consumed one queue at once (RocketMQ ms)",
    "order_violations": "orderly messages consumed out of order",
    "unconverged": "change points after which the group never converged",
}


def _rmq(ms: Any, time_scale: float) -> Any:
    return None if ms is None else round(ms / time_scale)


def group_figures(group: Mapping[str, Any], time_scale: float = 1.0) -> dict[str, Any]:
    """The compared figures of one group of a summary (``pipeline.metrics_reference.summarize``), its
    times in RocketMQ ms (wall ms / ``time_scale``), with the event figures it holds (``event_figures``)."""
    out = {k: group.get(k) for k in FIGURES if k in group}
    for k in _WALL_MS:
        if k in out:
            out[k] = _rmq(out[k], time_scale)
    entries = group.get("convergence") or []
    kills = [
        e["convergence_rocketmq_ms"]
        if e.get("convergence_rocketmq_ms") is not None
        else _rmq(e.get("convergence_ms"), time_scale)
        for e in entries
        if str(e.get("cause", "")).startswith("kill ") and e.get("converged")
    ]
    out["kill_convergence_ms"] = max(kills) if kills else None
    out["unconverged"] = sum(1 for e in entries if not e.get("converged"))
    return out


def event_figures(events: Iterable[Mapping[str, Any]], time_scale: float = 1.0) -> dict[str, dict[str, Any]]:
    """group -> the figures the summary has not, from a run's events in their order:

    * ``rebalance_rounds``: the group's ``rebalance`` events with ``changed`` (any of its topics), per
      consumer node of the group (a node's restarts count as one member);
    * ``expiry_window_ms``: the longest, over the ``pause`` nemeses of a member, of the time from the
      pause until a member other than the paused client added (``mq_added``) each queue the paused client
      held at the pause; None when some queue was never taken over, or no member was paused;
    * ``orderly_takeover_ms``: for an orderly group (``ORDERLY`` consumption), the longest, over the
      ``kill`` nemeses of a member, of the time from the kill until a member other than the killed client
      consumed from each queue the killed client held at the kill; None likewise.
    """
    rounds: dict[str, int] = defaultdict(int)
    members: dict[str, set[str]] = defaultdict(set)
    client_of: dict[str, tuple[str, str]] = {}  # node -> (group, client id) of its latest start
    held: dict[tuple[str, str], set[tuple[Any, ...]]] = defaultdict(set)  # (group, client) -> queues
    orderly: set[str] = set()
    # open watches: (group, kind, victim client, nemesis ts, queues still to be taken over)
    watches: list[tuple[str, str, str, int, set[tuple[Any, ...]]]] = []
    done: dict[tuple[str, str], list[int | None]] = defaultdict(list)  # (group, kind) -> windows

    def queue(e: Mapping[str, Any]) -> tuple[Any, ...]:
        return (e.get("topic"), e.get("broker"), e.get("queue_id"))

    def taken(group: str, kind: str, client: str, q: tuple[Any, ...], ts: int) -> None:
        for w in watches:
            if w[0] == group and w[1] == kind and w[2] != client:
                w[4].discard(q)
                if not w[4] and ts >= w[3]:
                    done[(group, kind)].append(ts - w[3])
        watches[:] = [w for w in watches if w[4]]

    for e in events:
        ev, group, client = e.get("event"), e.get("group"), e.get("client_id")
        if ev == "consumer_started" and group:
            members[str(group)].add(str(e.get("node")))
            client_of[str(e.get("node"))] = (str(group), str(client))
        elif ev == "rebalance" and group and e.get("changed"):
            rounds[str(group)] += 1
        elif ev == "mq_added" and group:
            held[(str(group), str(client))].add(queue(e))
            taken(str(group), "pause", str(client), queue(e), int(e["ts_ms"]))
        elif ev == "mq_removed" and group:
            held[(str(group), str(client))].discard(queue(e))
        elif ev == "consumer_stopped" and group:
            held.pop((str(group), str(client)), None)
        elif ev == "message_consumed" and group:
            if e.get("mode") == "ORDERLY":
                orderly.add(str(group))
            taken(str(group), "kill", str(client), queue(e), int(e["ts_ms"]))
        elif ev == "nemesis" and e.get("action") in ("pause", "kill", "stop"):
            who = client_of.get(str(e.get("target")))
            if who is None:
                continue
            g, victim = who
            queues = set(held.get(who, ()))
            if e.get("action") == "pause" and queues:
                watches.append((g, "pause", victim, int(e["ts_ms"]), queues))
            elif e.get("action") == "kill" and queues:
                watches.append((g, "kill", victim, int(e["ts_ms"]), queues))
            if e.get("action") != "pause":
                held.pop(who, None)
    for w in watches:  # never taken over
        done[(w[0], w[1])].append(None)

    def longest(group: str, kind: str) -> Any:
        windows = done.get((group, kind))
        if not windows or any(w is None for w in windows):
            return None
        return _rmq(max(w for w in windows if w is not None), time_scale)

    return {
        g: {
            "rebalance_rounds": round(rounds[g] / len(nodes), 1),
            "expiry_window_ms": longest(g, "pause"),
            "orderly_takeover_ms": longest(g, "kill") if g in orderly else None,
        }
        for g, nodes in members.items()
        if nodes
    }


class _Timed(Protocol):
    event: str
    ts: int


_E = TypeVar("_E", bound=_Timed)


def before_teardown(events: Sequence[_E]) -> list[_E]:
    """The events up to the runner's ``teardown`` (inclusive): the experiment, without the lab's ending
    of it. At the teardown every client is SIGKILLed unannounced and the servers stop after it (an
    Apache engine's JVMs take seconds), so a queue a client added as another died there, and every
    ownership interval, would run on to the last server's exit: overlap measured by how fast a broker
    shuts down, not by the experiment."""
    end = next((e.ts for e in events if e.event == "teardown"), None)
    return list(events) if end is None else [e for e in events if e.ts <= end]


def with_event_figures(
    summary: Mapping[str, Any], events: Iterable[Mapping[str, Any]], time_scale: float = 1.0
) -> dict[str, Any]:
    """The summary with each group's event figures (``event_figures``) added."""
    per_group = event_figures(events, time_scale)
    groups = {g: {**figures, **per_group.get(g, {})} for g, figures in summary.get("groups", {}).items()}
    return {**summary, "groups": groups}


# -- the table -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Cell:
    """One figure of one group on one combination, over the seeds."""

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


def agree(figure: str, *cells: Cell) -> bool | None:
    """Whether the cells agree on a figure: exact figures (and any figure not a number) have equal value
    sets, the others' ranges over the seeds have a value in common (pairwise overlapping ranges do). None
    when fewer than two cells have a value."""
    known = [c.known for c in cells if c.known]
    if len(known) < 2:
        return None
    if figure in EXACT or not all(isinstance(v, int | float) for k in known for v in k):
        return all(set(k) == set(known[0]) for k in known)
    return max(min(k) for k in known) <= min(max(k) for k in known)


def compare_groups(
    summaries: Mapping[str, Sequence[Mapping[str, Any]]], time_scale: float = 1.0
) -> dict[str, dict[str, dict[str, Any]]]:
    """group -> figure -> {combination: [value per seed], "agree": bool | None, "differ": [combination]}
    for the combinations of ``summaries`` (combination -> the summaries of its runs, one per seed, in seed
    order). ``differ`` names the combinations that do not agree with the first one (the reference)."""
    combos = list(summaries)
    groups = sorted({g for runs in summaries.values() for s in runs for g in s.get("groups", {})})
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for g in groups:
        per_combo = {
            c: [group_figures(s["groups"][g], time_scale) if g in s.get("groups", {}) else {} for s in runs]
            for c, runs in summaries.items()
        }
        rows: dict[str, dict[str, Any]] = {}
        for figure in FIGURES:
            row: dict[str, Any] = {c: [f.get(figure) for f in per_combo[c]] for c in combos}
            cells = {c: Cell(tuple(row[c])) for c in combos}
            row["agree"] = agree(figure, *cells.values())
            ref = cells[combos[0]]
            row["differ"] = [c for c in combos[1:] if agree(figure, ref, cells[c]) is False]
            rows[figure] = row
        out[g] = rows
    return out


def differing(table: Mapping[str, Mapping[str, Mapping[str, Any]]]) -> list[tuple[str, str]]:
    """(group, figure) of every row whose combinations disagree."""
    return [(g, f) for g, rows in table.items() for f, row in rows.items() if row.get("agree") is False]


_MARK = {True: "yes", False: "NO", None: "-"}


def render(table: Mapping[str, Mapping[str, Mapping[str, Any]]], combos: Sequence[str]) -> str:
    """The side-by-side table as text: per group, a line per figure."""
    lines: list[str] = []
    width = max((len(f) for f in FIGURES), default=8)
    cols = [max(12, len(c)) for c in combos]
    for group, rows in table.items():
        head = f"{'group ' + group:<{width}}  " + "  ".join(
            f"{c:<{w}}" for c, w in zip(combos, cols, strict=True)
        )
        lines += [head + "  agree", "-" * (len(head) + 7)]
        for figure, row in rows.items():
            cells = [Cell(tuple(row[c])).show() for c in combos]
            shown = "  ".join(f"{v:<{w}}" for v, w in zip(cells, cols, strict=True))
            lines.append(f"{figure:<{width}}  {shown}  {_MARK[row.get('agree')]}")
        differ = [f for f, r in rows.items() if r.get("agree") is False]
        lines.append(
            f"{len(differ)} figure(s) differ: {', '.join(differ)}"
            if differ
            else "every compared figure agrees"
        )
        lines.append("")
    return "\n".join(lines)


def render_markdown(doc: Mapping[str, Any], figures: Sequence[str] = HEADLINE) -> str:
    """A comparison document (compare.json) as markdown: per experiment and group, a row per figure and
    a column per combination, each cell the value over the seeds, the last column whether they agree."""
    combos = list(doc.get("combos", []))
    out: list[str] = []
    for name, exp in doc.get("experiments", {}).items():
        for group, rows in exp.get("groups", {}).items():
            seeds = exp.get("seeds", [])
            # a combination short of runs (an interrupted comparison) says how many its cells hold
            runs = {c: len(exp.get("runs", {}).get(c, seeds)) for c in combos}
            heads = [c if runs[c] >= len(seeds) else f"{c} ({runs[c]} of {len(seeds)} seeds)" for c in combos]
            out += [
                f"#### {name}, group {group}",
                "",
                f"Seeds {', '.join(str(s) for s in seeds)}.",
                "",
                "| figure | " + " | ".join(heads) + " | agree |",
                "|---|" + "---|" * len(combos) + "---|",
            ]
            for figure in figures:
                row = rows.get(figure, {})
                cells = [Cell(tuple(row.get(c, ()))).show() for c in combos]
                out.append(f"| {figure} | " + " | ".join(cells) + f" | {_MARK[row.get('agree')]} |")
            out.append("")
    return "\n".join(out)
