"""report.html: what happened in a run, for someone who was not there. One self-contained page: the
metrics with a plain explanation, the verdict and why, and matplotlib pictures (PNG, inline base64).

The pictures are drawn from small aggregates computed in Spark (ownership intervals, nemesis actions,
per-bucket counts); only those are collected to the driver.
"""

from __future__ import annotations

import base64
import html
import io
import json
import math
import os
from dataclasses import dataclass, field
from typing import Any

METRICS: dict[str, str] = {
    "sent": "Distinct messages the producers sent to the group's topics and the broker acknowledged.",
    "consumed_unique": "Distinct messages the group's consumers processed successfully.",
    "lost": "Messages that were sent but never consumed by the group. Should be 0.",
    "duplicates": "Extra deliveries: every processing of a message after its first one. After a crash "
    "or a rebalance RocketMQ replays from the last committed offset, so some are expected.",
    "duplicated_messages": "Messages processed two or more times.",
    "overlap_ms": "Time during which two or more consumers owned the same queue at once (summed over "
    "queues). Happens briefly during a rebalance, before the old owner lets go.",
    "orphan_ms": "Time during which a queue of the group had no owner at all, counted from the group's "
    "first queue assignment to the end of the run (summed over queues). Messages on it wait.",
    "stalled_ms": "Time during which a queue was owned only by paused (frozen) consumers: owned on paper "
    "but nobody working on it.",
    "concurrent_consume_ms": "Time during which two different consumers were processing messages of "
    "the same queue at the same moment. Forbidden for an orderly group.",
    "order_violations": "Orderly deliveries that went backwards (an offset not above an earlier one) "
    "within one consumer's ownership of a queue.",
}

VERDICT_RULES = (
    "The verdict is FAIL when a message was lost, when an orderly group (one that consumed in ORDERLY "
    "mode) had two consumers in the same queue at once or delivered out of order, or when after a "
    "change of membership (a consumer starting, stopping or being killed) the group never became whole "
    "again before the run ended. Whole means: every queue has exactly one owner, that owner is alive, and "
    "every running consumer has rebalanced with the current member list. Otherwise the verdict is OK."
)

ACTION_COLORS = {
    "kill": "#d62728",
    "stop": "#ff7f0e",
    "start": "#2ca02c",
    "pause": "#9467bd",
    "resume": "#17becf",
}


@dataclass
class PlotData:
    """Everything the pictures need, already small (collected rows)."""

    run_start: int
    run_end: int
    bucket_ms: int
    intervals: list[dict[str, Any]] = field(
        default_factory=list
    )  # group client_id node topic queue start end
    nemeses: list[dict[str, Any]] = field(default_factory=list)  # ts_ms action target
    rates: list[dict[str, Any]] = field(default_factory=list)  # group node bucket n
    duplicates: list[dict[str, Any]] = field(default_factory=list)  # group bucket n
    sends: list[dict[str, Any]] = field(default_factory=list)  # group bucket n
    orderly: set[str] = field(default_factory=set)  # groups with ORDERLY consumption


def pick_bucket_ms(duration_ms: int, target: int = 150) -> int:
    """A round bucket width giving about `target` buckets over the run."""
    raw = max(duration_ms, 1) / target
    for step in (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10_000, 30_000, 60_000):
        if step >= raw:
            return step
    return 60_000 * math.ceil(raw / 60_000)


