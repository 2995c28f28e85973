"""The shipped master-slave experiments, simulated: a failover that reads OK, #1094's stale offsets
of a master that comes back, and #2705's group that starts from the minimum offset on a slave without
its offsets. Deterministic for their seeds, so the counts are exact."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from kit.ha import SHIPPED, HaRun, lines, read_run

from rmqlab.sim.sim_cluster import SimCluster
from rmqlab.sim.sim_table import load
from rmqlab.sim.sim_table import parse as parse_sim


def simulate(tmp_path_factory: pytest.TempPathFactory, name: str, topic: str) -> HaRun:
    d = tmp_path_factory.mktemp(name)
    result = SimCluster(load(SHIPPED / f"{name}.toml"), d, out=io.StringIO(), progress=False).run()
    assert not result.errors, result.errors
    assert result.drained
    return read_run(Path(d), topic)


@pytest.fixture(scope="module")
def failover(tmp_path_factory: pytest.TempPathFactory) -> HaRun:
    return simulate(tmp_path_factory, "ha-failover", "TradeTopic")


@pytest.fixture(scope="module")
def stale(tmp_path_factory: pytest.TempPathFactory) -> HaRun:
    return simulate(tmp_path_factory, "ha-stale-master-offsets", "OrderTopic")


@pytest.fixture(scope="module")
def no_offsets(tmp_path_factory: pytest.TempPathFactory) -> HaRun:
    return simulate(tmp_path_factory, "ha-slave-without-offsets", "PayTopic")


def test_a_failover_reads_every_message_once_and_commits_to_the_slave(failover: HaRun) -> None:
    assert ("failover", "broker-a") in failover.nemeses and ("stop", "broker-a") in failover.nemeses
    assert failover.skipped == []
    assert len(failover.sent) == 300 and failover.lost == 0
    assert failover.duplicates == 0
    assert failover.slave_commits > 0  # the consumers' offsets went to the slave while the master was away


def test_a_master_back_with_old_offsets_overwrites_the_slave_and_the_restarted_group_repeats(
    stale: HaRun,
) -> None:
    assert ("pause", "broker-a") in stale.nemeses and ("resume", "broker-a") in stale.nemeses
    assert stale.lost == 0
    assert stale.slave_commits > 0
    # the slave's sync put the master's older offsets over the ones consumers committed to it
    assert stale.regressions and all(new < prev for _q, prev, new in stale.regressions)
    behind = {q: prev - new for q, prev, new in stale.regressions}
    # the restarted consumers start broker-a's queues at the master's old offsets ...
    for q, _prev, new in stale.regressions:
        assert stale.restart_offsets[("broker-a", q)] <= new
    # ... and consume again at least what lay between those and the slave's
    assert stale.duplicates_of("broker-a") >= sum(behind.values())


def test_a_slave_without_the_groups_offsets_sends_it_back_to_the_minimum_offset(no_offsets: HaRun) -> None:
    assert ("failover", "broker-a") in no_offsets.nemeses
    assert no_offsets.lost == 0
    starts = {q: off for (b, q), off in no_offsets.restart_offsets.items() if b == "broker-a"}
    assert starts and set(starts.values()) == {0}
    # every message broker-a stored before it went away is consumed again
    assert no_offsets.duplicates_of("broker-a") == no_offsets.sent_to("broker-a") > 0
    assert no_offsets.duplicates_of("broker-b") == 0


NEMESES_ON_SLAVES = """\
name = "slave-nemeses"
question = "do the process and network nemeses act on slaves?"
time_scale = 0.05
duration = 400
seed = 8

[cluster]
brokers = 1
slaves = 2

[[topics]]
name = "T"
queues = 4

[[consumers]]
group = "G"
topic = "T"
count = 1

[workload]
rate = 10
count = 100

[[nemesis]]
action = "kill"
target = "broker-a-s1"
at = 20
for = 30

[[nemesis]]
action = "pause"
target = "broker-a-s2"
at = 30
for = 20

[[nemesis]]
action = "restart"
target = "slave:next"
at = [80, 120]

[[nemesis]]
action = "blackhole"
target = "broker-a-s2"
peer = "broker-a"
at = 150
for = 50

[[nemesis]]
action = "stop"
target = "broker-a-s1"
at = 210

[[nemesis]]
action = "stop"
target = "broker-a-s2"
at = 215

[[nemesis]]
action = "failover"
target = "broker:random"
at = 220
"""


def test_process_and_network_nemeses_act_on_slaves_and_failover_needs_one_running(tmp_path: Path) -> None:
    sx = parse_sim(NEMESES_ON_SLAVES)
    result = SimCluster(sx, tmp_path, out=io.StringIO(), progress=False).run()
    assert not result.errors, result.errors
    run = read_run(tmp_path, "T")
    assert run.nemeses == [
        ("kill", "broker-a-s1"),
        ("pause", "broker-a-s2"),
        ("start", "broker-a-s1"),
        ("resume", "broker-a-s2"),
        ("stop", "broker-a-s1"),
        ("start", "broker-a-s1"),
        ("stop", "broker-a-s2"),
        ("start", "broker-a-s2"),
        ("blackhole", "broker-a-s2"),
        ("heal", "broker-a-s2"),
        ("stop", "broker-a-s1"),
        ("stop", "broker-a-s2"),
    ]
    # with both slaves down the failover is skipped, and broker-a keeps serving
    [skip] = run.skipped
    assert skip["action"] == "failover" and "no running slave" in skip["reason"]
    assert run.lost == 0
    # each slave incarnation registered with the master's name and its own id
    ids = {
        (e["node"], e["broker_id"])
        for e in lines(tmp_path, "broker-a-s*.jsonl")
        if e["event"] == "master_addr_changed"
    }
    assert {("broker-a-s1", 1), ("broker-a-s2", 2)} <= ids
    assert (tmp_path / "broker-a-s1.3.jsonl").exists()  # killed, started, restarted: three incarnations


def test_a_master_with_a_slave_fails_over_beside_a_master_without_one(tmp_path: Path) -> None:
    # broker-a has a slave and is a SYNC_MASTER; broker-b has none, so it must be a plain master whose
    # sends succeed (a SYNC_MASTER without a slave would refuse them all)
    text = (SHIPPED / "ha-failover.toml").read_text()
    text = text.replace("slaves = 1", 'slaves = { broker-a = 1 }\nbroker_role = "SYNC_MASTER"')
    assert 'target = "broker-a"' in text
    out = io.StringIO()
    result = SimCluster(parse_sim(text), tmp_path, out=out, progress=False).run()
    assert not result.errors, result.errors
    assert "starting name server and 2 broker(s) with 1 slave(s)" in out.getvalue()
    run = read_run(tmp_path, "TradeTopic")
    assert ("failover", "broker-a") in run.nemeses and run.skipped == []
    assert sorted(p.name for p in tmp_path.glob("broker-*-s*.jsonl")) == ["broker-a-s1.jsonl"]
    roles = {
        (e["node"], e["broker_role"])
        for e in lines(tmp_path, "broker-*.jsonl")
        if e["event"] == "broker_started"
    }
    assert {("broker-a", "SYNC_MASTER"), ("broker-a-s1", "SLAVE"), ("broker-b", "ASYNC_MASTER")} <= roles
    assert run.sent_to("broker-b") > 0 and run.sent_to("broker-a") > 0
    assert run.lost == 0 and run.slave_commits > 0
