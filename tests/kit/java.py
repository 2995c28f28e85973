"""Apache's Java clients in the interop tests: whether they can run here, their build, the driver's
command line (``interop/java/consumer.sh``) in a :class:`~kit.interop.Lab`, and a process's resident size."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from kit.interop import ROOT, Lab, Proc

LAUNCHER = ROOT / "interop" / "java" / "consumer.sh"
SETUP = ROOT / "scripts" / "setup_java_clients.sh"
KINDS = ("java", "java5", "java-lite", "java-grpc")


def java_tools_missing() -> str | None:
    """Why the Java clients cannot be built here (no JDK or no Maven), or None."""
    for tool, what in (("java", "a JDK 11 or newer"), ("mvn", "Maven 3.6 or newer")):
        if shutil.which(tool) is None:
            return f"no {tool} on PATH: the Java clients need {what} (scripts/setup_java_clients.sh)"
    return None


def build_java_clients(timeout: float = 900.0) -> None:
    """Runs scripts/setup_java_clients.sh: a no-op when the build is up to date, else a Maven build (the
    first one downloads the clients from Maven Central)."""
    done = subprocess.run(
        ["bash", str(SETUP)], cwd=ROOT, capture_output=True, text=True, timeout=timeout, check=False
    )
    if done.returncode:
        output = done.stdout[-3000:] + done.stderr[-3000:]
        raise RuntimeError(f"scripts/setup_java_clients.sh failed:\n{output}")


def java_consumer_argv(lab: Lab, name: str, kind: str, group: str, topic: str, *extra: str) -> list[str]:
    """The driver's command line: the lab's native port as name server (the proxy for ``java-grpc``), its
    events in ``<name>.jsonl`` and the client's own log in ``<name>.client-log`` of the run."""
    if kind not in KINDS:
        raise ValueError(f"unknown kind {kind!r}; known: {', '.join(KINDS)}")
    where = ["--endpoints", lab.proxy] if kind == "java-grpc" else ["--namesrv", lab.native]
    argv = [str(LAUNCHER), "--kind", kind, *where, "--group", group, "--topic", topic, "--node", name]
    argv += ["--log-file", str(lab.dir / f"{name}.jsonl")]
    return [*argv, "--client-log-dir", str(lab.dir / f"{name}.client-log"), *extra]


def java_consumer(lab: Lab, name: str, kind: str, group: str, topic: str, *extra: str) -> Proc:
    return lab.start(name, java_consumer_argv(lab, name, kind, group, topic, *extra))


def rss_kb(pid: int) -> int:
    """VmRSS of a running process, in KiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise ValueError(f"no VmRSS for pid {pid}")
