"""report.html: what happened in a run, for someone who was not there. One self-contained page: the
metrics with a plain explanation, the verdict and why, the written account (`report_story`) and the
pictures (`report_plots`, PNG, inline base64). The page imports the plots and the story; neither
imports the page.
"""

from __future__ import annotations

import html
import json
import os
from typing import Any

from rmqlab.pipeline.report_data import PlotData, clock_of, duplicates_after, group_markers
from rmqlab.pipeline.report_plots import (
    DUPLICATES_TEXT,
    MANY_MARKERS,
    convergence_text,
    ownership_text,
    plot_convergence,
    plot_duplicates,
    plot_offset_regressions,
    plot_ownership,
    plot_rates,
    rate_text,
    regressions_text,
)
from rmqlab.pipeline.report_story import answers, group_story, narrative, rmq_s, time_text
from rmqlab.pipeline.unavailability import CAUSE_TEXT, RunClock

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
    "idle_member_ms": "Time during which a live consumer owned no queue of a topic that had at least as "
    "many queues as the group had live consumers (summed over consumers and topics): the members' "
    "allocations disagree, or one has not rebalanced yet.",
    "stalled_ms": "Time during which a queue was owned only by paused (frozen) consumers, summed over "
    "queues: owned on paper but nobody working on it.",
    "concurrent_consume_ms": "Time during which two different consumers were processing messages of "
    "the same queue at the same moment. Forbidden for an orderly group.",
    "order_violations": "Orderly deliveries that went backwards (an offset not above an earlier one) "
    "within one consumer's ownership of a queue.",
}

REGRESSIONS_METRIC = (
    "Times a queue's committed offset moved backwards (a broker stored an older offset, or a new owner "
    "resumed below the last one), and under it the deliveries of the offsets in between that came again "
    "after it (regression_redelivered): duplicates the offset bookkeeping explains."
)

SLAVE_REGRESSIONS_METRIC = (
    "Times a slave's sync put its master's older offset of a queue over its own (apache/rocketmq#1094): "
    "the offsets consumers committed to the slave while the master was down, lost to the master's."
)

UNAVAILABLE_TEXT = (
    "Time during which messages waited on a queue (one had waited more than 3 s of RocketMQ time) and "
    "nobody consumed it, summed over queues, by cause: no owner; allocated but not taken (an orderly "
    "consumer waiting for the broker's lock); owner paused; owner running but consuming nothing."
)

VERDICT_RULES = (
    "The verdict is FAIL when a message was lost, when an orderly group (one that consumed in ORDERLY "
    "mode) had two consumers in the same queue at once or delivered out of order, or when after a "
    "change of membership (a consumer starting, stopping or being killed) the group never became whole "
    "again before the run ended. Whole means: every queue has exactly one owner, that owner is alive, and "
    "every running consumer has rebalanced with the current member list. Otherwise the verdict is OK."
)


MODE_TEXT = {
    "client": "client-side balancing (4.x)",
    "server-pull": "broker assigns queues, PULL (5.x)",
    "server-pop": "broker assigns, POP (5.x)",
}
MODES_TEXT = (
    "Each group's messages, whatever balances it. Longest wait: from a message's send to the group's "
    "first consumption of it (to the run's end when never consumed). Time to drain: from the last send "
    "until every sent message had been consumed (- when one was lost). Revived: messages the broker made "
    "visible again after their invisible time (POP only); longest revived wait: from such a message's "
    "first pop to its first consumption. Idle consumers: live consumers left without a queue for some "
    "time. Times in RocketMQ seconds. The verdict of a group whose queues the broker assigns comes from "
    "its messages (lost, order); its convergence is shown but not judged."
)


