"""Nemesis steps as the Runner carries them out on local processes, against a cluster whose nodes are only
declared."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from rmqlab.chaos.process_cluster import LocalCluster
from rmqlab.lab.experiment import parse
from rmqlab.lab.runner import Console, Runner, RunResult

EXPERIMENT = """\
name = "t"
time_scale = 0.05
duration = 300
[cluster]
brokers = 1
[[topics]]
name = "T"
queues = 4
[[consumers]]
group = "G"
topic = "T"
count = 1
[[nemesis]]
action = "fault"
target = "broker-a"
code = "PULL_MESSAGE"
errors = ["2:busy"]
at = 100
[[nemesis]]
action = "policy"
target = "broker-a"
release_locks_on_close = true
at = 110
"""


class EventRecorder:
    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []

    def emit(self, event: str, **fields: Any) -> None:
        self.events.append({"event": event, **fields})


class RecordingAdmin:
    def __init__(self) -> None:
        self.calls: list[str] = []

    async def fault_add(self, *args: Any, **kw: Any) -> int:
        self.calls.append("fault_add")
        return 1

    async def policy_set(self, *args: Any, **kw: Any) -> None:
        self.calls.append("policy_set")


async def test_broker_actions_on_a_broker_that_is_not_running_are_skipped_without_a_request(
    tmp_path: Path,
) -> None:
    exp = parse(EXPERIMENT)
    out = io.StringIO()
    cluster = LocalCluster(tmp_path / "run", time_scale=exp.time_scale)
    admin = RecordingAdmin()
    cluster.admin = admin  # type: ignore[assignment]
    cluster.add_broker("broker-a")
    cluster.brokers["broker-a"] = "10.9.0.11:10911"  # where it was before it was killed
    cluster.sup.member("broker-a").state = "exited"
    events = EventRecorder()
    runner = Runner(exp, cluster, events, RunResult(tmp_path / "run"), console=Console(out))
    try:
        for step in exp.schedule():
            await runner.execute(step)
        assert admin.calls == []
        assert [s.split(": ", 1)[1] for s in runner.result.skipped] == [
            "broker-a is not running (exited)",
            "broker-a is not running (exited)",
        ]
        assert [e["event"] for e in events.events] == ["nemesis_skipped", "nemesis_skipped"]
        cluster.sup.member("broker-a").state = "running"
        await runner.execute(exp.schedule()[1])
        assert admin.calls == ["policy_set"]
        assert events.events[-1] == {
            "event": "nemesis",
            "action": "policy",
            "target": "broker-a",
            "target_role": "broker",
            "release_locks_on_close": True,
        }
    finally:
        cluster.sup.close()
