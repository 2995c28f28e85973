"""Shared by the documentation tests: the project's root, its console scripts and one built site.

The site is built once per session with ``mkdocs build --strict`` (a broken link, a missing anchor or
a page left out of the nav fails it); the tests that look at the built pages share that build.
"""

from __future__ import annotations

import importlib
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Script:
    name: str
    target: str

    @property
    def module(self) -> str:
        return self.target.partition(":")[0]

    @property
    def package(self) -> str:
        """The package the entry point's module is in (``rmqlab.chaos`` for rmq-chaos)."""
        return self.module.rpartition(".")[0]


def pyproject() -> dict:
    with (ROOT / "pyproject.toml").open("rb") as f:
        return tomllib.load(f)


def console_scripts() -> list[Script]:
    return [Script(n, t) for n, t in sorted(pyproject()["project"]["scripts"].items())]


def script(name: str) -> Script:
    return next(s for s in console_scripts() if s.name == name)


def sibling_module(name: str, module: str) -> object:
    """A module of the package that holds ``name``'s entry point (``experiment`` beside rmq-chaos)."""
    return importlib.import_module(f"{script(name).package}.{module}")


@dataclass(frozen=True)
class Build:
    returncode: int
    output: str
    site: Path


@pytest.fixture(scope="session")
def built_site(tmp_path_factory: pytest.TempPathFactory) -> Build:
    pytest.importorskip("mkdocs", reason="mkdocs is not installed: pip install -e '.[docs]'")
    pytest.importorskip("material", reason="mkdocs-material is not installed: pip install -e '.[docs]'")
    site = tmp_path_factory.mktemp("site")
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    return Build(proc.returncode, proc.stdout + proc.stderr, site)
