"""rmq-chaos list/validate, the shipped experiments, and the live tally behind the progress line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rmqlab.chaos.__main__ import main, resolve
from rmqlab.cli import CHAOS_SHELVES, shipped
from rmqlab.lab.experiment import ExperimentError
from rmqlab.lab.tally import LogTailer, RunTally, progress_line

EXPECTED_SHIPPED = {
    "demo",
    "kill-one-of-four",
    "kill-orderly-consumer",
    "kill-orderly-consumer-release-locks",
    "pause-past-channel-expiry",
    "pause-past-channel-expiry-notify",
    "rolling-restart",
    "seed-different-subscriptions",
    "churn-avg",
    "churn-consistent-hash",
    "broker-kill-restart-durable",
    "broker-kill-restart-offset-flush",
    "network-partition",
    "latency-5s-one-consumer",
    "broker-pull-errors",
}


def test_every_shipped_experiment_is_valid_and_asks_a_question() -> None:
    texts = shipped(CHAOS_SHELVES)
    assert set(texts) >= EXPECTED_SHIPPED
    for name in texts:
        exp = resolve(name)
        assert exp.name == name
        assert exp.question.endswith("?") or "?" in exp.question, name
        assert exp.schedule() or name.endswith("seed-different-subscriptions"), f"{name} breaks nothing"


def test_demo_has_the_promised_shape() -> None:
    exp = resolve("demo")
    assert (
        len(exp.brokers) == 2 and exp.topics[0].queues == 16 and exp.topic_queues_per_broker("DemoTopic") == 8
    )
    assert sum(c.count for c in exp.consumers) == 4
    actions = [(s.action, s.target) for s in exp.schedule()]
    assert ("kill", "consumer-2") in actions and ("pause", "consumer-3") in actions
    assert ("resume", "consumer-3") in actions and ("restart", "consumer-4") in actions
    assert 30 <= exp.wall(exp.duration) <= 60


def test_policy_variants_differ_only_by_their_policy() -> None:
    base, variant = resolve("kill-orderly-consumer"), resolve("kill-orderly-consumer-release-locks")
    assert not base.policies.release_locks_on_close and variant.policies.release_locks_on_close
    assert base.schedule() == variant.schedule() and base.consumers == variant.consumers
    a, b = resolve("churn-avg"), resolve("churn-consistent-hash")
    assert [(s.t, s.target) for s in a.schedule()] == [(s.t, s.target) for s in b.schedule()]
    assert {c.strategy for c in a.consumers} == {"AVG"} and {c.strategy for c in b.consumers} == {
        "CONSISTENT_HASH"
    }


def test_list_prints_every_experiment(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    for name in EXPECTED_SHIPPED:
        assert name in out
    assert "INVALID" not in out


def test_validate_prints_schedule_and_rejects_bad_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["validate", "demo"]) == 0
    out = capsys.readouterr().out
    assert "kill consumer-2" in out and "wall" in out
    bad = tmp_path / "bad.toml"
    bad.write_text('duration = 10\n[[topics]]\nname = "T"\nqueues = 4\n[[nemesis]]\naction = "kil"\n')
    assert main(["validate", str(bad)]) == 2
    err = capsys.readouterr().err
    assert f"{bad}:6: nemesis[1].action: must be one of" in err


def test_validate_warns_of_each_action_the_schedule_leaves_nothing_to_act_on(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = resolve("kill-one-of-four").text
    f = tmp_path / "twice.toml"
    nemeses = '\n[[nemesis]]\naction = "resume"\ntarget = "consumer-1"\nat = [160]\n'
    f.write_text(text.replace("at = 150", "at = [150, 170]") + nemeses)
    assert main(["validate", str(f)]) == 0
    warnings = [line for line in capsys.readouterr().out.splitlines() if line.startswith("warning:")]
    assert warnings == [
        "warning: 160s resume consumer-1: the schedule before it leaves consumer-1 running, so the runner "
        "will skip it",
        "warning: 170s kill consumer-2: the schedule before it leaves consumer-2 down, so the runner will "
        "skip it",
    ]
    assert main(["validate", "kill-one-of-four"]) == 0
    assert "warning" not in capsys.readouterr().out


def test_run_refuses_a_bad_file_before_starting_anything(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("duration = -1\n")
    out = tmp_path / "run"
    assert main(["run", str(bad), "--out", str(out), "--no-analyze"]) == 2
    assert "duration: must be > 0" in capsys.readouterr().err
    assert not out.exists()


def test_run_refuses_a_directory_holding_logs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "x.jsonl").write_text("{}\n")
    assert main(["run", "demo", "--out", str(tmp_path), "--no-analyze"]) == 2
    assert "already holds a run" in capsys.readouterr().err


def test_missing_file_is_reported() -> None:
    with pytest.raises(ExperimentError, match="cannot read the file"):
        resolve("no-such-experiment.toml")


def test_an_unknown_experiment_name_lists_what_exists_and_suggests_the_nearest() -> None:
    with pytest.raises(ExperimentError) as info:
        resolve("kill-one-of-for")
    text = str(info.value)
    assert "no experiment file or shipped experiment named 'kill-one-of-for'" in text
    assert "did you mean 'kill-one-of-four'" in text  # the nearest first
    assert "demo" in text.split("(shipped: ")[1]


def test_tailer_reads_complete_lines_only_and_skips_hidden_files(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "_spark").mkdir()
    a = tmp_path / "sub" / "producer-1.jsonl"
    a.write_text('{"event": "message_sent", "topic": "T", "msg_id": "m1"}\n{"event": "message_se')
    (tmp_path / "_spark" / "x.jsonl").write_text('{"event": "message_sent", "topic": "T", "msg_id": "zz"}\n')
    (tmp_path / ".hidden.jsonl").write_text('{"event": "message_sent", "topic": "T", "msg_id": "zz"}\n')
    t = LogTailer(tmp_path)
    assert [e["msg_id"] for e in t.poll()] == ["m1"]
    with a.open("a") as f:
        f.write('nt", "topic": "T", "msg_id": "m2"}\nnot json\n[1]\n')
    assert [e["msg_id"] for e in t.poll()] == ["m2"]
    assert t.malformed == 2
    assert t.poll() == []


def test_tally_counts_and_drain_condition() -> None:
    tally = RunTally({"g1": {"T"}, "g2": {"U"}})
    sent = [{"event": "message_sent", "topic": "T", "msg_id": f"m{i}"} for i in range(3)]
    tally.feed(sent)
    assert tally.sent_total == 3 and not tally.drained()
    assert tally.missing() == {"g1": 3, "g2": 0}
    consumed = [
        {"event": "message_consumed", "group": "g1", "topic": "T", "msg_id": m} for m in ("m0", "m1", "m1")
    ]
    tally.feed([*consumed, {"event": "consumer_started", "group": "g1", "client_id": "c1"}])
    assert tally.groups["g1"].duplicates == 1 and tally.missing()["g1"] == 1
    tally.feed([{"event": "message_consumed", "group": "g1", "topic": "T", "msg_id": "m2"}])
    assert tally.drained()
    tally.feed([{"event": "nemesis", "action": "kill", "target": "consumer-1", "client_id": "c1"}])
    line = progress_line(12.34, 60, tally, (3, 1, 4), time_scale=0.05)
    assert line.startswith("[t=  247s/1200s   12.3s/60.0s wall run]")
    assert "sent 3" in line and "g1 3 (+1 dup)" in line and "consumers 3/4 (1 paused)" in line
    assert "last: kill consumer-1" in line
    assert tally.groups["g1"].live_clients == set()
    assert json.dumps(tally.summary())


def test_validate_names_each_masters_slaves(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", "ha-failover-java"]) == 0
    assert "  slaves: broker-a 1, broker-b 0 (ASYNC_MASTER)\n" in capsys.readouterr().out
    assert main(["validate", "demo"]) == 0
    assert "slaves:" not in capsys.readouterr().out
