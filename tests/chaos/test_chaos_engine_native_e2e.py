"""The lab's own consumers and producer on Apache RocketMQ's broker and name server, end to end: on an
engine they speak RocketMQ's remoting protocol (--protocol native). Three consumers take a batch, one is
SIGKILLed, the survivors take its queues over (orderly ones once Apache's broker let the dead client's
locks expire), and the verdict is OK. Needs a JDK and the engine's jars
(scripts/setup_apache_engine.sh); skipped with the reason otherwise."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from kit.chaos import events, processes_mentioning

from rmqlab.interop.apache.engine import EngineUnavailable, check_environment


def _missing(engine: str) -> str | None:
    try:
        check_environment(engine)
    except EngineUnavailable as e:
        return str(e)
    return None


EXPERIMENT = """\
name = "engine-native-e2e"
question = "do the lab's consumers rebalance on Apache's broker?"
time_scale = 0.5
duration = {duration}
seed = 5
drain_timeout = 60

[cluster]
brokers = 2
engine = "{engine}"

[[topics]]
name = "NativeTopic"
queues = 8

[[consumers]]
group = "GID_native"
topic = "NativeTopic"
count = 3
consume_ms = 2{orderly}

[workload]
rate = 10
count = 150

# after the clients' first route poll (30 s): Apache's brokers create the group's %RETRY% topic at its
# first heartbeat, and a client that fetched that route before both had, sees the second at that poll
[[nemesis]]
action = "kill"
target = "consumer-1"
at = 34
"""


@pytest.mark.slow
@pytest.mark.parametrize(
    ("engine", "orderly"),
    [
        pytest.param(e, o, marks=pytest.mark.skipif(bool(_missing(e)), reason=_missing(e) or "ready"))
        for e, o in (("apache-4.9.7", False), ("apache-5", False), ("apache-4.9.7", True))
    ],
)
def test_our_consumers_over_native_survive_a_kill_on_apache_broker(
    tmp_path: Path, engine: str, orderly: bool
) -> None:
    # an orderly group's survivors take the dead client's queues only once Apache's broker let its locks
    # expire (lockMaxLiveTime, 60 s scaled): the run lasts past that
    text = EXPERIMENT.format(
        engine=engine, orderly="\norderly = true" if orderly else "", duration=140 if orderly else 60
    )
    (tmp_path / "experiment.toml").write_text(text)
    proc = subprocess.run(
        [sys.executable, "-m", "rmqlab.chaos", "run", "experiment.toml", "--out", "run", "--no-analyze"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert f"engine {engine}" in out
    assert "drained: every group consumed all 150 sent message(s)" in out
    run_dir = tmp_path / "run"
    assert processes_mentioning(str(run_dir)) == []

    files = {p.name.removesuffix(".jsonl"): events(p) for p in run_dir.glob("*.jsonl")}
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["versions"]["engine"] == engine and "real_clients" not in manifest["versions"]
    sent = {e["msg_id"] for e in files["producer-1"] if e["event"] == "message_sent"}
    assert len(sent) == 150
    # the consumers' own lines, as on the emulator: rebalances, consumption, their offset commits
    for node in ("consumer-2", "consumer-3"):
        kinds = {e["event"] for e in files[node]}
        assert {"consumer_started", "rebalance", "mq_added", "message_consumed", "offset_committed"} <= kinds
    survivors = [e for n in ("consumer-2", "consumer-3") for e in files[n] if e["event"] == "rebalance"]
    assert any(len(e["cid_all"]) == 2 for e in survivors), "no survivor rebalanced without consumer-1"

    reference = pytest.importorskip("rmqlab.pipeline.metrics_reference")
    summary = reference.summarize_run(run_dir)
    group = summary["groups"]["GID_native"]
    assert group["verdict"] == "ok", group
    assert group["sent"] == 150 and group["lost"] == 0, group
    modes = {
        e["mode"] for n in ("consumer-2", "consumer-3") for e in files[n] if e["event"] == "message_consumed"
    }
    assert modes == {"ORDERLY" if orderly else "CONCURRENTLY"}
    kill = next(c for c in group["convergence"] if c["cause"].startswith("kill consumer-1"))
    assert kill["converged"], group["convergence"]
