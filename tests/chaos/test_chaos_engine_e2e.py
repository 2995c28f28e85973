"""An experiment on engine "apache-4.9.7" end to end: Apache's name server and two brokers (JVMs, under the
lab's supervisor), three of Apache's Java consumers and Apache's Go producer; a consumer is SIGKILLed and a
broker killed and started again. Needs the engine's jars (scripts/setup_apache_engine.sh) and the Java and
Go clients built; skipped otherwise."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from kit.chaos import events, processes_mentioning, run_experiment

from rmqlab.chaos.realclients import RealClients
from rmqlab.interop.apache.engine import EngineUnavailable, check_environment


def _missing() -> list[str]:
    out = [why for kind in ("java", "go") if (why := RealClients().missing(kind))]
    try:
        check_environment("apache-4.9.7")
    except EngineUnavailable as e:
        out.append(str(e))
    return out


pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(bool(_missing()), reason="; ".join(_missing()) or "engine and clients ready"),
]

EXPERIMENT = """\
name = "engine-e2e"
question = "does an experiment run on Apache's broker?"
time_scale = 0.5
duration = 40
seed = 4
drain_timeout = 60

[cluster]
brokers = 2
engine = "apache-4.9.7"

[[topics]]
name = "EngineTopic"
queues = 8

[[consumers]]
group = "GID_engine"
topic = "EngineTopic"
client = "java"
count = 3

[workload]
rate = 10
count = 150

[[nemesis]]
action = "kill"
target = "consumer-1"
at = 12

[[nemesis]]
action = "restart"
target = "broker-b"
mode = "kill"
down = 4
at = 20
"""


def test_java_consumers_on_apache_broker_take_a_consumer_kill_and_a_broker_restart(tmp_path: Path) -> None:
    rc, run_dir, out = run_experiment(tmp_path, EXPERIMENT)
    assert rc == 0, out
    assert "engine apache-4.9.7" in out
    assert "drained: every group consumed all 150 sent message(s)" in out
    assert processes_mentioning(str(run_dir)) == []

    files = {p.name.removesuffix(".jsonl"): events(p) for p in run_dir.glob("*.jsonl")}
    # Apache's members write only their launcher's lines; the broker-b restart is a second incarnation
    ups = [
        e["msg"]
        for f in ("broker-b", "broker-b.2")
        for e in files[f]
        if e["event"] == "log" and " up at " in e["msg"]
    ]
    assert len(ups) == 2 and all(m.startswith("Apache RocketMQ 4.9.7 broker broker-b") for m in ups)
    assert (run_dir / "engine" / "broker-b" / "store" / "commitlog").is_dir()
    sent = {e["msg_id"]: e for e in files["producer-1"] if e["event"] == "message_sent"}
    assert len(sent) == 150 and {e["broker"] for e in sent.values()} == {"broker-a", "broker-b"}
    assert {e["role"] for e in files["producer-1"]} == {"producer"}
    nemesis = [(e["action"], e["target"]) for e in files["chaos"] if e["event"] == "nemesis"]
    assert nemesis == [("kill", "consumer-1"), ("kill", "broker-b"), ("start", "broker-b")]

    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["native"]["namesrv"] == manifest["namesrv"]
    assert manifest["nodes"]["broker-b"]["incarnations"] == 2
    assert manifest["versions"]["engine"] == "apache-4.9.7"
    assert manifest["versions"]["real_clients"]["go"].startswith("rocketmq-client-go v2.")

    reference = pytest.importorskip("rmqlab.pipeline.metrics_reference")
    group = reference.summarize_run(run_dir)["groups"]["GID_engine"]
    assert group["sent"] == 150 and group["lost"] == 0, group
    kill = next(c for c in group["convergence"] if c["cause"].startswith("kill consumer-1"))
    assert kill["converged"], group["convergence"]
