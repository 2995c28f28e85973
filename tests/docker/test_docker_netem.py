"""Latency, jitter and loss by the kernel's netem where it has it, and the fallback where it has not: the
probe, the exact ``tc`` commands a fault builds, and their removal on heal and at the end. These need no
engine (a stand-in ``tc`` or a recorder plays the kernel); the real fallback runs in the comparison of
``network-partition`` in test_docker_backend.py."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

from rmqlab.chaos import container
from rmqlab.chaos.container import ContainerCluster, ContainerMember, ImageInfo, probe_netem
from rmqlab.chaos.netem import NetemFull, NetemTable, Shape


def test_shape_arguments_follow_the_relays_delay_window() -> None:
    # the relay holds a chunk ms + uniform(0, jitter): netem's +- jitter is centred on ms + jitter/2
    assert Shape(delay_ms=5, jitter_ms=2).netem_args() == ["netem", "delay", "6000us", "1000us"]
    assert Shape(delay_ms=0.25).netem_args() == ["netem", "delay", "250us"]
    assert Shape(loss_percent=30).netem_args() == ["netem", "loss", "random", "30%"]
    assert Shape(delay_ms=1, loss_percent=2.5).netem_args() == [
        "netem", "delay", "1000us", "loss", "random", "2.5%",
    ]  # fmt: skip
    assert Shape().netem_args() == ["netem"]


def test_the_tc_commands_of_a_namespace_from_first_fault_to_last_heal() -> None:
    t = NetemTable()
    root = ["qdisc", "add", "dev", "eth0", "root", "handle", "1:", "prio", "bands", "16", "priomap",
            "1", "2", "2", "2", "1", "2", "0", "0", "1", "1", "1", "1", "1", "1", "1", "1"]  # fmt: skip
    assert t.set("10.9.0.11", "consumer-1", delay_ms=5) == [
        root,
        ["qdisc", "add", "dev", "eth0", "parent", "1:4", "handle", "40:", "netem", "delay", "5000us"],
        ["filter", "add", "dev", "eth0", "parent", "1:", "protocol", "ip", "prio", "4", "u32",
         "match", "ip", "dst", "10.9.0.11/32", "flowid", "1:4"],
    ]  # fmt: skip
    # a second destination: a band of its own, no second root
    assert [c[:2] for c in t.set("10.9.0.12", "consumer-1", delay_ms=5)] == [
        ["qdisc", "add"],
        ["filter", "add"],
    ]
    assert t.bands == {"10.9.0.11": 4, "10.9.0.12": 5}
    # another fault on the first link: one netem with both, changed in place
    assert t.set("10.9.0.11", "broker-a", loss_percent=20) == [
        ["qdisc", "change", "dev", "eth0", "parent", "1:4", "handle", "40:", "netem", "delay", "5000us",
         "loss", "random", "20%"],
    ]  # fmt: skip
    # healing one owner leaves the other's shape
    assert t.clear("10.9.0.11", "consumer-1") == [
        ["qdisc", "change", "dev", "eth0", "parent", "1:4", "handle", "40:", "netem", "loss", "random",
         "20%"],
    ]  # fmt: skip
    assert t.clear("10.9.0.11", "consumer-1") == []  # nothing of its left
    assert t.clear("10.9.0.11", "broker-a") == [
        ["filter", "del", "dev", "eth0", "parent", "1:", "protocol", "ip", "prio", "4"],
        ["qdisc", "del", "dev", "eth0", "parent", "1:4", "handle", "40:"],
    ]
    # the last band goes with the root
    assert t.clear("10.9.0.12", "consumer-1") == [["qdisc", "del", "dev", "eth0", "root"]]
    assert not t and t.teardown() == []
    t.set("10.9.0.11", "x", loss_percent=1)
    assert t.teardown() == [["qdisc", "del", "dev", "eth0", "root"]] and not t


def test_bands_are_hex_and_run_out_cleanly() -> None:
    t = NetemTable()
    for i in range(13):
        t.set(f"10.9.0.{i}", "x", delay_ms=1)
    assert t.bands["10.9.0.6"] == 10
    assert t.set("10.9.0.6", "x", delay_ms=2)[0][5:8] == ["1:a", "handle", "a0:"]
    assert t.bands["10.9.0.12"] == 16
    with pytest.raises(NetemFull, match=r"no netem band left on eth0 for 10\.9\.0\.99"):
        t.set("10.9.0.99", "x", delay_ms=1)
    assert "10.9.0.99" not in t.shapes.get("10.9.0.99", {})


FAKE_TOOLS = textwrap.dedent(
    """\
    #!{python}
    import os, sys
    with open(os.environ["FAKE_TC_LOG"], "a") as f:
        f.write(" ".join(sys.argv) + "\\n")
    if os.path.basename(sys.argv[0]) == "unshare":
        os.execvp(sys.argv[2], sys.argv[2:])  # "unshare --net CMD...": run CMD (the stand-in tc)
    if os.environ["FAKE_TC"] == "refuse":
        sys.exit("Error: Specified qdisc kind is unknown.")
    """
)


@pytest.mark.parametrize("answer", ["refuse", "take"])
async def test_the_probe_tries_netem_in_a_scratch_namespace(
    answer: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for tool in ("unshare", "tc", "nsenter"):
        (tmp_path / tool).write_text(FAKE_TOOLS.format(python=sys.executable))
        (tmp_path / tool).chmod(0o755)
    log = tmp_path / "calls"
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("FAKE_TC", answer)
    monkeypatch.setenv("FAKE_TC_LOG", str(log))
    monkeypatch.setattr(container.os, "geteuid", lambda: 0)
    monkeypatch.setattr("chaos.netem.os.geteuid", lambda: 0)
    problem = await probe_netem()
    calls = [line.split()[1:] for line in log.read_text().splitlines()]
    assert calls == [
        ["--net", "tc", "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1ms"],  # unshare's
        ["qdisc", "add", "dev", "lo", "root", "netem", "delay", "1ms"],  # tc's, in the new namespace
    ]
    if answer == "refuse":
        assert problem == "this kernel refuses a netem qdisc (Error: Specified qdisc kind is unknown.)"
    else:
        assert problem is None


async def test_the_probe_says_why_it_cannot_try(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no tc, unshare, nsenter
    problem = await probe_netem()
    assert problem == "tc and unshare and nsenter not installed (apt-get install iproute2 util-linux)"
    monkeypatch.setattr(container, "probe_precondition", lambda: None)
    exit_3 = [sys.executable, "-c", "import sys; sys.exit(3)"]
    monkeypatch.setattr(container, "probe_command", lambda: exit_3)
    assert await probe_netem() == "this kernel refuses a netem qdisc (exit 3)"


def cluster_of(tmp_path: Path, *, netem: bool) -> tuple[ContainerCluster, dict[str, str]]:
    cluster = ContainerCluster(tmp_path, image=ImageInfo("img", "sha256:1", "d"), time_scale=0.05)
    cluster.sup.free_ips = [f"10.9.0.{i}" for i in range(10, 20)]  # type: ignore[attr-defined]
    cluster.netem = netem
    cluster.add_namesrv()
    for b in ("broker-a", "broker-b"):
        cluster.add_broker(b)
    for c in ("consumer-1", "consumer-2"):
        cluster.add_consumer(c, group="G", topic="T")
    ip = {m.node: m.ip for m in cluster.sup if isinstance(m, ContainerMember)}
    for m in cluster.sup:
        assert isinstance(m, ContainerMember)
        m.container = f"c-{m.node}"
    cluster.brokers = {b: f"{ip[b]}:10911" for b in ("broker-a", "broker-b")}
    cluster.namesrv = f"{ip['namesrv']}:9876"
    return cluster, ip


async def test_the_kernel_without_netem_takes_the_relay_and_iptables(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def no() -> str:
        return "this kernel refuses a netem qdisc (Error: Specified qdisc kind is unknown.)"

    async def yes() -> None:
        return None

    cluster, _ = cluster_of(tmp_path, netem=False)
    try:
        monkeypatch.setattr(container, "probe_netem", no)
        await cluster.probe()
        assert not cluster.netem and cluster.relayed_actions == ("latency", "reset")
        assert [cluster.network_via(a, "consumer-1") for a in ("latency", "loss", "blackhole", "reset")] == [
            "relay", "iptables", "iptables", "relay",
        ]  # fmt: skip
        assert "no netem (this kernel refuses" in cluster.network_note()
        monkeypatch.setattr(container, "probe_netem", yes)
        await cluster.probe()
        assert cluster.netem and cluster.relayed_actions == ("reset",)
        assert [cluster.network_via(a, "consumer-1") for a in ("latency", "loss", "blackhole", "reset")] == [
            "netem", "netem", "iptables", "relay",
        ]  # fmt: skip
    finally:
        cluster.sup.close()


async def test_netem_goes_on_the_sending_side_of_each_direction_and_comes_off(tmp_path: Path) -> None:
    cluster, ip = cluster_of(tmp_path, netem=True)
    calls: list[tuple[str, str, list[str]]] = []

    async def tc(node: str, name: str, args: list[str]) -> None:
        assert name == f"c-{node}"
        calls.append((node, args[0] + " " + args[1], args))

    cluster._tc = tc  # type: ignore[method-assign]
    try:
        # latency on a client's links to every broker: both directions, one band per destination
        await cluster.apply_network("consumer-1", "latency", "all", ms=5, jitter_ms=0)
        where = [(n, verb, a[a.index("dst") + 1] if "dst" in a else None) for n, verb, a in calls]
        assert where == [
            ("consumer-1", "qdisc add", None),  # the root
            ("consumer-1", "qdisc add", None),
            ("consumer-1", "filter add", f"{ip['broker-a']}/32"),
            ("broker-a", "qdisc add", None),
            ("broker-a", "qdisc add", None),
            ("broker-a", "filter add", f"{ip['consumer-1']}/32"),
            ("consumer-1", "qdisc add", None),
            ("consumer-1", "filter add", f"{ip['broker-b']}/32"),
            ("broker-b", "qdisc add", None),
            ("broker-b", "qdisc add", None),
            ("broker-b", "filter add", f"{ip['consumer-1']}/32"),
        ]
        netems = [a for _, _, a in calls if "netem" in a]
        assert len(netems) == 4 and all(a[-2:] == ["delay", "5000us"] for a in netems)
        # one-way loss between two servers: only the sending side of that direction
        calls.clear()
        await cluster.apply_network("broker-a", "loss", "namesrv", percent=30, direction="in")
        assert [(n, verb) for n, verb, _ in calls] == [("namesrv", "qdisc add"), ("namesrv", "qdisc add"),
                                                      ("namesrv", "filter add")]  # fmt: skip
        assert calls[1][2][-4:] == ["netem", "loss", "random", "30%"]
        assert cluster.network_faulty("broker-a") and cluster.network_faulty("consumer-1")
        assert [f["via"] for f in cluster.network_faults] == ["netem", "netem"]
        assert cluster.manifest()["containers"]["network_faults"] == [
            {"action": "latency", "target": "consumer-1", "peer": "all", "via": "netem"},
            {"action": "loss", "target": "broker-a", "peer": "namesrv", "via": "netem"},
        ]
        # heal of one peer: exactly that link's bands, on both sides
        calls.clear()
        await cluster.apply_network("consumer-1", "heal", "broker-b")
        assert calls == [
            ("consumer-1", "filter del", ["filter", "del", "dev", "eth0", "parent", "1:", "protocol", "ip",
                                          "prio", "5"]),
            ("consumer-1", "qdisc del", ["qdisc", "del", "dev", "eth0", "parent", "1:5", "handle", "50:"]),
            ("broker-b", "qdisc del", ["qdisc", "del", "dev", "eth0", "root"]),
        ]  # fmt: skip
        assert cluster.network_faulty("consumer-1")
        # a failed run: whatever is still in force comes off before the containers stop
        calls.clear()
        await cluster.remove_netem()
        assert sorted((n, a) for n, _, a in calls) == [
            (n, ["qdisc", "del", "dev", "eth0", "root"]) for n in ("broker-a", "consumer-1", "namesrv")
        ]
        assert not cluster.network_faulty("consumer-1") and not cluster.network_faulty("broker-a")
        calls.clear()
        await cluster.remove_netem()
        assert calls == []
    finally:
        cluster.sup.close()


async def test_a_failed_tc_is_an_error_and_its_heal_is_quiet(tmp_path: Path) -> None:
    cluster, _ = cluster_of(tmp_path, netem=True)

    async def tc(node: str, name: str, args: list[str]) -> None:
        raise ValueError(f"tc in {node}'s network namespace failed: RTNETLINK answers: Not permitted")

    cluster._tc = tc  # type: ignore[method-assign]
    try:
        with pytest.raises(ValueError, match="tc in consumer-2's network namespace failed"):
            await cluster.apply_network("consumer-2", "loss", "broker-a", percent=10)
        await cluster.apply_network("consumer-2", "heal", "all")  # what failed to go away: no error
        assert not cluster.network_faulty("consumer-2")
    finally:
        cluster.sup.close()
