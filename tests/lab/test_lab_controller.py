"""Experiment files in RocketMQ 5's controller mode: ``[cluster] rocketmq5`` and ``controller``, the flags
they give the name server and the brokers, and the combinations refused at their lines."""

from __future__ import annotations

from kit.chaos import line_of, problems

from rmqlab.lab import experiment as ex

BASE = """\
name = "t"
duration = 60

[cluster]
brokers = 2
slaves = 1
broker_role = "SYNC_MASTER"
rocketmq5 = true
controller = true

[[topics]]
name = "T"
queues = 8

[[consumers]]
group = "g"
topic = "T"
count = 2
"""


def test_controller_mode_flags_for_name_server_masters_and_slaves() -> None:
    e = ex.parse(BASE)
    assert e.controller and e.rocketmq5
    assert e.namesrv_flags() == ["--enable-controller-in-namesrv"]
    assert e.broker_flags() == ["--broker-role", "SYNC_MASTER", "--rocketmq5", "--controller-mode"]
    # a slave's role is the controller's to give: it is told the role it takes as master
    assert e.slave_flags("broker-a-s1") == [
        "--broker-id",
        "1",
        "--broker-role",
        "SYNC_MASTER",
        "--rocketmq5",
        "--controller-mode",
    ]
    assert e.to_dict()["controller"] is True
    plain = ex.parse(BASE.replace("controller = true\n", "").replace("rocketmq5 = true\n", ""))
    assert plain.namesrv_flags() == [] and "--controller-mode" not in plain.broker_flags()


def test_the_controller_without_rocketmq5_is_refused_at_its_line() -> None:
    text = BASE.replace("rocketmq5 = true\n", "")
    [(line, msg)] = problems(text)
    assert line == line_of(text, "controller = true") and "rocketmq5 = true" in msg


def test_the_controller_without_slaves_is_refused_at_its_line() -> None:
    text = BASE.replace("slaves = 1\n", "").replace('broker_role = "SYNC_MASTER"\n', "")
    [(line, msg)] = problems(text)
    assert line == line_of(text, "controller = true") and "slaves >= 1" in msg


def test_the_controller_on_an_apache_engine_is_refused() -> None:
    text = BASE.replace("controller = true", 'controller = true\nengine = "apache-5"')
    found = problems(text)
    assert (
        line_of(text, "controller = true"),
        "cluster.controller: engine 'apache-5': the lab runs the controller with the emulator only",
    ) in found


def test_rocketmq5_and_controller_must_be_booleans() -> None:
    text = BASE.replace("controller = true", 'controller = "yes"')
    [(line, _msg)] = problems(text)
    assert line == line_of(text, 'controller = "yes"')


def test_failover_under_the_controller_has_nothing_to_undo() -> None:
    text = BASE + '\n[[nemesis]]\naction = "failover"\ntarget = "broker-a"\nat = 10\nfor = 20\n'
    [(line, msg)] = problems(text)
    assert line == line_of(text, "for = 20") and "remove 'for'" in msg
    ex.parse(text.replace("for = 20\n", ""))  # without it, the file runs


def test_nodes_map_to_their_controller_broker_ids() -> None:
    assert ex.controller_broker_id("broker-a") == 1
    assert ex.controller_broker_id("broker-a-s1") == 2 and ex.controller_broker_id("broker-c-s3") == 4
