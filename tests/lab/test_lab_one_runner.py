"""One experiment file, run on local processes (``rmq-chaos run``) and simulated (``rmq-sim run``): the same
Runner takes up the same actions, action by action, and carries out or skips the same ones."""

from __future__ import annotations

import asyncio
import io
import json
from pathlib import Path

import pytest

from rmqlab.chaos.run import ChaosRun
from rmqlab.lab.experiment import parse
from rmqlab.lab.runner import Runner
from rmqlab.sim.sim_cluster import SimCluster
from rmqlab.sim.sim_table import parse as parse_sim

EXPERIMENT = """\
name = "one-runner"
question = "Does every backend run the same schedule through the same Runner?"
time_scale = 0.05
duration = 140
seed = 7
drain_timeout = 200

[[topics]]
name = "T"
queues = 4

[[consumers]]
group = "G"
topic = "T"
count = 3
consume_ms = 1

[workload]
rate = 20
count = 60

[[nemesis]]
action = "kill"
target = "consumer-1"
at = 20

[[nemesis]]
action = "kill"
target = "consumer-1"
at = 25

[[nemesis]]
action = "start"
target = "consumer-1"
at = 40

[[nemesis]]
action = "pause"
target = "consumer-2"
at = 50
for = 20

[[nemesis]]
action = "restart"
target = "consumer-3"
at = 80

[[nemesis]]
action = "latency"
target = "consumer-2"
ms = 200
at = 90
for = 10

[[nemesis]]
action = "fault"
target = "broker-a"
code = "PULL_MESSAGE"
errors = ["2:busy"]
count = 3
at = 95

[[nemesis]]
action = "hang"
target = "consumer-3"
at = 110
"""

# (lab time, action, target, carried out): the schedule, the kill of a killed node skipped, and what the
# Runner undoes before the drain (the hung listener, the fault)
EXPECTED = [
    (20.0, "kill", "consumer-1", True),
    (25.0, "kill", "consumer-1", False),
    (40.0, "start", "consumer-1", True),
    (50.0, "pause", "consumer-2", True),
    (70.0, "resume", "consumer-2", True),
    (80.0, "restart", "consumer-3", True),
    (90.0, "latency", "consumer-2", True),
    (95.0, "fault", "broker-a", True),
    (100.0, "heal", "consumer-2", True),
    (110.0, "hang", "consumer-3", True),
    (140.0, "fault-clear", "broker-a", True),
    (140.0, "unhang", "consumer-3", True),
]


def taken_up(runner: Runner | None) -> list[tuple[float, str, str, bool]]:
    """In the order of the schedule (a start that takes longer on processes ends after a later action)."""
    assert runner is not None
    return sorted((e.step.t, e.step.action, e.step.target, e.skipped is None) for e in runner.record)


def nemeses(run_dir: Path) -> list[tuple[str, str]]:
    events = [json.loads(line) for line in (run_dir / "chaos.jsonl").read_text().splitlines()]
    return sorted((e["action"], e["target"]) for e in events if e["event"] == "nemesis")


@pytest.mark.slow
def test_processes_and_the_simulator_take_up_the_same_actions(tmp_path: Path) -> None:
    local = ChaosRun(parse(EXPERIMENT), tmp_path / "local", analyze=False, out=io.StringIO())
    result = asyncio.run(local.run())
    assert result.errors == [] and result.drained, result.errors

    simulated = SimCluster(parse_sim(EXPERIMENT), tmp_path / "sim", out=io.StringIO(), progress=False)
    sim_result = simulated.run()
    assert sim_result.errors == [] and sim_result.drained, sim_result.errors

    assert isinstance(local.runner, Runner) and isinstance(simulated.runner, Runner)
    assert taken_up(local.runner) == EXPECTED
    assert taken_up(simulated.runner) == EXPECTED
    # and each wrote the same nemesis events (the process lab its own, the simulator its own)
    assert nemeses(tmp_path / "local") == nemeses(tmp_path / "sim")
    assert len(result.skipped) == len(sim_result.skipped) == 1
