"""The documentation tests' one built site: ``mkdocs build --strict`` once per session (a broken link,
a missing anchor or a page left out of the nav fails it); the tests that look at the built pages share
that build. Their helpers are ``kit.docs``."""

from __future__ import annotations

import subprocess
import sys

import pytest
from kit.docs import ROOT, Build


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
