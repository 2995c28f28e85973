"""A short experiment end to end with real processes: name server, two brokers, a producer, three
consumers, a SIGKILL of a consumer, a pause, added latency through the fault relay and a broker-side
request fault. The run directory must hold every process's events and a manifest, and nothing may be
left running afterwards."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from kit.chaos import events, processes_mentioning, run_experiment

EXPERIMENT = """\
name = "e2e"
question = "does the lab work end to end?"
time_scale = 0.05
duration = 200
seed = 5
drain_timeout = 300

[cluster]
brokers = 2

[[topics]]
name = "E2ETopic"
queues = 8

[[consumers]]
group = "GID_e2e"
topic = "E2ETopic"
count = 3
consume_ms = 1

[workload]
rate = 60
count = 360

[[nemesis]]
action = "kill"
target = "consumer-2"
at = 70

[[nemesis]]
action = "pause"
target = "consumer-3"
at = 30
for = 20

[[nemesis]]
action = "latency"
target = "consumer-1"
broker = "broker-b"
ms = 200
at = 20
for = 60

[[nemesis]]
action = "fault"
target = "broker-a"
code = "PULL_MESSAGE"
errors = ["2:injected busy"]
group = "GID_e2e"
count = 3
at = 100
"""


@pytest.mark.slow
def test_short_experiment_with_a_consumer_sigkill(tmp_path: Path) -> None:
    rc, run_dir, out = run_experiment(tmp_path, EXPERIMENT)
    assert rc == 0, out
    assert "drained: every group consumed all 360 sent message(s)" in out
    assert "verdict: OK" in out
    assert processes_mentioning(str(run_dir)) == []

    # every process wrote its events, under its own node name
    files = {p.name: events(p) for p in run_dir.glob("*.jsonl")}
    nodes = {
        "namesrv",
        "broker-a",
        "broker-b",
        "producer-1",
        "consumer-1",
        "consumer-2",
        "consumer-3",
        "chaos",
    }
    assert {name.removesuffix(".jsonl") for name in files} == nodes
    for name, evs in files.items():
        assert evs, name
        assert {e["node"] for e in evs} == {name.removesuffix(".jsonl")}
        assert all(isinstance(e["ts_ms"], int) and isinstance(e["event"], str) for e in evs)

    chaos = files["chaos.jsonl"]
    nemesis = [e for e in chaos if e["event"] == "nemesis"]
    assert Counter(e["action"] for e in nemesis) == Counter(
        {"kill": 1, "pause": 1, "resume": 1, "latency": 1, "heal": 1, "fault": 1, "fault-clear": 1}
    )
    [kill] = [e for e in nemesis if e["action"] == "kill"]
    assert (kill["target"], kill["target_role"], kill["group"]) == ("consumer-2", "consumer", "GID_e2e")
    assert all(e["role"] == "chaos" for e in chaos)

    # the killed consumer never shut down gracefully and wrote nothing after the kill
    victim = files["consumer-2.jsonl"]
    assert any(e["event"] == "consumer_started" for e in victim)
    assert not any(e["event"] == "consumer_stopped" for e in victim)
    assert max(e["ts_ms"] for e in victim) <= kill["ts_ms"] + 50
    # the run ended by killing the clients without nemesis events (no change points of its own)
    assert [e["event"] for e in chaos if e["event"].startswith("teardown")] == [
        "teardown",
        "teardown_clients_killed",
    ]

    # nothing lost: every acknowledged send was consumed by the group
    sent = {e["msg_id"] for e in files["producer-1.jsonl"] if e["event"] == "message_sent"}
    consumed = {
        e["msg_id"]
        for f in ("consumer-1", "consumer-2", "consumer-3")
        for e in files[f + ".jsonl"]
        if e["event"] == "message_consumed"
    }
    assert len(sent) == 360 and sent <= consumed

    # the fault reached the broker, the latency went through consumer-1's own relay
    [fault] = [e for e in nemesis if e["action"] == "fault"]
    assert isinstance(fault["fault_id"], int) and fault["request_code"] == 11
    assert any(e["event"] == "fault_injected" for e in files["broker-a.jsonl"])
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["nodes"]["consumer-2"]["role"] == "consumer"
    assert manifest["nodes"]["consumer-2"]["group"] == "GID_e2e"
    assert manifest["nodes"]["consumer-2"]["returncode"] == -9
    assert manifest["seed"] == 5 and manifest["drained"] is True
    assert set(manifest["ports"]) == {"namesrv", "broker-a", "broker-b"}
    relays = manifest["nodes"]["consumer-1"]["relays"]
    assert relays["brokers"]["broker-b"]["accepted"] >= 1 and relays["namesrv"]["accepted"] >= 1
    assert "relays" not in manifest["nodes"]["consumer-3"]
    for info in manifest["nodes"].values():  # the manifest names files that are there
        for rel in [*info["log_files"], info["out_file"]]:
            assert (run_dir / rel).is_file(), rel
    assert not (run_dir / "run").exists()

    # and the analysis' own definitions (EVENTS.md, plain-Python reference) find nothing wrong
    reference = pytest.importorskip("rmqlab.pipeline.metrics_reference")
    summary = reference.summarize_run(run_dir)
    group = summary["groups"]["GID_e2e"]
    assert group["lost"] == 0 and group["sent"] == 360
    assert [c["cause"] for c in group["convergence"] if "kill" in c["cause"]] == ["kill consumer-2"]
    assert group["verdict"] == "ok", group


@pytest.mark.slow
def test_ctrl_c_stops_the_whole_cluster(tmp_path: Path) -> None:
    exp_file = tmp_path / "e2e.toml"
    exp_file.write_text(EXPERIMENT.replace("duration = 200", "duration = 2000"))
    run_dir = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "rmqlab.chaos", "run", str(exp_file), "--out", str(run_dir), "--no-analyze"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith("running for"):
                break
        assert len(processes_mentioning(str(run_dir))) >= 7  # name server, brokers, consumers, producer
        proc.send_signal(signal.SIGINT)
        rest = proc.communicate(timeout=60)[0]
        assert proc.returncode == 130, rest
        assert "interrupted: stopping the cluster" in rest
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert processes_mentioning(str(run_dir)) == []
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["interrupted"] is True
