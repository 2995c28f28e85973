"""A small mixed experiment end to end with real processes: one of our consumers, ali-ons (JS) and
Apache's C++ client in one group over two brokers; the C++ consumer is SIGKILLed and started again, the
JS one paused and resumed. Needs the real clients (scripts/setup_real_clients.sh); skipped otherwise."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from kit.chaos import events, processes_mentioning, run_experiment

from rmqlab.chaos.realclients import RealClients

_clients = RealClients()
_missing = [why for kind in ("cpp", "js") if (why := _clients.missing(kind))]

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(bool(_missing), reason="; ".join(_missing) or "real clients installed"),
]

# The C++ consumer joins once the others hold their queues, so that it only ever gains queues (a 2.1.0
# consumer that gets back a queue it gave up stops pulling it: cpp-queue-regained).
EXPERIMENT = """\
name = "mixed-e2e"
question = "do real clients run in the lab?"
time_scale = 0.5
duration = 24
seed = 2
drain_timeout = 50

[cluster]
brokers = 2

[[topics]]
name = "MixTopic"
queues = 4

[[consumers]]
group = "GID_mix"
topic = "MixTopic"

[[consumers]]
group = "GID_mix"
topic = "MixTopic"
client = "js"

[[consumers]]
group = "GID_mix"
topic = "MixTopic"
client = "cpp"
start = 4

[workload]
rate = 20
count = 200

[[nemesis]]
action = "kill"
target = "consumer-3"
at = 10
for = 6

[[nemesis]]
action = "pause"
target = "consumer-2"
at = 12
for = 4
"""


def test_mixed_group_with_kill_restart_and_pause_of_real_clients(tmp_path: Path) -> None:
    rc, run_dir, out = run_experiment(tmp_path, EXPERIMENT)
    assert rc == 0, out
    assert "drained: every group consumed all 200 sent message(s)" in out
    assert processes_mentioning(str(run_dir)) == []

    # every process wrote its events under its own node name, the restarted C++ consumer twice
    files = {p.name.removesuffix(".jsonl"): events(p) for p in run_dir.glob("*.jsonl")}
    assert set(files) == {
        "namesrv",
        "broker-a",
        "broker-b",
        "producer-1",
        "consumer-1",
        "consumer-2",
        "consumer-3",
        "consumer-3.2",
        "chaos",
    }
    for name, evs in files.items():
        assert evs and {e["node"] for e in evs} == {name.removesuffix(".2")}, name
    started = {n: [e for e in files[n] if e["event"] == "consumer_started"] for n in files if "consumer" in n}
    assert started["consumer-2"][0]["client"] == "ali-ons-3.12.0"
    assert started["consumer-3"][0]["client"] == started["consumer-3.2"][0]["client"] == "cpp-2.1.0"
    assert started["consumer-3"][0]["client_id"] != started["consumer-3.2"][0]["client_id"]
    # the C++ client's own log is kept with the run
    assert list((run_dir / "consumer-3.client-log").glob("*_rocketmq-cpp.log*"))

    nemesis = [(e["action"], e["target"]) for e in files["chaos"] if e["event"] == "nemesis"]
    assert nemesis[:2] == [("kill", "consumer-3"), ("pause", "consumer-2")]
    assert sorted(nemesis[2:]) == [("resume", "consumer-2"), ("start", "consumer-3")]  # both at 16 s
    kill = next(e for e in files["chaos"] if e["event"] == "nemesis" and e["action"] == "kill")
    assert kill["group"] == "GID_mix" and kill["client_id"] == started["consumer-3"][0]["client_id"]
    assert max(e["ts_ms"] for e in files["consumer-3"]) <= kill["ts_ms"] + 50

    # nothing lost, and the real clients name the broker and queue each message was sent to
    sent = {e["msg_id"]: e for e in files["producer-1"] if e["event"] == "message_sent"}
    assert len(sent) == 200 and {e["broker"] for e in sent.values()} == {"broker-a", "broker-b"}
    consumed = [e for evs in files.values() for e in evs if e["event"] == "message_consumed"]
    assert set(sent) <= {e["msg_id"] for e in consumed}
    real = [e for e in consumed if e["node"] in ("consumer-2", "consumer-3")]
    assert {e["node"] for e in real} == {"consumer-2", "consumer-3"}
    assert "broker-b" in {e["broker"] for e in real}  # not only the drivers' default name
    where = ("broker", "queue_id", "queue_offset")
    for e in real:
        assert [e[k] for k in where] == [sent[e["msg_id"]][k] for k in where], e

    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["clients"] == {"consumer-1": "python", "consumer-2": "js", "consumer-3": "cpp"}
    assert {n: manifest["nodes"][n]["client"] for n in manifest["clients"]} == manifest["clients"]
    assert set(manifest["versions"]["real_clients"]) == {"cpp", "js"}
    assert manifest["native"]["namesrv"] and set(manifest["native"]["brokers"]) == {"broker-a", "broker-b"}
    assert manifest["nodes"]["consumer-3"]["incarnations"] == 2

    reference = pytest.importorskip("rmqlab.pipeline.metrics_reference")
    group = reference.summarize_run(run_dir)["groups"]["GID_mix"]
    assert group["sent"] == 200 and group["lost"] == 0, group
