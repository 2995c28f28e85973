"""``rmq-sim shrink``: a failing simulated run shrinks to a smaller experiment file that still fails the
same check when run again; the search keeps what the failure needs; a run that passed or is not a
simulated run is said so."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

from rmqlab.lab import experiment as lab_experiment
from rmqlab.sim.shrink import Shrinker, failing_kinds, size
from rmqlab.sim.sim_table import SimExperiment, load
from tests.sim.test_sim_cli import rmq_sim

# The seed articles' mistake (members of one group subscribing to different topics loses messages)
# under churn that has nothing to do with it: the shrinker should find the churn unnecessary.
MIXED = """\
name = "mixed-subscriptions-churn"
time_scale = 0.05
duration = 300
seed = 7
drain_timeout = 100

[cluster]
brokers = 1

[[topics]]
name = "TopicA"
queues = 8

[[topics]]
name = "TopicB"
queues = 8

[[consumers]]
group = "GID_mixed"
topic = "TopicA"
count = 3

[[consumers]]
group = "GID_mixed"
topic = "TopicB"
count = 3

[workload]
rate = 20
count = 400

[[nemesis]]
action = "pause"
target = "consumer-1"
at = 40
for = 10

[[nemesis]]
action = "kill"
target = "consumer-2"
at = 80

[[nemesis]]
action = "restart"
target = "consumer-5"
at = 120
"""


def test_a_failing_run_shrinks_to_a_smaller_file_that_still_fails(tmp_path: Path) -> None:
    (tmp_path / "mixed.toml").write_text(MIXED)
    r = rmq_sim("run", "mixed.toml", "--out", "run", "--no-analyze", "--quiet", cwd=tmp_path)
    assert r.returncode == 1, r.stdout + r.stderr
    r = rmq_sim("shrink", "run", "--reason", "orderly", cwd=tmp_path)
    assert r.returncode == 2 and "no group fails the orderly check (failing: GID_mixed: lost" in r.stderr
    r = rmq_sim("shrink", "run", "--out", "small.toml", cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "group GID_mixed fails the lost check" in r.stdout
    assert "candidate 1: consumers 5, actions 3" in r.stdout
    assert "rmq-sim run small.toml" in r.stdout and "rmq-chaos run small.toml" in r.stdout

    small = tomllib.loads((tmp_path / "small.toml").read_text())
    before = size(tomllib.loads(MIXED))
    after = size(small)
    assert after["actions"] == 0  # the churn is not needed to lose messages
    assert after["consumers"] < before["consumers"] and after["duration"] < before["duration"]
    assert after["queues"] < before["queues"] and after["messages"] < before["messages"]
    assert small["seed"] == 7 and small["name"] == "mixed-subscriptions-churn-shrunk"
    # both tools load the file
    load(tmp_path / "small.toml")
    lab_experiment.load(tmp_path / "small.toml")
    # and run again it fails the same check
    r = rmq_sim("run", "small.toml", "--out", "again", "--no-analyze", "--quiet", cwd=tmp_path)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "lost" in failing_kinds(tmp_path / "again")["GID_mixed"]


def test_a_run_that_passed_has_nothing_to_shrink(tmp_path: Path) -> None:
    # one topic for the whole group and no churn: nothing is lost
    text = MIXED.split("[[nemesis]]")[0].replace('topic = "TopicB"', 'topic = "TopicA"')
    (tmp_path / "ok.toml").write_text(text)
    r = rmq_sim("run", "ok.toml", "--out", "run", "--no-analyze", "--quiet", cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    r = rmq_sim("shrink", "run", cwd=tmp_path)
    assert r.returncode == 1 and "did not fail: nothing to shrink" in r.stderr
    assert not (tmp_path / "run-shrunk.toml").exists()


def test_shrink_refuses_what_is_not_a_simulated_run(tmp_path: Path) -> None:
    r = rmq_sim("shrink", "missing", cwd=tmp_path)
    assert r.returncode == 2 and "is not a directory" in r.stderr
    real = tmp_path / "real"
    real.mkdir()
    (real / "manifest.json").write_text(json.dumps({"name": "demo", "seed": 1}))
    r = rmq_sim("shrink", "real", cwd=tmp_path)
    assert r.returncode == 2 and "is not a simulated run" in r.stderr and "shrunk" in r.stderr
    r = rmq_sim("shrink", "real", "--budget", "0", cwd=tmp_path)
    assert r.returncode == 2 and "the budget must be a number of candidates >= 1" in r.stderr


# The search itself, with a stand-in for the simulation: the failure needs the kill of consumer-2 and
# at least two consumers; everything else is noise.
def needs_the_kill(sx: SimExperiment) -> tuple[dict[str, set[str]], str | None]:
    kill = any(n.action == "kill" and n.target == "consumer-2" for n in sx.exp.nemeses)
    enough = sum(c.count for c in sx.exp.consumers) >= 2
    return ({"GID_mixed": {"not-converged"}} if kill and enough else {}), None


GC = """
[[sim.gc]]
target = "consumer:random"
every = 30
pause_s = 2
"""


def shrinker(budget: int = 200, lines: list[str] | None = None) -> Shrinker:
    return Shrinker(
        tomllib.loads(MIXED + GC),
        seed=7,
        group="GID_mixed",
        kind="not-converged",
        origin="test",
        budget=budget,
        say=(lines if lines is not None else []).append,
        run_candidate=needs_the_kill,
    )


def test_the_search_keeps_the_needed_action_and_cuts_the_tail_after_it() -> None:
    s = shrinker()
    doc = s.run()
    assert doc["nemesis"] == [{"action": "kill", "target": "consumer-2", "at": 80}]
    assert "sim" not in doc  # the GC pauses went too, and the emptied [sim] table with them
    # consumer-2 must exist: two consumers of one entry (the first entry goes, then TopicA no one reads)
    assert doc["consumers"] == [{"group": "GID_mixed", "topic": "TopicB", "count": 2}]
    assert doc["topics"] == [{"name": "TopicB", "queues": 1}] and doc["workload"]["count"] == 1
    # one rebalance interval (20 s) after the kill
    assert doc["duration"] == 100
    assert s.kept > 0 and s.candidates < 200


def test_the_budget_bounds_the_candidates_and_each_is_reported() -> None:
    lines: list[str] = []
    s = shrinker(budget=3, lines=lines)
    s.run()
    assert s.candidates == 3
    assert [line.split(":")[0] for line in lines] == ["candidate 1", "candidate 2", "candidate 3"]


@pytest.mark.parametrize("kind", ["lost", "orderly"])
def test_a_candidate_failing_another_check_is_not_kept(kind: str) -> None:
    s = shrinker()
    s.run_candidate = lambda sx: ({"GID_mixed": {kind}}, None)
    doc = s.run()
    assert doc == tomllib.loads(MIXED + GC)
    assert s.kept == 0
