"""``--backend docker`` refuses to start, with a message naming the problem, when the engine or the image
is not usable or the experiment asks for what containers cannot do. A stand-in ``docker`` command plays
the engine, so these run without one; nothing may start (no run directory, no container)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from rmqlab.chaos.container import DIGEST_LABEL, SOURCE_PACKAGES, source_digest

FAKE_DOCKER = textwrap.dedent(
    """\
    #!{python}
    import json, os, sys
    args = sys.argv[1:]
    with open(os.environ["FAKE_DOCKER_LOG"], "a") as f:
        f.write(json.dumps(args) + "\\n")
    mode = os.environ["FAKE_DOCKER_MODE"]
    if args[:1] == ["info"]:
        if mode == "denied":
            sys.exit("permission denied while trying to connect to the Docker daemon socket at "
                     "unix:///var/run/docker.sock: connect: permission denied")
        if mode == "down":
            sys.exit("Cannot connect to the Docker daemon at unix:///var/run/docker.sock. "
                     "Is the docker daemon running?")
        print("20.10.24")
        sys.exit(0)
    if args[:2] == ["image", "inspect"]:
        if mode == "noimage":
            sys.exit("Error: No such image: " + args[2])
        digest = os.environ["FAKE_DOCKER_DIGEST"]
        print(json.dumps([{{"Id": "sha256:" + "ab" * 32, "Config": {{"Labels": {{"{label}": digest}}}}}}]))
        sys.exit(0)
    sys.exit("unexpected docker call: " + " ".join(args))
    """
)

KILL = """\
name = "kill"
time_scale = 0.05
duration = 100
[cluster]
brokers = 1
[[topics]]
name = "T"
queues = 4
[[consumers]]
group = "G"
topic = "T"
count = 2
[[nemesis]]
action = "kill"
target = "consumer-1"
at = 50
"""


def run(
    tmp_path: Path, mode: str, text: str = KILL, *, with_docker: bool = True, digest: str = ""
) -> tuple[int, str, list]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    log = tmp_path / "docker-calls.jsonl"
    if with_docker:
        fake = bin_dir / "docker"
        fake.write_text(FAKE_DOCKER.format(python=sys.executable, label=DIGEST_LABEL))
        fake.chmod(0o755)
    exp = tmp_path / "exp.toml"
    exp.write_text(text)
    env = {
        **os.environ,
        "PATH": str(bin_dir),
        "FAKE_DOCKER_MODE": mode,
        "FAKE_DOCKER_LOG": str(log),
        "FAKE_DOCKER_DIGEST": digest or source_digest(),
    }
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "rmqlab.chaos",
            "run",
            str(exp),
            "--out",
            str(tmp_path / "run"),
            "--backend",
            "docker",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    calls = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    return proc.returncode, proc.stdout + proc.stderr, calls


def nothing_started(tmp_path: Path, calls: list) -> bool:
    return not (tmp_path / "run").exists() and not any(c[:1] in (["run"], ["network"]) for c in calls)


@pytest.mark.parametrize(
    ("mode", "with_docker", "message"),
    [
        ("ok", False, "the docker command is not installed"),
        (
            "down",
            True,
            "the Docker engine does not answer (start dockerd): Cannot connect to the Docker daemon",
        ),
        (
            "denied",
            True,
            "no permission to use the Docker engine's socket (join the docker group, or run as root)",
        ),
        ("noimage", True, "the image rocketmq-rebalance-lab:latest does not exist: build it with"),
    ],
)
def test_engine_and_image_problems_stop_the_run_before_it_starts(
    tmp_path: Path, mode: str, with_docker: bool, message: str
) -> None:
    rc, out, calls = run(tmp_path, mode, with_docker=with_docker)
    assert rc == 2, out
    assert out.startswith("rmq-chaos: the docker backend cannot run kill: "), out
    assert message in out, out
    assert nothing_started(tmp_path, calls)


def test_an_image_built_from_other_sources_is_refused(tmp_path: Path) -> None:
    rc, out, calls = run(tmp_path, "ok", digest="0" * 64)
    assert rc == 2, out
    assert "was built from other sources than this checkout (source digest 000000000000, checkout " in out
    assert "rebuild it with `bash scripts/docker/build_image.sh`" in out
    assert nothing_started(tmp_path, calls)
    # the same image with this checkout's digest passes the checks (and the fake engine then refuses)
    rc, out, calls = run(tmp_path, "ok")
    assert "unexpected docker call: network create" in out
    assert ["network", "create"] in [c[:2] for c in calls]


def test_a_real_client_cannot_run_in_a_container(tmp_path: Path) -> None:
    text = KILL.replace("count = 2\n", 'count = 2\nclient = "cpp"\n').replace(
        "time_scale = 0.05", "time_scale = 1"
    )
    rc, out, calls = run(tmp_path, "ok", text)
    assert rc == 2, out
    assert "real RocketMQ clients are not in the image: consumer-1, consumer-2" in out
    assert nothing_started(tmp_path, calls)


def test_source_digest_follows_the_sources(tmp_path: Path) -> None:
    for pkg in SOURCE_PACKAGES:
        (tmp_path / pkg).mkdir()
        (tmp_path / pkg / "a.py").write_text("x = 1\n")
    first = source_digest(tmp_path)
    assert first == source_digest(tmp_path)
    (tmp_path / "chaos" / "__pycache__").mkdir()
    (tmp_path / "chaos" / "__pycache__" / "a.py").write_text("ignored")
    (tmp_path / "README.md").write_text("not in the image's sources")
    assert source_digest(tmp_path) == first
    (tmp_path / "broker" / "a.py").write_text("x = 2\n")
    assert source_digest(tmp_path) != first


def with_nemesis(entry: str) -> str:
    return KILL.replace(
        '[[nemesis]]\naction = "kill"\ntarget = "consumer-1"\nat = 50\n', "[[nemesis]]\n" + entry
    )


@pytest.mark.parametrize(
    ("entry", "named"),
    [
        (
            'action = "blackhole"\ntarget = "consumer-1"\nbroker = "broker-a"\ndirection = "in"\nat = 50\n',
            "blackhole consumer-1 (direction=in)",
        ),
        (
            'action = "loss"\ntarget = "consumer-1"\nbroker = "broker-a"\npercent = 20\nat = 50\n',
            "loss consumer-1 (packet loss)",
        ),
        (
            'action = "blackhole"\ntarget = "broker-a"\npeer = "namesrv"\nat = 50\n',
            "blackhole broker-a (a link between broker-a and namesrv)",
        ),
    ],
)
def test_what_only_the_kernel_does_needs_the_docker_backend(tmp_path: Path, entry: str, named: str) -> None:
    exp = tmp_path / "kernel.toml"
    exp.write_text(with_nemesis(entry))
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "rmqlab.chaos",
            "run",
            str(exp),
            "--out",
            str(tmp_path / "run"),
            "--no-analyze",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "these network faults need --backend docker" in proc.stderr
    assert proc.stderr.rstrip().endswith(": " + named), proc.stderr
    assert not (tmp_path / "run").exists()


def test_kernel_faults_without_root_are_refused_before_anything_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rmqlab.chaos import container
    from rmqlab.lab.experiment import parse

    exp = parse(with_nemesis('action = "loss"\ntarget = "consumer-1"\npercent = 20\nat = 50\n'))
    monkeypatch.setattr(container.os, "geteuid", lambda: 1000)
    assert container.backend_problems(exp) == [
        "a partition or packet loss sets iptables rules in a container's network namespace: run as root"
    ]
    monkeypatch.setattr(container.shutil, "which", lambda name: None if name == "nsenter" else "/bin/x")
    assert container.backend_problems(exp) == [
        "a partition or packet loss needs nsenter on this machine (apt-get install util-linux iptables)"
    ]


def test_drop_rules_per_direction_port_and_chance() -> None:
    from rmqlab.chaos.container import drop_rules

    assert drop_rules("10.9.0.11", "10911", drop_out=True, drop_in=False) == [
        ["OUTPUT", "-p", "tcp", "-d", "10.9.0.11", "--dport", "10911", "-j", "DROP"]
    ]
    assert drop_rules("10.9.0.11", None, drop_out=False, drop_in=True, probability=0.25) == [
        [
            "INPUT",
            "-s",
            "10.9.0.11",
            "-m",
            "statistic",
            "--mode",
            "random",
            "--probability",
            "0.25",
            "-j",
            "DROP",
        ]
    ]
    assert len(drop_rules("10.9.0.11", None, drop_out=True, drop_in=True)) == 2
    assert drop_rules("10.9.0.11", None, drop_out=False, drop_in=False) == []


async def test_rules_go_where_the_packets_pass_and_heal_removes_exactly_them(tmp_path: Path) -> None:
    from rmqlab.chaos.container import ContainerCluster, ContainerMember, ImageInfo

    cluster = ContainerCluster(tmp_path, image=ImageInfo("img", "sha256:1", "d"), time_scale=0.05)
    cluster.sup.free_ips = [f"10.9.0.{i}" for i in range(10, 20)]  # type: ignore[attr-defined]
    cluster.add_namesrv()
    for b in ("broker-a", "broker-b"):
        cluster.add_broker(b)
    for c in ("consumer-1", "consumer-2", "consumer-3"):
        cluster.add_consumer(c, group="G", topic="T", proxied=c == "consumer-3")
    ip = {m.node: m.ip for m in cluster.sup if isinstance(m, ContainerMember)}
    cluster.brokers = {b: f"{ip[b]}:10911" for b in ("broker-a", "broker-b")}
    cluster.namesrv = f"{ip['namesrv']}:9876"

    class Relay:
        def __init__(self, address: str) -> None:
            self.address = address

    class Links:  # consumer-3's fault relays on the gateway, one per server
        namesrv_address = "10.9.0.1:40000"

        def select(self, peer: str) -> list[Relay]:
            return [Relay({"namesrv": "10.9.0.1:40000", "broker-a": "10.9.0.1:40001"}[peer])]

        def apply(self, action: str, peer: str) -> list[str]:
            healed.append(peer)
            return []

    healed: list[str] = []
    cluster.links = {"consumer-3": Links()}  # type: ignore[dict-item]
    calls: list[tuple[str, str, list[str]]] = []

    async def iptables(node: str, op: str, rule: list[str]) -> None:
        calls.append((node, op, rule))

    cluster._iptables = iptables  # type: ignore[method-assign]
    try:
        # between two servers, both ways: in the target's namespace, on the peer's address
        await cluster.apply_network("broker-a", "blackhole", "namesrv")
        ns = ip["namesrv"]
        assert calls == [
            ("broker-a", "-A", ["OUTPUT", "-d", ns, "-j", "DROP"]),
            ("broker-a", "-A", ["INPUT", "-s", ns, "-j", "DROP"]),
        ]
        # one way, a client to a broker
        calls.clear()
        await cluster.apply_network("consumer-1", "blackhole", "broker-b", direction="out")
        assert calls == [("consumer-1", "-A", ["OUTPUT", "-d", ip["broker-b"], "-j", "DROP"])]
        # a broker's link to a client that reaches it through a relay on the gateway: cut in the
        # client's namespace, on the relay's address, with in and out seen from the client
        calls.clear()
        await cluster.apply_network("broker-a", "blackhole", "consumer-3", direction="out")
        assert calls == [
            ("consumer-3", "-A", ["INPUT", "-p", "tcp", "-s", "10.9.0.1", "--sport", "40001", "-j", "DROP"])
        ]
        # loss: the same places, each packet with the chance
        calls.clear()
        await cluster.apply_network("consumer-2", "loss", "all", percent=30)
        assert [(n, r[0], r[2], r[-3]) for n, _, r in calls] == [
            ("consumer-2", "OUTPUT", ip["broker-a"], "0.3"),
            ("consumer-2", "INPUT", ip["broker-a"], "0.3"),
            ("consumer-2", "OUTPUT", ip["broker-b"], "0.3"),
            ("consumer-2", "INPUT", ip["broker-b"], "0.3"),
        ]
        assert all(cluster.network_faulty(n) for n in ("broker-a", "consumer-1", "consumer-2"))
        # heal: a target's rules towards the named peer only, wherever they were put
        calls.clear()
        await cluster.apply_network("broker-a", "heal", "consumer-3")
        assert calls == [
            ("consumer-3", "-D", ["INPUT", "-p", "tcp", "-s", "10.9.0.1", "--sport", "40001", "-j", "DROP"])
        ]
        assert cluster.network_faulty("broker-a") and healed == []  # namesrv's rules stay
        await cluster.apply_network("broker-a", "heal", "all")
        assert [op for _, op, _ in calls[1:]] == ["-D", "-D"] and not cluster.network_faulty("broker-a")
        await cluster.apply_network("consumer-3", "heal", "broker-a")
        assert healed == ["broker-a"]  # the relay's faults of that link
        with pytest.raises(ValueError, match="no link to 'broker-z'"):
            await cluster.apply_network("consumer-2", "blackhole", "broker-z")
        with pytest.raises(ValueError, match="no fault relay for latency"):
            await cluster.apply_network("consumer-2", "latency", "broker-a", ms=5)
    finally:
        cluster.sup.close()


def test_the_container_tests_wait_for_the_background_build_and_show_its_failure(tmp_path: Path) -> None:
    from kit.docker import wait_for_build

    base = str(tmp_path / "image-build")
    (tmp_path / "image-build.log").write_text("step 1\nerror: debootstrap failed\n")
    with pytest.raises(pytest.fail.Exception, match=r"did not finish within 0\.1 s"):
        wait_for_build(base, timeout_s=0.1)
    (tmp_path / "image-build.status").write_text("1\n")
    with pytest.raises(
        pytest.fail.Exception, match=r"failed \(exit 1; log: .*\):\nstep 1\nerror: debootstrap"
    ):
        wait_for_build(base)
    (tmp_path / "image-build.status").write_text("0\n")
    wait_for_build(base)
