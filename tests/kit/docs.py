"""What the documentation tests share: the project's root, its console scripts, the built site's type."""

from __future__ import annotations

import importlib
import tomllib
from dataclasses import dataclass
from pathlib import Path

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
