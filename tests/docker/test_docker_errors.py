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

from chaos.container import DIGEST_LABEL, source_digest

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
            "chaos",
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
    for pkg in ("protocol", "broker", "client", "chaos"):
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


ONE_WAY = KILL.replace(
    '[[nemesis]]\naction = "kill"\ntarget = "consumer-1"\nat = 50\n',
    '[[nemesis]]\naction = "blackhole"\ntarget = "consumer-1"\nbroker = "broker-a"\n'
    'direction = "in"\nat = 50\n',
)


def test_a_one_way_partition_needs_the_docker_backend(tmp_path: Path) -> None:
    exp = tmp_path / "one-way.toml"
    exp.write_text(ONE_WAY)
    proc = subprocess.run(
        [sys.executable, "-m", "chaos", "run", str(exp), "--out", str(tmp_path / "run"), "--no-analyze"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "one-way partitions need --backend docker" in proc.stderr
    assert "blackhole consumer-1 (direction=in)" in proc.stderr
    assert not (tmp_path / "run").exists()


async def test_partition_rules_per_direction_and_heal_removes_exactly_them(tmp_path: Path) -> None:
    from chaos.container import ContainerCluster, ImageInfo

    cluster = ContainerCluster(tmp_path, image=ImageInfo("img", "sha256:1", "d"), time_scale=0.05)
    cluster.brokers = {"broker-a": "10.9.0.11:10911", "broker-b": "10.9.0.12:10911"}
    cluster.namesrv = "10.9.0.10:9876"
    calls: list[tuple[str, str, list[str]]] = []

    async def iptables(node: str, op: str, rule: list[str]) -> None:
        calls.append((node, op, rule))

    cluster._iptables = iptables  # type: ignore[method-assign]
    try:
        await cluster.apply_network("consumer-1", "blackhole", "broker-a", direction="out")
        await cluster.apply_network("consumer-1", "blackhole", "broker-b", direction="in")
        await cluster.apply_network("consumer-2", "blackhole", "all")
        out_a = ["OUTPUT", "-p", "tcp", "-d", "10.9.0.11", "--dport", "10911", "-j", "DROP"]
        in_b = ["INPUT", "-p", "tcp", "-s", "10.9.0.12", "--sport", "10911", "-j", "DROP"]
        assert calls[:2] == [("consumer-1", "-A", out_a), ("consumer-1", "-A", in_b)]
        assert [(n, op, r[0], r[4]) for n, op, r in calls[2:]] == [
            ("consumer-2", "-A", "OUTPUT", "10.9.0.11"),
            ("consumer-2", "-A", "INPUT", "10.9.0.11"),
            ("consumer-2", "-A", "OUTPUT", "10.9.0.12"),
            ("consumer-2", "-A", "INPUT", "10.9.0.12"),
        ]
        assert cluster.network_faulty("consumer-1") and cluster.network_faulty("consumer-2")
        calls.clear()
        await cluster.apply_network("consumer-1", "heal", "broker-b")
        assert calls == [("consumer-1", "-D", in_b)]
        assert cluster.network_faulty("consumer-1")  # broker-a's rule stays
        await cluster.apply_network("consumer-1", "heal", "all")
        assert calls[-1] == ("consumer-1", "-D", out_a) and not cluster.network_faulty("consumer-1")
        with pytest.raises(ValueError, match="no link to 'broker-z'"):
            await cluster.apply_network("consumer-2", "blackhole", "broker-z")
        with pytest.raises(ValueError, match="no fault proxy for latency"):
            await cluster.apply_network("consumer-2", "latency", "broker-a", ms=5)
    finally:
        cluster.sup.close()
