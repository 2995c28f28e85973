"""Fixtures for the chaos tests."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from kit.chaos import STANDIN


@pytest.fixture
def standin(tmp_path: Path) -> dict[str, str]:
    """Writes the stand-in module and returns the env that makes it importable as ``standin_role``."""
    d = tmp_path / "mods"
    d.mkdir()
    (d / "standin_role.py").write_text(STANDIN)
    return {"PYTHONPATH": str(d) + os.pathsep + os.environ.get("PYTHONPATH", "")}