def collect_plot_data(analysis: Any, max_intervals: int = 20_000) -> PlotData:
    """Aggregate in Spark what the plots need; collect only the aggregates."""
    import pyspark.sql.functions as F

    t = analysis.t
    start = analysis.stats.start_ms or 0
    end = analysis.stats.end_ms or 0
    bucket_ms = pick_bucket_ms(end - start)
    bucket = F.floor((F.col("ts_ms") - F.lit(start)) / F.lit(bucket_ms)).cast("long").alias("bucket")
    # One node per client (a client id normally lives on one node; take the first name if not).
    node_of = t.client_nodes.groupBy("client_id").agg(F.min("node").alias("node"))
    intervals = [
        r.asDict()
        for r in t.intervals.join(node_of, "client_id", "left")
        .select("group", "client_id", "node", "topic", "queue", "start", "end")
        .orderBy("start")
        .limit(max_intervals)
        .collect()
    ]
    nemeses = [
        r.asDict()
        for r in analysis.ctl.where(F.col("event") == "nemesis")
        .select("ts_ms", "action", "target")
        .orderBy("ts_ms")
        .limit(2000)
        .collect()
    ]
    consumed = t.consumed.select("group", "client_id", "msg_id", "ts_ms", bucket)
    rates = [
        r.asDict()
        for r in consumed.join(node_of, "client_id", "left")
        .groupBy("group", F.coalesce("node", "client_id").alias("node"), "bucket")
        .agg(F.count("*").alias("n"))
        .collect()
    ]
    # Duplicates per bucket = lines in the bucket minus first deliveries in the bucket (the first
    # delivery of a message is its earliest line), so no per-message sort is needed.
    lines = consumed.groupBy("group", "bucket").agg(F.count("*").alias("lines"))
    firsts = (
        consumed.groupBy("group", "msg_id")
        .agg(F.min("ts_ms").alias("ts_ms"))
        .select("group", bucket)
        .groupBy("group", "bucket")
        .agg(F.count("*").alias("firsts"))
    )
    duplicates = [
        {"group": r["group"], "bucket": r["bucket"], "n": r["lines"] - (r["firsts"] or 0)}
        for r in lines.join(firsts, ["group", "bucket"], "left").collect()
        if r["lines"] - (r["firsts"] or 0) > 0
    ]
    sent = analysis.ev.where(F.col("event") == "message_sent").select("topic", bucket)
    sends = [
        r.asDict()
        for r in sent.join(F.broadcast(t.group_topics), "topic")
        .groupBy("group", "bucket")
        .agg(F.count("*").alias("n"))
        .collect()
    ]
    orderly = {r["group"] for r in analysis.orderly_groups().collect()}
    return PlotData(start, end, bucket_ms, intervals, nemeses, rates, duplicates, sends, orderly)


# -- pictures -----------------------------------------------------------------------------------------


def _png(fig: Any) -> str:
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, bbox_inches="tight")
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def _seconds(data: PlotData) -> Any:
    return lambda ms: (ms - data.run_start) / 1000.0


def group_nodes(data: PlotData, group: str) -> set[str]:
    """Nodes of the group's consumers (from its ownership intervals and consumption lines)."""
    nodes = {r["node"] for r in data.intervals if r["group"] == group and r["node"]}
    return nodes | {r["node"] for r in data.rates if r["group"] == group}


def _mark_nemeses(ax: Any, data: PlotData, group: str) -> None:
    """Vertical dashed lines at the chaos runner's actions on this group's nodes (and on nodes of no
    group, such as brokers), labelled; actions of the same instant share one label."""
    to_x = _seconds(data)
    mine = group_nodes(data, group)
    everyone = {r["node"] for r in data.intervals if r["node"]} | {r["node"] for r in data.rates}
    by_time: dict[int, list[dict[str, Any]]] = {}
    for n in data.nemeses:
        if n["target"] in mine or n["target"] not in everyone:
            by_time.setdefault(n["ts_ms"], []).append(n)
    for ts, actions in sorted(by_time.items()):
        color = ACTION_COLORS.get(actions[0]["action"], "gray")
        x = to_x(ts)
        ax.axvline(x, color=color, linestyle="--", linewidth=1.3)
        text = ", ".join(f"{a['action']} {a['target']}" for a in actions)
        ax.annotate(
            text,
            (x, 0.98),
            xycoords=("data", "axes fraction"),
            rotation=90,
            fontsize=8,
            va="top",
            ha="right",
            color=color,
            bbox={"boxstyle": "round,pad=0.15", "facecolor": "white", "edgecolor": "none", "alpha": 0.85},
        )


def _queue_sort_key(q: tuple[str, str]) -> tuple[Any, ...]:
    broker, _, qid = q[1].rpartition(":")
    return (q[0], broker, int(qid) if qid.isdigit() else qid)


