"""pipeline.pop_metrics on hand-worked runs: a classic group and a POP group over the same topic, a
revive, a lost message, idle consumers; its Spark twin and rmq-analyze's `mode` and `pop` fields."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from kit.pipeline_cases import Builder, write_case_files

from rmqlab.pipeline.metrics_reference import load_run
from rmqlab.pipeline.pop_reference import idle_ms, main, mode_metrics

BROKER = "broker-b"


def broker(b: Builder, ts: int, event: str, group: str, **fields: Any) -> None:
    """A POP line of the broker (message_popped, message_revived, invisible_time_changed)."""
    b.ev("broker.jsonl", ts, event, BROKER, "broker", group=group, **fields)


def build(b: Builder) -> None:
    b.ev("chaos.jsonl", 1000, "schedule_started", "chaos", "chaos", time_scale=0.5)
    b.started(1000, "consumer-1", "c1", group="C")
    b.started(1000, "consumer-2", "c2", group="C")
    b.started(1000, "consumer-3", "p1", group="P")
    b.rebalance(1010, "consumer-1", "c1", ["c1", "c2"], ["b:0"], group="C")
    # c2 gets nothing: idle from 1010 until it is killed at 1500
    b.rebalance(1010, "consumer-2", "c2", ["c1", "c2"], [], group="C")
    b.rebalance(1010, "consumer-1", "c1", ["c1"], ["b:0"], group="C", topic="%RETRY%C")
    b.assignment(1020, "consumer-3", "p1", "P", pop=["b:-1"])
    b.sent(1100, "m1", "b:0", 0)
    b.sent(1200, "m2", "b:0", 1)
    b.consumed(1300, "consumer-1", "c1", "m1", "b:0", group="C")
    b.consumed(1400, "consumer-1", "c1", "m1", "b:0", group="C")
    broker(b, 1150, "message_popped", "P", msg_id="m1")
    broker(b, 1250, "message_popped", "P", msg_id="m2")
    broker(b, 3000, "message_revived", "P", msg_id="m1")
    b.consumed(3600, "consumer-3", "p1", "m1", "b:0", group="P", topic=("P", "T"))  # the revived copy
    b.consumed(1300, "consumer-3", "p1", "m2", "b:0", 1, group="P")
    b.nemesis(1500, "kill", "consumer-2", group="C")
    broker(b, 1600, "invisible_time_changed", "P")
    b.sent(4000, "m3", "b:0", topic="U")


def records(*builds: Any) -> list[dict[str, Any]]:
    b = Builder(end=4000)
    for step in builds:
        step(b)
    return [json.loads(line) for lines in b.files.values() for line in lines]


def write(tmp_path: Path, *builds: Any) -> Path:
    b = Builder(end=4000)
    for step in builds:
        step(b)
    write_case_files(tmp_path, dict(b.files))
    return tmp_path


def test_hand_worked_groups() -> None:
    out = mode_metrics(records(build))
    assert out["run"] == {"start_ms": 1000, "end_ms": 4000, "time_scale": 0.5, "t0_ms": 1000}
    c, p = out["groups"]["C"], out["groups"]["P"]
    # C: m1 consumed twice (a duplicate), m2 never: lost, waiting from its send (1200) to the end (4000)
    assert (c["mode"], c["topics"], c["sent"], c["lost"], c["duplicates"]) == ("client", ["T"], 2, 1, 1)
    assert c["longest_wait_ms"] == 2800 and c["time_to_drain_ms"] is None
    # c2 was idle (live, no queue) from its empty rebalance at 1010 until its kill at 1500
    assert (c["idle_consumers"], c["idle_consumer_ms"]) == (1, 490)
    # P: m1 popped at 1150, revived, consumed at 3600 from the retry topic; m2 consumed at 1300
    assert (p["mode"], p["sent"], p["lost"], p["duplicates"]) == ("server-pop", 2, 0, 0)
    assert p["longest_wait_ms"] == 3600 - 1100 and p["time_to_drain_ms"] == 3600 - 1200
    assert (p["revived"], p["revived_messages"], p["longest_revived_wait_ms"]) == (1, 1, 3600 - 1150)
    assert p["invisible_time_changes"] == 1 and p["idle_consumers"] == 0


def test_idle_ms_counts_only_live_spans_after_the_first_allocation() -> None:
    allocs = [(10, "T", False), (20, "U", True), (30, "U", False), (50, "T", True)]
    # idle at [10, 20) and [30, 50); live [0, 15) and [35, 100)
    assert idle_ms(allocs, [(0, 15), (35, 100)], 100) == 5 + 15
    assert idle_ms([], [(0, 100)], 100) == 0  # never balanced: not idle
    assert idle_ms([(10, "T", False)], [(0, 100)], 100) == 90


def test_cli_writes_modes_json(tmp_path: Path, capsys: Any) -> None:
    write(tmp_path, build)
    assert main([str(tmp_path)]) == 0
    table = capsys.readouterr().out
    assert "| P | server-pop | 2 | 0 | 0 | 5 | 5 | 1 | 0 |" in table  # 2500 ms at scale 0.5 = 5 s
    assert json.loads((tmp_path / "modes.json").read_text())["groups"]["C"]["lost"] == 1
    assert main([str(tmp_path / "nope")]) == 2


def more(b: Builder) -> None:
    """A second POP consumer idle for lack of an assignment, which consumes m1 once more."""
    b.started(1000, "consumer-4", "p2", group="P")
    b.assignment(1030, "consumer-4", "p2", "P")
    b.consumed(3700, "consumer-4", "p2", "m1", "b:0", group="P")


@pytest.mark.spark
def test_spark_twin_equals_the_reference(spark: Any, tmp_path: Path) -> None:
    from rmqlab.pipeline.pop_spark import mode_metrics_spark

    run_dir = write(tmp_path, build, more)
    (run_dir / "bad.jsonl").write_text('{"ts_ms": "x"}\n')
    events, _ = load_run(run_dir)
    expected = mode_metrics(e.rec for e in events)
    got = mode_metrics_spark(spark, run_dir)
    assert got == expected
    assert got["groups"]["P"]["idle_consumers"] == 1 and got["groups"]["P"]["duplicates"] == 1


def retry_pull(b: Builder) -> None:
    """p2 pulls the group's %RETRY% queue but nothing of T: still idle (retry topics do not count)."""
    b.assignment(1030, "consumer-4", "p2", "P", topic="%RETRY%P", pull=["b:0"])


