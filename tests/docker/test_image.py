"""The lab's image holds every package of the project and every command it declares."""

from __future__ import annotations

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
