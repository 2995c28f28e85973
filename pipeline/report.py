"""report.html: the run's metrics and pictures, self-contained (PNG images inline as base64).

The plot data are small aggregates computed in Spark (ownership intervals, per-second counts); only
those are collected to the driver.
"""

from __future__ import annotations

import base64
import html
import io
import json
import os
from dataclasses import dataclass, field
from typing import Any

from pipeline.ingest import ORDER_COLUMNS

EXPLAIN = {
    "sent": "distinct messages the producers had acknowledged on the group's topics",
    "consumed_unique": "distinct messages the group's listeners returned success for",
    "lost": "sent but never consumed by the group",
    "duplicates": "extra deliveries: consumption lines beyond the first for each message",
    "duplicated_messages": "messages consumed two or more times",
    "overlap_ms": "time during which a queue was owned by two or more clients at once (summed over queues)",
    "orphan_ms": "time during which a queue of the group had no owner at all, from the group's first queue",
    "stalled_ms": "time during which every owner of a queue was paused (SIGSTOP)",
    "concurrent_consume_ms": "time during which two clients were inside the listener for the same queue",
    "order_violations": "orderly deliveries that went backwards within one ownership",
}


@dataclass
class PlotData:
    """Everything the report draws, already small (collected rows)."""

    run_start: int
    run_end: int
    intervals: list[dict[str, Any]] = field(
        default_factory=list
    )  # group, client_id, node, topic, queue, start, end
    nemeses: list[dict[str, Any]] = field(default_factory=list)  # ts_ms, action, target
    rates: list[dict[str, Any]] = field(default_factory=list)  # group, node, second, count
    duplicates: list[dict[str, Any]] = field(default_factory=list)  # group, second, count


def collect_plot_data(analysis: Any, bucket_ms: int = 1000) -> PlotData:
    """Aggregate in Spark what the plots need; collect only the aggregates."""
    import pyspark.sql.functions as F
    from pyspark.sql.window import Window

    t = analysis.t
    start = analysis.stats.start_ms or 0
    end = analysis.stats.end_ms or 0
    iv = t.intervals.join(t.client_nodes, "client_id", "left")
    intervals = [
        r.asDict()
        for r in iv.select("group", "client_id", "node", "topic", "queue", "start", "end").collect()
    ]
    nemeses = [
        r.asDict()
        for r in analysis.ctl.where(F.col("event") == "nemesis")
        .select("ts_ms", "action", "target")
        .orderBy("ts_ms")
        .collect()
    ]
    consumed = t.consumed.join(t.client_nodes, "client_id", "left")
    sec = F.floor((F.col("ts_ms") - F.lit(start)) / F.lit(bucket_ms)).cast("long").alias("second")
    rates = [
        r.asDict()
        for r in consumed.groupBy("group", F.coalesce("node", "client_id").alias("node"), sec)
        .count()
        .collect()
    ]
    order = Window.partitionBy("group", "msg_id").orderBy(*ORDER_COLUMNS)
    dups = (
        t.consumed.withColumn("n", F.row_number().over(order))
        .where(F.col("n") > 1)
        .groupBy("group", sec)
        .count()
    )
    duplicates = [r.asDict() for r in dups.collect()]
    return PlotData(start, end, intervals, nemeses, rates, duplicates)


def _png(fig: Any) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    import matplotlib.pyplot as plt

    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def _mark_nemeses(ax: Any, data: PlotData, to_x: Any) -> None:
    colors = {"kill": "red", "stop": "darkorange", "start": "green", "pause": "purple", "resume": "teal"}
    for n in data.nemeses:
        x = to_x(n["ts_ms"])
        ax.axvline(x, color=colors.get(n["action"], "gray"), linestyle="--", linewidth=1)
        ax.annotate(
            f"{n['action']} {n['target']}",
            (x, 1.0),
            xycoords=("data", "axes fraction"),
            rotation=90,
            fontsize=7,
            va="top",
            ha="right",
            color=colors.get(n["action"], "gray"),
        )