@pytest.mark.spark
def test_rmq_analyze_shows_both_modes(spark: Any, tmp_path: Path, capsys: Any) -> None:
    """rmq-analyze on a root of two runs: each summary.json's `mode` and `pop` per group equal the plain
    twin, the POP group's verdict comes from its messages, report.html puts the groups side by side and
    index.html compares the runs' groups; the Spark analysis of the runs writes the same files."""
    from rmqlab.pipeline.__main__ import main as analyze
    from rmqlab.pipeline.availability_reference import summarize_run

    root = tmp_path / "root"
    write(root / "a", build, more, retry_pull)
    write(root / "b", build)
    assert analyze([str(root), "--quiet"]) == 1  # C lost m2 in both
    for rel in ("a", "b"):
        summary = json.loads((root / rel / "summary.json").read_text())
        summary.pop("answer")
        assert summary == summarize_run(root / rel), rel
    summary = json.loads((root / "a" / "summary.json").read_text())
    c, p = summary["groups"]["C"], summary["groups"]["P"]
    assert (c["mode"], c["verdict"], p["mode"], p["verdict"]) == ("client", "fail", "server-pop", "ok")
    # P's group entry counts the revived copy consumed from %RETRY%P_T: nothing lost
    assert (p["topics"], p["sent"], p["lost"], p["duplicates"]) == (["%RETRY%P", "T"], 2, 0, 1)
    assert p["pop"]["revived"] == 1 and p["pop"]["longest_wait_ms"] == 3600 - 1100
    assert p["pop"]["idle_consumers"] == 1  # p2, whose only queue is of the %RETRY% topic
    assert c["pop"]["idle_consumers"] == 1 and c["pop"]["time_to_drain_ms"] is None
    report = (root / "a" / "report.html").read_text()
    assert "Client-side balancing and POP side by side" in report
    assert ">server-pop</td>" in report and ">client</td>" in report
    index = (root / "index.html").read_text()
    assert "Client-side balancing and RocketMQ 5 side by side" in index
    assert "<td>P</td><td>server-pop</td><td>0</td><td>1</td><td>5.0</td>" in index  # 2500 ms at 0.5
    assert "a: FAIL (C)" in capsys.readouterr().out
    # These small runs went to the reference in Spark tasks; the Spark analysis writes the same bytes.
    assert analyze([str(root), "--quiet", "--analysis", "spark", "--out", str(tmp_path / "spark")]) == 1
    files = ("a/summary.json", "a/report.html", "b/summary.json", "b/report.html", "runs.csv", "index.html")
    for rel in files:
        assert (tmp_path / "spark" / rel).read_bytes() == (root / rel).read_bytes(), rel


