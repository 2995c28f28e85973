"""Real RocketMQ clients as lab consumers: where their environments and drivers live, how they run.

The drivers in ``interop/`` write the same events as our consumer (EVENTS.md) and print ``READY <client
id>``, so the supervisor runs them like any member: only the program differs. Apache's C++ client runs
with the interpreter of ``.venv-real``, ali-ons with ``node`` from ``interop/js/node_modules``, Apache's
RocketMQ 5 Python client with ``.venv-v5`` and its Node.js client from ``interop/js5/node_modules``
(those two talk gRPC to ``rmq-proxy``); ``scripts/setup_real_clients.sh`` makes all four. Apache's Java
clients run through ``interop/java/consumer.sh`` on the class paths ``scripts/setup_java_clients.sh``
builds under ``.cache/java/lib``, its Go client as the binary ``scripts/setup_go_client.sh`` builds into
``.cache/go``. Real clients keep RocketMQ's own timers, except Apache's Java remoting clients, whose driver
scales those that can be set from outside (``--time-scale``).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from rmqlab.lab.experiment import (
    CLIENT_NAMES,
    JAVA_CLIENTS,
    REAL_CLIENTS,
    Experiment,
    ExperimentError,
    KeyLines,
)

SETUP_SCRIPT = "scripts/setup_real_clients.sh"
JAVA_SETUP_SCRIPT = "scripts/setup_java_clients.sh"
GO_SETUP_SCRIPT = "scripts/setup_go_client.sh"
# The class path folder of .cache/java/lib each Java kind runs on (interop/java/consumer.sh's modules).
JAVA_MODULES = {"java": "client4", "java-lite": "client4", "java5": "client5", "java-grpc": "grpc"}
JAVA_VERSIONS = {
    "java": "rocketmq-client 4.9.8",
    "java-lite": "rocketmq-client 4.9.8",
    "java5": "rocketmq-client 5.5.0",
    "java-grpc": "rocketmq-client-java 5.2.0",
}


def setup_script(kind: str) -> str:
    """The script of a checkout that installs or builds the real client ``kind``."""
    if kind in JAVA_CLIENTS:
        return JAVA_SETUP_SCRIPT
    return GO_SETUP_SCRIPT if kind == "go" else SETUP_SCRIPT


# The real clients' environments live in a checkout of the project (the setup script installs them
# there). Run from a checkout, that is this package's own root; an installed package has no place for
# them, so RMQLAB_CHECKOUT names a checkout whose clients to use.
CHECKOUT_ENV = "RMQLAB_CHECKOUT"
PACKAGE_ROOT = Path(__file__).resolve().parents[1]


def default_root() -> Path:
    named = os.environ.get(CHECKOUT_ENV)
    return Path(named).resolve() if named else PACKAGE_ROOT


ROOT = default_root()


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

    @property
    def v5_python(self) -> Path:
        return self.root / ".venv-v5" / "bin" / "python"

    @property
    def js5_dir(self) -> Path:
        return self.root / "interop" / "js5"

    @property
    def java_lib(self) -> Path:
        return self.root / ".cache" / "java" / "lib"

    @property
    def go_binary(self) -> Path:
        return self.root / ".cache" / "go" / "rocketmq-go-consumer"

    def driver(self, kind: str) -> Path:
        if kind in JAVA_CLIENTS:
            return self.root / "interop" / "java" / "consumer.sh"
        return {
            "cpp": self.root / "interop" / "cpp_consumer.py",
            "js": self.js_dir / "consumer.js",
            "py5": self.root / "interop" / "py5_client.py",
            "js5": self.js5_dir / "client.js",
            "go": self.root / "interop" / "go" / "main.go",
        }[kind]

    def missing(self, kind: str) -> str | None:
        """Why ``kind`` cannot run here, or None when it can."""
        name = CLIENT_NAMES[kind]
        script = setup_script(kind)
        if not (self.root / script).is_file():
            return (
                f"{name} runs from a checkout of the project, where {script} installs it; this lab is "
                f"an installed package ({self.root}): set {CHECKOUT_ENV}=DIR to a checkout where that "
                "script has run"
            )
        fix = f"run {script} in the project's checkout"
        driver = self.driver(kind)
        if not driver.is_file():
            return f"{name}: its driver {driver.relative_to(self.root)} is missing ({fix})"
        if kind in JAVA_CLIENTS:
            if shutil.which("java") is None:
                return f"{name}: java is not installed (install a JDK 17, then {fix})"
            module = self.java_lib / JAVA_MODULES[kind]
            if not any(module.glob("*.jar")):
                return f"{name}: not built, no .cache/java/lib/{JAVA_MODULES[kind]} ({fix} to build it)"
            if kind == "java-grpc":
                return self._proxy_missing(name)
            return None
        if kind == "go":
            if not os.access(self.go_binary, os.X_OK):
                return f"{name}: not built, no .cache/go/rocketmq-go-consumer ({fix} to build it)"
            return None
        if kind == "py5":
            return self._v5_python_missing(name, fix)
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
        if kind == "js5":
            if not (self.js5_dir / "node_modules" / "rocketmq-client-nodejs").is_dir():
                return f"{name}: no interop/js5/node_modules/rocketmq-client-nodejs ({fix} to install it)"
            return self._proxy_missing(name)
        if not (self.js_dir / "node_modules" / "ali-ons").is_dir():
            return f"{name}: no interop/js/node_modules/ali-ons ({fix} to install it)"
        return None

    def _v5_python_missing(self, name: str, fix: str) -> str | None:
        if not self.v5_python.exists():
            return f"{name}: no .venv-v5 with the client ({fix} to install it)"
        try:
            probe = subprocess.run(
                [str(self.v5_python), "-c", "import rocketmq.v5.consumer"], capture_output=True, timeout=60
            )
        except (OSError, subprocess.TimeoutExpired) as e:
            return f"{name}: .venv-v5/bin/python does not run ({e}); {fix}"
        if probe.returncode:
            return f"{name}: .venv-v5 cannot load the client (re{fix})"
        return self._proxy_missing(name)

    @staticmethod
    def _proxy_missing(name: str) -> str | None:
        """The v5 clients need rmq-proxy, and rmq-proxy needs the project's [v5] extra."""
        try:
            import rmqlab.proxy.v5  # noqa: F401
        except ImportError as e:
            return f"{name}: rmq-proxy cannot start: {e}"
        return None

    def program(self, kind: str) -> list[str]:
        """The argv that starts ``kind``'s driver (before the common ``--node``/``--log-file`` flags)."""
        if kind == "cpp":
            return [str(self.python), str(self.driver(kind))]
        if kind == "py5":
            return [str(self.v5_python), str(self.driver(kind)), "consumer"]
        if kind in JAVA_CLIENTS:
            return [str(self.driver(kind)), "--kind", kind]
        if kind == "go":
            return [str(self.go_binary)]
        node = shutil.which("node")
        if node is None:
            raise RuntimeError(self.missing("js") or "node is not installed")
        return [node, str(self.driver(kind))] + (["consumer"] if kind == "js5" else [])

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
        if "py5" in kinds:
            pattern = ".venv-v5/lib/python*/site-packages/rocketmq_python_client-*.dist-info"
            found = sorted(self.root.glob(pattern))
            version = found[-1].name.removesuffix(".dist-info").rpartition("-")[2] if found else "unknown"
            out["py5"] = f"rocketmq-python-client {version}"
        if "js5" in kinds:
            try:
                path = self.js5_dir / "node_modules" / "rocketmq-client-nodejs" / "package.json"
                version = json.loads(path.read_text()).get("version", "unknown")
                out["js5"] = f"rocketmq-client-nodejs {version}"
            except (OSError, ValueError):
                out["js5"] = "rocketmq-client-nodejs (unknown version)"
        for kind in sorted(kinds & set(JAVA_CLIENTS)):
            out[kind] = JAVA_VERSIONS[kind]
        if "go" in kinds:
            gomod = self.root / "interop" / "go" / "go.mod"
            try:
                words = next(
                    line.split()
                    for line in gomod.read_text().splitlines()
                    if "github.com/apache/rocketmq-client-go/v2 " in line
                )
                out["go"] = f"rocketmq-client-go {words[-1]}"
            except (OSError, StopIteration):
                out["go"] = "rocketmq-client-go (unknown version)"
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
