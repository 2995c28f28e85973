"""The report's pictures: matplotlib charts of one run (queue ownership or, for a large group, its
health map; consumption rates; duplicates; convergence), each as an inline base64 PNG, and their
captions. Drawn through matplotlib's object API (a `Figure` of its own, rendered by the Agg canvas), so
drawing a report neither switches the caller's backend nor leaves a pyplot figure open.
"""

from __future__ import annotations

import base64
import io
import itertools
import math
import re
from dataclasses import dataclass
from typing import Any

import matplotlib
from matplotlib.colors import ListedColormap, to_hex, to_rgb
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from rmqlab.pipeline.report_data import (
    Marker,
    PlotData,
    clock_of,
    group_nodes,
    pause_spans,
    real_topics,
    short_cause,
)
from rmqlab.pipeline.unavailability import CAUSE_TEXT, CAUSES, RunClock

NUMBERED_MARKERS_TEXT = (
    "Numbered markers above the {what} are the chaos runner's actions (dashed) and the broker's "
    "channel expiries and lock take-overs (dotted); small ticks are the broker's NOTIFY sends."
)
TICK_MARKERS_TEXT = (
    "Above the {what}, a tick per action of the chaos runner (upper row) and per channel expiry or lock "
    "take-over of the broker (lower row), coloured by kind; the small ticks under them are the broker's "
    "NOTIFY sends."
)
OWNERSHIP_BASE_TEXT = (
    "Each row is a queue; each bar is the time one consumer owned it (colour = consumer; a "
    "restarted node's new process is '#2'). Hatched: the owner was paused. The thin strip under "
    "a row marks the time its messages waited and nobody consumed them, coloured by cause."
)
OWNERSHIP_TEXT = f"{OWNERSHIP_BASE_TEXT} {NUMBERED_MARKERS_TEXT.format(what='chart')}"

RATE_TEXT = (
    "Messages each consumer node finished per {clock} second; the grey line is what the producers "
    "sent. A consumer that stops at a kill or pause drops to zero; the others speed up to drain "
    "the backlog once they take over its queues."
)
MANY_NODES = 20  # past the palette's 20 colours, the rates of a group's nodes are drawn summed
RATES_TEXT = (
    "Messages the group's {nodes} consumer nodes finished per {clock} second, all together (a line each "
    "would be {nodes} lines); the grey line is what the producers sent. A dip below it is a backlog "
    "growing, a rise above it the backlog being drained."
)

DUPLICATES_TEXT = (
    "Deliveries of a message after its first one, by when they happened: after a kill the new "
    "owner resumes from the last committed offset; after a pause past the channel expiry, the "
    "resumed consumer re-consumes what it had fetched before the others took over."
)


# Past this many markers a chart's lane draws ticks instead of numbered circles (which would pile up),
# and the list of them under the ownership chart is folded.
MANY_MARKERS = 40


FONT = 13  # at 850 px wide the pictures stay legible when a 700 px screen shrinks them by a quarter
FIG_W = 8.5
LANE_H = 1.0  # inches for the marker lane: three rows of numbered circles that never touch
LANE_ROWS = (3.3, 2.0, 0.7)
# Outside the consumers' palette (tab10/tab20), so a strip is never read as an owner.
CAUSE_COLORS = {
    "no_owner": "#000000",
    "lock_wait": "#ff00ff",
    "owner_paused": "#5a5a5a",
    "owner_idle": "#ffd700",
}


def _levels(xs: list[float], gap: float, lanes: int = 3) -> list[int]:
    """A lane per label so that labels closer than `gap` never share one (greedy, lowest lane first)."""
    last = [-math.inf] * lanes
    out = []
    for x in xs:
        lane = next((i for i in range(lanes) if x - last[i] >= gap), min(range(lanes), key=lambda i: last[i]))
        last[lane] = x
        out.append(lane)
    return out


def _figure(height: float, markers: list[Marker]) -> tuple[Figure, Any, Any]:
    """A figure with a marker lane above the main axes (sharing x), so labels never sit on the data."""
    if not markers:
        fig = Figure(figsize=(FIG_W, height))
        return fig, None, fig.subplots()
    fig = Figure(figsize=(FIG_W, height + LANE_H))
    lane, ax = fig.subplots(
        2,
        1,
        sharex=True,
        gridspec_kw={"height_ratios": [LANE_H, height], "hspace": 0.04},
    )
    return fig, lane, ax