def _group(
    mode: str, lost: int, dups: int, wait_ms: int, drain_ms: int | None, revived: int
) -> dict[str, Any]:
    pop = {"longest_wait_ms": wait_ms, "time_to_drain_ms": drain_ms, "revived": revived}
    verdict = "fail" if lost else "ok"
    return {"mode": mode, "lost": lost, "duplicates": dups, "pop": pop, "verdict": verdict}


def test_the_index_puts_each_runs_groups_side_by_side(tmp_path: Path) -> None:
    from rmqlab.pipeline.discover import RunDir
    from rmqlab.pipeline.runs import RootResult, modes_section

    def run(rel: str, groups: dict[str, Any]) -> tuple[RunDir, dict[str, Any]]:
        summary = {"run": {"time_scale": 0.05}, "groups": groups}
        return RunDir(rel, str(tmp_path / rel), [], {"name": f"exp-{rel}"}), summary

    pair = run("pair", {
        "C": _group("client", 0, 7, 1450, 5, 0),  # 1.45 s wall at scale 0.05 = 29 s
        "P": _group("server-pop", 0, 0, 3120, None, 1),
    })  # fmt: skip
    classic = run("classic-only", {"C": _group("client", 1, 0, 100, None, 0)})
    result = RootResult([pair[0], classic[0]], [])
    result.summaries = {"pair": pair[1], "classic-only": classic[1]}
    html = "".join(modes_section(result))
    assert "<td>C</td><td>client</td><td>0</td><td>7</td><td>29.0</td><td>0.1</td><td>-</td>" in html
    assert "<td>P</td><td>server-pop</td><td>0</td><td>0</td><td>62.4</td><td>-</td><td>1</td>" in html
    assert "exp-pair" in html and "classic-only" not in html  # a run without a RocketMQ 5 group is left out
    result = RootResult([classic[0]], [])
    result.summaries = {"classic-only": classic[1]}
    assert modes_section(result) == []


def test_a_pop_groups_wait_is_explained_by_the_revive() -> None:
    from rmqlab.pipeline.report_data import Marker
    from rmqlab.pipeline.report_story import answer_for_group
    from rmqlab.pipeline.unavailability import RunClock

    spans = [{"from_s": 150.0, "to_s": 212.0, "cause": "no_owner"}]
    g = {
        **_group("server-pop", 0, 0, 0, 0, 3),
        "convergence": [],
        "unavailability": {"queues": [{"queue": "b:0", "spans": spans}]},
    }
    kill = [Marker(150_000, "kill consumer-6", "k", "nemesis")]
    said = answer_for_group("P", g, RunClock(0, 1.0), kill, [])
    assert said[0].startswith(
        "P: after 'kill consumer-6' at t = 150.0 s, 1 queue(s) were unavailable for up to 62.0 s"
    )
    assert "invisible time" in said[0] and "3 revive(s)" in said[0] and "rebalance" not in said[0]
    g["mode"] = "client"  # the same wait in a classic group is a rebalance's
    assert (
        "the others' rebalance gave the queues a new owner"
        in answer_for_group("C", g, RunClock(0, 1.0), kill, [])[0]
    )


def test_a_queue_that_waits_twice_after_one_change_is_one_queue() -> None:
    """The hung POP consumer pops a message of queue 4, which waits for its revive, then another one
    (two stretches of one queue); queue 0 of the group's retry topic is another queue than b:0."""
    from rmqlab.pipeline.report_data import Marker
    from rmqlab.pipeline.report_story import answer_for_group
    from rmqlab.pipeline.unavailability import RunClock

    def queue(topic: str, name: str, *spans: tuple[float, float]) -> dict[str, Any]:
        return {
            "topic": topic,
            "queue": name,
            "spans": [{"from_s": a, "to_s": b, "cause": "no_owner"} for a, b in spans],
        }

    un = {
        "queues": [
            queue("T", "b:0", (155.0, 521.0)),
            queue("T", "b:4", (151.0, 269.8), (287.1, 509.2)),  # 17 s apart: two stretches
            queue("%RETRY%P", "b:0", (160.0, 200.0)),
        ]
    }
    g = {**_group("server-pop", 0, 0, 0, 0, 3), "convergence": [], "unavailability": un}
    hang = [Marker(150_000, "hang consumer-6", "h", "nemesis")]
    said = answer_for_group("P", g, RunClock(0, 1.0), hang, [])
    assert said[0].startswith(
        "P: after 'hang consumer-6' at t = 150.0 s, 3 queue(s) were unavailable in 4 stretches for up to "
        "366.0 s of RocketMQ time"
    )
