"""The run's time scale when no chaos runner wrote one: a compose cluster's servers log theirs in
`broker_started` and `namesrv_started`, and the analysis tells its figures in that RocketMQ time, both
twins alike (the plain-Python reference and Spark); when the run's processes logged different scales,
summary.json says so in `run.time_scale_note`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from kit.pipeline_cases import Builder, write_case_files

from rmqlab.pipeline.availability_reference import summarize_run
from rmqlab.pipeline.discover import RunDir, discover
from rmqlab.pipeline.small_runs import analyse_run
from rmqlab.pipeline.unavailability import RunClock, run_clock

WALL_PAUSED_MS = 900  # the paused owner's queue waits [1100, 2000)


def build_compose_run(root: Path, scales: dict[str, float], runner: float | None = None) -> Path:
    """Two consumers on four queues, as a compose cluster writes them: no chaos.jsonl (unless ``runner``
    gives the scale of a chaos runner's schedule), the servers' start events with the scales in
    ``scales`` (node -> scale), the hand-driven pause of n1 recorded in nemesis.jsonl."""
    b = Builder(end=5000)
    if runner is not None:
        b.ev("chaos.jsonl", 0, "schedule_started", "chaos", "chaos", time_scale=runner, duration_s=100)
    for node, scale in scales.items():
        if node.startswith("namesrv"):
            b.ev(f"{node}.jsonl", 0, "namesrv_started", node, "namesrv", addr="x:9876", time_scale=scale)
        else:
            b.ev(
                f"{node}.jsonl", 0, "broker_started", node, "broker", broker=node, addr="x:10911",
                time_scale=scale, messages=0,
            )  # fmt: skip
    for node, client in (("n1", "c1"), ("n2", "c2")):
        b.started(10, node, client)
        b.route(10, node, client, ["b:0", "b:1", "b:2", "b:3"])
    b.rebalance(20, "n1", "c1", ["c1", "c2"], ["b:0", "b:1"])
    b.rebalance(20, "n2", "c2", ["c1", "c2"], ["b:2", "b:3"])
    for node, client, queues in (("n1", "c1", ["b:0", "b:1"]), ("n2", "c2", ["b:2", "b:3"])):
        for q in queues:
            b.added(20, node, client, q)
    b.sent(500, "m4", "b:0")
    b.consumed(520, "n1", "c1", "m4", "b:0")

    def by_hand(ts: int, action: str) -> None:
        b.ev(
            "nemesis.jsonl", ts, "nemesis", "chaos", "chaos", action=action, target="n1",
            target_role="consumer", group="g", client_id="c1", by="hand",
        )  # fmt: skip

    by_hand(1000, "pause")
    b.sent(1100, "m0", "b:0")
    by_hand(2000, "resume")
    b.consumed(2010, "n1", "c1", "m0", "b:0")
    b.sent(3000, "m2", "b:2")
    b.consumed(3005, "n2", "c2", "m2", "b:2")
    write_case_files(root, b.finish())
    return root


def test_the_servers_scale_counts_when_no_runner_wrote_one() -> None:
    servers = [
        {"ts_ms": 5, "event": "broker_started", "node": "broker-a", "time_scale": 0.05},
        {"ts_ms": 1, "event": "namesrv_started", "node": "namesrv", "time_scale": 0.05},
    ]
    assert run_clock(servers, 100, None) == RunClock(100, 0.05)
    # the chaos runner's scale goes first, and a given one before both
    runner = [{"ts_ms": 50, "event": "schedule_started", "node": "chaos", "time_scale": 0.1}]
    clock = run_clock(runner + servers, 0, None)
    assert (clock.t0_ms, clock.time_scale) == (50, 0.1)
    assert clock.note == (
        "time scale 0.1 from the chaos runner, but the servers logged 0.05 (broker-a, namesrv)"
    )
    clock = run_clock(servers, 0, 0.5)
    assert clock.time_scale == 0.5
    assert clock.note == "time scale 0.5 as given, but the run's processes logged 0.05 (broker-a, namesrv)"
    assert run_clock(servers, 0, 0.05).note is None
    # what is not a positive finite number is no scale
    bad = [{"ts_ms": 1, "event": "broker_started", "node": "b", "time_scale": v} for v in (0, -1, True, "1")]
    assert run_clock(bad, 7, None) == RunClock(7, 1.0)
    # servers that disagree: the scale most of them logged, the first logged of as many, and a note
    mixed = [
        {"ts_ms": 3, "event": "broker_started", "node": "broker-b", "time_scale": 0.1},
        *servers,
    ]
    clock = run_clock(mixed, 0, None)
    assert clock.time_scale == 0.05
    assert clock.note == (
        "no chaos runner logged a time scale and the servers disagree: 0.05 (broker-a, namesrv), "
        "0.1 (broker-b); the analysis takes 0.05, the one most of them logged"
    )
    tie = [*mixed[:1], servers[0]]
    assert run_clock(tie, 0, None).time_scale == 0.1  # broker-b logged at 3, broker-a at 5
    assert run_clock(list(reversed(tie)), 0, None) == run_clock(tie, 0, None)  # whatever the input order


def _rocketmq_twenty_times_wall(summary: dict[str, Any]) -> None:
    assert summary["run"]["time_scale"] == 0.05 and "time_scale_note" not in summary["run"]
    g = summary["groups"]["g"]
    un = g["unavailability"]
    assert un["by_cause_ms"]["owner_paused"] == WALL_PAUSED_MS
    assert un["by_cause_rocketmq_ms"]["owner_paused"] == 20 * WALL_PAUSED_MS
    assert un["total_rocketmq_ms"] == 20 * un["total_ms"] > 0
    assert g["rocketmq_time"]["unavailable_ms"] == un["total_rocketmq_ms"]
    for key in ("overlap_ms", "orphan_ms", "idle_member_ms", "stalled_ms", "concurrent_consume_ms"):
        assert g["rocketmq_time"][key] == 20 * g[key], key
    assert g["stalled_ms"] > 0
    for e in g["convergence"]:
        assert e["convergence_rocketmq_ms"] == 20 * e["convergence_ms"]
    pause = next(m for m in g["unavailability"]["queues"] if m["queue"] == "b:0")
    assert pause["spans"] == [{"from_s": 22.0, "to_s": 40.0, "cause": "owner_paused"}]  # t = 0 is ts 0


def test_a_compose_run_is_told_in_the_servers_rocketmq_time(tmp_path: Path) -> None:
    run_dir = build_compose_run(tmp_path / "run", {"namesrv": 0.05, "broker-a": 0.05, "broker-b": 0.05})
    summary = summarize_run(run_dir)
    _rocketmq_twenty_times_wall(summary)
    # the answer tells the 0.9 s wall pause of the owner as 18 s of RocketMQ time, not 0.9 s
    run = RunDir("run", str(run_dir), discover(run_dir), {})
    answered, _ = analyse_run(run, plots=True)
    assert any("were unavailable for up to 18.0 s of RocketMQ time" in a for a in answered["answer"])


def test_disagreeing_scales_are_noted_by_the_reference(tmp_path: Path) -> None:
    servers = summarize_run(
        build_compose_run(tmp_path / "servers", {"namesrv": 0.1, "broker-a": 0.05, "broker-b": 0.05})
    )
    assert servers["run"]["time_scale"] == 0.05
    assert servers["run"]["time_scale_note"] == (
        "no chaos runner logged a time scale and the servers disagree: 0.05 (broker-a, broker-b), "
        "0.1 (namesrv); the analysis takes 0.05, the one most of them logged"
    )
    runner = summarize_run(
        build_compose_run(tmp_path / "runner", {"namesrv": 0.05, "broker-a": 0.05}, runner=0.1)
    )
    assert runner["run"]["time_scale"] == 0.1
    assert runner["run"]["time_scale_note"] == (
        "time scale 0.1 from the chaos runner, but the servers logged 0.05 (broker-a, namesrv)"
    )
    given = summarize_run(tmp_path / "runner", time_scale=0.05)
    assert given["run"]["time_scale_note"] == (
        "time scale 0.05 as given, but the run's processes logged 0.05 (broker-a, namesrv), "
        "0.1 (the chaos runner)"
    )
    agreeing = summarize_run(build_compose_run(tmp_path / "agree", {"broker-a": 0.1}, runner=0.1))
    assert "time_scale_note" not in agreeing["run"]


@pytest.mark.spark
def test_spark_tells_the_compose_run_as_the_reference_does(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rmqlab.pipeline.__main__ import main

    monkeypatch.setattr("os.nice", lambda _: None)  # the test process keeps its priority
    run_dir = build_compose_run(tmp_path / "run", {"namesrv": 0.05, "broker-a": 0.05, "broker-b": 0.05})
    assert main([str(run_dir), "--quiet"]) == 0
    summary = json.loads((run_dir / "summary.json").read_text())
    answer = summary.pop("answer")
    assert summary == summarize_run(run_dir)
    _rocketmq_twenty_times_wall(summary)
    assert any("were unavailable for up to 18.0 s of RocketMQ time" in a for a in answer)
    assert "at time scale 0.05" in (run_dir / "report.html").read_text()

    noted = build_compose_run(tmp_path / "noted", {"namesrv": 0.1, "broker-a": 0.05, "broker-b": 0.05})
    assert main([str(noted), "--quiet", "--no-report"]) == 0
    summary = json.loads((noted / "summary.json").read_text())
    summary.pop("answer")
    assert summary == summarize_run(noted)
    note = summary["run"]["time_scale_note"]
    assert "the servers disagree: 0.05 (broker-a, broker-b), 0.1 (namesrv)" in note
