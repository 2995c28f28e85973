"""The lab's image holds every package of the project and every command it declares."""

from __future__ import annotations

import os
import re
import subprocess
import tomllib
from pathlib import Path

from rmqlab.chaos.container import SOURCE_PACKAGES, ImageInfo

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def packages() -> list[str]:
    """The checkout's folders that pyproject maps into the rmqlab package."""
    return sorted(set(PYPROJECT["tool"]["setuptools"]["package-dir"].values()))


def test_the_dockerfile_copies_every_package_and_the_digest_covers_what_runs_in_it() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    ignore = (ROOT / ".dockerignore").read_text().splitlines()
    copied = re.findall(r"^COPY (\w+) \./\1$", dockerfile, re.M)
    assert sorted(copied) == sorted(packages())
    assert [p for p in packages() if f"!{p}/" not in ignore] == []
    # the pipeline runs on the host (Spark); everything else of the image is in its source digest
    assert sorted(SOURCE_PACKAGES) == sorted(set(packages()) - {"pipeline"})


def test_every_command_of_the_project_runs_in_the_image(image: ImageInfo) -> None:
    commands = sorted(PYPROJECT["project"]["scripts"])
    loop = 'for c in "$@"; do "$c" --help >/dev/null 2>&1 || echo "broken: $c"; done'
    proc = subprocess.run(
        ["docker", "run", "--rm", image.name, "sh", "-c", loop, "sh", *commands],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split("\n")[:-1] == [], proc.stdout
    assert "rmq-sim" in commands


def test_the_roles_run_as_an_unprivileged_user_or_the_one_given(image: ImageInfo, tmp_path: Path) -> None:
    def run(*args: str) -> str:
        proc = subprocess.run(
            ["docker", "run", "--rm", *args], capture_output=True, text=True, timeout=120, check=False
        )
        assert proc.returncode == 0, proc.stderr
        return proc.stdout.split()

    # by default the image's own user, which owns /runs (an anonymous volume starts out as its)
    assert run(image.name, "sh", "-c", "id -u; id -g; touch /runs/x && stat -c %u /runs/x") == [
        "10001", "10001", "10001",
    ]  # fmt: skip
    # the compose file's run-dir job: root makes the run's folder in the host's bind mount and gives it
    # to the user the roles run as, who can then write there
    host = tmp_path / "runs"
    host.mkdir()
    mount = f"{host}:/runs"
    run("--user", "0:0", "-v", mount, image.name, "sh", "-c", "mkdir -p /runs/r && chown 10001:10001 /runs/r")
    run("-v", mount, image.name, "rmq-admin", "--help")  # a role's console script, as the default user
    run("-v", mount, image.name, "touch", "/runs/r/namesrv.jsonl")
    assert (host / "r" / "namesrv.jsonl").stat().st_uid == 10001
    # --user UID:GID (RMQ_USER, the docker backend's host user): the files are that user's
    uid = "4321" if os.geteuid() == 0 else str(os.getuid())
    if os.geteuid() == 0:
        os.chown(host, 4321, 4321)
    run("--user", f"{uid}:{uid}", "-v", mount, image.name, "touch", "/runs/mine")
    assert (host / "mine").stat().st_uid == int(uid)
    # what the roles wrote as 10001 is the host's to remove, whoever that is
    run("--user", "0:0", "-v", mount, image.name, "rm", "-rf", "/runs/r", "/runs/mine")
