"""Per-queue unavailability by cause, the run's clock and the broker's markers: the classifier on
hand-made spans, a hand-made run worked out by hand on the plain-Python twin, and the same run through
`rmq-analyze` (Spark) giving the same summary.json and a report that opens with the answer."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from kit.pipeline_cases import Builder, write_case_files

from rmqlab.pipeline.availability_reference import summarize_run
from rmqlab.pipeline.unavailability import (
    GroupInputs,
    QueueInputs,
    RunClock,
    broker_markers,
    classify_queue,
    quiet_spans,
    run_clock,
    waiting_spans,
)

INF = 2**63 - 1


def test_waits_at_or_under_the_threshold_do_not_count_and_overlapping_ones_merge() -> None:
    assert waiting_spans([(0, 100), (50, 151), (300, 400), (400, 501)], 100) == [(50, 151), (400, 501)]
    assert waiting_spans([(0, 200), (100, 300), (300, 450)], 100) == [(0, 450)]


def test_quiet_spans_are_the_long_gaps_between_consumptions() -> None:
    assert quiet_spans([(0, 1000)], [50, 100, 400, 500, 2000], 100) == [(100, 400), (500, 1000)]
    assert quiet_spans([(0, 100)], [], 100) == []


def test_each_cause_in_its_order() -> None:
    g = GroupInputs(
        pauses={"c1": [(200, 700)]},
        live={"c1": [(0, INF)], "c2": [(0, INF)], "c3": [(0, INF)]},
        rebalances={
            ("c2", "T"): [(300, frozenset({"b:9"})), (600, frozenset())],
            ("c3", "T"): [(0, frozenset({"b:9"}))],
        },
    )
    g.pauses["c3"] = [(0, INF)]  # a paused client's allocation does not make the queue wait for a lock
    owned = QueueInputs(waiting=[(0, 1000)], quiet=[(0, 1000)], owners=[("c1", 0, 2000)])
    r = classify_queue("T", "b:0", owned, g, 100)
    assert r.by_cause == {"no_owner": 0, "lock_wait": 0, "owner_paused": 500, "owner_idle": 500}
    assert r.spans == [(0, 200, "owner_idle"), (200, 700, "owner_paused"), (700, 1000, "owner_idle")]
    orphan = QueueInputs(waiting=[(100, 900)], quiet=[(100, 900)])
    r = classify_queue("T", "b:9", orphan, g, 100)
    assert r.by_cause == {"no_owner": 500, "lock_wait": 300, "owner_paused": 0, "owner_idle": 0}
    assert r.spans == [(100, 300, "no_owner"), (300, 600, "lock_wait"), (600, 900, "no_owner")]


def test_a_running_owner_counts_only_past_the_threshold_within_a_quiet_span() -> None:
    g = GroupInputs(live={"c1": [(0, INF)]})
    at_threshold = QueueInputs(waiting=[(0, 1000)], quiet=[(0, 100)], owners=[("c1", 0, 1000)])
    assert classify_queue("T", "q", at_threshold, g, 100).total == 0
    past = QueueInputs(waiting=[(0, 1000)], quiet=[(0, 101)], owners=[("c1", 0, 1000)])
    assert classify_queue("T", "q", past, g, 100).by_cause["owner_idle"] == 101
    # a queue owned only part of the quiet span: only the owned part counts, and only when over G
    part = QueueInputs(waiting=[(0, 1000)], quiet=[(0, 1000)], owners=[("c1", 950, 1000)])
    assert classify_queue("T", "q", part, g, 100).by_cause == {
        "no_owner": 950, "lock_wait": 0, "owner_paused": 0, "owner_idle": 0,
    }  # fmt: skip


def test_the_clock_comes_from_the_chaos_runner() -> None:
    side = [
        {"ts_ms": 500, "event": "experiment_started", "time_scale": 0.05},
        {"ts_ms": 900, "event": "schedule_started", "time_scale": 0.05},
    ]
    clock = run_clock(side, 100, None)
    assert clock == RunClock(900, 0.05)
    assert clock.at_s(1900) == pytest.approx(20.0) and clock.rmq_ms(150) == 3000
    assert clock.idle_threshold_ms == 150
    assert run_clock(side[:1], 100, None) == RunClock(100, 0.05)
    assert run_clock(side, 100, 0.5).time_scale == 0.5
    assert run_clock([], None, None) == RunClock(0, 1.0)


def test_broker_markers_keep_expiries_notifications_and_lock_take_overs() -> None:
    side = [
        {"ts_ms": 3, "event": "lock_acquired", "node": "broker-a", "group": "g", "client_id": "c1",
         "previous_client_id": "c1", "topic": "T", "broker": "b", "queue_id": 0},
        {"ts_ms": 2, "event": "lock_acquired", "node": "broker-a", "group": "g", "client_id": "c1",
         "previous_client_id": "c2", "topic": "T", "broker": "b", "queue_id": 1},
        {"ts_ms": 1, "event": "consumer_unregistered", "node": "broker-a", "group": "g", "client_id": "c2",
         "reason": "channel_expired"},
        {"ts_ms": 1, "event": "consumer_unregistered", "node": "broker-a", "group": "g", "client_id": "c3",
         "reason": "unregister"},
        {"ts_ms": 4, "event": "notify_sent", "node": "broker-b", "group": "g", "cause": "register"},
        {"ts_ms": 5, "event": "notify_sent", "node": "broker-b", "group": "other", "cause": "register"},
    ]  # fmt: skip
    marks = broker_markers(side, "g", {"c1": "n1", "c2": "n2"})
    assert [(m["ts_ms"], m["kind"]) for m in marks] == [
        (1, "channel_expired"), (2, "lock_taken_over"), (4, "notify_sent"),
    ]  # fmt: skip
    assert marks[0]["node"] == "n2" and marks[1]["previous_node"] == "n2" and marks[1]["detail"] == "T b:1"


def build_run(root: Path) -> Path:
    """Four queues, time scale 0.05 (G = 150 ms): b:0's owner is paused, b:2's owner is killed and the
    survivor waits for its lock, b:3's owner consumes nothing for a while, b:1 has no messages."""
    b = Builder(end=5000)
    b.ev("chaos.jsonl", 0, "schedule_started", "chaos", "chaos", time_scale=0.05, duration_s=100)
    for node, client in (("n1", "c1"), ("n2", "c2")):
        b.started(10, node, client)
        b.route(10, node, client, ["b:0", "b:1", "b:2", "b:3"])
    b.rebalance(20, "n1", "c1", ["c1", "c2"], ["b:0", "b:1"])
    b.rebalance(20, "n2", "c2", ["c1", "c2"], ["b:2", "b:3"])
    for node, client, queues in (("n1", "c1", ["b:0", "b:1"]), ("n2", "c2", ["b:2", "b:3"])):
        for q in queues:
            b.added(20, node, client, q)
    b.sent(500, "m4", "b:0")
    b.consumed(520, "n1", "c1", "m4", "b:0")  # waited 20 ms: not counted
    b.nemesis(1000, "pause", "n1")
    b.sent(1100, "m0", "b:0")
    b.nemesis(2000, "resume", "n1")
    b.consumed(2010, "n1", "c1", "m0", "b:0")  # paused owner [1100, 2000) = 900
    b.nemesis(3000, "kill", "n2")
    b.ev("broker-a.jsonl", 3000, "consumer_unregistered", "broker-a", "broker", group="g", client_id="c2",
         reason="channel_expired")  # fmt: skip
    b.ev("broker-a.jsonl", 3001, "notify_sent", "broker-a", "broker", group="g", cause="channel_closed")
    b.sent(3050, "m2", "b:2")
    b.rebalance(3100, "n1", "c1", ["c1"], ["b:0", "b:1", "b:2", "b:3"])
    b.added(3100, "n1", "c1", "b:3")
    b.sent(3200, "m3", "b:3")
    b.ev("broker-a.jsonl", 3600, "lock_acquired", "broker-a", "broker", group="g", client_id="c1",
         previous_client_id="c2", topic="T", broker="b", queue_id=2)  # fmt: skip
    b.added(3600, "n1", "c1", "b:2")
    b.consumed(3610, "n1", "c1", "m2", "b:2")  # no owner 50, lock wait 500
    b.consumed(4000, "n1", "c1", "m3", "b:3")  # owner running, nothing consumed for 800
    write_case_files(root, b.finish())
    return root


