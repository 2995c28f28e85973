"""Real RocketMQ clients as lab consumers: the `client` key, its validation, the environment check, and
how the cluster and supervisor start them (no processes here; see test_chaos_real_clients_e2e.py)."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest
from kit.chaos import fake_checkout, line_of, problems

from rmqlab.chaos import realclients
from rmqlab.chaos.__main__ import main, resolve
from rmqlab.chaos.process_cluster import LocalCluster
from rmqlab.chaos.realclients import RealClients, check_environment
from rmqlab.chaos.supervisor import Member, Supervisor, SupervisorError
from rmqlab.lab import experiment as ex
from rmqlab.lab.tally import RunTally

DRIVERS = ("cpp_consumer.py", "js/consumer.js")
MIXED = """\
name = "mixed"
question = "q?"
time_scale = 0.5
duration = 60

[[topics]]
name = "T"
queues = 4

[[consumers]]
group = "g"
topic = "T"

[[consumers]]
group = "g"
topic = "T"
client = "cpp"
orderly = true

[[consumers]]
group = "g"
topic = "T"
client = "js"
start = 10

[[nemesis]]
action = "kill"
target = "consumer-2"
at = 20
"""


def test_client_key_defaults_to_ours_and_names_the_real_ones() -> None:
    e = ex.parse(MIXED)
    assert [(c.client, c.nodes, c.start) for c in e.consumers] == [
        ("python", ("consumer-1",), 0.0),
        ("cpp", ("consumer-2",), 0.0),
        ("js", ("consumer-3",), 10.0),
    ]
    assert e.real_clients() == {"cpp", "js"}
    assert e.nodes()["consumer-2"].client == "cpp" and e.nodes()["consumer-1"].client == "python"
    assert [c["client"] for c in e.to_dict()["consumers"]] == ["python", "cpp", "js"]
    assert ex.parse(MIXED.replace('client = "cpp"\norderly = true\n', "").replace('client = "js"\n', ""))


def test_unknown_client_names_its_line_and_the_choices() -> None:
    text = MIXED.replace('client = "js"', 'client = "rust"')
    [(line, msg)] = problems(text)
    assert line == line_of(text, 'client = "rust"')
    assert msg == (
        "consumers[3].client: must be one of python, cpp, js, py5, js5, java, java5, java-lite, java-grpc, "
        "go; got 'rust'"
    )


def test_what_the_real_clients_cannot_do_is_named_on_its_line() -> None:
    text = MIXED.replace('client = "js"\n', 'client = "js"\norderly = true\nbroadcast = true\n')
    text = text.replace(
        'client = "cpp"\n', 'client = "cpp"\nstrategy = "CONSISTENT_HASH"\nconsume_from = "last"\n'
    )
    got = dict(problems(text))
    assert "concurrently only" in got[line_of(text, "orderly = true", 2)]
    assert "clustering mode only" in got[line_of(text, "broadcast = true")]
    assert "averagely only" in got[line_of(text, "CONSISTENT_HASH")]
    assert "cannot be set" in got[line_of(text, 'consume_from = "last"')]
    assert len(got) == 4


def test_real_clients_need_a_time_scale_that_keeps_their_heartbeats_alive() -> None:
    text = MIXED.replace("time_scale = 0.5", "time_scale = 0.25")
    [(line, msg)] = problems(text)
    assert line == line_of(text, "time_scale")
    assert msg.startswith(
        "time_scale: must be >= 0.5 with real clients (Apache's C++ client 2.1.0 and ali-ons"
    )
    assert "heartbeat every 30 s" in msg
    # Our own consumers alone may run as fast as they like.
    only_ours = text.replace('client = "cpp"\norderly = true\n', "").replace('client = "js"\n', "")
    assert ex.parse(only_ours).time_scale == 0.25


def test_network_nemeses_cannot_target_real_clients() -> None:
    text = MIXED + '\n[[nemesis]]\naction = "latency"\ntarget = "consumer:all"\nms = 5\nat = 5\n'
    [(line, msg)] = problems(text)
    assert line == line_of(text, 'target = "consumer:all"')
    assert "fault relay" in msg and "consumer-2, consumer-3" in msg
    assert ex.parse(text.replace("consumer:all", "consumer-1"))


def test_a_consumer_must_join_before_the_end() -> None:
    text = MIXED.replace("start = 10", "start = 60")
    [(line, msg)] = problems(text)
    assert line == line_of(text, "start = 60") and "not before the end" in msg
    assert problems(MIXED.replace("start = 10", "start = -1"))[0][1] == "consumers[3].start: must be >= 0"


def test_a_missing_environment_names_the_client_line_and_the_setup_script(tmp_path: Path) -> None:
    exp = ex.parse(MIXED, source="mixed.toml")
    with pytest.raises(ex.ExperimentError) as info:
        check_environment(exp, RealClients(fake_checkout(tmp_path, *DRIVERS)))
    got = dict(info.value.problems)
    cpp = got[line_of(MIXED, 'client = "cpp"')]
    assert cpp.startswith("consumers[2].client: Apache's C++ client 2.1.0: no .venv-real")
    assert "scripts/setup_real_clients.sh" in cpp
    js = got[line_of(MIXED, 'client = "js"')]
    assert "ali-ons" in js and "scripts/setup_real_clients.sh" in js
    assert str(info.value).startswith(f"mixed.toml:{line_of(MIXED, 'client =')}: ")
    # A file with only our consumers needs nothing.
    check_environment(ex.parse(BASE_OURS), RealClients(tmp_path / "nowhere"))


BASE_OURS = MIXED.split("[[consumers]]")[0] + '[[consumers]]\ngroup = "g"\ntopic = "T"\n'


def test_validate_and_run_refuse_a_missing_client_before_starting_anything(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(realclients, "ROOT", fake_checkout(tmp_path / "checkout", *DRIVERS))
    f = tmp_path / "mixed.toml"
    f.write_text(MIXED)
    assert main(["validate", str(f)]) == 2
    assert main(["run", str(f), "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    cpp_line = line_of(MIXED, 'client = "cpp"')
    assert f"{f}:{cpp_line}: consumers[2].client" in err
    assert "scripts/setup_real_clients.sh" in err
    assert not (tmp_path / "run").exists()


def test_learned_ports_keep_the_native_port_apart() -> None:
    m = Member("broker-a", "broker", "broker", ["--port", "0", "--remoting-port", "0"], port=0)
    m.ready_info = "127.0.0.1:4100 native=127.0.0.1:4200"
    Supervisor._learn_port(m)
    assert m.args == ["--port", "4100", "--remoting-port", "4200"]
    assert (m.port, m.native_port, m.address, m.native_address) == (
        4100,
        4200,
        "127.0.0.1:4100",
        "127.0.0.1:4200",
    )
    plain = Member("namesrv", "namesrv", "rmqlab.broker.namesrv_main", ["--port", "0"], port=0)
    plain.ready_info = "127.0.0.1:4300"
    Supervisor._learn_port(plain)
    assert plain.args == ["--port", "4300"] and plain.native_port is None


def test_real_consumers_run_their_driver_without_a_time_scale(tmp_path: Path) -> None:
    clients = RealClients(fake_checkout(tmp_path / "checkout", *DRIVERS))
    cluster = LocalCluster(tmp_path / "run", time_scale=0.5)
    try:
        cpp = cluster.add_real_consumer(
            "consumer-2", client="cpp", group="g", topic="T", orderly=True, consume_ms=3, clients=clients
        )
        ours = cluster.add_consumer("consumer-1", group="g", topic="T")
        cluster.sup.vars.update(
            namesrv="127.0.0.1:1", namesrv_native="127.0.0.1:2", broker_addrs="broker-a=x:3"
        )
        cmd = cluster.sup.command(cpp, "LOG")
        role = cmd[cmd.index(str(clients.python)) :]
        assert role == [
            str(clients.python),
            str(clients.driver("cpp")),
            "--node",
            "consumer-2",
            "--log-file",
            "LOG",
            "--namesrv",
            "127.0.0.1:2",
            "--group",
            "g",
            "--topic",
            "T",
            "--broker-addrs",
            "broker-a=x:3",
            "--consume-ms",
            "3",
            "--orderly",
            "--client-log-dir",
            str(tmp_path / "run" / "consumer-2.client-log"),
        ]
        assert (cpp.client, ours.client) == ("cpp", "python")
        assert "--time-scale" in cluster.sup.command(ours, "LOG")
        with pytest.raises(ValueError, match="concurrently only"):
            cluster.add_real_consumer("consumer-3", client="js", group="g", topic="T", orderly=True)
        with pytest.raises(SupervisorError, match="absolute path"):
            cluster.sup.add("x", "consumer", "m", program=["node", "consumer.js"])
        info = cluster.manifest()["nodes"]["consumer-2"]
        assert info["client"] == "cpp" and info["native_port"] is None
    finally:
        cluster.sup.close()


@pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")
def test_the_js_driver_runs_with_node(tmp_path: Path) -> None:
    clients = RealClients(tmp_path)
    assert clients.program("js") == [shutil.which("node"), str(tmp_path / "interop" / "js" / "consumer.js")]


def test_tally_places_missing_messages_and_ignored_pulls_on_their_queues() -> None:
    t = RunTally({"g": {"T"}})

    def q(event: str, qid: int, **kw: object) -> dict[str, object]:
        return {"event": event, "topic": "T", "broker": "broker-a", "queue_id": qid, **kw}

    t.feed(
        [
            q("message_sent", 0, msg_id="m0", queue_offset=0),
            q("message_sent", 2, msg_id="m2", queue_offset=0),
            q("message_sent", 2, msg_id="m3", queue_offset=1),
            q("message_consumed", 0, msg_id="m0", group="g", client_id="c"),
            q("mq_removed", 2, client_id="c", group="g"),
            q("pull_answer_ignored", 2, client_id="c"),  # an old request's answer after giving it up
            q("mq_added", 2, client_id="c", group="g"),
            q("pull_answer_ignored", 2, client_id="c"),  # its current request's answer: the stall
        ]
    )
    assert t.missing() == {"g": 2}
    assert t.missing_by_queue("g") == {"T/broker-a:2": 2}
    assert t.summary()["pull_answers_ignored"] == {"T/broker-a:2": 1}


def test_shipped_real_client_experiments_parse() -> None:
    regained = resolve("cpp-queue-regained")
    assert [c.client for c in regained.consumers] == ["cpp", "python"]
    assert regained.consumers[1].start > 0
    assert [(s.action, s.target) for s in regained.schedule()] == [("stop", "consumer-2")]
    mixed = resolve("mixed-group-kill")
    assert mixed.real_clients() == {"cpp", "js"} and "python" in {c.client for c in mixed.consumers}
    assert [(s.action, s.target) for s in mixed.schedule()] == [("kill", "consumer-4")]
    for exp in (regained, mixed):
        wall = exp.wall(exp.duration + exp.drain_timeout)
        assert exp.time_scale >= ex.REAL_CLIENT_MIN_TIME_SCALE and wall <= 90, exp.name


def test_driver_names_brokers_by_store_host() -> None:
    sys.path.insert(0, str(realclients.ROOT / "interop"))
    try:
        import cpp_consumer
    finally:
        sys.path.pop(0)
    addrs = cpp_consumer.parse_broker_addrs("broker-a=127.0.0.1:4001,broker-b=127.0.0.1:4002")
    assert addrs == {"127.0.0.1:4001": "broker-a", "127.0.0.1:4002": "broker-b"}
    with pytest.raises(Exception, match="NAME=HOST:PORT"):
        cpp_consumer.parse_broker_addrs("broker-a")

    class NoSymbol:
        pass

    names = cpp_consumer.BrokerNames(NoSymbol(), addrs, "broker-a")
    assert names.name(1234) == "broker-a"  # no accessor: the default
    names.store_host = lambda _h: "10.0.0.5:4002"  # type: ignore[method-assign]
    assert names.name(1234) == "broker-b"  # another host, same port


def test_an_installed_lab_says_real_clients_need_a_checkout(tmp_path: Path) -> None:
    installed = tmp_path / "site-packages" / "rmqlab"
    for driver in DRIVERS:  # the drivers ship as package data; the clients' environments cannot
        (installed / "interop" / driver).parent.mkdir(parents=True, exist_ok=True)
        (installed / "interop" / driver).write_text("")
    why = RealClients(installed).missing("cpp")
    assert why is not None and "RMQLAB_CHECKOUT=DIR" in why and "installed package" in why
    assert RealClients(fake_checkout(tmp_path / "checkout", *DRIVERS)).missing("cpp") != why