def plot_ownership(data: PlotData, group: str) -> str | None:
    """Gantt chart: one row per queue, one bar per ownership interval, coloured by consumer."""
    import matplotlib.pyplot as plt

    rows = [r for r in data.intervals if r["group"] == group]
    if not rows:
        return None
    queues = sorted({(r["topic"], r["queue"]) for r in rows}, key=_queue_sort_key)
    owners = sorted({r["client_id"] for r in rows})
    label = {
        c: next((f"{r['node']} ({c})" for r in rows if r["client_id"] == c and r["node"]), c) for c in owners
    }
    cmap = plt.get_cmap("tab10" if len(owners) <= 10 else "tab20")
    color = {c: cmap(i % cmap.N) for i, c in enumerate(owners)}
    y = {q: i for i, q in enumerate(queues)}
    many_topics = len({q[0] for q in queues}) > 1
    to_x = _seconds(data)
    fig, ax = plt.subplots(figsize=(12, max(2.8, 0.32 * len(queues) + 1.6)))
    # Each owner of a queue gets its own lane inside the queue's row, so two owners at once show as two
    # parallel bars (overlap) rather than one bar hiding the other.
    lanes: dict[tuple[str, str], list[str]] = {}
    for r in rows:
        owners_of = lanes.setdefault((r["topic"], r["queue"]), [])
        if r["client_id"] not in owners_of:
            owners_of.append(r["client_id"])
    for r in rows:
        queue = (r["topic"], r["queue"])
        n, i = len(lanes[queue]), lanes[queue].index(r["client_id"])
        height = 0.8 / n
        ax.barh(
            y[queue] - 0.4 + (i + 0.5) * height,
            max(to_x(r["end"]) - to_x(r["start"]), 0.0005),
            left=to_x(r["start"]),
            height=height * 0.92,
            color=color[r["client_id"]],
            alpha=0.8,
            edgecolor="black",
            linewidth=0.3,
        )
    ax.set_yticks(range(len(queues)))
    ax.set_yticklabels([f"{t} {q}" if many_topics else q for t, q in queues], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0, max(to_x(data.run_end), 0.001))
    ax.set_xlabel("seconds since the run started")
    ax.set_title(f"{group}: which consumer owned which queue, and when (one lane per owner)")
    _mark_nemeses(ax, data, group)
    handles = [plt.Rectangle((0, 0), 1, 1, color=color[c]) for c in owners]
    ax.legend(handles, [label[c] for c in owners], fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return _png(fig)


def _per_second(n: int, bucket_ms: int) -> float:
    return n * 1000.0 / bucket_ms


def plot_rates(data: PlotData, group: str) -> str | None:
    """Messages processed per second by each consumer node (and sent, for comparison)."""
    import matplotlib.pyplot as plt

    rows = [r for r in data.rates if r["group"] == group]
    if not rows:
        return None
    first = min(r["bucket"] for r in rows)
    last = max(r["bucket"] for r in rows)
    xs = list(range(first, last + 1))
    to_s = [(b * data.bucket_ms) / 1000.0 for b in xs]
    fig, ax = plt.subplots(figsize=(12, 3.6))
    sends = {r["bucket"]: r["n"] for r in data.sends if r["group"] == group}
    if sends:
        ax.plot(to_s, [_per_second(sends.get(b, 0), data.bucket_ms) for b in xs], color="lightgray",
                linewidth=2.5, label="sent (all producers)")  # fmt: skip
    for node in sorted({r["node"] for r in rows}):
        counts = {r["bucket"]: r["n"] for r in rows if r["node"] == node}
        # Buckets without a line are zeros (a paused or dead consumer), not gaps to draw across.
        ax.plot(to_s, [_per_second(counts.get(b, 0), data.bucket_ms) for b in xs], linewidth=1.2, label=node)
    _mark_nemeses(ax, data, group)
    ax.set_xlabel("seconds since the run started")
    ax.set_ylabel("messages / s")
    ax.set_title(f"{group}: consumption rate per consumer (buckets of {data.bucket_ms} ms)")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return _png(fig)


def plot_duplicates(data: PlotData, group: str) -> str | None:
    import matplotlib.pyplot as plt

    rows = sorted((r["bucket"], r["n"]) for r in data.duplicates if r["group"] == group)
    if not rows:
        return None
    fig, ax = plt.subplots(figsize=(12, 2.8))
    width = data.bucket_ms / 1000.0
    ax.bar([b * width for b, _ in rows], [n for _, n in rows], width=width, align="edge", color="crimson")
    ax.set_xlim(0, max((data.run_end - data.run_start) / 1000.0, 0.001))
    _mark_nemeses(ax, data, group)
    ax.set_xlabel("seconds since the run started")
    ax.set_ylabel("duplicate deliveries")
    ax.set_title(f"{group}: duplicate deliveries over time (buckets of {data.bucket_ms} ms)")
    return _png(fig)


def plot_convergence(entries: list[dict[str, Any]], group: str, run_start: int) -> str | None:
    import matplotlib.pyplot as plt

    if not entries:
        return None
    fig, ax = plt.subplots(figsize=(12, max(2.2, 0.36 * len(entries) + 1.2)))
    labels = [f"{(e['change_ms'] - run_start) / 1000:.3f} s  {e['cause']}"[:80] for e in entries]
    values = [e["convergence_ms"] if e["converged"] else 0 for e in entries]
    top = max([*values, 1])
    colors = ["steelblue" if e["converged"] else "crimson" for e in entries]
    ax.barh(range(len(entries)), values, color=colors)
    for i, e in enumerate(entries):
        text = f"{e['convergence_ms']} ms" if e["converged"] else "never whole again before the run ended"
        ax.annotate(text, (values[i], i), xytext=(4, 0), textcoords="offset points", va="center", fontsize=8,
                    color="black" if e["converged"] else "crimson")  # fmt: skip
    ax.set_yticks(range(len(entries)))
    ax.set_yticklabels(labels, fontsize=8)
    ax.set_xlim(0, top * 1.35)
    ax.invert_yaxis()
    ax.set_xlabel("time until the group was whole again (ms)")
    ax.set_title(f"{group}: convergence after each change of membership")
    return _png(fig)


# -- text ---------------------------------------------------------------------------------------------


def _fmt_s(ms: int, run_start: int) -> str:
    return f"{(ms - run_start) / 1000:.3f} s"


def narrative(summary: dict[str, Any], data: PlotData | None) -> list[str]:
    """Plain sentences about the run as a whole."""
    run = summary["run"]
    out = []
    if run["start_ms"] is not None and run["end_ms"] is not None:
        out.append(
            f"The run lasted {(run['end_ms'] - run['start_ms']) / 1000:.3f} s and logged {run['events']} "
            f"events ({run['malformed_lines']} damaged or unreadable lines were skipped)."
        )
    groups = summary["groups"]
    if groups:
        names = ", ".join(sorted(groups))
        out.append(f"{len(groups)} consumer group(s) took part: {names}.")
    else:
        out.append("No consumer group appears in this run.")
    if data is not None and data.nemeses:
        actions = [
            f"{n['action']} {n['target']} at {_fmt_s(n['ts_ms'], data.run_start)}" for n in data.nemeses
        ]
        shown = "; ".join(actions[:20]) + ("; ..." if len(actions) > 20 else "")
        out.append(f"The chaos runner acted {len(actions)} time(s): {shown}.")
    elif data is not None:
        out.append("The chaos runner did nothing to the processes in this run.")
    return out


def group_story(name: str, g: dict[str, Any], run_start: int, orderly: bool) -> list[str]:
    """Plain sentences about one group: what went wrong or right, with the numbers."""
    out = [
        f"{g['consumed_unique']} of the {g['sent']} messages sent to {', '.join(g['topics']) or 'no topic'} "
        f"were consumed; {g['lost']} lost, {g['duplicates']} extra deliveries of {g['duplicated_messages']} "
        "message(s)."
    ]
    if g["orphan_ms"]:
        out.append(f"Queues went without an owner for {g['orphan_ms']} ms in total (summed over queues).")
    if g["overlap_ms"]:
        out.append(f"Queues had two owners at once for {g['overlap_ms']} ms in total.")
    if g["stalled_ms"]:
        out.append(f"Queues were held only by paused consumers for {g['stalled_ms']} ms in total.")
    for e in g["convergence"]:
        when = _fmt_s(e["change_ms"], run_start)
        if e["converged"]:
            out.append(
                f"After '{e['cause']}' at {when} the group was whole again {e['convergence_ms']} ms later."
            )
        else:
            out.append(
                f"After '{e['cause']}' at {when} the group never became whole again before the run ended."
            )
    reasons = []
    if g["lost"]:
        reasons.append(f"{g['lost']} message(s) were lost")
    if orderly:
        out.append(
            "The group consumed in ORDERLY mode, so one consumer at a time per queue and no going back."
        )
    if orderly and g["concurrent_consume_ms"]:
        reasons.append(f"two consumers processed one queue at once for {g['concurrent_consume_ms']} ms")
    if orderly and g["order_violations"]:
        reasons.append(f"{g['order_violations']} orderly deliveries went backwards")
    never = [e for e in g["convergence"] if not e["converged"]]
    if never:
        reasons.append(f"{len(never)} change(s) were never recovered from")
    if g["verdict"] == "fail":
        out.append("Verdict FAIL: " + ("; ".join(reasons) if reasons else "see the rules below") + ".")
    else:
        out.append(
            "Verdict OK: nothing was lost, order held where it had to, and every change was recovered from."
        )
    return out


def render_html(summary: dict[str, Any], data: PlotData | None, title: str) -> str:
    run = summary["run"]
    run_start = run["start_ms"] or 0
    esc = html.escape
    parts = [
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>",
        f"<title>{esc(title)}</title>",
        "<style>body{font-family:sans-serif;max-width:1250px;margin:2em auto;color:#222;line-height:1.45}"
        "table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #ccc;padding:3px 8px;"
        "text-align:left;vertical-align:top}.ok{color:#060;font-weight:bold}"
        ".fail{color:#b00;font-weight:bold}img{max-width:100%;border:1px solid #eee}small{color:#555}"
        ".num{text-align:right}</style></head><body>",
        f"<h1>{esc(title)}</h1>",
    ]
    overall = "fail" if any(g["verdict"] == "fail" for g in summary["groups"].values()) else "ok"
    parts.append(f"<p>Overall verdict: <span class='{overall}'>{overall.upper()}</span></p>")
    parts.append("<h2>What happened</h2><ul>")
    parts += [f"<li>{esc(s)}</li>" for s in narrative(summary, data)]
    parts.append("</ul>")
    if summary["groups"]:
        parts.append("<h2>Metrics</h2><table><tr><th>metric</th>")
        parts += [f"<th>{esc(g)}</th>" for g in summary["groups"]]
        parts.append("<th>what it means</th></tr>")
        for key, meaning in METRICS.items():
            parts.append(f"<tr><td>{key}</td>")
            parts += [f"<td class='num'>{g[key]}</td>" for g in summary["groups"].values()]
            parts.append(f"<td><small>{esc(meaning)}</small></td></tr>")
        parts.append("<tr><td>verdict</td>")
        parts += [
            f"<td class='{g['verdict']}'>{g['verdict'].upper()}</td>" for g in summary["groups"].values()
        ]
        parts.append(f"<td><small>{esc(VERDICT_RULES)}</small></td></tr></table>")
    for name, g in summary["groups"].items():
        parts.append(
            f"<h2>Group {esc(name)}: <span class='{g['verdict']}'>{g['verdict'].upper()}</span></h2><ul>"
        )
        orderly = data is not None and name in data.orderly
        parts += [f"<li>{esc(s)}</li>" for s in group_story(name, g, run_start, orderly)]
        parts.append("</ul>")
        images: list[tuple[str, str | None, str]] = []
        if data is not None:
            images += [
                ("Queue ownership", plot_ownership(data, name),
                 "Each row is a queue; each bar is the time one consumer owned it (colour = consumer). "
                 "Dashed lines are the chaos runner's actions. A gap in a row is a queue nobody served "
                 "(orphan time); two bars over the same instant are two owners (overlap). After a kill, "
                 "the victim's bars stop and, once the others notice and rebalance, other colours take "
                 "over."),
                ("Consumption rate", plot_rates(data, name),
                 "Messages each consumer node finished per second; the grey line is what the producers "
                 "sent. A consumer that stops at a kill or pause drops to zero; the others speed up to drain "
                 "the backlog once they take over its queues."),
                ("Duplicates", plot_duplicates(data, name),
                 "Deliveries of a message after its first one, by when they happened. They cluster after "
                 "a kill: the new owner resumes from the last committed offset."),
            ]  # fmt: skip
        images.append(
            ("Convergence", plot_convergence(g["convergence"], name, run_start),
             "For each start, stop or kill in the group: how long until every queue had exactly one live "
             "owner and every running consumer had rebalanced with the current member list. Red: never.")
        )  # fmt: skip
        for caption, png, explanation in images:
            if png:
                parts.append(f"<h3>{esc(caption)}</h3><p><small>{esc(explanation)}</small></p>")
                parts.append(f"<img alt='{esc(caption)}' src='data:image/png;base64,{png}'>")
        parts.append("<details><summary>convergence entries (summary.json)</summary><pre>")
        parts.append(esc(json.dumps(g["convergence"], indent=1)))
        parts.append("</pre></details>")
    parts.append(f"<h2>How the verdict is decided</h2><p>{esc(VERDICT_RULES)}</p>")
    parts.append(
        "<p><small>Times are milliseconds of the processes' clocks; intervals include their start and "
        "exclude their end. Definitions: the project's event-log contract (EVENTS.md).</small></p>"
    )
    parts.append("</body></html>")
    return "".join(parts)


def write_report(
    path: str | os.PathLike[str], summary: dict[str, Any], data: PlotData | None, title: str
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(render_html(summary, data, title))
