"""Real RocketMQ clients as lab consumers: where their environments and drivers live, how they run.

The drivers in ``interop/`` write the same events as our consumer (EVENTS.md) and print ``READY <client
id>``, so the supervisor runs them like any member: only the program differs. Apache's C++ client runs
with the interpreter of ``.venv-real`` and ali-ons with ``node`` from ``interop/js/node_modules``;
``scripts/setup_real_clients.sh`` makes both. Real clients ignore the lab's time scale: they keep
RocketMQ's own timers.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from chaos.experiment import CLIENT_NAMES, REAL_CLIENTS, Experiment, ExperimentError, KeyLines

SETUP_SCRIPT = "scripts/setup_real_clients.sh"
ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class RealClients:
    """The real clients' environments under a project checkout (``root``)."""

    root: Path = field(default_factory=lambda: ROOT)

    @property
    def python(self) -> Path:
        return self.root / ".venv-real" / "bin" / "python"

    @property
    def js_dir(self) -> Path:
        return self.root / "interop" / "js"

    def driver(self, kind: str) -> Path:
        return {"cpp": self.root / "interop" / "cpp_consumer.py", "js": self.js_dir / "consumer.js"}[kind]

    def missing(self, kind: str) -> str | None:
        """Why ``kind`` cannot run here, or None when it can."""
        name = CLIENT_NAMES[kind]
        fix = f"run {SETUP_SCRIPT} in the project's checkout"
        driver = self.driver(kind)
        if not driver.is_file():
            return f"{name}: its driver {driver.relative_to(self.root)} is missing ({fix})"
        if kind == "cpp":
            if not self.python.exists():
                return f"{name}: no .venv-real with the client ({fix} to install it)"
            try:
                probe = subprocess.run(
                    [str(self.python), "-c", "import rocketmq.client"],
                    capture_output=True,
                    timeout=60,
                )
            except (OSError, subprocess.TimeoutExpired) as e:
                return f"{name}: .venv-real/bin/python does not run ({e}); {fix}"
            if probe.returncode:
                return f"{name}: .venv-real cannot load the client (re{fix})"
            return None
        if shutil.which("node") is None:
            return f"{name}: node is not installed (install Node.js 18 or newer, then {fix})"
        if not (self.js_dir / "node_modules" / "ali-ons").is_dir():
            return f"{name}: no interop/js/node_modules/ali-ons ({fix} to install it)"
        return None

    def program(self, kind: str) -> list[str]:
        """The argv that starts ``kind``'s driver (before the common ``--node``/``--log-file`` flags)."""
        if kind == "cpp":
            return [str(self.python), str(self.driver(kind))]
        node = shutil.which("node")
        if node is None:
            raise RuntimeError(self.missing("js") or "node is not installed")
        return [node, str(self.driver(kind))]

    def versions(self, kinds: set[str]) -> dict[str, str]:
        """What each real client in ``kinds`` is, read from its installed package."""
        out: dict[str, str] = {}
        if "cpp" in kinds:
            pattern = ".venv-real/lib/python*/site-packages/rocketmq_python_cvs-*.dist-info"
            found = sorted(self.root.glob(pattern))
            version = found[-1].name.removesuffix(".dist-info").rpartition("-")[2] if found else "unknown"
            out["cpp"] = f"C++ client 2.1.0 (rocketmq-python-cvs {version})"
        if "js" in kinds:
            try:
                meta = json.loads((self.js_dir / "node_modules" / "ali-ons" / "package.json").read_text())
                out["js"] = f"ali-ons {meta.get('version', 'unknown')}"
            except (OSError, ValueError):
                out["js"] = "ali-ons (unknown version)"
        return out


def check_environment(exp: Experiment, clients: RealClients | None = None) -> None:
    """Raise ExperimentError naming the ``client`` line of every real client that cannot run here."""
    clients = clients or RealClients()
    lines = KeyLines(exp.text)
    problems: list[tuple[int | None, str]] = []
    seen: set[str] = set()
    for i, c in enumerate(exp.consumers):
        if c.client not in REAL_CLIENTS or c.client in seen:
            continue
        seen.add(c.client)
        why = clients.missing(c.client)
        if why:
            problems.append((lines.line_of(("consumers", i, "client")), f"consumers[{i + 1}].client: {why}"))
    if problems:
        raise ExperimentError(exp.source, problems)
