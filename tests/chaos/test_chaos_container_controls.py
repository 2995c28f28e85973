"""The container backend's pause, resume and signals reach the engine in the order given, without the
caller waiting for the engine: the runner calls them from its event loop. A stand-in ``docker`` command
plays the engine and holds its first command until the test releases it."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from rmqlab.chaos.container import ContainerSupervisor

FAKE_DOCKER = textwrap.dedent(
    """\
    #!{python}
    import os, sys, time
    args = sys.argv[1:]
    with open(os.environ["FAKE_DOCKER_LOG"], "a") as f:
        f.write(" ".join(args) + "\\n")
    if args[0] == "pause":  # an engine slow to freeze the container
        release = os.environ["FAKE_DOCKER_RELEASE"]
        deadline = time.monotonic() + 60
        while not os.path.exists(release) and time.monotonic() < deadline:
            time.sleep(0.01)
    """
)


@pytest.fixture
def fake_engine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    docker = bin_dir / "docker"
    docker.write_text(FAKE_DOCKER.format(python=sys.executable))
    docker.chmod(0o755)
    log, release = tmp_path / "docker.log", tmp_path / "release"
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_DOCKER_LOG", str(log))
    monkeypatch.setenv("FAKE_DOCKER_RELEASE", str(release))
    return log, release


def test_a_stop_of_a_paused_container_neither_waits_for_the_engine_nor_overtakes_the_pause(
    tmp_path: Path, fake_engine: tuple[Path, Path]
) -> None:
    log, release = fake_engine
    sup = ContainerSupervisor(
        tmp_path / "run",
        image="rmq-lab:test",
        network="rmq-test",
        label="rmqtest",
        time_scale=1.0,
        log=None,
        ready_timeout_s=5,
        stop_timeout_s=1,
    )
    sup.free_ips = ["10.0.0.2"]
    m = sup.add("consumer-1", "consumer", "client.consumer")
    m.container = "rmqtest-consumer-1-1"  # type: ignore[attr-defined]
    m.proc = subprocess.Popen(["sleep", "60"])  # the attached ``docker run``
    m.state = "running"
    try:
        calls = threading.Thread(target=lambda: (sup.pause("consumer-1"), sup.begin_stop("consumer-1")))
        calls.start()
        calls.join(timeout=5)  # the old code waited 10 s for the engine here
        # The engine still holds the pause: a caller that waited for it would still be inside.
        assert not calls.is_alive(), "pause/stop waited for the engine"
        assert not release.exists()
        release.touch()
    finally:
        m.proc.kill()
        m.proc.wait()
        sup.close(timeout_s=0)  # runs what is queued before it returns
    commands = log.read_text().splitlines()
    c = "rmqtest-consumer-1-1"
    assert commands[:3] == [f"pause {c}", f"unpause {c}", f"kill --signal SIGTERM {c}"]