def plot_ownership(data: PlotData, group: str) -> str | None:
    import matplotlib.pyplot as plt

    rows = [r for r in data.intervals if r["group"] == group]
    if not rows:
        return None
    queues = sorted(
        {(r["topic"], r["queue"]) for r in rows},
        key=lambda q: (q[0], q[1].split(":")[0], int(q[1].split(":")[1])),
    )
    owners = sorted({r["node"] or r["client_id"] for r in rows})
    cmap = plt.get_cmap("tab10" if len(owners) <= 10 else "tab20")
    color = {o: cmap(i % cmap.N) for i, o in enumerate(owners)}
    y = {q: i for i, q in enumerate(queues)}
    to_x = lambda ms: (ms - data.run_start) / 1000.0  # noqa: E731
    fig, ax = plt.subplots(figsize=(11, max(2.5, 0.28 * len(queues) + 1.2)))
    for r in rows:
        end = min(r["end"], data.run_end)
        owner = r["node"] or r["client_id"]
        ax.barh(
            y[(r["topic"], r["queue"])],
            to_x(end) - to_x(r["start"]),
            left=to_x(r["start"]),
            height=0.8,
            color=color[owner],
            alpha=0.75,
            edgecolor="black",
            linewidth=0.3,
        )
    ax.set_yticks(range(len(queues)))
    ax.set_yticklabels([f"{t} {q}" if len({x[0] for x in queues}) > 1 else q for t, q in queues], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("seconds since the run started")
    ax.set_title(f"{group}: who owned which queue when (overlapping bars = two owners)")
    _mark_nemeses(ax, data, to_x)
    handles = [plt.Rectangle((0, 0), 1, 1, color=color[o]) for o in owners]
    ax.legend(handles, owners, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return _png(fig)


def plot_rates(data: PlotData, group: str) -> str | None:
    import matplotlib.pyplot as plt

    rows = [r for r in data.rates if r["group"] == group]
    if not rows:
        return None
    fig, ax = plt.subplots(figsize=(11, 3.2))
    last = max(r["second"] for r in rows)
    for node in sorted({r["node"] for r in rows}):
        counts = {r["second"]: r["count"] for r in rows if r["node"] == node}
        # Seconds without a line are zeros (a paused or dead consumer), not gaps to draw across.
        xs = list(range(min(counts), last + 1))
        ax.plot(xs, [counts.get(x, 0) for x in xs], marker=".", markersize=3, linewidth=1, label=node)
    _mark_nemeses(ax, data, lambda ms: (ms - data.run_start) / 1000.0)
    ax.set_xlabel("seconds since the run started")
    ax.set_ylabel("messages consumed / s")
    ax.set_title(f"{group}: consumption rate per consumer")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return _png(fig)


def plot_duplicates(data: PlotData, group: str) -> str | None:
    import matplotlib.pyplot as plt

    rows = sorted((r["second"], r["count"]) for r in data.duplicates if r["group"] == group)
    if not rows:
        return None
    fig, ax = plt.subplots(figsize=(11, 2.6))
    ax.bar([r[0] for r in rows], [r[1] for r in rows], width=0.9, color="crimson")
    _mark_nemeses(ax, data, lambda ms: (ms - data.run_start) / 1000.0)
    ax.set_xlabel("seconds since the run started")
    ax.set_ylabel("duplicate deliveries")
    ax.set_title(f"{group}: duplicate deliveries over time")
    return _png(fig)


def plot_convergence(entries: list[dict[str, Any]], group: str, run_start: int) -> str | None:
    import matplotlib.pyplot as plt

    if not entries:
        return None
    fig, ax = plt.subplots(figsize=(11, max(2.2, 0.3 * len(entries) + 1)))
    labels = [f"{(e['change_ms'] - run_start) / 1000:.1f}s {e['cause']}"[:70] for e in entries]
    values = [e["convergence_ms"] if e["converged"] else 0 for e in entries]
    colors = ["steelblue" if e["converged"] else "crimson" for e in entries]
    ax.barh(range(len(entries)), values, color=colors)
    for i, e in enumerate(entries):
        ax.annotate(
            "never converged" if not e["converged"] else f"{e['convergence_ms']} ms",
            (values[i], i),
            xytext=(3, 0),
            textcoords="offset points",
            va="center",
            fontsize=7,
        )
    ax.set_yticks(range(len(entries)))
    ax.set_yticklabels(labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("time until the group was whole again (ms)")
    ax.set_title(f"{group}: convergence after each change of membership")
    return _png(fig)


def render_html(summary: dict[str, Any], data: PlotData | None, title: str) -> str:
    run = summary["run"]
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        f"<title>{html.escape(title)}</title>",
        "<style>body{font-family:sans-serif;max-width:1200px;margin:2em auto;color:#222}"
        "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:3px 8px;text-align:left}"
        ".ok{color:#060;font-weight:bold}.fail{color:#b00;font-weight:bold}img{max-width:100%}"
        "small{color:#666}</style></head><body>",
        f"<h1>{html.escape(title)}</h1>",
        f"<p>{run['events']} events, {run['malformed_lines']} malformed lines skipped; "
        f"{((run['end_ms'] or 0) - (run['start_ms'] or 0)) / 1000:.1f} s of run time.</p>",
    ]
    for group, g in summary["groups"].items():
        verdict = g["verdict"]
        parts.append(f"<h2>Group {html.escape(group)}: <span class='{verdict}'>{verdict.upper()}</span></h2>")
        parts.append(f"<p>Topics: {html.escape(', '.join(g['topics']))}.</p>")
        parts.append("<table><tr><th>metric</th><th>value</th><th>what it means</th></tr>")
        for k, why in EXPLAIN.items():
            parts.append(f"<tr><td>{k}</td><td>{g[k]}</td><td><small>{html.escape(why)}</small></td></tr>")
        parts.append("</table>")
        reasons = []
        if g["lost"]:
            reasons.append(f"{g['lost']} message(s) lost")
        if g["concurrent_consume_ms"] or g["order_violations"]:
            reasons.append("orderly rules broken (if the group is orderly)")
        bad = [c for c in g["convergence"] if not c["converged"]]
        if bad:
            reasons.append(f"{len(bad)} change point(s) never converged")
        parts.append(
            "<p>The verdict fails when messages are lost, when an orderly group consumed a queue in two "
            "clients at once or out of order, or when the group never became whole again after a change. "
            + (f"Here: {html.escape('; '.join(reasons))}." if verdict == "fail" else "None of that happened.")
            + "</p>"
        )
        images = []
        if data is not None:
            images = [
                (
                    "Queue ownership",
                    plot_ownership(data, group),
                    "Each row is a queue, each bar a client's ownership interval; dashed lines are the "
                    "nemesis actions. A gap is a queue nobody served (orphan time), two bars at once "
                    "are overlap.",
                ),
                ("Consumption rate", plot_rates(data, group), "Messages each consumer finished per second."),
                (
                    "Duplicates",
                    plot_duplicates(data, group),
                    "Deliveries of a message after its first, by the second they happened in.",
                ),
            ]
        images.append(
            (
                "Convergence",
                plot_convergence(g["convergence"], group, run["start_ms"] or 0),
                "For each start, stop or kill: how long until every queue had exactly one live owner "
                "and every live consumer had rebalanced with the right member list.",
            )
        )
        for name, png, caption in images:
            if png:
                parts.append(f"<h3>{name}</h3><p><small>{html.escape(caption)}</small></p>")
                parts.append(f"<img alt='{name}' src='data:image/png;base64,{png}'>")
        parts.append("<details><summary>convergence entries</summary><pre>")
        parts.append(html.escape(json.dumps(g["convergence"], indent=1)))
        parts.append("</pre></details>")
    parts.append("</body></html>")
    return "".join(parts)


def write_report(
    path: str | os.PathLike[str], summary: dict[str, Any], data: PlotData | None, title: str
) -> None:
    os.environ.setdefault("MPLBACKEND", "Agg")
    import matplotlib

    matplotlib.use("Agg")
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(render_html(summary, data, title))
