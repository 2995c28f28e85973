"""Apache's engine in master-slave (4.9's: brokerId 1..N, brokerRole SLAVE, no automatic failover): what
the parser accepts and refuses, the broker files and command lines of the slaves, and in the slow tier a
master and its slave as JVMs under the member launcher, the slave registered under its master's name
and the name server's route keeping it alone when the master stops."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from kit.chaos import line_of, problems

from rmqlab.chaos.process_cluster import APACHE_MEMBER_MODULE, LocalCluster
from rmqlab.chaos.realclients import RealClients
from rmqlab.interop.apache.engine import (
    EngineUnavailable,
    broker_properties,
    check_environment,
    cluster_brokers,
    native_request,
)
from rmqlab.lab import experiment as ex
from rmqlab.protocol.codes import RequestCode
from rmqlab.protocol.native.translate import parse_json_body

ENGINE = "apache-4.9.7"
TEXT = """\
name = "engine-ha"
time_scale = 0.5
duration = 120

[cluster]
brokers = 2
slaves = { broker-a = 1 }
broker_role = "SYNC_MASTER"
slave_read_enable = true
engine = "apache-4.9.7"

[[topics]]
name = "T"
queues = 8

[[consumers]]
group = "g"
topic = "T"
client = "java"
count = 2

[workload]
rate = 10
count = 100

[[nemesis]]
action = "failover"
target = "broker-a"
at = 40
"""


def engine_missing() -> str | None:
    try:
        check_environment(ENGINE)
    except EngineUnavailable as exc:
        return str(exc)
    return None


def test_apache_4_9_runs_master_slave_and_5_masters_only() -> None:
    exp = ex.parse(TEXT)
    assert exp.engine == ENGINE and exp.slave_nodes() == ("broker-a-s1",)
    five = TEXT.replace(ENGINE, "apache-5")
    found = problems(five)
    assert (
        line_of(five, "slaves ="),
        "cluster.slaves: the lab runs engine 'apache-5' with masters only (master-slave runs on emulator, "
        "apache-4.9.7)",
    ) in found
    lag = TEXT.replace("slave_read_enable = true", "replication_lag_ms = 500")
    [(line, msg)] = problems(lag)
    assert line == line_of(lag, "replication_lag_ms") and "copies to its slaves as fast as it can" in msg


def test_a_slave_broker_file_shares_its_masters_name_with_brokerid_and_the_slave_role(tmp_path: Path) -> None:
    master = broker_properties(
        "broker-a",
        20911,
        "n:1",
        tmp_path / "m",
        engine=ENGINE,
        broker_role="SYNC_MASTER",
        slave_read_enable=True,
    )
    assert (master["brokerId"], master["brokerRole"], master["slaveReadEnable"]) == (
        "0",
        "SYNC_MASTER",
        "true",
    )
    slave = broker_properties("broker-a", 20921, "n:1", tmp_path / "s", engine=ENGINE, broker_id=1)
    assert (slave["brokerName"], slave["brokerId"], slave["brokerRole"]) == ("broker-a", "1", "SLAVE")
    assert "slaveReadEnable" not in slave  # RocketMQ's default, false
    plain = broker_properties("broker-b", 20931, "n:1", tmp_path / "b", engine=ENGINE)
    assert (plain["brokerId"], plain["brokerRole"]) == ("0", "ASYNC_MASTER")


def test_the_process_backend_declares_apaches_slaves_after_their_master(tmp_path: Path) -> None:
    why = engine_missing() or RealClients().missing("java") or RealClients().missing("go")
    if why:
        pytest.skip(why)
    cluster = LocalCluster(tmp_path / "run", time_scale=0.5)
    try:
        cluster.declare(ex.parse(TEXT))
        members = cluster.sup.members
        brokers = [n for n, m in members.items() if m.role == "broker"]
        assert brokers == ["broker-a", "broker-a-s1", "broker-b"]
        assert cluster.engine_nodes == {"namesrv", *brokers}
        master, slave, alone = (members[n].args for n in brokers)
        assert members["broker-a-s1"].module == APACHE_MEMBER_MODULE
        assert slave[slave.index("--name") + 1] == "broker-a" and slave[slave.index("--broker-id") + 1] == "1"
        assert "--topic" not in slave and "--slave-read-enable" in slave  # the slave copies the topics
        assert master[master.index("--broker-role") + 1] == "SYNC_MASTER" and "--slave-read-enable" in master
        assert "--broker-role" not in alone  # broker-b has no slave: a plain ASYNC_MASTER
    finally:
        cluster.sup.close()


# -- JVMs ------------------------------------------------------------------------------------------------


class Members:
    """Apache's members started by the lab's launcher (python -m rmqlab.interop.apache.member)."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.procs: dict[str, subprocess.Popen[str]] = {}

    def start(self, node: str, *args: str, timeout: float = 120.0) -> str:
        argv = [sys.executable, "-m", "rmqlab.interop.apache.member", "--engine", ENGINE]
        argv += ["--run-dir", str(self.run_dir), "--node", node, "--time-scale", "0.5", *args]
        p = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
        )
        self.procs[node] = p
        deadline = time.monotonic() + timeout
        assert p.stdout is not None
        for line in p.stdout:
            if line.startswith("READY "):
                return line.split()[1]
            assert time.monotonic() < deadline, f"{node} not ready after {timeout:g} s"
        raise AssertionError(f"{node} exited with {p.wait()} before it was ready")

    def stop(self, node: str) -> int:
        p = self.procs.pop(node)
        os.killpg(p.pid, signal.SIGTERM)
        return p.wait(60)

    def close(self) -> None:
        for p in self.procs.values():
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait(10)