def modes_table(summary: dict[str, Any], clock: RunClock) -> list[str]:
    """The groups side by side, classic and RocketMQ 5 (EVENTS.md, proposed section): HTML parts, none
    when the summary has no `pop` figures."""
    groups = {n: g for n, g in summary["groups"].items() if g.get("pop") is not None}
    if not groups:
        return []
    esc = html.escape

    def secs(ms: int | None) -> str:
        return "-" if ms is None else f"{clock.rmq_ms(ms) / 1000:.1f}"

    head = (
        "group", "mode", "sent", "lost", "duplicates", "longest wait (s)", "time to drain (s)", "revived",
        "longest revived wait (s)", "invisible-time changes", "idle consumers", "verdict",
    )  # fmt: skip
    parts = [
        "<h2>Client-side balancing and POP side by side</h2>",
        f"<p><small>{esc(MODES_TEXT)}</small></p>",
    ]
    parts.append("<table><tr>" + "".join(f"<th>{h}</th>" for h in head) + "</tr>")
    for name, g in groups.items():
        pop, mode = g["pop"], g.get("mode", "client")
        revived = pop["revived"] if mode == "server-pop" else "-"
        cells = [
            f"<td>{esc(name)}</td>",
            f"<td title='{esc(MODE_TEXT.get(mode, mode))}'>{esc(mode)}</td>",
            *(f"<td class='num'>{v}</td>" for v in (g["sent"], g["lost"], g["duplicates"])),
            f"<td class='num'>{secs(pop['longest_wait_ms'])}</td>",
            f"<td class='num'>{secs(pop['time_to_drain_ms'])}</td>",
            f"<td class='num'>{revived}</td>",
            f"<td class='num'>{secs(pop['longest_revived_wait_ms']) if mode == 'server-pop' else '-'}</td>",
            f"<td class='num'>{pop['invisible_time_changes'] if mode == 'server-pop' else '-'}</td>",
            f"<td class='num'>{pop['idle_consumers']}</td>",
            f"<td class='{g['verdict']}'>{g['verdict'].upper()}</td>",
        ]
        parts.append("<tr>" + "".join(cells) + "</tr>")
    parts.append("</table>")
    return parts


# What the milliseconds beside RocketMQ time are, by the run's clock (RunClock.kind)
SOURCE_MS = {
    "wall": "wall-clock milliseconds of the processes",
    "simulated": "simulated milliseconds (a simulated run has no wall time)",
}


