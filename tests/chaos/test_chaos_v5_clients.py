"""Apache's RocketMQ 5 clients as lab consumers (``client = "py5"`` / ``"js5"``): their validation, the
environment check, and how the cluster starts them and rmq-proxy (no processes here; the end-to-end run is
tests/interop/test_interop_v5_clients.py and the shipped v5-pop-kill experiment)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from kit.chaos import fake_checkout, line_of, problems

from rmqlab.chaos.process_cluster import PROXY_NODE, LocalCluster
from rmqlab.chaos.realclients import RealClients, check_environment
from rmqlab.lab import experiment as ex

V5 = """\
name = "v5"
question = "q?"
time_scale = 0.5
duration = 60

[[topics]]
name = "T"
queues = 4

[[consumers]]
group = "g"
topic = "T"
client = "py5"
count = 2
consume_ms = 5

[[consumers]]
group = "g"
topic = "T"
client = "js5"

[[nemesis]]
action = "kill"
target = "consumer-1"
at = 20
"""


def test_v5_clients_are_real_clients() -> None:
    e = ex.parse(V5)
    assert [(c.client, c.nodes) for c in e.consumers] == [
        ("py5", ("consumer-1", "consumer-2")),
        ("js5", ("consumer-3",)),
    ]
    assert e.real_clients() == {"py5", "js5"}


def test_what_v5_consumers_cannot_do_is_named_on_its_line() -> None:
    text = V5.replace('client = "js5"\n', 'client = "js5"\norderly = true\nstrategy = "AVG"\n')
    got = dict(problems(text))
    assert "FIFO is not emulated" in got[line_of(text, "orderly = true")]
    assert "no allocation strategy" in got[line_of(text, 'strategy = "AVG"')]
    assert len(got) == 2
    slow = V5.replace("time_scale = 0.5", "time_scale = 0.25")
    [(line, msg)] = problems(slow)
    assert line == line_of(slow, "time_scale") and "Python client 5.1.2" in msg


def test_a_missing_v5_environment_names_the_client_line(tmp_path: Path) -> None:
    checkout = fake_checkout(tmp_path, "py5_client.py", "js5/client.js")
    with pytest.raises(ex.ExperimentError) as info:
        check_environment(ex.parse(V5, source="v5.toml"), RealClients(checkout))
    got = dict(info.value.problems)
    assert "no .venv-v5" in got[line_of(V5, 'client = "py5"')]
    js5 = got[line_of(V5, 'client = "js5"')]
    assert "rocketmq-client-nodejs" in js5 or "node is not installed" in js5
    assert all("scripts/setup_real_clients.sh" in why for why in got.values())


def test_v5_consumers_keep_their_own_timers_and_the_proxy_scales_its_own(tmp_path: Path) -> None:
    clients = RealClients(tmp_path / "checkout")
    cluster = LocalCluster(tmp_path / "run", time_scale=0.5)
    try:
        proxy = cluster.add_proxy()
        py5 = cluster.add_real_consumer(
            "consumer-1", client="py5", group="g", topic="T", consume_ms=3, clients=clients
        )
        cluster.sup.vars.update(namesrv="127.0.0.1:1", proxy="127.0.0.1:8081")
        cmd = cluster.sup.command(py5, "LOG")
        assert cmd[cmd.index(str(clients.v5_python)) :] == [
            str(clients.v5_python),
            str(clients.driver("py5")),
            "consumer",
            "--node",
            "consumer-1",
            "--log-file",
            "LOG",
            "--endpoints",
            "127.0.0.1:8081",
            "--group",
            "g",
            "--topic",
            "T",
            "--kind",
            "push",
            "--consume-ms",
            "3",
        ]
        proxy_cmd = cluster.sup.command(proxy, "LOG")
        assert proxy.node == PROXY_NODE and proxy.role == "proxy"
        assert proxy_cmd[proxy_cmd.index("-m") + 1] == "rmqlab.proxy"
        assert "--namesrv" in proxy_cmd and proxy_cmd[proxy_cmd.index("--namesrv") + 1] == "127.0.0.1:1"
        assert "--time-scale" in proxy_cmd and "--time-scale" not in cmd
    finally:
        cluster.sup.close()


@pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")
def test_the_js5_driver_runs_with_node(tmp_path: Path) -> None:
    assert RealClients(tmp_path).program("js5") == [
        shutil.which("node"),
        str(tmp_path / "interop" / "js5" / "client.js"),
        "consumer",
    ]


def test_the_hung_listener_nemesis_may_target_v5_consumers() -> None:
    hang = V5 + '\n[[nemesis]]\naction = "hang"\ntarget = "consumer-3"\nat = 10\nfor = 20\n'
    assert [n.action for n in ex.parse(hang).nemeses] == ["kill", "hang"]
    cpp = hang.replace('client = "js5"', 'client = "cpp"')
    [(line, msg)] = problems(cpp)
    assert "hangs the listener" in msg and line == line_of(cpp, 'target = "consumer-3"')
