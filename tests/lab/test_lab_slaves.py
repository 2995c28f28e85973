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
    assert line == line_of(bad_role, "broker_role") and msg.endswith("use ASYNC_MASTER or SYNC_MASTER")


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


def test_apache_5_runs_masters_only() -> None:
    text = BASE.replace("slaves = 1", 'slaves = 1\nengine = "apache-5"').replace(
        "count = 2\n", 'count = 2\nclient = "java"\n', 1
    )
    found = problems(text)
    assert (
        line_of(text, "slaves = 1"),
        "cluster.slaves: the lab runs engine 'apache-5' with masters only (master-slave runs on emulator, "
        "apache-4.9.7)",
    ) in found
    # 4.9 runs master-slave (tests/chaos/test_chaos_engine_slaves.py)
    four = text.replace("apache-5", "apache-4.9.7")
    assert ex.parse(four).slave_nodes() == ("broker-a-s1", "broker-b-s1")


PER_MASTER = BASE.replace("slaves = 1", "slaves = { broker-a = 2 }")


@pytest.mark.parametrize(
    "form",
    [
        "slaves = { broker-a = 2 }",
        "slaves = { broker-a = 2, broker-b = 0 }",
        "[cluster.slaves]\nbroker-a = 2",
    ],
)
def test_a_per_master_slave_count_gives_slaves_to_the_masters_it_names_only(form: str) -> None:
    text = BASE.replace("slaves = 1", form)
    if form.startswith("[cluster.slaves]"):  # a table of its own: after [cluster]'s keys
        text = BASE.replace("slaves = 1\n", "").replace("\n[[topics]]", f"\n{form}\n\n[[topics]]", 1)
    e = ex.parse(text)
    assert e.slave_nodes() == ("broker-a-s1", "broker-a-s2")
    assert (e.slave_count("broker-a"), e.slave_count("broker-b")) == (2, 0)
    assert e.has_slaves and e.nodes()["broker-a-s2"].role == "slave" and "broker-b-s1" not in e.nodes()
    assert e.to_dict()["broker_slaves"] == {"broker-a": 2, "broker-b": 0}


def test_only_a_master_with_slaves_takes_the_masters_role() -> None:
    e = ex.parse(PER_MASTER.replace("{ broker-a = 2 }", '{ broker-a = 1 }\nbroker_role = "SYNC_MASTER"'))
    assert e.broker_flags("broker-a") == ["--broker-role", "SYNC_MASTER"]
    # a SYNC_MASTER without a slave would answer every send SLAVE_NOT_AVAILABLE: broker-b is a plain master
    assert e.broker_flags("broker-b") == []
    assert ex.parse(BASE).broker_flags("broker-b") == ["--broker-role", "ASYNC_MASTER"]


@pytest.mark.parametrize(
    ("key", "expected"),
    [
        (
            "broker-a-s1",
            "cluster.slaves.broker-a-s1: broker-a-s1 is not a master but a slave (brokerId 1 of broker-a)",
        ),
        (
            "broker-c",
            "cluster.slaves.broker-c: no master 'broker-c': the masters of this cluster are broker-a, "
            "broker-b ([cluster] brokers = 2)",
        ),
    ],
)
def test_slaves_on_a_broker_that_is_not_a_master_are_refused_at_its_line(key: str, expected: str) -> None:
    text = BASE.replace("slaves = 1", f"slaves = {{ broker-a = 1, {key} = 1 }}")
    [(line, msg)] = problems(text)
    assert line == line_of(text, "slaves =")
    assert msg.startswith(expected)
    table = BASE.replace("slaves = 1\n", "").replace(
        "\n[[topics]]", f"\n[cluster.slaves]\nbroker-a = 1\n{key} = 1\n\n[[topics]]", 1
    )
    [(line, msg)] = problems(table)
    assert line == line_of(table, f"{key} = 1") and msg.startswith(expected)


def test_masters_given_the_slave_role_are_refused() -> None:
    text = PER_MASTER.replace("{ broker-a = 2 }", '{ broker-a = 2 }\nbroker_role = "SLAVE"')
    [(line, msg)] = problems(text)
    assert line == line_of(text, "broker_role")
    assert msg.startswith(
        "cluster.broker_role: is the masters' brokerRole, and 'SLAVE' would leave the slaves"
    )


@pytest.mark.parametrize("value", ["-1", "1.5", '"2"', "true", "9", "{ x = 1 }"])
def test_a_per_master_count_that_is_not_a_non_negative_integer_is_refused_at_its_line(value: str) -> None:
    text = BASE.replace("slaves = 1", f"slaves = {{ broker-b = {value} }}")
    found = problems(text)
    assert found and all(line == line_of(text, "slaves =") for line, _ in found)
    assert found[0][1].startswith("cluster.slaves.broker-b: must be")


def test_failover_of_a_master_without_slaves_is_refused() -> None:
    nemesis = '\n[[nemesis]]\naction = "failover"\ntarget = "{t}"\nat = 10\n'
    text = PER_MASTER + nemesis.format(t="broker-b")
    [(line, msg)] = problems(text)
    assert line == line_of(text, 'target = "broker-b"')
    assert msg == (
        "nemesis[1].target: 'failover' switches a master to its slave, and broker-b has none "
        "([cluster] slaves = { broker-a = 2 }): target broker-a"
    )
    # a selector that may pick it is refused too; broker-a alone is fine
    any_master = PER_MASTER + nemesis.format(t="broker:random")
    [(line, msg)] = problems(any_master)
    assert line == line_of(any_master, 'target = "broker:random"') and "broker-b has none" in msg
    assert ex.parse(PER_MASTER + nemesis.format(t="broker-a")).nemeses[0].target == "broker-a"
    # a slave of the master without slaves names its count
    kill = PER_MASTER + '\n[[nemesis]]\naction = "kill"\ntarget = "broker-b-s1"\nat = 10\n'
    [(line, msg)] = problems(kill)
    assert "no slave 'broker-b-s1': broker-b has 0 slave(s) ([cluster] slaves = { broker-a = 2 }" in msg


def test_the_controller_takes_the_per_master_form_and_needs_one_slave() -> None:
    v5 = "rocketmq5 = true\ncontroller = true\nslaves = { broker-a = 1 }"
    e = ex.parse(BASE.replace("slaves = 1", v5))
    assert e.controller and e.slave_nodes() == ("broker-a-s1",)
    none = BASE.replace("slaves = 1", v5.replace("broker-a = 1", "broker-a = 0"))
    [(line, msg)] = problems(none)
    assert line == line_of(none, "controller") and msg.endswith("it needs slaves >= 1")
