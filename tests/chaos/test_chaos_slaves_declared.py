"""The local and container backends declare each master's slaves as rmq-broker nodes with the master's
broker name, their broker id, the SLAVE role and the experiment's HA settings (nothing is started)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rmqlab.chaos.container import ContainerCluster, ImageInfo
from rmqlab.chaos.process_cluster import LocalCluster
from rmqlab.lab import experiment as ex

TEXT = """\
duration = 100
[cluster]
brokers = 2
slaves = 1
durable = true
broker_role = "SYNC_MASTER"
replication_lag_ms = 500
slave_read_enable = true
[[topics]]
name = "T"
queues = 4
"""


def flag(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


@pytest.mark.parametrize("kind", ["local", "docker"])
def test_slaves_are_declared_after_their_masters_with_the_slave_flags(tmp_path: Path, kind: str) -> None:
    exp = ex.parse(TEXT)
    if kind == "local":
        cluster: LocalCluster = LocalCluster(tmp_path, time_scale=0.05)
    else:
        cluster = ContainerCluster(tmp_path, image=ImageInfo("img", "sha256:0", "d"), time_scale=0.05)
        # the addresses prepare() would take from the run's bridge network
        cluster.sup.free_ips = [f"172.30.0.{i}" for i in range(10, 30)]  # type: ignore[attr-defined]
    try:
        cluster.declare(exp)
        members = {m.node: m for m in cluster.sup}
        brokers = [n for n, m in members.items() if m.role == "broker"]
        assert brokers == ["broker-a", "broker-a-s1", "broker-b", "broker-b-s1"]
        master, slave = members["broker-b"].args, members["broker-b-s1"].args
        assert flag(master, "--broker-role") == "SYNC_MASTER" and "--broker-id" not in master
        assert flag(slave, "--broker-name") == "broker-b" and flag(slave, "--broker-id") == "1"
        assert flag(slave, "--broker-role") == "SLAVE" and flag(slave, "--ha-replication-lag-ms") == "500"
        assert "--slave-read-enable" in slave and "--slave-read-enable" in master
        # each node keeps a store of its own
        assert flag(slave, "--store-dir").endswith("store/broker-b-s1")
    finally:
        cluster.sup.close()


@pytest.mark.parametrize("kind", ["local", "docker"])
def test_a_per_master_slave_count_declares_slaves_of_that_master_only(tmp_path: Path, kind: str) -> None:
    exp = ex.parse(TEXT.replace("slaves = 1", "slaves = { broker-b = 2 }"))
    if kind == "local":
        cluster: LocalCluster = LocalCluster(tmp_path, time_scale=0.05)
    else:
        cluster = ContainerCluster(tmp_path, image=ImageInfo("img", "sha256:0", "d"), time_scale=0.05)
        cluster.sup.free_ips = [f"172.30.0.{i}" for i in range(10, 30)]  # type: ignore[attr-defined]
    try:
        cluster.declare(exp)
        members = {m.node: m for m in cluster.sup}
        brokers = [n for n, m in members.items() if m.role == "broker"]
        assert brokers == ["broker-a", "broker-b", "broker-b-s1", "broker-b-s2"]
        # broker-a has no slave: a plain master, not a SYNC_MASTER waiting for one
        assert "--broker-role" not in members["broker-a"].args
        assert flag(members["broker-b"].args, "--broker-role") == "SYNC_MASTER"
        assert flag(members["broker-b-s2"].args, "--broker-id") == "2"
    finally:
        cluster.sup.close()
