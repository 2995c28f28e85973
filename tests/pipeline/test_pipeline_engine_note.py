"""A run on an Apache engine says, last in its answer, which broker-side figures its broker cannot give
(the manifest's ``versions.engine``); the emulator's runs say nothing of it."""

from __future__ import annotations

import json
from pathlib import Path

from rmqlab.pipeline.discover import discover_runs
from rmqlab.pipeline.report_story import manifest_engine
from rmqlab.pipeline.small_runs import analyse_run


def _run(root: Path, versions: dict[str, str]) -> Path:
    run = root / "run"
    run.mkdir(parents=True)
    (run / "manifest.json").write_text(json.dumps({"name": "x", "versions": versions}))
    lines = [
        {
            "event": "message_sent",
            "node": "producer-1",
            "role": "producer",
            "ts_ms": 1000,
            "msg_id": "m1",
            "topic": "T",
            "broker": "broker-a",
            "queue_id": 0,
            "queue_offset": 0,
        },
        {
            "event": "message_consumed",
            "node": "consumer-1",
            "role": "consumer",
            "ts_ms": 1010,
            "group": "g",
            "client_id": "c1",
            "msg_id": "m1",
            "topic": "T",
            "broker": "broker-a",
            "queue_id": 0,
            "queue_offset": 0,
            "started_ms": 1005,
            "mode": "CONCURRENTLY",
        },
    ]
    (run / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in lines))
    return root


def test_manifest_engine_reads_the_engine_of_apache_runs_only() -> None:
    assert manifest_engine({"versions": {"engine": "apache-5"}}) == "apache-5"
    assert manifest_engine({"versions": {"lab": "0.1.0"}}) is None
    assert manifest_engine({"versions": {"engine": "emulator"}}) is None
    assert manifest_engine("not a map") is None


def test_an_engine_run_names_the_missing_broker_figures_last(tmp_path: Path) -> None:
    [run], _ = discover_runs(_run(tmp_path / "a", {"engine": "apache-4.9.7"}))
    summary, _ = analyse_run(run, True)
    last = summary["answer"][-1]
    assert last.startswith("The name server and brokers of this run were Apache RocketMQ's own")
    assert "engine apache-4.9.7" in last and "consumer_registered" in last
    [run], _ = discover_runs(_run(tmp_path / "b", {"lab": "0.1.0"}))
    summary, _ = analyse_run(run, True)
    assert not any("Apache RocketMQ's own" in s for s in summary["answer"])
