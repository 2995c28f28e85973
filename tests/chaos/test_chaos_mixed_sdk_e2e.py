"""The shipped mixed-sdk-kill end to end: the lab's consumers, Apache's Java, Go and C++ clients in one
group on one topic, the Java one SIGKILLed. Each SDK allocates with its own code; the run must lose
nothing, every member must consume, and just before the kill and before the teardown the members' own
allocations must split the topic's queues (every queue held by exactly one member, every member holding
one). Needs the clients built (scripts/setup_real_clients.sh); skipped otherwise, saying which is missing."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from kit.chaos import events, processes_mentioning

from rmqlab.chaos.realclients import RealClients
from rmqlab.pipeline.metrics_reference import RunModel, load_run, summarize

_clients = RealClients()
_missing = [why for kind in ("java", "go", "cpp") if (why := _clients.missing(kind))]

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(bool(_missing), reason="; ".join(_missing) or "Java, Go and C++ clients built"),
]

GROUP, TOPIC = "GID_mixed_sdk", "MixedSdkTopic"
KINDS = {
    "consumer-1": "python",
    "consumer-2": "python",
    "consumer-3": "java",
    "consumer-4": "go",
    "consumer-5": "cpp",
}


def holders(model: RunModel, at: int) -> dict[str, set[str]]:
    """queue -> the client ids holding it at ``at`` (ownership intervals of the topic)."""
    out: dict[str, set[str]] = {}
    for iv in model.intervals:
        if iv.group == GROUP and iv.topic == TOPIC and iv.start <= at < iv.end:
            out.setdefault(iv.queue, set()).add(iv.client)
    return out


def test_four_sdks_split_one_topic_before_and_after_the_java_member_is_killed(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "rmqlab.chaos", "run", "mixed-sdk-kill", "--out", "run", "--no-analyze"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    out = proc.stdout + proc.stderr
    run_dir = tmp_path / "run"
    assert proc.returncode == 0, out
    assert "drained: every group consumed all 240 sent message(s)" in out
    assert processes_mentioning(str(run_dir)) == []
    assert json.loads((run_dir / "manifest.json").read_text())["clients"] == KINDS

    files = {node: events(run_dir / f"{node}.jsonl") for node in KINDS}
    client_of = {
        node: next(e["client_id"] for e in lines if e["event"] == "consumer_started")
        for node, lines in files.items()
    }
    for node, lines in files.items():
        assert any(e["event"] == "message_consumed" for e in lines), (
            f"{node} ({KINDS[node]}) consumed nothing"
        )

    loaded, malformed = load_run(run_dir)
    group = summarize(loaded, malformed)["groups"][GROUP]
    assert (group["verdict"], group["sent"], group["lost"]) == ("ok", 240, 0), group
    assert "idle_member_ms" in group

    model = RunModel(loaded)
    kill = next(e.ts for e in loaded if e.event == "nemesis" and e.get("action") == "kill")
    # The last instant before the lab kills the clients (their rebalances after that are teardown's).
    teardown = next(e.ts for e in loaded if e.event == "teardown")
    queues = {f"broker-a:{i}" for i in range(8)}
    for at, members in ((kill - 1, set(KINDS)), (teardown - 1, set(KINDS) - {"consumer-3"})):
        held = holders(model, at)
        assert set(held) == queues, (at, held)
        assert all(len(owners) == 1 for owners in held.values()), (at, held)
        owners = {next(iter(o)) for o in held.values()}
        assert owners == {client_of[n] for n in members}, ({KINDS[n]: client_of[n] for n in members}, held)