def render_html(
    summary: dict[str, Any], data: PlotData | None, title: str, question: str | None = None
) -> str:
    clock = clock_of(data, summary)
    esc = html.escape
    parts = [
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>",
        "<meta name='viewport' content='width=device-width, initial-scale=1'>",
        f"<title>{esc(title)}</title>",
        "<style>body{font-family:sans-serif;max-width:900px;margin:1.5em auto;padding:0 1em;color:#222;"
        "line-height:1.45}table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #ccc;"
        "padding:3px 8px;text-align:left;vertical-align:top}.ok{color:#060;font-weight:bold}"
        ".fail{color:#b00;font-weight:bold}img{width:100%;max-width:880px;border:1px solid #eee}"
        "small{color:#555}.num{text-align:right}.answer{background:#f3f6fb;border-left:4px solid #1f77b4;"
        "padding:.4em .9em}ol.marks{font-size:.92em}</style></head><body>",
        f"<h1>{esc(title)}</h1>",
    ]
    said = summary.get("answer") or answers(summary, data)
    if question or said:
        parts.append("<div class='answer'>")
        if question:
            parts.append(f"<p><b>Question:</b> {esc(question)}</p>")
        if said:
            parts.append("<p><b>Answer:</b> " + " ".join(esc(s) for s in said) + "</p>")
        parts.append("</div>")
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
            for g in summary["groups"].values():
                rmq = (g.get("rocketmq_time") or {}).get(key)
                # .get: a summary.json written before idle_member_ms lacks it
                cell = (
                    f"{g.get(key, '-')}"
                    if rmq is None
                    else f"{rmq_s(rmq)} RocketMQ<br><small>{g[key]} ms {clock.kind}</small>"
                )
                parts.append(f"<td class='num'>{cell}</td>")
            parts.append(f"<td><small>{esc(meaning)}</small></td></tr>")
        parts.append("<tr><td>offset_regressions</td>")
        for g in summary["groups"].values():
            regs, again = g.get("offset_regressions") or [], g.get("regression_redelivered", 0)
            parts.append(f"<td class='num'>{len(regs)}<br><small>{again} again</small></td>")
        parts.append(f"<td><small>{esc(REGRESSIONS_METRIC)}</small></td></tr>")
        if any(g.get("slave_offset_regressions") for g in summary["groups"].values()):
            parts.append("<tr><td>slave_offset_regressions</td>")
            for g in summary["groups"].values():
                parts.append(f"<td class='num'>{len(g.get('slave_offset_regressions') or [])}</td>")
            parts.append(f"<td><small>{esc(SLAVE_REGRESSIONS_METRIC)}</small></td></tr>")
        parts.append("<tr><td>unavailable</td>")
        for g in summary["groups"].values():
            un = g.get("unavailability") or {}
            causes = "<br>".join(
                f"<small>{esc(CAUSE_TEXT[c])}: {rmq_s(v)}</small>"
                for c, v in (un.get("by_cause_rocketmq_ms") or {}).items()
                if v
            )
            parts.append(f"<td class='num'>{rmq_s(un.get('total_rocketmq_ms'))} RocketMQ<br>{causes}</td>")
        parts.append(f"<td><small>{esc(UNAVAILABLE_TEXT)}</small></td></tr>")
        parts.append("<tr><td>verdict</td>")
        parts += [
            f"<td class='{g['verdict']}'>{g['verdict'].upper()}</td>" for g in summary["groups"].values()
        ]
        parts.append(f"<td><small>{esc(VERDICT_RULES)}</small></td></tr></table>")
    parts += modes_table(summary, clock)
    for name, g in summary["groups"].items():
        parts.append(
            f"<h2>Group {esc(name)}: <span class='{g['verdict']}'>{g['verdict'].upper()}</span></h2><ul>"
        )
        orderly = data is not None and name in data.orderly
        markers = group_markers(data, name, g) if data is not None else []
        dups = duplicates_after(data, name, markers) if data is not None else []
        parts += [f"<li>{esc(s)}</li>" for s in group_story(name, g, clock, orderly, dups, markers)]
        parts.append("</ul>")
        images: list[tuple[str, str | None, str]] = []
        if data is not None:
            images += [
                (
                    "Queue ownership",
                    plot_ownership(data, name, markers, g),
                    ownership_text(data, name, len(markers)),
                ),
                (
                    "Consumption rate",
                    plot_rates(data, name, markers),
                    rate_text(data, name),
                ),
                (
                    "Duplicates",
                    plot_duplicates(data, name, markers),
                    DUPLICATES_TEXT,
                ),
                (
                    "Offset regressions",
                    plot_offset_regressions(g.get("offset_regressions") or [], data, name, markers),
                    regressions_text(g.get("offset_regressions") or []),
                ),
            ]
        images.append(
            (
                "Convergence",
                plot_convergence(g["convergence"], name, clock),
                convergence_text(g["convergence"]),
            )
        )
        for caption, png, explanation in images:
            if png:
                parts.append(f"<h3>{esc(caption)}</h3><p><small>{esc(explanation)}</small></p>")
                parts.append(f"<img alt='{esc(caption)}' src='data:image/png;base64,{png}'>")
                if caption == "Queue ownership" and markers:
                    many = len(markers) > MANY_MARKERS
                    if many:  # drawn as ticks, not numbered: the list is there on demand
                        parts.append(
                            f"<details><summary>the {len(markers):,} chaos actions and broker changes the "
                            "ticks above the charts mark</summary>"
                        )
                    parts.append("<ol class='marks'>")
                    parts += [f"<li>{esc(m.text)} at {esc(time_text(m.ts, clock))}</li>" for m in markers]
                    parts.append("</ol>")
                    if many:
                        parts.append("</details>")
        parts.append("<details><summary>convergence entries (summary.json)</summary><pre>")
        parts.append(esc(json.dumps(g["convergence"], indent=1)))
        parts.append("</pre></details>")
        if g.get("offset_regressions"):
            parts.append("<details><summary>offset regressions (summary.json)</summary><pre>")
            parts.append(esc(json.dumps(g["offset_regressions"], indent=1)))
            parts.append("</pre></details>")
        if g.get("slave_offset_regressions"):
            parts.append("<details><summary>slave offset regressions (summary.json)</summary><pre>")
            parts.append(esc(json.dumps(g["slave_offset_regressions"], indent=1)))
            parts.append("</pre></details>")
    parts.append(f"<h2>How the verdict is decided</h2><p>{esc(VERDICT_RULES)}</p>")
    parts.append(
        f"<p><small>Durations are RocketMQ time ({clock.kind} milliseconds divided by the run's time scale) "
        f"with the {SOURCE_MS[clock.kind]} beside them; intervals include their start and exclude "
        "their end. Definitions: the project's event-log contract (EVENTS.md).</small></p>"
    )
    parts.append("</body></html>")
    return "".join(parts)


def write_report(
    path: str | os.PathLike[str],
    summary: dict[str, Any],
    data: PlotData | None,
    title: str,
    question: str | None = None,
) -> None:
    """Write the run's report.html. The pictures are drawn on figures of their own (matplotlib's
    object API), so the caller's backend and pyplot's open figures are left as they were."""
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(render_html(summary, data, title, question))