def _draw_markers(
    lane: Any, ax: Any, markers: list[Marker], clock: RunClock, x_max: float, notifies: list[int] = ()
) -> None:  # type: ignore[assignment]
    """Numbered markers in their own lane (staggered), a line through the data for each, and small
    ticks for the broker's NOTIFY sends; the numbers are explained under the picture."""
    if lane is None:
        return
    xs = [clock.at_s(m.ts) for m in markers]
    if len(markers) > MANY_MARKERS:
        # a tick per marker in the lane, the chaos runner's above the broker's, and no line through
        # the data: hundreds of them would hide it
        for m, x in zip(markers, xs, strict=True):
            low, high = (1.6, 3.6) if m.kind == "nemesis" else (0.3, 1.4)
            lane.plot([x, x], [low, high], color=m.color, linewidth=0.8, alpha=0.8)
        xs = []
    levels = _levels(xs, gap=max(x_max, 1e-9) * 0.035)
    for i, (m, x, level) in enumerate(zip(markers, xs, levels, strict=False), start=1):
        dashed = "--" if m.kind == "nemesis" else ":"
        ax.axvline(x, color=m.color, linestyle=dashed, linewidth=1.2)
        lane.axvline(x, color=m.color, linestyle=dashed, linewidth=0.8, alpha=0.5)
        lane.annotate(
            str(i),
            (x, LANE_ROWS[level]),
            ha="center",
            va="center",
            fontsize=FONT - 1,
            color="white",
            fontweight="bold",
            bbox={"boxstyle": "circle,pad=0.2", "facecolor": m.color, "edgecolor": "none"},
        )
    for ts in notifies:
        lane.plot([clock.at_s(ts)] * 2, [-0.45, 0.0], color="#1f77b4", linewidth=0.8)
    lane.set_ylim(-0.5, 4.0)
    lane.set_yticks([])
    lane.tick_params(axis="x", which="both", bottom=False)
    for side in ("top", "right", "left"):
        lane.spines[side].set_visible(False)
    if notifies:
        lane.text(  # beside the lane, where no tick can be
            1.01,
            -0.25,
            "NOTIFY\nsent",
            transform=lane.get_yaxis_transform(),
            ha="left",
            va="center",
            fontsize=FONT - 3,
            color="#1f77b4",
        )


def _x_label(ax: Any, clock: RunClock) -> None:
    if clock.time_scale == 1.0:
        ax.set_xlabel("seconds since t = 0", fontsize=FONT)
    else:
        ax.set_xlabel(
            f"RocketMQ seconds since t = 0 ({clock.kind} seconds = x {clock.time_scale:g})", fontsize=FONT
        )


def figure_png(fig: Figure) -> str:
    """The figure as a base64 PNG. A figure of our own (made as `Figure`, not by pyplot) is drawn by
    the Agg canvas whatever the caller's backend is, and is simply dropped afterwards; one made by
    pyplot is closed, so pyplot does not keep it."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, bbox_inches="tight")
    if fig.canvas.manager is not None:  # pyplot's: only pyplot gives a figure a manager
        import matplotlib.pyplot as plt

        plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def client_labels(rows: list[dict[str, Any]]) -> dict[str, str]:
    """Consumers by node name; a node's later processes (restarts) get '#2', '#3' in order of start."""
    first: dict[str, int] = {}
    node: dict[str, str] = {}
    for r in rows:
        c = r["client_id"]
        first[c] = min(first.get(c, r["start"]), r["start"])
        node.setdefault(c, r["node"] or c)
    out: dict[str, str] = {}
    seen: dict[str, int] = {}
    for c in sorted(first, key=lambda c: (first[c], c)):
        seen[node[c]] = seen.get(node[c], 0) + 1
        out[c] = node[c] if seen[node[c]] == 1 else f"{node[c]} #{seen[node[c]]}"
    return out


def _queue_sort_key(q: tuple[str, str]) -> tuple[Any, ...]:
    broker, _, qid = q[1].rpartition(":")
    return (q[0], broker, int(qid) if qid.isdigit() else qid)


# Past this many queues the ownership chart is a health map: at 0.3 inch a row, 64 rows already make a
# picture of about 2,000 px, two screens, and a group that large has more consumers than a palette has
# colours that can be told apart.
MANY_QUEUES = 64
MAP_ROWS = 128  # rows of cells at most: about 4 px each at the map's height
MAP_COLUMNS = 150  # columns of cells (time buckets): about 5 px each
MAP_H = 5.2  # inches
# A cell's states from least to most severe (key, legend text, colour): a cell shows the most severe
# state its queues were in for a share of its time (BRIEF_SHARE). Messages waiting (unavailable) is
# the harm itself, so it ranks above the ownership states that lead to it.
MAP_STATES: list[tuple[str, str, str]] = [
    ("unassigned", "before the group's first assignment", "#ffffff"),
    ("not_collected", "not collected (too many ownership intervals)", "#d9d9d9"),
    ("one_owner", "one owner", "#c7e9c0"),
    ("overlap", "two or more owners (overlap)", "#6baed6"),
    ("paused", "owned only by paused consumers", "#c5b0d5"),
    ("orphan", "no owner (orphan)", "#fdae6b"),
    *((f"unavailable_{c}", f"unavailable: {CAUSE_TEXT[c].split(' (')[0]}", CAUSE_COLORS[c]) for c in CAUSES),
]
RANK = {key: i for i, (key, _, _) in enumerate(MAP_STATES)}
# A cell shows the worst state that took at least this share of its queue-time (its queues x its
# seconds), else the worst of any moment, pale: at a thousand consumers a rebalance leaves hundreds of
# queues without an owner for milliseconds, which in full colour would read as the whole cell's time.
BRIEF_SHARE = 0.05

