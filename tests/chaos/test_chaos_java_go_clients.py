"""Apache's Java and Go clients as experiment members: the `client` values, what the parser lets each do,
the environment check naming the setup scripts, and the command lines the cluster starts them with (no
processes here; see test_chaos_java_go_clients_e2e.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from kit.chaos import line_of, problems

from rmqlab.chaos.__main__ import main, resolve
from rmqlab.chaos.process_cluster import LocalCluster
from rmqlab.chaos.realclients import RealClients, check_environment
from rmqlab.chaos.supervisor import SupervisorError
from rmqlab.lab import experiment as ex

MIXED = """\
name = "java-go"
time_scale = 0.5
duration = 60

[[topics]]
name = "T"
queues = 8

[[consumers]]
group = "g"
topic = "T"

[[consumers]]
group = "g"
topic = "T"
client = "java"
orderly = true
strategy = "AVG_BY_CIRCLE"

[[consumers]]
group = "g"
topic = "T"
client = "go"
consume_from = "last"

[[consumers]]
group = "g"
topic = "T"
client = "java-lite"

[[consumers]]
group = "g2"
topic = "T"
client = "java-grpc"

[[nemesis]]
action = "hang"
target = "consumer-2"
at = 10
for = 5
"""
JAVA_LINE = 'client = "java"'
GO_LINE = 'client = "go"'


def checkout(root: Path, *, java: bool = True, go: bool = True) -> Path:
    """A checkout with the Java and Go drivers' files and setup scripts, and with ``java``/``go`` their
    builds."""
    (root / "scripts").mkdir(parents=True, exist_ok=True)
    for script in ("setup_java_clients.sh", "setup_go_client.sh", "setup_real_clients.sh"):
        (root / "scripts" / script).write_text("")
    for driver in ("java/consumer.sh", "go/main.go"):
        (root / "interop" / driver).parent.mkdir(parents=True, exist_ok=True)
        (root / "interop" / driver).write_text("")
    if java:
        for module in ("client4", "client5", "grpc"):
            (root / ".cache" / "java" / "lib" / module).mkdir(parents=True, exist_ok=True)
            (root / ".cache" / "java" / "lib" / module / "driver.jar").write_text("")
    if go:
        binary = root / ".cache" / "go" / "rocketmq-go-consumer"
        binary.parent.mkdir(parents=True, exist_ok=True)
        binary.write_text("")
        binary.chmod(0o755)
    return root


def test_java_and_go_clients_are_real_clients_with_their_own_settings() -> None:
    e = ex.parse(MIXED)
    assert [(c.client, c.nodes) for c in e.consumers] == [
        ("python", ("consumer-1",)),
        ("java", ("consumer-2",)),
        ("go", ("consumer-3",)),
        ("java-lite", ("consumer-4",)),
        ("java-grpc", ("consumer-5",)),
    ]
    assert e.real_clients() == {"java", "go", "java-lite", "java-grpc"}
    java, go = e.consumers[1], e.consumers[2]
    assert (java.orderly, java.strategy, go.consume_from) == (True, "AVG_BY_CIRCLE", "last")
    assert [(s.action, s.target) for s in e.schedule()] == [("hang", "consumer-2"), ("unhang", "consumer-2")]


def test_what_the_java_and_go_drivers_cannot_do_is_named_on_its_line() -> None:
    text = MIXED.replace('client = "go"\n', 'client = "go"\nbroadcast = true\n')
    text = text.replace('client = "java-lite"\n', 'client = "java-lite"\norderly = true\n')
    text = text.replace('client = "java-grpc"\n', 'client = "java-grpc"\nstrategy = "AVG"\n')
    text = text.replace('consume_from = "last"', 'consume_from = "timestamp"')
    got = dict(problems(text))
    assert "clustering mode only" in got[line_of(text, "broadcast = true")]
    assert 'use client "java"' in got[line_of(text, "orderly = true", 2)]
    assert "no allocation strategy" in got[line_of(text, 'strategy = "AVG"')]
    assert '"first" or "last" only' in got[line_of(text, 'consume_from = "timestamp"')]
    assert len(got) == 4


def test_a_go_consumer_cannot_be_hung_and_java5_may_follow_the_broker() -> None:
    text = MIXED.replace('target = "consumer-2"', 'target = "consumer-3"')
    [(line, msg)] = problems(text)
    assert line == line_of(text, 'target = "consumer-3"') and "v5 and Java clients' drivers" in msg
    server = MIXED.replace('client = "java-grpc"\n', 'client = "java5"\nassignment = "server-pop"\n')
    assert ex.parse(server).consumers[4].request_mode == "POP"
    refused = MIXED.replace('client = "java-grpc"\n', 'client = "go"\nassignment = "server-pop"\n')
    [(line, msg)] = problems(refused)
    assert line == line_of(refused, "assignment =") and 'client "java5"' in msg


def test_an_unbuilt_client_names_its_line_and_its_setup_script(tmp_path: Path) -> None:
    exp = ex.parse(MIXED, source="java-go.toml")
    with pytest.raises(ex.ExperimentError) as info:
        check_environment(exp, RealClients(checkout(tmp_path, java=False, go=False)))
    got = dict(info.value.problems)
    java = got[line_of(MIXED, JAVA_LINE)]
    assert java.startswith("consumers[2].client: Apache's Java client 4.9.8 (DefaultMQPushConsumer): ")
    assert "not built" in java
    assert "scripts/setup_java_clients.sh" in java
    go = got[line_of(MIXED, GO_LINE)]
    assert "not built, no .cache/go/rocketmq-go-consumer" in go and "scripts/setup_go_client.sh" in go
    assert "scripts/setup_java_clients.sh" in got[line_of(MIXED, 'client = "java-lite"')]
    assert str(info.value).startswith(f"java-go.toml:{line_of(MIXED, JAVA_LINE)}: ")
    # built, they pass (java-grpc also needs rmq-proxy's [v5] extra, which this checkout's venv has)
    check_environment(exp, RealClients(checkout(tmp_path / "built")))


def test_rmq_chaos_refuses_to_start_an_unbuilt_client(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(
        "rmqlab.chaos.realclients.ROOT", checkout(tmp_path / "checkout", go=False), raising=True
    )
    text = MIXED.replace('client = "java-grpc"', 'client = "java5"')
    f = tmp_path / "java-go.toml"
    f.write_text(text)
    assert main(["run", str(f), "--out", str(tmp_path / "run"), "--no-analyze"]) == 2
    err = capsys.readouterr().err
    assert f"{f}:{line_of(text, GO_LINE)}: consumers[3].client" in err
    assert "scripts/setup_go_client.sh" in err
    assert not (tmp_path / "run").exists()


def test_java_and_go_consumers_run_their_drivers(tmp_path: Path) -> None:
    clients = RealClients(checkout(tmp_path / "checkout"))
    cluster = LocalCluster(tmp_path / "run", time_scale=0.5, clients=clients)
    try:
        cluster.declare(ex.parse(MIXED))
        cluster.sup.vars.update(
            namesrv="127.0.0.1:1", namesrv_native="127.0.0.1:2", broker_addrs="broker-a=x:3", proxy="p:4"
        )

        def role(node: str) -> list[str]:
            cmd = cluster.sup.command(cluster.sup.member(node), "LOG")
            head = str(clients.driver("java")) if "--kind" in cmd else str(clients.go_binary)
            return cmd[cmd.index(head) :]

        assert role("consumer-2") == [
            str(clients.driver("java")),
            "--kind",
            "java",
            "--node",
            "consumer-2",
            "--time-scale",  # the Java remoting clients scale what their timers let be set
            "0.5",
            "--log-file",
            "LOG",
            "--namesrv",
            "127.0.0.1:2",
            "--group",
            "g",
            "--topic",
            "T",
            "--strategy",
            "AVG_BY_CIRCLE",
            "--consume-from",
            "first",
            "--orderly",
            "--client-log-dir",
            str(tmp_path / "run" / "consumer-2.client-log"),
        ]
        go = role("consumer-3")
        assert go[:3] == [str(clients.go_binary), "--node", "consumer-3"] and "--time-scale" not in go
        assert go[go.index("--broker-addrs") + 1] == "broker-a=x:3"
        assert go[go.index("--consume-from") + 1] == "last"
        grpc = role("consumer-5")
        assert grpc[grpc.index("--endpoints") + 1] == "p:4" and "--time-scale" not in grpc
        assert "proxy" in cluster.sup.members  # java-grpc pops through rmq-proxy
        assert cluster.sup.member("namesrv").args[-2:] == ["--remoting-port", "0"]
        cluster.sup.member("consumer-3").state = "running"
        with pytest.raises(SupervisorError, match="cannot be hung"):
            cluster.sup.hang("consumer-3")
    finally:
        cluster.sup.close()


def test_the_versions_come_from_the_pinned_builds() -> None:
    versions = RealClients().versions({"java", "java5", "java-grpc", "go"})
    assert versions["java"] == "rocketmq-client 4.9.8" and versions["java5"] == "rocketmq-client 5.5.0"
    assert versions["java-grpc"] == "rocketmq-client-java 5.2.0"
    assert versions["go"].startswith("rocketmq-client-go v2.")


def test_the_shipped_mixed_sdk_experiment_parses() -> None:
    exp = resolve("mixed-sdk-kill")
    assert [c.client for c in exp.consumers] == ["python", "java", "go", "cpp"]
    assert [(s.action, s.target) for s in exp.schedule()] == [("kill", "consumer-3")]
    assert exp.nodes()["consumer-3"].client == "java" and exp.nodes()["consumer-5"].client == "cpp"
    wall = exp.wall(exp.duration + exp.drain_timeout)
    assert exp.time_scale >= ex.REAL_CLIENT_MIN_TIME_SCALE and wall <= 90