EXPECTED_WALL = {"no_owner": 50, "lock_wait": 500, "owner_paused": 900, "owner_idle": 800}


def test_a_hand_made_run_worked_out_by_hand(tmp_path: Path) -> None:
    summary = summarize_run(build_run(tmp_path / "run"))
    assert summary["run"]["time_scale"] == 0.05 and summary["run"]["t0_ms"] == 0
    g = summary["groups"]["g"]
    un = g["unavailability"]
    assert un["by_cause_ms"] == EXPECTED_WALL and un["total_ms"] == 2250
    assert un["by_cause_rocketmq_ms"] == {k: v * 20 for k, v in EXPECTED_WALL.items()}
    assert {q["queue"]: q["total_rocketmq_ms"] for q in un["queues"]} == {
        "b:0": 18000,
        "b:2": 11000,
        "b:3": 16000,
    }
    b2 = next(q for q in un["queues"] if q["queue"] == "b:2")
    assert b2["spans"] == [
        {"from_s": 61.0, "to_s": 62.0, "cause": "no_owner"},
        {"from_s": 62.0, "to_s": 72.0, "cause": "lock_wait"},
    ]
    assert g["rocketmq_time"]["unavailable_ms"] == 45000 and g["rocketmq_time"]["stalled_ms"] == 2 * 1000 * 20
    kill = next(e for e in g["convergence"] if e["cause"] == "kill n2")
    assert kill["at_s"] == 60.0 and kill["convergence_rocketmq_ms"] == kill["convergence_ms"] * 20
    assert [(m["kind"], m["at_s"]) for m in g["broker_markers"]] == [
        ("channel_expired", 60.0), ("notify_sent", 60.02), ("lock_taken_over", 72.0),
    ]  # fmt: skip