MAP_TEXT = (
    "The group has {queues} queues, too many for a row each. Each row of cells is {per} in the order "
    "topic, broker, queue id; each column is {col} of RocketMQ time. A cell has the colour of the worst "
    "state its queues were in for at least "
    f"{BRIEF_SHARE:.0%} of its queue-time (its queues times its seconds), worst first: messages waited "
    "and nobody consumed them (by cause), no owner, owned only by paused consumers, two or more owners, "
    "one owner. A pale cell had no such state: it shows the worst of any moment, such as the milliseconds "
    "without an owner that a rebalance leaves."
)


@dataclass
class HealthMap:
    """The cells of a many-queue group's health map: `cells[row][column]` is an index in MAP_STATES."""

    cells: Any  # numpy array, rows x columns
    # True where no state worse than one owner took BRIEF_SHARE of the cell's queue-time: the cell
    # shows the worst it had at any moment, pale
    brief: Any
    queues: list[tuple[str, str]]  # in row order, `per_row` to a row
    per_row: int
    x0: float  # RocketMQ seconds at the left edge
    x1: float


def _map_shape(queues: int) -> tuple[int, int]:
    """(queues per row, rows) of a health map."""
    per = max(1, math.ceil(queues / MAP_ROWS))
    return per, math.ceil(queues / per)