@pytest.fixture
def members(tmp_path: Path) -> Iterator[Members]:
    why = engine_missing()
    if why:
        pytest.skip(why)
    m = Members(tmp_path / "engine")
    try:
        yield m
    finally:
        m.close()


def route_addrs(namesrv: str, topic: str) -> dict[str, dict[str, str]]:
    """The route's brokers with every id's address (the slave's too): name -> {id: address}."""
    answer = native_request(namesrv, RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": topic})
    body = parse_json_body(answer.body) or {}
    return {
        str(d["brokerName"]): {str(k): v for k, v in d["brokerAddrs"].items()} for d in body["brokerDatas"]
    }


def wait_for(what: str, check: Callable[[], bool], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"no {what} after {timeout:g} s"
        time.sleep(0.5)


@pytest.mark.slow
def test_apaches_slave_registers_under_its_master_and_outlives_it_in_the_route(members: Members) -> None:
    namesrv = members.start("namesrv", "--role", "namesrv")
    master = members.start("broker-a", "--role", "broker", "--namesrv", namesrv, "--topic", "T:4")
    slave = members.start("broker-a-s1", "--role", "broker", "--name", "broker-a", "--namesrv", namesrv,
                          "--broker-id", "1")  # fmt: skip
    assert cluster_brokers(namesrv) == {"broker-a": {0: master, 1: slave}}
    # the slave keeps a store of its own, beside its master's
    assert (members.run_dir / "broker-a-s1" / "store").is_dir() and (
        members.run_dir / "broker-a" / "store"
    ).is_dir()
    # its sync (every 10 s) copies the master's topics, and its registration puts it in their route
    wait_for(
        "slave in T's route", lambda: route_addrs(namesrv, "T").get("broker-a") == {"0": master, "1": slave}
    )
    # its message copy connects to the master's HA port (listenPort + 1) found in that answer
    master_log = members.run_dir / "broker-a" / "rocketmq.log"
    wait_for(
        "the slave's HA connection", lambda: "HAService receive new connection" in master_log.read_text()
    )
    # what a failover leaves: the master gone, the route lists the slave alone under broker-a, which is
    # where 4.9's client turns to pull (findBrokerAddressInSubscribe) and commit (findBrokerAddressInAdmin)
    assert members.stop("broker-a") == 0
    wait_for("the route without the master", lambda: route_addrs(namesrv, "T") == {"broker-a": {"1": slave}})
