"""The offset regressions in the report: the figure (a row each, dots past MANY_MARKERS), the story's
sentence by the change they followed, and the answer's words for the change."""

from __future__ import annotations

import base64
import html
import struct
from typing import Any

from rmqlab.pipeline import report_plots
from rmqlab.pipeline.report_data import Marker, PlotData, regression_text, regressions_after
from rmqlab.pipeline.report_page import render_html
from rmqlab.pipeline.report_story import answer_for_group, group_story
from rmqlab.pipeline.unavailability import RunClock

END = 60_000
CLOCK = RunClock(0, 1.0)
KILL = Marker(20_000, "kill broker-a", "k", "nemesis")
START = Marker(30_000, "start broker-a", "s", "nemesis")


def png_height(b64: str) -> int:
    raw = base64.b64decode(b64[:64])
    return struct.unpack(">II", raw[16:24])[1]


def regression(ts: int, queue: str, old: int, new: int, again: int, event: str = "offset_committed") -> dict:
    node = queue.split(":")[0] if event == "offset_committed" else "consumer-2"
    return {"change_ms": ts, "topic": "T", "queue": queue, "from": old, "to": new, "event": event,
            "node": node, "redelivered": again}  # fmt: skip


ENTRIES = [
    regression(5_000, "broker-b:0", 9, 8, 0),
    regression(31_000, "broker-a:0", 40, 25, 15, "mq_added"),
    regression(31_000, "broker-a:1", 38, 30, 6, "mq_added"),
    regression(32_000, "broker-a:1", 41, 40, 1),
]


def group(entries: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "topics": ["T"], "sent": 100, "consumed_unique": 100, "lost": 0, "duplicates": 22,
        "duplicated_messages": 22, "overlap_ms": 0, "orphan_ms": 0, "stalled_ms": 0,
        "concurrent_consume_ms": 0, "order_violations": 0, "verdict": "ok", "mode": "client",
        "convergence": [], "offset_regressions": entries,
        "regression_redelivered": sum(e["redelivered"] for e in entries),
    }  # fmt: skip


def test_regressions_go_to_the_latest_change_at_or_before_them() -> None:
    by = regressions_after(ENTRIES, [KILL, START])
    assert [(m.text if m else None, [e["queue"] for e in es]) for m, es in by] == [
        (None, ["broker-b:0"]),
        ("start broker-a", ["broker-a:0", "broker-a:1", "broker-a:1"]),
    ]
    assert regression_text(ENTRIES[1:]) == (
        "the committed offset of 2 queues moved back 3 times (by up to 15 offsets) and 22 deliveries of "
        "those offsets came again"
    )
    assert regression_text(ENTRIES[:1]).endswith(
        "moved back (by up to 1 offset) and nothing was delivered again because of it"
    )


def test_the_story_tells_them_by_change_and_names_the_costliest() -> None:
    story = group_story("G", group(ENTRIES), CLOCK, False, [], [KILL, START])
    (said,) = [s for s in story if s.startswith("Committed offsets")]
    assert "before any change the committed offset of 1 queue moved back" in said
    assert "after start broker-a (t = 30.0 s)" in said
    assert said.endswith(
        "The costliest: broker-a:0 of T from 40 back to 25 at t = 31.0 s (a new owner read it, consumer-2), "
        "15 deliveries again."
    )
    assert not [s for s in group_story("G", group([]), CLOCK, False) if s.startswith("Committed")]


def test_the_answer_gives_a_change_the_regressions_up_to_the_next_change() -> None:
    said = answer_for_group("G", group(ENTRIES), CLOCK, [KILL, START], [])
    # the start is no change of the answer: what followed the restart belongs to the kill
    assert len(said) == 1 and said[0].startswith("G: after 'kill broker-a' at t = 20.0 s")
    assert said[0].endswith(
        "; the committed offset of 2 queues moved back 3 times (by up to 15 offsets) and 22 deliveries of "
        "those offsets came again."
    )


def test_the_page_draws_a_row_each_and_dots_past_many() -> None:
    data = PlotData(0, END, 1000, clock=CLOCK)
    data.nemeses = [{"ts_ms": KILL.ts, "action": "kill", "target": "broker-a"}]
    summary = {
        "run": {
            "events": 1,
            "malformed_lines": 0,
            "start_ms": 0,
            "end_ms": END,
            "t0_ms": 0,
            "time_scale": 1.0,
        },
        "groups": {"G": group(ENTRIES)},
    }
    page = render_html(summary, data, "Run x")
    assert "<h3>Offset regressions</h3>" in page and html.escape(report_plots.REGRESSIONS_TEXT) in page
    assert "offset regressions (summary.json)" in page
    quiet = render_html({**summary, "groups": {"G": group([])}}, data, "Run x")
    assert "<h3>Offset regressions</h3>" not in quiet
    few = report_plots.plot_offset_regressions(ENTRIES, data, "G", [KILL])
    many_entries = [regression(100 * i, f"broker-a:{i % 4}", 10 + i, i, i % 3) for i in range(100)]
    many = report_plots.plot_offset_regressions(many_entries, data, "G", [KILL])
    assert few and many and png_height(many) <= 450
    assert report_plots.regressions_text(many_entries) == report_plots.REGRESSIONS_DOTS_TEXT
    assert report_plots.plot_offset_regressions([], data, "G", []) is None


def test_the_page_counts_a_slaves_offsets_moving_back_when_there_are_any() -> None:
    data = PlotData(0, END, 1000, clock=CLOCK)
    run = {"events": 1, "malformed_lines": 0, "start_ms": 0, "end_ms": END, "t0_ms": 0, "time_scale": 1.0}
    synced = [
        {
            "change_ms": 25_000,
            "topic": "T",
            "queue": f"broker-a:{q}",
            "from": 215,
            "to": 130,
            "node": "broker-a-s1",
        }
        for q in range(3)
    ]
    page = render_html(
        {"run": run, "groups": {"G": {**group([]), "slave_offset_regressions": synced}}}, data, "x"
    )
    assert "<tr><td>slave_offset_regressions</td><td class='num'>3</td>" in page
    assert "slave offset regressions (summary.json)" in page and "broker-a-s1" in page
    quiet = render_html(
        {"run": run, "groups": {"G": {**group([]), "slave_offset_regressions": []}}}, data, "x"
    )
    assert "slave_offset_regressions" not in quiet