def health_map(data: PlotData, group: str, summary_group: dict[str, Any] | None = None) -> HealthMap | None:
    """The group's queues (binned) against time buckets, each cell at its worst lasting state (or its
    worst, brief), from the ownership intervals, the pauses and the summary's unavailable spans."""
    import numpy as np

    rows = [r for r in data.intervals if r["group"] == group]
    if not rows:
        return None
    clock = clock_of(data)
    x = clock.at_s
    queues = sorted({(r["topic"], r["queue"]) for r in rows}, key=_queue_sort_key)
    index = {q: i for i, q in enumerate(queues)}
    x0, x1 = min(0.0, x(data.run_start)), max(x(data.run_end), 0.001)
    width = (x1 - x0) / MAP_COLUMNS
    cells = np.zeros((len(queues), MAP_COLUMNS), dtype=np.int8)
    per, n_rows = _map_shape(len(queues))
    # queue-seconds in each state per cell (summed over the row's queues): how long its worst state lasted
    spent = np.zeros((len(MAP_STATES), n_rows, MAP_COLUMNS), dtype=np.float64)

    def mark(row: int, start_s: float, end_s: float, state: str) -> None:
        c0 = min(max(int((start_s - x0) // width), 0), MAP_COLUMNS - 1)
        c1 = min(max(math.ceil((end_s - x0) / width), c0 + 1), MAP_COLUMNS)
        np.maximum(cells[row, c0:c1], RANK[state], out=cells[row, c0:c1])
        left = x0 + width * np.arange(c0, c1)
        spent[RANK[state], row // per, c0:c1] += np.clip(
            np.minimum(end_s, left + width) - np.maximum(start_s, left), 0, None
        )

    paused: dict[str, list[tuple[int, int]]] = {}
    for node, ps, pe in pause_spans(data):
        paused.setdefault(node, []).append((ps, pe))
    by_queue: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in rows:
        by_queue.setdefault((r["topic"], r["queue"]), []).append(r)
    first = min(r["start"] for r in rows)
    end = data.run_end if data.intervals_cut_at is None else min(data.run_end, data.intervals_cut_at)
    for queue, ivs in by_queue.items():
        # the queue's time cut where its owners or their pauses change; each piece has one state
        cuts = {first, end}
        for r in ivs:
            cuts.update((r["start"], r["end"]))
            for ps, pe in paused.get(r["node"], ()):
                cuts.update((max(ps, r["start"]), min(pe, r["end"])))
        edges = sorted(t for t in cuts if first <= t <= end)
        for a, b in itertools.pairwise(edges):
            owners = [r for r in ivs if r["start"] <= a < r["end"]]
            if not owners:
                state = "orphan"
            elif all(any(ps <= a < pe for ps, pe in paused.get(r["node"], ())) for r in owners):
                state = "paused"
            else:
                state = "overlap" if len({r["client_id"] for r in owners}) > 1 else "one_owner"
            mark(index[queue], x(a), x(b), state)
    if data.intervals_cut_at is not None:
        c0 = max(int((x(data.intervals_cut_at) - x0) // width), 0)
        cells[:, c0:] = RANK["not_collected"]
        spent[:, :, c0:] = 0  # what was seen of the owners there is a part, not a share
    for q in (summary_group or {}).get("unavailability", {}).get("queues", []):
        row = index.get((q["topic"], q["queue"]))
        if row is not None:
            for sp in q["spans"]:
                mark(row, sp["from_s"], sp["to_s"], f"unavailable_{sp['cause']}")
    padded = np.zeros((n_rows * per, MAP_COLUMNS), dtype=np.int8)
    padded[: len(queues)] = cells
    worst = padded.reshape(n_rows, per, MAP_COLUMNS).max(axis=1)
    queue_time = np.minimum(per, len(queues) - per * np.arange(n_rows))[:, None] * width
    share = spent / queue_time[None]
    # The worst state that took at least BRIEF_SHARE of the cell; failing one, the worst at any moment,
    # pale (so a rebalance's milliseconds of orphan do not hide a lasting overlap or pause)
    ranks = np.arange(len(MAP_STATES))[:, None, None]
    lasting = (ranks > RANK["one_owner"]) & (share >= BRIEF_SHARE)
    shown = np.where(lasting.any(axis=0), np.where(lasting, ranks, -1).max(axis=0), worst).astype(np.int8)
    brief = ~lasting.any(axis=0) & (worst > RANK["one_owner"])
    return HealthMap(shown, brief, queues, per, x0, x1)


def _pale(color: str) -> str:
    """The colour three fifths of the way to white: a state that lasted only briefly in its cell."""
    return to_hex(tuple(1 - 0.4 * (1 - c) for c in to_rgb(color)))


def plot_health_map(
    data: PlotData, group: str, markers: list[Marker], summary_group: dict[str, Any] | None = None
) -> str | None:
    """The ownership chart of a group of many queues: its health map, with the other charts' marker
    lane and time axis, and a legend of the states in it."""
    hm = health_map(data, group, summary_group)
    if hm is None:
        return None
    clock = clock_of(data)
    n_rows = hm.cells.shape[0]
    fig, lane, ax = _figure(MAP_H, markers)
    n = len(MAP_STATES)
    colors = [c for _, _, c in MAP_STATES] + [_pale(c) for _, _, c in MAP_STATES]
    ax.imshow(
        hm.cells + n * hm.brief,  # a brief state's pale twin sits n further along the colour map
        cmap=ListedColormap(colors),
        vmin=-0.5,
        vmax=2 * n - 0.5,
        interpolation="nearest",
        aspect="auto",
        extent=(hm.x0, hm.x1, n_rows, 0),
    )
    many_topics = len(real_topics(sorted({q[0] for q in hm.queues}))) > 1
    ticks = list(range(0, n_rows, max(1, math.ceil(n_rows / 8))))
    ax.set_yticks([t + 0.5 for t in ticks])
    ax.set_yticklabels(
        [_queue_label(*hm.queues[t * hm.per_row], many_topics) for t in ticks], fontsize=FONT - 2
    )
    ax.set_ylabel(f"queues ({hm.per_row} a row)" if hm.per_row > 1 else "queues", fontsize=FONT)
    ax.tick_params(axis="x", labelsize=FONT - 1)
    ax.set_xlim(hm.x0, hm.x1)
    _x_label(ax, clock)
    (lane or ax).set_title(f"{group}: health of its {len(hm.queues):,} queues over time", fontsize=FONT + 1)
    _draw_markers(lane, ax, markers, clock, hm.x1, _notifies(summary_group))
    for line in ax.lines:  # the marker lines, thin and faint so the cells at a change stay visible
        line.set_linewidth(0.7)
        line.set_alpha(0.5)
    seen = {int(v) for v in set(hm.cells[~hm.brief].flat)} | {RANK["one_owner"]}
    pale = {int(v) for v in set(hm.cells[hm.brief].flat)}
    # the full colours in the left column, the pale ones in the right (a legend fills column by column)
    left = [(text, color) for i, (_, text, color) in enumerate(MAP_STATES) if i in seen]
    right = [(f"{text}, briefly", _pale(c)) for i, (_, text, c) in enumerate(MAP_STATES) if i in pale]
    if right:
        rows = max(len(left), len(right))
        left += [("", "")] * (rows - len(left))
        right += [("", "")] * (rows - len(right))
    shown = left + right
    ax.legend(
        [
            Rectangle((0, 0), 1, 1, facecolor=c or "none", edgecolor="#888", linewidth=0.5, visible=bool(c))
            for _, c in shown
        ],
        [text for text, _ in shown],
        fontsize=FONT - 1,
        loc="upper center",
        bbox_to_anchor=(0.5, -0.7 / (0.85 * MAP_H)),
        ncol=2,
        frameon=False,
    )
    return figure_png(fig)


def ownership_text(data: PlotData, group: str, markers: int = 0) -> str:
    """The caption of the group's ownership chart: what a bar is, or for a health map what a cell is,
    and what its ``markers`` markers look like (numbered, or ticks past MANY_MARKERS)."""
    queues = {(r["topic"], r["queue"]) for r in data.intervals if r["group"] == group}
    what = "chart" if len(queues) <= MANY_QUEUES else "map"
    marks = (TICK_MARKERS_TEXT if markers > MANY_MARKERS else NUMBERED_MARKERS_TEXT).format(what=what)
    if what == "chart":
        return f"{OWNERSHIP_BASE_TEXT} {marks}"
    clock = clock_of(data)
    span = max(clock.at_s(data.run_end), 0.001) - min(0.0, clock.at_s(data.run_start))
    per, _ = _map_shape(len(queues))
    text = MAP_TEXT.format(
        queues=f"{len(queues):,}",
        per="one queue" if per == 1 else f"{per} queues",
        col=f"{span / MAP_COLUMNS:.2g} s",
    )
    return f"{text} {marks}"


def plot_ownership(
    data: PlotData, group: str, markers: list[Marker], summary_group: dict[str, Any] | None = None
) -> str | None:
    """Gantt chart: one row per queue, one bar per ownership interval, coloured by consumer; paused
    stretches hatched; unavailable stretches as a strip under the bars, coloured by cause. A group of
    more than MANY_QUEUES queues gets its health map instead."""
    rows = [r for r in data.intervals if r["group"] == group]
    if not rows:
        return None
    if len({(r["topic"], r["queue"]) for r in rows}) > MANY_QUEUES:
        return plot_health_map(data, group, markers, summary_group)
    clock = clock_of(data)
    queues = sorted({(r["topic"], r["queue"]) for r in rows}, key=_queue_sort_key)
    label = client_labels(rows)
    owners = sorted(label, key=lambda c: label[c])
    cmap = matplotlib.colormaps["tab10" if len(owners) <= 10 else "tab20"]
    color = {c: cmap(i % cmap.N) for i, c in enumerate(owners)}
    y = {q: i for i, q in enumerate(queues)}
    many_topics = len(real_topics(sorted({q[0] for q in queues}))) > 1
    x = clock.at_s
    fig_h = max(2.8, 0.3 * len(queues) + 1.4)
    fig, lane, ax = _figure(fig_h, markers)
    # Each owner of a queue gets its own lane inside the queue's row, so two owners at once show as two
    # parallel bars (overlap) rather than one bar hiding the other.
    lanes: dict[tuple[str, str], list[str]] = {}
    for r in rows:
        owners_of = lanes.setdefault((r["topic"], r["queue"]), [])
        if r["client_id"] not in owners_of:
            owners_of.append(r["client_id"])
    pauses = pause_spans(data)
    for r in rows:
        queue = (r["topic"], r["queue"])
        n, i = len(lanes[queue]), lanes[queue].index(r["client_id"])
        height = 0.72 / n
        mid = y[queue] - 0.44 + (i + 0.5) * height
        ax.barh(
            mid,
            max(x(r["end"]) - x(r["start"]), 0.0005),
            left=x(r["start"]),
            height=height * 0.92,
            color=color[r["client_id"]],
            alpha=0.85,
            edgecolor="black",
            linewidth=0.3,
        )
        for node, ps, pe in pauses:
            s, e = max(ps, r["start"]), min(pe, r["end"])
            if node == r["node"] and e > s:
                ax.barh(
                    mid,
                    x(e) - x(s),
                    left=x(s),
                    height=height * 0.92,
                    facecolor="white",
                    alpha=0.55,
                    hatch="////",
                    edgecolor="#444",
                    linewidth=0,
                )
    causes_seen: set[str] = set()
    for q in (summary_group or {}).get("unavailability", {}).get("queues", []):
        key = (q["topic"], q["queue"])
        if key not in y:
            continue
        for sp in q["spans"]:
            causes_seen.add(sp["cause"])
            ax.barh(
                y[key] + 0.36,
                sp["to_s"] - sp["from_s"],
                left=sp["from_s"],
                height=0.14,
                color=CAUSE_COLORS[sp["cause"]],
                linewidth=0,
            )
    ax.set_yticks(range(len(queues)))
    ax.set_yticklabels([_queue_label(t, q, many_topics) for t, q in queues], fontsize=FONT - 2)
    ax.tick_params(axis="x", labelsize=FONT - 1)
    ax.set_ylim(len(queues) - 0.5, -0.5)
    x_max = max(x(data.run_end), 0.001)
    ax.set_xlim(min(0.0, x(data.run_start)), x_max)
    _x_label(ax, clock)
    (lane or ax).set_title(f"{group}: who owned which queue, and when", fontsize=FONT + 1)
    _draw_markers(lane, ax, markers, clock, x_max, _notifies(summary_group))
    handles = [Rectangle((0, 0), 1, 1, color=color[c]) for c in owners]
    names = [label[c] for c in owners]
    if pauses and any(node in group_nodes(data, group) for node, _, _ in pauses):
        handles.append(Rectangle((0, 0), 1, 1, facecolor="white", hatch="////", edgecolor="#444"))
        names.append("paused (SIGSTOP)")
    for cause in CAUSES:
        if cause in causes_seen:
            handles.append(Rectangle((0, 0), 1, 1, color=CAUSE_COLORS[cause]))
            names.append(f"unavailable: {CAUSE_TEXT[cause].split(' (')[0]}")
    ax.legend(
        handles,
        names,
        fontsize=FONT - 1,
        loc="upper center",
        bbox_to_anchor=(0.5, -0.7 / (0.85 * fig_h)),  # just under the axis label, whatever the height
        ncol=min(len(names), 3),
        frameon=False,
    )
    return figure_png(fig)


def _queue_label(topic: str, queue: str, many_topics: bool) -> str:
    """'b:3' style labels: the topic only when there are several; a retry topic as 'retry'."""
    if topic.startswith("%RETRY%"):
        return f"retry {queue}"
    return f"{topic} {queue}" if many_topics else queue


def _notifies(summary_group: dict[str, Any] | None) -> list[int]:
    return [m["ts_ms"] for m in (summary_group or {}).get("broker_markers", []) if m["kind"] == "notify_sent"]


def _per_second(n: int, bucket_ms: int) -> float:
    return n * 1000.0 / bucket_ms


def plot_rates(data: PlotData, group: str, markers: list[Marker]) -> str | None:
    """Messages processed per second by each consumer node (and sent, for comparison)."""
    rows = [r for r in data.rates if r["group"] == group]
    if not rows:
        return None
    clock = clock_of(data)
    first = min(r["bucket"] for r in rows)
    last = max(r["bucket"] for r in rows)
    xs = list(range(first, last + 1))
    at = [clock.at_s(data.run_start + b * data.bucket_ms) for b in xs]
    fig, lane, ax = _figure(3.0, markers)
    sends = {r["bucket"]: r["n"] for r in data.sends if r["group"] == group}
    if sends:
        ax.plot(
            at,
            [_per_second(sends.get(b, 0), data.bucket_ms) for b in xs],
            color="lightgray",
            linewidth=2.5,
            label="sent (all producers)",
        )
    nodes = sorted({r["node"] for r in rows})
    title = f"{group}: consumption rate per consumer"
    if len(nodes) > MANY_NODES:  # one line each would be a tangle with a legend taller than a screen
        title = f"{group}: consumption rate of its {len(nodes):,} consumers together"
        total: dict[int, int] = {}
        for r in rows:
            total[r["bucket"]] = total.get(r["bucket"], 0) + r["n"]
        label = f"all {len(nodes):,} consumers together"
        ax.plot(at, [_per_second(total.get(b, 0), data.bucket_ms) for b in xs], linewidth=1.2, label=label)
        nodes = []
    for node in nodes:
        counts = {r["bucket"]: r["n"] for r in rows if r["node"] == node}
        # Buckets without a line are zeros (a paused or dead consumer), not gaps to draw across.
        ax.plot(at, [_per_second(counts.get(b, 0), data.bucket_ms) for b in xs], linewidth=1.2, label=node)
    _time_axes(data, lane, ax, markers, f"messages / {clock_of(data).kind} s", title)
    ax.legend(fontsize=FONT - 1, loc="upper center", bbox_to_anchor=(0.5, -0.3), ncol=4, frameon=False)
    return figure_png(fig)


def rate_text(data: PlotData, group: str) -> str:
    """The caption of the group's rate chart, which sums the nodes of a large group."""
    nodes = {r["node"] for r in data.rates if r["group"] == group}
    clock = clock_of(data).kind
    if len(nodes) <= MANY_NODES:
        return RATE_TEXT.format(clock=clock)
    return RATES_TEXT.format(nodes=f"{len(nodes):,}", clock=clock)


def _time_axes(data: PlotData, lane: Any, ax: Any, markers: list[Marker], ylabel: str, title: str) -> None:
    """The shared x axis of the time charts (RocketMQ seconds since t = 0), their markers and labels."""
    clock = clock_of(data)
    x_max = max(clock.at_s(data.run_end), 0.001)
    ax.set_xlim(min(0.0, clock.at_s(data.run_start)), x_max)
    _draw_markers(lane, ax, markers, clock, x_max)
    _x_label(ax, clock)
    ax.set_ylabel(ylabel, fontsize=FONT)
    ax.tick_params(labelsize=FONT - 1)
    (lane or ax).set_title(title, fontsize=FONT + 1)


def plot_duplicates(data: PlotData, group: str, markers: list[Marker]) -> str | None:
    rows = sorted((r["bucket"], r["n"]) for r in data.duplicates if r["group"] == group)
    if not rows:
        return None
    clock = clock_of(data)
    fig, lane, ax = _figure(2.4, markers)
    width = clock.rmq_ms(data.bucket_ms) / 1000.0
    ax.bar(
        [clock.at_s(data.run_start + b * data.bucket_ms) for b, _ in rows],
        [n for _, n in rows],
        width=width,
        align="edge",
        color="crimson",
    )
    _time_axes(data, lane, ax, markers, "duplicates", f"{group}: duplicate deliveries over time")
    return figure_png(fig)


REGRESSIONS_TEXT = (
    "One row per time a queue's committed offset moved backwards (a broker storing an older offset than "
    "the one before, or a new owner resuming below it), labelled with its time, the queue and the old and "
    "new offset: in blue how many offsets it went back, in red how many deliveries of those offsets came "
    "again after it (repeats of messages already consumed)."
)
REGRESSIONS_DOTS_TEXT = (
    "Each time a queue's committed offset moved backwards (a broker storing an older offset than the one "
    "before, or a new owner resuming below it), at its time: a blue dot, how many offsets it went back; a "
    "red cross, how many deliveries of those offsets came again after it. Every one is listed in the "
    "offset regression entries below."
)


def regressions_text(entries: list[dict[str, Any]]) -> str:
    return REGRESSIONS_DOTS_TEXT if len(entries) > MANY_MARKERS else REGRESSIONS_TEXT


def plot_offset_regressions(
    entries: list[dict[str, Any]], data: PlotData, group: str, markers: list[Marker]
) -> str | None:
    """The group's offset regressions, a row each (how far back, how many deliveries again); past
    MANY_MARKERS of them, dots over time."""
    if not entries:
        return None
    clock = clock_of(data)
    back = [e["from"] - e["to"] for e in entries]
    again = [e["redelivered"] for e in entries]
    if len(entries) > MANY_MARKERS:
        fig, lane, ax = _figure(2.8, markers)
        xs = [clock.at_s(e["change_ms"]) for e in entries]
        ax.scatter(xs, back, s=16, color="steelblue", label="offsets moved back")
        ax.scatter(xs, again, s=22, marker="x", color="crimson", label="deliveries again")
        ax.set_ylim(0, max([*back, *again, 1]) * 1.25)
        _time_axes(data, lane, ax, markers, "offsets", f"{group}: committed offsets moving backwards")
        ax.legend(fontsize=FONT - 2, loc="upper left", frameon=False)
        return figure_png(fig)
    fig = Figure(figsize=(FIG_W, max(2.0, 0.34 * len(entries) + 1.2)))
    ax = fig.subplots()
    rows = range(len(entries))
    labels = [f"t = {clock.at_s(e['change_ms']):z.1f} s  {e['queue']} {e['from']}→{e['to']}" for e in entries]
    ax.barh(rows, back, height=0.75, color="#a6c8e6", label="offsets moved back")
    ax.barh(rows, again, height=0.35, color="crimson", label="deliveries again")
    top = max([*back, *again, 1])
    for i, e in enumerate(entries):
        who = "stored by" if e["event"] == "offset_committed" else "read by"
        ax.annotate(
            f"{again[i]} again ({who} {e['node']})",
            (max(back[i], again[i]), i),
            xytext=(4, 0),
            textcoords="offset points",
            va="center",
            fontsize=FONT - 2,
        )
    ax.set_yticks(list(rows))
    ax.set_yticklabels(labels, fontsize=FONT - 1)
    ax.set_xlim(0, top * 1.9)
    ax.invert_yaxis()
    ax.tick_params(axis="x", labelsize=FONT - 1)
    ax.set_xlabel("offsets", fontsize=FONT)
    # between the title and the bars: beside them it would sit on the labels of the longest
    ax.legend(fontsize=FONT - 2, loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=2, frameon=False)
    ax.set_title(f"{group}: committed offsets moving backwards", fontsize=FONT + 1, pad=24)
    return figure_png(fig)


def plot_convergence(entries: list[dict[str, Any]], group: str, clock: RunClock) -> str | None:
    if not entries:
        return None
    if len(entries) > MANY_MARKERS:
        return _plot_convergence_over_time(entries, group, clock)
    fig = Figure(figsize=(FIG_W, max(2.0, 0.34 * len(entries) + 1.0)))
    ax = fig.subplots()
    labels = [f"t = {clock.at_s(e['change_ms']):z.1f} s  {short_cause(e['cause'])}" for e in entries]
    # a label too long for the margin loses the named targets of a many-action change first
    labels = [(re.sub(r" \([^)]*\)", "", t) if len(t) > 48 else t)[:48] for t in labels]
    values = [clock.rmq_ms(e["convergence_ms"]) / 1000 if e["converged"] else 0 for e in entries]
    top = max([*values, 0.001])
    colors = ["steelblue" if e["converged"] else "crimson" for e in entries]
    ax.barh(range(len(entries)), values, color=colors)
    for i, e in enumerate(entries):
        text = (
            f"{values[i]:.2f} s ({e['convergence_ms']} ms {clock.kind})"
            if e["converged"]
            else "never whole again"
        )
        ax.annotate(
            text,
            (values[i], i),
            xytext=(4, 0),
            textcoords="offset points",
            va="center",
            fontsize=FONT - 1,
            color="black" if e["converged"] else "crimson",
        )
    ax.set_yticks(range(len(entries)))
    ax.set_yticklabels(labels, fontsize=FONT - 1)
    ax.set_xlim(0, top * 1.6)
    ax.invert_yaxis()
    ax.tick_params(axis="x", labelsize=FONT - 1)
    ax.set_xlabel("RocketMQ seconds until the group was whole again", fontsize=FONT)
    ax.set_title(f"{group}: convergence after each change of membership", fontsize=FONT + 1)
    return figure_png(fig)


def _plot_convergence_over_time(entries: list[dict[str, Any]], group: str, clock: RunClock) -> str:
    """Past MANY_MARKERS changes a bar each would be a page tall: one dot per change at its time, its
    convergence on a log scale (from a millisecond to a minute are both common), never as a red cross."""
    fig = Figure(figsize=(FIG_W - 1.4, 3.4))  # the legend beside it takes the rest
    ax = fig.subplots()
    done = [e for e in entries if e["converged"]]
    never = [e for e in entries if not e["converged"]]
    ys = [max(clock.rmq_ms(e["convergence_ms"]) / 1000, CONVERGENCE_FLOOR_S) for e in done]
    # ticks at powers of ten up to one at or above the slowest; "never" a decade above, set apart
    decade = 10.0 ** math.ceil(math.log10(max([*ys, 1.0])))
    ax.scatter([clock.at_s(e["change_ms"]) for e in done], ys, s=14, color="steelblue", label="whole again")
    ticks = [t for t in (0.001, 0.01, 0.1, 1, 10, 100, 1000, 10_000) if t <= decade]
    labels = [f"{t:g} s" if t >= 1 else f"{t * 1000:g} ms" for t in ticks]  # "10 ms", not 10⁻²
    if never:
        ax.scatter(
            [clock.at_s(e["change_ms"]) for e in never],
            [decade * 10] * len(never),
            s=40,
            marker="x",
            color="crimson",
            label="never whole again",
        )
        ax.axhline(decade * 10**0.5, color="#999", lw=0.8, ls="--")
        ticks, labels = [*ticks, decade * 10], [*labels, "never"]
    ax.set_yscale("log")
    ax.set_ylim(CONVERGENCE_FLOOR_S / 2, ticks[-1] * 2)
    ax.set_yticks(ticks, labels)
    ax.minorticks_off()
    # beside the axes: inside, it would hide the dots and crosses of the last minutes
    ax.legend(fontsize=FONT - 2, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    ax.tick_params(labelsize=FONT - 1)
    _x_label(ax, clock)
    ax.set_ylabel("RocketMQ time", fontsize=FONT)
    ax.set_title(
        f"{group}: convergence after each of {len(entries):,} changes of membership", fontsize=FONT + 1
    )
    return figure_png(fig)


CONVERGENCE_FLOOR_S = 0.001  # a change converged at once is drawn at a millisecond (a log scale has no 0)
CONVERGENCE_TEXT = (
    "For each start, stop or kill in the group: how long until every queue had exactly one live owner and "
    "every running consumer had rebalanced with the current member list. Red: never."
)
CONVERGENCE_DOTS_TEXT = (
    "For each of the group's starts, stops and kills, a dot at its time: how long until every queue had "
    "exactly one live owner and every running consumer had rebalanced with the current member list, on a "
    "log scale (under a millisecond drawn at one). Red crosses in the top row: never. Each change is "
    "listed in the convergence entries below."
)


def convergence_text(entries: list[dict[str, Any]]) -> str:
    return CONVERGENCE_DOTS_TEXT if len(entries) > MANY_MARKERS else CONVERGENCE_TEXT
