"""Shared pieces of the chaos tests: a stand-in role process, an event collector, process-state probes,
`rmq-chaos run` on an experiment text, the problems a refused experiment text gets, and a checkout that
holds interop drivers only."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from rmqlab.lab import experiment as ex

STANDIN = textwrap.dedent(
    '''
    """A stand-in role: the common flags, a JSON-lines log, READY, graceful SIGTERM."""
    import argparse, json, os, signal, sys, time

    p = argparse.ArgumentParser()
    p.add_argument("--node"); p.add_argument("--log-file"); p.add_argument("--time-scale", type=float)
    p.add_argument("--ready", default="addr"); p.add_argument("--delay", type=float, default=0.0)
    p.add_argument("--exit-after", type=float, default=None); p.add_argument("--fail", action="store_true")
    p.add_argument("--ignore-term", action="store_true"); p.add_argument("--spawn-child", action="store_true")
    a = p.parse_args()

    def emit(event, **kw):
        with open(a.log_file, "a") as f:
            f.write(json.dumps({"ts_ms": int(time.time() * 1000), "event": event, "node": a.node,
                                "role": "standin", "pid": os.getpid(), **kw}) + "\\n")

    def on_term(*_):
        if a.ignore_term:
            return
        emit("graceful_stop")
        sys.exit(0)

    signal.signal(signal.SIGTERM, on_term)
    emit("started", time_scale=a.time_scale)
    if a.fail:
        print("boom: cannot start", flush=True)
        sys.exit(3)
    if a.spawn_child:
        import subprocess
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        emit("child", child_pid=child.pid)
    time.sleep(a.delay)
    if a.ready != "none":
        print("READY " + (f"{a.node}@{os.getpid()}" if a.ready == "cid" else "127.0.0.1:1"), flush=True)
    deadline = time.time() + (a.exit_after if a.exit_after is not None else 60)
    while time.time() < deadline:
        time.sleep(0.05)
    emit("done")
    '''
)


class Events:
    """Collects emitted events like an EventLog would."""

    def __init__(self) -> None:
        self.items: list[dict[str, Any]] = []

    def emit(self, event: str, **fields: Any) -> None:
        self.items.append({"event": event, **fields})

    def named(self, event: str) -> list[dict[str, Any]]:
        return [e for e in self.items if e["event"] == event]


def proc_state(pid: int) -> str | None:
    """The kernel's one-letter state of a process (R, S, T, Z, ...), None when it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[0]


def gone(pid: int, timeout_s: float = 5.0) -> bool:
    """True once the process no longer exists (a zombie counts as gone only after it is reaped)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc_state(pid) is None:
            return True
        time.sleep(0.02)
    return False


def events(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def processes_mentioning(text: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmdline:
            found.append(int(entry.name))
    return found


def run_experiment(tmp_path: Path, text: str) -> tuple[int, Path, str]:
    """`rmq-chaos run` (no analysis) on an experiment written to tmp_path: exit code, run dir, output."""
    exp_file = tmp_path / "experiment.toml"
    exp_file.write_text(text)
    run_dir = tmp_path / "run"
    # A relative --out, as scripts/demo.sh passes: every file must still land one level deep.
    proc = subprocess.run(
        [sys.executable, "-m", "rmqlab.chaos", "run", str(exp_file), "--out", "run", "--no-analyze"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    return proc.returncode, run_dir, proc.stdout + proc.stderr


def problems(text: str) -> list[tuple[int | None, str]]:
    """The (line, message) problems ``lab.experiment.parse`` refuses an experiment text with."""
    with pytest.raises(ex.ExperimentError) as info:
        ex.parse(text, source="x.toml")
    return info.value.problems


def line_of(text: str, needle: str, nth: int = 1) -> int:
    """The number of the nth line of ``text`` that contains ``needle``."""
    return [i for i, line in enumerate(text.splitlines(), 1) if needle in line][nth - 1]


def fake_checkout(root: Path, *drivers: str) -> Path:
    """A checkout with the given interop driver files (empty), its setup script, and none of the clients'
    environments."""
    (root / "scripts").mkdir(parents=True, exist_ok=True)
    (root / "scripts" / "setup_real_clients.sh").write_text("")
    for driver in drivers:
        path = root / "interop" / driver
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("")
    return root
