"""`[cluster] engine`: Apache RocketMQ's own name server and brokers in place of the emulator's. What the
parser accepts and refuses (file:line), the environment check before anything starts, and the command
lines the process backend declares (no processes here; see test_chaos_engine_e2e.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from kit.chaos import line_of, problems

from rmqlab.chaos.container import backend_problems
from rmqlab.chaos.process_cluster import APACHE_MEMBER_MODULE, LocalCluster
from rmqlab.chaos.realclients import RealClients
from rmqlab.interop.apache import engine as apache
from rmqlab.lab import experiment as ex
from rmqlab.sim.sim_table import parse as sim_parse

ENGINE = """\
name = "engine"
time_scale = 0.5
duration = 60

[cluster]
brokers = 2
engine = "apache-4.9.7"

[[topics]]
name = "T"
queues = 8

[[consumers]]
group = "g"
topic = "T"
client = "java"
count = 2

[[consumers]]
group = "g"
topic = "T"
client = "go"

[workload]
rate = 10
count = 100

[[nemesis]]
action = "kill"
target = "broker-b"
at = 20

[[nemesis]]
action = "pause"
target = "consumer-3"
at = 30
for = 5
"""


def test_the_engine_defaults_to_the_emulator_and_names_apache_releases() -> None:
    e = ex.parse(ENGINE)
    assert e.engine == "apache-4.9.7" and e.to_dict()["engine"] == "apache-4.9.7"
    assert ex.parse(ENGINE.replace('engine = "apache-4.9.7"\n', "")).engine == "emulator"
    assert ex.parse(ENGINE.replace("apache-4.9.7", "apache-5")).engine == "apache-5"


def test_the_parser_knows_the_engines_interop_runs() -> None:
    assert set(ex.ENGINES) - {"emulator"} == set(apache.ENGINES)
    assert set(ex.ENGINES_NOT_SERVED) == set(apache.NOT_SERVED)


def test_an_unknown_engine_names_the_ones_that_exist_and_4_9_8_says_why_not() -> None:
    text = ENGINE.replace("apache-4.9.7", "apache-4.4")
    [(line, msg)] = problems(text)
    assert line == line_of(text, "engine =")
    assert msg == "cluster.engine: must be one of emulator, apache-4.9.7, apache-5; got 'apache-4.4'"
    text = ENGINE.replace("apache-4.9.7", "apache-4.9.8")
    [(line, msg)] = problems(text)
    assert line == line_of(text, "engine =") and "Maven Central serves no rocketmq-broker" in msg
    assert "use apache-4.9.7" in msg


def test_the_lab_own_client_joins_apache_broker_and_the_v5_clients_cannot() -> None:
    text = ENGINE.replace('client = "go"\n', "").replace('client = "java"\n', 'client = "py5"\n')
    got = dict(problems(text))
    assert "needs rmq-proxy" in got[line_of(text, 'client = "py5"')]
    assert '"python"' in got[line_of(text, 'client = "py5"')]
    assert len(got) == 1  # the lab's own consumer (no client key) speaks RocketMQ's protocol there
    # a server-side assignment is set through the lab's admin protocol, which Apache's broker lacks
    text = ENGINE.replace('client = "go"\n', 'assignment = "server-pull"\n')
    got = dict(problems(text))
    assert "does not serve" in got[line_of(text, 'assignment = "server-pull"')] and len(got) == 1


def test_what_apache_broker_cannot_do_is_refused_on_its_line() -> None:
    text = ENGINE + (
        '\n[[nemesis]]\naction = "fault"\ntarget = "broker-a"\ncode = 11\nerrors = ["1:x"]\nat = 5\n'
        '\n[[nemesis]]\naction = "policy"\ntarget = "broker-a"\nnotify_on_channel_expired = true\nat = 6\n'
        '\n[[nemesis]]\naction = "latency"\ntarget = "producer-1"\nms = 50\nat = 7\n'
        "\n[policies]\nrelease_locks_on_close = true\n"
    )
    got = dict(problems(text))
    assert "no fault injection or policy switch" in got[line_of(text, 'action = "fault"')]
    assert "no fault injection or policy switch" in got[line_of(text, 'action = "policy"')]
    assert "fault relay" in got[line_of(text, 'action = "latency"')]
    assert "none of the lab's policies" in got[line_of(text, "[policies]")]
    assert len(got) == 4


def test_other_backends_refuse_the_engine() -> None:
    exp = ex.parse(ENGINE)
    assert any("Apache's JVMs run on the process backend" in p for p in backend_problems(exp))
    only_servers = 'duration = 10\n[cluster]\nengine = "apache-5"\n[[topics]]\nname = "T"\nqueues = 4\n'
    with pytest.raises(ex.ExperimentError) as info:
        sim_parse(only_servers, source="e.toml")
    assert str(info.value) == (
        "e.toml:3: cluster.engine: engine 'apache-5' runs Apache RocketMQ's own JVMs, which the simulator "
        "cannot run (it runs our own code only): use rmq-chaos for this experiment"
    )


def test_a_missing_engine_or_go_producer_is_named_before_anything_starts(tmp_path: Path) -> None:
    checkout = tmp_path / "checkout"
    (checkout / "scripts").mkdir(parents=True)
    (checkout / "scripts" / "setup_go_client.sh").write_text("")
    (checkout / "interop" / "go").mkdir(parents=True)
    (checkout / "interop" / "go" / "main.go").write_text("")
    cluster = LocalCluster(tmp_path / "run", time_scale=0.5, clients=RealClients(checkout))
    exp = ex.parse(ENGINE.replace("apache-4.9.7", "apache-5").replace('client = "java"\n', 'client = "go"\n'))
    try:
        with pytest.raises(ex.ExperimentError) as info:
            cluster._check_engine(exp)
        got = dict(info.value.problems)
        go = got[line_of(ENGINE, "[workload]")]
        assert "Apache's Go producer sends the messages" in go and "scripts/setup_go_client.sh" in go
        if apache_engine_missing("apache-5"):  # this machine has not fetched the jars: said at the line
            assert "scripts/setup_apache_engine.sh" in got[line_of(ENGINE, "engine =")]
        assert not cluster.sup.members  # nothing declared
    finally:
        cluster.sup.close()


def apache_engine_missing(name: str) -> str | None:
    try:
        apache.check_environment(name)
    except apache.EngineUnavailable as e:
        return str(e)
    return None


@pytest.mark.skipif(apache_engine_missing("apache-4.9.7") is not None, reason="apache-4.9.7 not fetched")
def test_the_process_backend_declares_apache_jvms_and_apache_clients(tmp_path: Path) -> None:
    clients = RealClients()
    if clients.missing("go") or clients.missing("java"):
        pytest.skip(clients.missing("go") or clients.missing("java") or "")
    cluster = LocalCluster(tmp_path / "run", time_scale=0.5)
    try:
        cluster.declare(ex.parse(ENGINE))
        members = cluster.sup.members
        assert {m.module for n, m in members.items() if m.role in ("namesrv", "broker")} == {
            APACHE_MEMBER_MODULE
        }
        assert cluster.engine_nodes == {"namesrv", "broker-a", "broker-b"}
        broker = members["broker-b"].args
        assert broker[broker.index("--engine") + 1] == "apache-4.9.7"
        assert broker[broker.index("--topic") + 1] == "T:4"  # 8 queues over 2 brokers
        assert broker[broker.index("--namesrv") + 1] == "{namesrv}"
        producer = members["producer-1"]
        assert producer.program == [str(clients.go_binary), "producer"] and producer.expect_exit
        assert producer.args[:2] == ["--namesrv", "{namesrv_native}"]
        assert {members[f"consumer-{i}"].client for i in (1, 2, 3)} == {"java", "go"}
        assert "proxy" not in members
    finally:
        cluster.sup.close()


OURS = ENGINE.replace('client = "java"\n', "").replace('client = "go"\n', "orderly = true\n")


@pytest.mark.skipif(apache_engine_missing("apache-4.9.7") is not None, reason="apache-4.9.7 not fetched")
def test_the_lab_own_consumers_and_producer_speak_native_to_an_engine(tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path / "run", time_scale=0.5, clients=RealClients(tmp_path / "no-go"))
    try:
        cluster.declare(ex.parse(OURS))  # no Go client needed: the producer is ours
        members = cluster.sup.members
        for node in ("consumer-1", "consumer-2", "consumer-3", "producer-1"):
            args = members[node].args
            assert args[args.index("--protocol") + 1] == "native", node
            assert args[args.index("--namesrv") + 1] == "{namesrv}", node
        assert "--orderly" in members["consumer-3"].args
        assert members["producer-1"].module == "rmqlab.client.producer_main"
        assert members["producer-1"].expect_exit
    finally:
        cluster.sup.close()


def test_an_engine_member_without_its_jars_names_the_setup_script(tmp_path: Path) -> None:
    """The launcher the supervisor runs for each JVM: no jars in the checkout it is given, exit 3."""
    env = {**os.environ, "RMQLAB_CHECKOUT": str(tmp_path / "empty")}
    argv = [sys.executable, "-m", "rmqlab.interop.apache.member", "--role", "namesrv", "--engine", "apache-5"]
    argv += ["--run-dir", str(tmp_path / "run"), "--node", "namesrv"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 3, done.stderr
    assert "engine apache-5" in done.stderr and "scripts/setup_apache_engine.sh" in done.stderr
    assert "READY" not in done.stdout
