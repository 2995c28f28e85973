"""report.html of a large group (many consumers, many queues, many changes), built synthetically: the
ownership chart becomes a health map of bounded size, a many-action change is told in short, and the
answer gives equal outcomes one sentence."""

from __future__ import annotations

import base64
import re
import struct
from typing import Any

import pytest

from rmqlab.pipeline import report_plots, report_story
from rmqlab.pipeline.report_data import Marker, PlotData, group_markers, short_cause
from rmqlab.pipeline.report_page import render_html
from rmqlab.pipeline.report_plots import (
    MAP_STATES,
    OWNERSHIP_TEXT,
    health_map,
    ownership_text,
    plot_ownership,
)
from rmqlab.pipeline.report_story import answer_for_group, group_story
from rmqlab.pipeline.unavailability import RunClock

END = 600_000  # a ten-minute run, t = 0 at 0 ms, time scale 1
CLOCK = RunClock(0, 1.0)
STATE = {key: i for i, (key, _, _) in enumerate(MAP_STATES)}


def png_size(b64: str) -> tuple[int, int]:
    """(width, height) from the PNG's IHDR chunk."""
    raw = base64.b64decode(b64[:64])
    assert raw[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", raw[16:24])


def large_group(queues: int, consumers: int, kills: int = 0) -> PlotData:
    """`queues` queues of topic T on two brokers dealt round to `consumers` consumers from t = 0; every
    30 s from t = 30 s one consumer is killed and its queues go to the next one 5 ms later."""
    names = [f"consumer-{i}" for i in range(1, consumers + 1)]
    data = PlotData(0, END, 4000, clock=CLOCK)
    owner = {q: names[q % consumers] for q in range(queues)}
    since = dict.fromkeys(range(queues), 0)

    def interval(q: int, client: str, start: int, end: int) -> None:
        broker = "broker-a" if q < queues // 2 else "broker-b"
        data.intervals.append(
            {"group": "G", "client_id": client, "node": client, "topic": "T",
             "queue": f"{broker}:{q % (queues // 2)}", "start": start, "end": end}
        )  # fmt: skip

    for k in range(kills):
        ts, dead = 30_000 * (k + 1), names[k]
        data.nemeses.append({"ts_ms": ts, "action": "kill", "target": dead})
        heir = names[k + 1]
        for q in range(queues):
            if owner[q] == dead:
                interval(q, dead, since[q], ts)
                owner[q], since[q] = heir, ts + 5
    for q in range(queues):
        interval(q, owner[q], since[q], END)
    data.intervals.sort(key=lambda r: r["start"])
    return data


def test_a_many_queue_group_gets_a_health_map_of_bounded_size_without_a_legend_of_consumers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    data = large_group(queues=400, consumers=100, kills=3)
    legends: list[list[str]] = []
    png = report_plots.figure_png

    def keep_legend(fig: Any) -> str:
        legends.extend(
            [t.get_text() for t in ax.get_legend().get_texts()] for ax in fig.axes if ax.get_legend()
        )
        return png(fig)

    monkeypatch.setattr(report_plots, "figure_png", keep_legend)
    out = plot_ownership(data, "G", group_markers(data, "G", None), None)
    assert out is not None
    width, height = png_size(out)
    assert width <= 1000 and height <= 900  # one screen; the Gantt of 400 queues was 12,000 px tall
    (legend,) = legends
    assert not any(text.startswith("consumer-") for text in legend)
    assert "one owner" in legend
    # each kill leaves its queues 5 ms without an owner: a pale cell, not a cell's worth of orphan
    assert "no owner (orphan), briefly" in legend and "no owner (orphan)" not in legend
    assert ownership_text(data, "G").startswith("The group has 400 queues")


def test_the_map_keeps_the_worst_state_of_each_cell() -> None:
    """100 queues (a row each), 150 columns of 4 s: an overlap, a paused owner, an unavailable span,
    and intervals left uncollected each show where they happened."""
    data = large_group(queues=100, consumers=10)
    data.intervals.append(  # consumer-2 owns b:0 too from t = 100 s to 110 s
        {"group": "G", "client_id": "consumer-2", "node": "consumer-2", "topic": "T", "queue": "broker-b:0",
         "start": 100_000, "end": 110_000}
    )  # fmt: skip
    data.nemeses += [  # consumer-4 paused from t = 200 s to 240 s
        {"ts_ms": 200_000, "action": "pause", "target": "consumer-4"},
        {"ts_ms": 240_000, "action": "resume", "target": "consumer-4"},
    ]
    spans = [{"from_s": 300.0, "to_s": 320.0, "cause": "owner_idle"}]
    summary_group = {"unavailability": {"queues": [{"topic": "T", "queue": "broker-a:7", "spans": spans}]}}
    hm = health_map(data, "G", summary_group)
    assert hm is not None and hm.per_row == 1 and hm.cells.shape == (100, 150)
    row = {f"{t} {q}": i for i, (t, q) in enumerate(hm.queues)}
    assert hm.cells[row["T broker-b:0"], 26] == STATE["overlap"]  # t = 104-108 s
    assert hm.cells[row["T broker-b:0"], 24] == STATE["one_owner"]
    assert hm.cells[row["T broker-a:3"], 55] == STATE["paused"]  # queue 3 is consumer-4's
    assert hm.cells[row["T broker-a:4"], 55] == STATE["one_owner"]
    assert hm.cells[row["T broker-a:7"], 77] == STATE["unavailable_owner_idle"]
    assert hm.cells[row["T broker-a:7"], 81] == STATE["one_owner"]
    assert not hm.brief[row["T broker-b:0"], 26] and not hm.brief[row["T broker-a:7"], 77]
    assert not hm.brief[row["T broker-a:3"], 55] and not hm.brief[row["T broker-a:4"], 55]
    data.intervals_cut_at = 400_000  # what started from t = 400 s on was not collected
    hm = health_map(data, "G", summary_group)
    assert hm is not None and set(hm.cells[:, 100:].flat) == {STATE["not_collected"]}


def test_a_state_that_took_a_sliver_of_its_cell_is_told_apart_as_brief() -> None:
    # consumer-1 killed at t = 30 s: its queues have no owner for 5 ms, then 10 s for queue a:0
    data = large_group(queues=100, consumers=10, kills=1)
    a0 = next(r for r in data.intervals if r["queue"] == "broker-a:0" and r["start"] > 0)
    a0["start"] = 40_000
    hm = health_map(data, "G")
    assert hm is not None
    row = {f"{t} {q}": i for i, (t, q) in enumerate(hm.queues)}
    column = 30 // 4  # t = 28-32 s
    for queue, brief in (("broker-a:10", True), ("broker-a:0", False)):  # 5 ms, and 2 s of the 4 s
        assert hm.cells[row[f"T {queue}"], column] == STATE["orphan"]
        assert hm.brief[row[f"T {queue}"], column] == brief
    assert not hm.brief[row["T broker-a:0"], column + 1]  # t = 32-36 s: an orphan all along
    assert not hm.brief.any(where=hm.cells == STATE["one_owner"])  # one owner is never pale
    # a lasting overlap in the cell outranks the milliseconds of orphan there
    a10 = next(r for r in data.intervals if r["queue"] == "broker-a:10" and r["start"] > 0)
    data.intervals.append(
        {**a10, "client_id": "consumer-9", "node": "consumer-9", "start": 30_500, "end": 31_900}
    )
    hm = health_map(data, "G")
    assert hm is not None
    assert (
        hm.cells[row["T broker-a:10"], column] == STATE["overlap"]
        and not hm.brief[row["T broker-a:10"], column]
    )
    # binned rows (two queues a row past 128): a row's queue-time counts both queues
    data = large_group(queues=200, consumers=10, kills=1)
    hm = health_map(data, "G")
    assert (
        hm is not None and hm.per_row == 2 and hm.brief[0, column] and hm.cells[0, column] == STATE["orphan"]
    )


def test_up_to_64_queues_keep_the_gantt_chart() -> None:
    assert ownership_text(large_group(queues=64, consumers=4), "G") == OWNERSHIP_TEXT
    assert ownership_text(large_group(queues=66, consumers=4), "G") != OWNERSHIP_TEXT


def test_a_cause_of_many_actions_is_told_in_short_and_a_short_one_as_it_is() -> None:
    start_up = "; ".join(f"start 10.0.0.{i % 250}@{i}#1 on consumer-{i}" for i in range(1, 1001))
    short = "start of 1,000 consumers (consumer-1, consumer-2, consumer-3 and 997 more)"
    assert short_cause(start_up) == short
    assert short_cause("stop 1.2.3.4@1#1 on consumer-1; start 1.2.3.4@2#1 on consumer-1") == (
        "stop consumer-1; start consumer-1"
    )
    g = {
        "consumed_unique": 10, "sent": 10, "topics": ["T"], "lost": 0, "duplicates": 0,
        "duplicated_messages": 0, "orphan_ms": 0, "overlap_ms": 0, "stalled_ms": 0, "verdict": "ok",
        "concurrent_consume_ms": 0, "order_violations": 0,
        "convergence": [{"change_ms": 0, "cause": start_up, "converged": True, "convergence_ms": 4004}],
    }  # fmt: skip
    (story,) = [s for s in group_story("G", g, CLOCK, False) if s.startswith("After")]
    assert story == f"After '{short}' at t = 0.0 s the group was whole again 4.0 s later (4004 ms wall)."
    data = PlotData(0, END, 4000, clock=CLOCK)  # the chaos runner starting them all at one instant
    data.nemeses = [{"ts_ms": 0, "action": "start", "target": f"consumer-{i}"} for i in range(1, 1001)]
    (marker,) = group_markers(data, "G", None)
    assert marker.text == short


def test_many_changes_with_the_same_outcome_share_a_sentence_with_their_duplicates_summed() -> None:
    kills = [Marker(30_000 * k, f"kill consumer-{k}", "k", "nemesis") for k in range(1, 11)]
    entries = [
        {"change_ms": m.ts, "cause": f"kill 1.2.3.4@{k}#1 on consumer-{k}", "converged": k != 9,
         "convergence_ms": 3}
        for k, m in enumerate(kills, start=1)
    ]  # fmt: skip
    g = {"convergence": entries, "mode": "client", "unavailability": {"queues": []}}
    said = answer_for_group("G", g, CLOCK, kills, [(kills[4], 2), (kills[6], 3)])  # after the 5th, 7th
    assert said == [
        "G: after each of 9 changes ('kill consumer-1' at t = 30.0 s, 'kill consumer-2' at t = 60.0 s, "
        "'kill consumer-3' at t = 90.0 s and 6 more up to t = 300.0 s), the group was whole again within "
        "0.0 s of RocketMQ time (the broker notified the group at once) and no queue's messages waited "
        "longer than 3 s; 5 duplicate deliveries followed them in all, at most 3 after one ('kill "
        "consumer-7' at t = 210.0 s).",
        "G: after 'kill consumer-9' at t = 270.0 s, no queue's messages waited longer than 3 s of RocketMQ "
        "time; no duplicate deliveries followed.",
    ]
    quiet = answer_for_group("G", g, CLOCK, kills, [])
    assert quiet[0].endswith("no duplicate deliveries followed them in all.")
    # six changes or fewer: one sentence each, as before
    assert len(answer_for_group("G", g, CLOCK, kills[:6], [])) == 6


def test_the_report_of_a_large_group_stays_small() -> None:
    data = large_group(queues=800, consumers=200, kills=10)
    summary = {
        "run": {"events": 1, "malformed_lines": 0, "start_ms": 0, "end_ms": END, "t0_ms": 0,
                "time_scale": 1.0},
        "groups": {
            "G": {
                "topics": ["T"], "sent": 1, "consumed_unique": 1, "lost": 0, "duplicates": 0,
                "duplicated_messages": 0, "overlap_ms": 0, "orphan_ms": 50, "stalled_ms": 0,
                "concurrent_consume_ms": 0, "order_violations": 0, "verdict": "ok", "mode": "client",
                "convergence": [
                    {"change_ms": n["ts_ms"], "cause": f"{n['action']} 1.2.3.4@1#1 on {n['target']}",
                     "converged": True, "convergence_ms": 3}
                    for n in data.nemeses
                ],
            }
        },
    }  # fmt: skip
    page = render_html(summary, data, "Run x")
    images = re.findall(r"base64,([^']+)'", page)
    assert images and all(png_size(b)[1] <= 1200 for b in images)
    assert len(page) < 1_000_000
    assert page.count("After each of 10 changes") == 1


def test_many_markers_are_ticks_and_their_list_is_folded_while_a_few_stay_numbered() -> None:
    def lane_of(kills: int) -> tuple[Any, Any, list[Marker]]:
        data = large_group(queues=200, consumers=kills + 2, kills=kills)
        markers = group_markers(data, "G", None)
        _, lane, ax = report_plots._figure(3.0, markers)  # a figure of its own: nothing to close
        report_plots._draw_markers(lane, ax, markers, CLOCK, END / 1000)
        return lane, ax, markers

    lane, ax, markers = lane_of(report_plots.MANY_MARKERS + 1)
    assert len(markers) == report_plots.MANY_MARKERS + 1
    assert not lane.texts and not ax.lines  # no numbered circles, no line through the data
    assert len(lane.lines) == len(markers)  # a tick each
    lane, ax, markers = lane_of(3)
    assert [t.get_text() for t in lane.texts] == ["1", "2", "3"] and len(ax.lines) == 3

    data = large_group(queues=200, consumers=60, kills=50)
    summary = {
        "run": {"events": 1, "malformed_lines": 0, "start_ms": 0, "end_ms": END, "t0_ms": 0,
                "time_scale": 1.0},
        "groups": {"G": {
            "topics": ["T"], "sent": 1, "consumed_unique": 1, "lost": 0, "duplicates": 0,
            "duplicated_messages": 0, "overlap_ms": 0, "orphan_ms": 0, "stalled_ms": 0,
            "concurrent_consume_ms": 0, "order_violations": 0, "verdict": "ok", "mode": "client",
            "convergence": [],
        }},
    }  # fmt: skip
    page = render_html(summary, data, "Run x")
    assert "<details><summary>the 50 chaos actions and broker changes" in page
    assert "a tick per action of the chaos runner" in page and "Numbered markers" not in page
    assert page.count("<li>kill consumer-") == 50  # folded, not dropped


def convergence_entries(n: int, never: set[int] = frozenset(), slow: int | None = None) -> list[dict]:
    """A kill every 30 s from t = 30 s: whole again 3 ms later (the k-th in `never`: never; `slow`: 9 s)."""
    return [
        {"change_ms": 30_000 * k, "cause": f"kill 1.2.3.4@{k}#1 on consumer-{k}", "converged": k not in never,
         "convergence_ms": 9_000 if k == slow else 3}
        for k in range(1, n + 1)
    ]  # fmt: skip


def story_of(entries: list[dict], dups: list = ()) -> list[str]:  # type: ignore[assignment]
    g = {"topics": ["T"], "sent": 1, "consumed_unique": 1, "lost": 0, "duplicates": 0,
         "duplicated_messages": 0, "overlap_ms": 0, "orphan_ms": 0, "stalled_ms": 0,
         "concurrent_consume_ms": 0, "order_violations": 0, "verdict": "ok",
         "convergence": entries}  # fmt: skip
    return group_story("G", g, CLOCK, False, dups)


def test_the_story_of_many_changes_tells_their_convergence_in_short_and_names_the_unrecovered() -> None:
    story = story_of(convergence_entries(100, never={40, 70}, slow=12))
    assert not [s for s in story if s.startswith("After 'kill")]  # not one sentence per change
    assert (
        "After 98 of its 100 changes of membership the group was whole again: half of them within 3 ms, "
        "nine in ten within 3 ms, the slowest 9.0 s after 'kill consumer-12' at t = 360.0 s"
        in " ".join(story)
    )
    assert (
        "After 2 of the 100 changes it never became whole again before the run ended: 'kill consumer-40' at "
        "t = 1200.0 s and 'kill consumer-70' at t = 2100.0 s." in story
    )
    many_never = story_of(convergence_entries(20, never=set(range(1, 21))))
    assert not [s for s in many_never if "whole again:" in s]
    assert "at t = 90.0 s and 17 more." in " ".join(many_never)
    # six or fewer: a sentence each, as before
    few = story_of(convergence_entries(6, never={2}))
    assert len([s for s in few if s.startswith("After 'kill")]) == 6


def test_the_story_names_the_changes_most_duplicates_followed_when_there_are_many() -> None:
    marks = [Marker(30_000 * k, f"kill consumer-{k}", "k", "nemesis") for k in range(1, 11)]
    dups = [(None, 4), *[(m, k) for k, m in enumerate(marks, start=1)]]
    said = [s for s in story_of([], dups) if s.startswith("Extra")]
    assert said == [
        "Extra deliveries followed 10 of the changes (55 in all); the most 10 after kill consumer-10 "
        "(t = 300.0 s), 9 after kill consumer-9 (t = 270.0 s), 8 after kill consumer-8 (t = 240.0 s); "
        "4 before any change."
    ]
    few = [s for s in story_of([], dups[:3]) if s.startswith("Extra")]
    assert few == [
        "Extra deliveries by the change they followed: 4 before any change; 1 after kill consumer-1 "
        "(t = 30.0 s); 2 after kill consumer-2 (t = 60.0 s)."
    ]


def test_many_changes_get_a_convergence_chart_over_time_of_bounded_height() -> None:
    many = convergence_entries(report_plots.MANY_MARKERS + 1, never={5})
    width, height = png_size(report_plots.plot_convergence(many, "G", CLOCK) or "")
    assert height <= 400 and width <= 900
    assert report_plots.convergence_text(many) == report_plots.CONVERGENCE_DOTS_TEXT
    few = convergence_entries(report_plots.MANY_MARKERS)
    assert png_size(report_plots.plot_convergence(few, "G", CLOCK) or "")[1] > 1000  # a bar each, as before
    assert report_plots.convergence_text(few) == report_plots.CONVERGENCE_TEXT


def test_many_chaos_actions_are_counted_by_kind_before_the_first_ones_are_named() -> None:
    summary = {"run": {"events": 1, "malformed_lines": 0, "start_ms": 0, "end_ms": END}, "groups": {}}
    data = large_group(queues=200, consumers=40, kills=report_story.NEMESES_NAMED + 1)
    data.nemeses.append({"ts_ms": END - 1, "action": "pause", "target": "consumer-40"})
    said = [s for s in report_story.narrative(summary, data) if s.startswith("The chaos runner")]
    assert said[0].startswith(
        "The chaos runner wrote 22 nemesis event(s) (a restart is written as a stop and a start): 21 kill, "
        "1 pause; the first 20: kill consumer-1 at t = 30.0 s; kill consumer-2 at t = 60.0 s;"
    )
    assert "consumer-21 " not in said[0]
    data.nemeses = data.nemeses[:3]
    said = [s for s in report_story.narrative(summary, data) if s.startswith("The chaos runner")]
    assert "kill;" not in said[0] and said[0].endswith("kill consumer-3 at t = 90.0 s.")


def test_the_rates_of_many_consumers_are_one_summed_line_and_the_title_says_so(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    drawn: list[tuple[list[str], list[str], list[list[float]]]] = []
    png = report_plots.figure_png

    def keep(fig: Any) -> str:
        for ax in fig.axes:
            if ax.get_legend():
                texts = [t.get_text() for t in ax.get_legend().get_texts()]
                drawn.append(
                    (texts, [a.get_title() for a in fig.axes], [list(ln.get_ydata()) for ln in ax.lines])
                )
        return png(fig)

    monkeypatch.setattr(report_plots, "figure_png", keep)
    for nodes in (report_plots.MANY_NODES + 1, 3):
        data = PlotData(0, END, 4000, clock=CLOCK)
        data.rates = [
            {"group": "G", "node": f"consumer-{i}", "bucket": b, "n": 4}
            for i in range(nodes)
            for b in range(3)
        ]
        assert report_plots.plot_rates(data, "G", []) is not None
    (many, many_titles, many_lines), (few, few_titles, _) = drawn
    assert many == ["all 21 consumers together"] and many_lines == [
        [21.0, 21.0, 21.0]
    ]  # 4 per 4 s, 21 of them
    assert "G: consumption rate of its 21 consumers together" in many_titles
    assert few == ["consumer-0", "consumer-1", "consumer-2"]
    assert "G: consumption rate per consumer" in few_titles


def test_the_story_tells_idle_members_in_rocketmq_time_and_is_silent_without_them() -> None:
    g = {"topics": ["T"], "sent": 1, "consumed_unique": 1, "lost": 0, "duplicates": 0,
         "duplicated_messages": 0, "overlap_ms": 0, "orphan_ms": 0, "idle_member_ms": 1500,
         "stalled_ms": 0, "concurrent_consume_ms": 0, "order_violations": 0, "verdict": "ok",
         "convergence": []}  # fmt: skip
    said = [s for s in group_story("G", g, RunClock(0, 0.5), False) if s.startswith("Members held")]
    assert said == [
        "Members held no queue while their topic had one for each member for 3.0 s (1500 ms wall), summed "
        "over members: their allocations disagreed, or one had not rebalanced yet."
    ]
    for quiet in ({**g, "idle_member_ms": 0}, {k: v for k, v in g.items() if k != "idle_member_ms"}):
        assert not [s for s in group_story("G", quiet, CLOCK, False) if s.startswith("Members held")]
