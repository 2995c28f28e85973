"""Master-slave experiment files: [cluster] slaves and its keys, the slave nodes, the failover action,
and the file:line errors that stop a run before anything starts."""

from __future__ import annotations

import pytest
from kit.chaos import line_of, problems

from rmqlab.lab import experiment as ex
from rmqlab.lab.schedule import unfit_steps

BASE = """\
name = "t"
duration = 300
seed = 3

[cluster]
brokers = 2
slaves = 1

[[topics]]
name = "T"
queues = 8

[[consumers]]
group = "g"
topic = "T"
count = 2

[workload]
rate = 10
count = 100
"""


def test_slaves_are_nodes_named_after_their_master_with_their_broker_id() -> None:
    e = ex.parse(BASE.replace("slaves = 1", "slaves = 2"))
    assert e.slave_nodes() == ("broker-a-s1", "broker-a-s2", "broker-b-s1", "broker-b-s2")
    assert e.slave_nodes("broker-b") == ("broker-b-s1", "broker-b-s2")
    nodes = e.nodes()
    assert nodes["broker-a-s2"].role == "slave" and nodes["broker-a"].role == "broker"
    assert ex.slave_of("broker-b-s2") == ("broker-b", 2)
    assert ex.parse(BASE.replace("slaves = 1", "slaves = 0")).slave_nodes() == ()


def test_master_and_slave_flags_carry_role_lag_and_slave_read() -> None:
    text = BASE.replace(
        "slaves = 1",
        'slaves = 1\nbroker_role = "SYNC_MASTER"\nreplication_lag_ms = 2000\nslave_read_enable = true',
    )
    e = ex.parse(text.replace('name = "t"', 'name = "t"\ntime_scale = 0.5'))
    assert e.broker_flags() == ["--broker-role", "SYNC_MASTER", "--slave-read-enable"]
    flags = e.slave_flags("broker-b-s1")
    assert flags == [
        "--broker-id",
        "1",
        "--broker-role",
        "SLAVE",
        "--ha-replication-lag-ms",
        "2000",  # RocketMQ time: the broker scales it like every timer
        "--slave-read-enable",
    ]
    d = e.to_dict()
    assert (
        d["slaves"] == 1
        and d["broker_role"] == "SYNC_MASTER"
        and d["slave_nodes"]
        == [
            "broker-a-s1",
            "broker-b-s1",
        ]
    )
    # without slaves a broker is a plain master, as before
    assert ex.parse(BASE.replace("slaves = 1", "slaves = 0")).broker_flags() == []


@pytest.mark.parametrize("value", ["-1", "1.5", '"2"', "true", "9"])
def test_a_slave_count_that_is_not_a_non_negative_integer_is_refused_at_its_line(value: str) -> None:
    text = BASE.replace("slaves = 1", f"slaves = {value}")
    [(line, msg)] = problems(text)
    assert line == line_of(text, "slaves =")
    assert msg.startswith("cluster.slaves: must be")


def test_master_slave_keys_without_slaves_are_refused() -> None:
    text = BASE.replace("slaves = 1", 'broker_role = "SYNC_MASTER"')
    [(line, msg)] = problems(text)
    assert line == line_of(text, "broker_role")
    assert "needs slaves >= 1" in msg
    bad_role = BASE.replace("slaves = 1", 'slaves = 1\nbroker_role = "SLAVE"')
    [(line, msg)] = problems(bad_role)
    assert line == line_of(bad_role, "broker_role") and "ASYNC_MASTER, SYNC_MASTER" in msg


def test_a_nemesis_on_a_slave_that_does_not_exist_is_refused_at_its_target() -> None:
    text = BASE + '\n[[nemesis]]\naction = "kill"\ntarget = "broker-a-s2"\nat = 10\n'
    [(line, msg)] = problems(text)
    assert line == line_of(text, 'target = "broker-a-s2"')
    assert "no slave 'broker-a-s2': broker-a has 1 slave(s)" in msg
    no_slaves = BASE.replace("slaves = 1", "slaves = 0") + (
        '\n[[nemesis]]\naction = "pause"\ntarget = "slave:random"\nat = 10\n'
    )
    [(line, msg)] = problems(no_slaves)
    assert line == line_of(no_slaves, 'target = "slave:random"') and "no node matches" in msg


def test_failover_needs_a_slave_and_a_master() -> None:
    nemesis = '\n[[nemesis]]\naction = "failover"\ntarget = "{t}"\nat = 10\n'
    text = BASE.replace("slaves = 1", "slaves = 0") + nemesis.format(t="broker-a")
    [(line, msg)] = problems(text)
    assert line == line_of(text, "[[nemesis]]")
    assert "give [cluster] slaves >= 1" in msg
    on_slave = BASE + nemesis.format(t="broker-a-s1")
    [(line, msg)] = problems(on_slave)
    assert line == line_of(on_slave, 'target = "broker-a-s1"') and "acts on a master" in msg


def test_broker_random_picks_masters_and_slave_random_slaves() -> None:
    text = BASE + (
        '\n[[nemesis]]\naction = "failover"\ntarget = "broker:random"\nevery = 30\ntimes = 4\nfor = 10\n'
        '\n[[nemesis]]\naction = "kill"\ntarget = "slave:next"\nat = [200, 250]\n'
    )
    steps = ex.parse(text).schedule()
    failovers = [s for s in steps if s.action == "failover"]
    assert len(failovers) == 4 and {s.target for s in failovers} <= {"broker-a", "broker-b"}
    starts = [s for s in steps if s.action == "start"]
    assert [(s.t, s.target) for s in starts] == [(f.t + 10, f.target) for f in failovers]
    kills = [s.target for s in steps if s.action == "kill"]
    assert kills == ["broker-a-s1", "broker-b-s1"]
    assert unfit_steps(steps) == []


def test_failover_of_a_master_that_is_down_is_an_unfit_step() -> None:
    text = BASE + (
        '\n[[nemesis]]\naction = "kill"\ntarget = "broker-a"\nat = 10\n'
        '\n[[nemesis]]\naction = "failover"\ntarget = "broker-a"\nat = 20\nmode = "kill"\n'
    )
    steps = ex.parse(text).schedule()
    assert steps[1].params == {"mode": "kill"}
    [(step, state)] = unfit_steps(steps)
    assert step.action == "failover" and state == "down"


def test_an_apache_engine_runs_masters_only() -> None:
    text = BASE.replace("slaves = 1", 'slaves = 1\nengine = "apache-4.9.7"').replace(
        "count = 2\n", 'count = 2\nclient = "java"\n', 1
    )
    found = problems(text)
    assert (
        line_of(text, "slaves = 1"),
        "cluster.slaves: the lab runs engine 'apache-4.9.7' with masters only (slaves are the emulator's)",
    ) in found