@pytest.mark.spark
def test_rmq_analyze_gives_the_same_summary_and_opens_the_report_with_the_answer(
    spark: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from rmqlab.pipeline.__main__ import main

    run_dir = build_run(tmp_path / "run")
    (run_dir / "manifest.json").write_text(json.dumps({"name": "hand", "question": "What stalls?"}))
    niced: list[int] = []
    monkeypatch.setattr("os.nice", niced.append)  # the test process keeps its priority
    # As the chaos runner starts it: warm up on a simulated run, then wait for the manifest (here at once).
    assert main([str(run_dir), "--after", str(run_dir / "manifest.json")]) == 0
    assert niced == [10]
    assert "[rmq-analyze] warm up" in capsys.readouterr().err
    summary = json.loads((run_dir / "summary.json").read_text())
    answer = summary.pop("answer")
    assert summary == summarize_run(run_dir)
    assert any(
        "After 'pause n1' at t = 20.0 s, 1 queue(s) were unavailable for up to 18.0 s" in a for a in answer
    )
    assert any(
        "After 'kill n2' at t = 60.0 s" in a and "waiting for the broker lock" not in a for a in answer
    )
    page = (run_dir / "report.html").read_text()
    top = page.index("<b>Answer:</b>")
    assert page.index("<b>Question:</b> What stalls?") < top < page.index("<h2>What happened</h2>")
    assert "n2 expired" not in page and "broker-a expired n2&#x27;s channel, no NOTIFY" in page
    assert "n1 took 1 queue lock(s) of n2 (expired)" in page
    assert "--time-scale" in _help(capsys)


def _help(capsys: pytest.CaptureFixture[str]) -> str:
    from rmqlab.pipeline.__main__ import main

    with pytest.raises(SystemExit):
        main(["--help"])
    return capsys.readouterr().out


def test_waiting_for_the_run_gives_up_when_the_runner_is_gone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rmqlab.pipeline import __main__ as cli

    parents = iter([100, 100, 1])  # the runner died: the process is adopted
    monkeypatch.setattr("os.getppid", lambda: next(parents))
    assert cli._wait_for(tmp_path / "manifest.json", poll_s=0) is False
    (tmp_path / "manifest.json").write_text("{}")
    monkeypatch.setattr("os.getppid", lambda: 100)
    assert cli._wait_for(tmp_path / "manifest.json", poll_s=0) is True


def test_broker_changes_at_the_same_instant_go_by_broker_whatever_the_input_order() -> None:
    # Spark hands the brokers' files over by size, the reference by name: the markers must not differ
    def notify(node: str, cause: str) -> dict[str, Any]:
        return {"event": "notify_sent", "ts_ms": 5, "node": node, "group": "G", "cause": cause}

    side = [
        notify("broker-b", "b1"),
        notify("broker-a", "a1"),
        notify("broker-b", "b2"),
        notify("broker-a", "a2"),
    ]
    got = [m["detail"] for m in broker_markers(side, "G", {})]
    assert got == ["a1", "a2", "b1", "b2"]
    assert [m["detail"] for m in broker_markers(list(reversed(side)), "G", {})] == ["a2", "a1", "b2", "b1"]
