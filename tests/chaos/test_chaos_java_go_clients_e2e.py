"""Apache's Java and Go clients in one group with ours, end to end with real processes: the Java consumer
(rocketmq-client 4.9.8) is SIGKILLed and started again, the Go one (rocketmq-client-go) paused and
resumed, the Java consumer's listener hung and released. Needs the clients built
(scripts/setup_java_clients.sh, scripts/setup_go_client.sh); skipped otherwise."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from kit.chaos import events, processes_mentioning, run_experiment

from rmqlab.chaos.realclients import RealClients

_clients = RealClients()
_missing = [why for kind in ("java", "go") if (why := _clients.missing(kind))]

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(bool(_missing), reason="; ".join(_missing) or "Java and Go clients built"),
]

EXPERIMENT = """\
name = "java-go-e2e"
question = "do Apache's Java and Go clients run in the lab?"
time_scale = 0.5
duration = 40
seed = 3
drain_timeout = 60

[[topics]]
name = "JavaGoTopic"
queues = 6

[[consumers]]
group = "GID_java_go"
topic = "JavaGoTopic"

[[consumers]]
group = "GID_java_go"
topic = "JavaGoTopic"
client = "java"

[[consumers]]
group = "GID_java_go"
topic = "JavaGoTopic"
client = "go"

[workload]
rate = 10
count = 200

[[nemesis]]
action = "hang"
target = "consumer-2"
at = 6
for = 4

[[nemesis]]
action = "kill"
target = "consumer-2"
at = 14
for = 6

[[nemesis]]
action = "pause"
target = "consumer-3"
at = 16
for = 4
"""


def test_java_and_go_consumers_take_kill_restart_pause_and_hang(tmp_path: Path) -> None:
    rc, run_dir, out = run_experiment(tmp_path, EXPERIMENT)
    assert rc == 0, out
    assert "drained: every group consumed all 200 sent message(s)" in out
    assert processes_mentioning(str(run_dir)) == []

    files = {p.name.removesuffix(".jsonl"): events(p) for p in run_dir.glob("*.jsonl")}
    assert {"consumer-1", "consumer-2", "consumer-2.2", "consumer-3"} <= set(files)
    started = {n: [e for e in files[n] if e["event"] == "consumer_started"] for n in files if "consumer" in n}
    assert started["consumer-2"][0]["client"] == started["consumer-2.2"][0]["client"] == "java-4.9.8"
    assert started["consumer-3"][0]["client"].startswith("go-2.")
    assert started["consumer-2"][0]["client_id"] != started["consumer-2.2"][0]["client_id"]
    # the Java client's listener answered the hang and the release
    assert [e["event"] for e in files["consumer-2"] if e["event"].startswith("listener_")] == [
        "listener_hung",
        "listener_released",
    ]
    nemesis = [(e["action"], e["target"]) for e in files["chaos"] if e["event"] == "nemesis"]
    assert nemesis == [
        ("hang", "consumer-2"),
        ("unhang", "consumer-2"),
        ("kill", "consumer-2"),
        ("pause", "consumer-3"),
        ("start", "consumer-2"),
        ("resume", "consumer-3"),
    ]
    kill = next(e for e in files["chaos"] if e["event"] == "nemesis" and e["action"] == "kill")
    assert kill["client_id"] == started["consumer-2"][0]["client_id"]
    # Both SDKs' strategies allocated over the same members: each wrote its rebalance rounds.
    for node in ("consumer-2", "consumer-3"):
        assert any(e["event"] == "rebalance" and len(e["cid_all"]) == 3 for e in files[node]), node

    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["clients"] == {"consumer-1": "python", "consumer-2": "java", "consumer-3": "go"}
    assert manifest["versions"]["real_clients"]["java"] == "rocketmq-client 4.9.8"

    reference = pytest.importorskip("rmqlab.pipeline.metrics_reference")
    group = reference.summarize_run(run_dir)["groups"]["GID_java_go"]
    assert group["sent"] == 200 and group["lost"] == 0, group
