"""Shared pieces of the container tests: run rmq-chaos, read a run, what a run left behind."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from rmqlab.chaos.container import IMAGE, RUN_LABEL
from rmqlab.cli import CHAOS_SHELVES, shipped

# The comparison runs the shipped experiments with their tails cut: every nemesis of the four is over
# by 280 s of RocketMQ time, and 320 s leaves two rebalance rounds after the last one.
SHORT_DURATION = 320


def shortened(name: str, duration: int = SHORT_DURATION) -> str:
    """A shipped experiment's text with a shorter duration and a workload that fits into it."""
    text = shipped(CHAOS_SHELVES)[name].text
    rate = float(re.search(r"^rate = (\d+)$", text, re.M).group(1))  # type: ignore[union-attr]
    scale = float(re.search(r"^time_scale = ([\d.]+)$", text, re.M).group(1))  # type: ignore[union-attr]
    text = re.sub(r"^duration = \d+$", f"duration = {duration}", text, flags=re.M)
    # the workload's count (three digits or more; the consumers' count is small)
    return re.sub(r"^count = \d{3,}$", f"count = {int(rate * duration * scale * 0.9)}", text, flags=re.M)


def chaos_run(exp_file: Path, run_dir: Path, *args: str, backend: str = "local") -> subprocess.Popen[str]:
    if backend == "docker":
        args = ("--image", IMAGE, *args)  # the tests' image (RMQ_IMAGE), not only the default name
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "rmqlab.chaos",
            "run",
            str(exp_file),
            "--out",
            str(run_dir),
            "--no-analyze",
            "--backend",
            backend,
            *args,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def leftovers() -> dict[str, list[str]]:
    """Containers and networks of lab runs that still exist."""

    def names(*cmd: str) -> list[str]:
        return subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=30).stdout.split()

    return {
        "containers": names("docker", "ps", "-a", "--filter", f"label={RUN_LABEL}", "--format", "{{.Names}}"),
        "networks": names(
            "docker", "network", "ls", "--filter", f"label={RUN_LABEL}", "--format", "{{.Name}}"
        ),
    }


def host_rules_mentioning(text: str) -> list[str]:
    """Lines of the host's iptables rules that mention ``text`` (a run's subnet)."""
    out = subprocess.run(["iptables-save"], capture_output=True, text=True, timeout=30, check=False).stdout
    return [line for line in out.splitlines() if text in line]


def figures(summary: dict[str, Any], group: str, time_scale: float) -> dict[str, Any]:
    """What the comparison compares: the verdict, losses, and RocketMQ-time seconds of the faults."""
    g = summary["groups"][group]
    kills = [c for c in g["convergence"] if c["cause"].startswith("kill ")]
    return {
        "verdict": g["verdict"],
        "lost": g["lost"],
        "duplicates": g["duplicates"],
        "kill_convergence_s": [
            None if c["convergence_ms"] is None else c["convergence_ms"] / 1000 / time_scale for c in kills
        ],
        "stalled_s": g["stalled_ms"] / 1000 / time_scale,
        "orphan_s": g["orphan_ms"] / 1000 / time_scale,
    }


def partition_figures(run_dir: Path, time_scale: float) -> dict[str, Any]:
    """What a client's partition from a broker did (the first blackhole of the run, and its heal):
    the messages the client consumed from that broker while cut off (half a second after the cut, for
    what was already on its way), and the RocketMQ seconds from the heal until it consumed from there
    again."""
    nemeses = [
        e
        for e in map(json.loads, (run_dir / "chaos.jsonl").read_text().splitlines())
        if e.get("event") == "nemesis"
    ]
    cut = next(e for e in nemeses if e["action"] == "blackhole")
    node, broker = cut["target"], cut["broker"]
    heal = next(
        e for e in nemeses if e["action"] == "heal" and e["target"] == node and e["ts_ms"] > cut["ts_ms"]
    )
    consumed = [
        e["ts_ms"]
        for e in map(json.loads, (run_dir / f"{node}.jsonl").read_text().splitlines())
        if e.get("event") == "message_consumed" and e["broker"] == broker
    ]
    after = [t for t in consumed if t >= heal["ts_ms"]]
    return {
        "consumed_while_cut": sum(cut["ts_ms"] + 500 <= t < heal["ts_ms"] for t in consumed),
        "resumed_after_heal_s": (min(after) - heal["ts_ms"]) / 1000 / time_scale if after else None,
    }


# scripts/test.sh builds the image while the other tests run; the container tests wait for it so long
BUILD_WAIT_S = 900.0


def wait_for_build(status_base: str, timeout_s: float = BUILD_WAIT_S) -> None:
    """Wait until the background build of scripts/test.sh wrote its exit status; fail with its log."""
    status, log = Path(status_base + ".status"), Path(status_base + ".log")
    deadline = time.monotonic() + timeout_s
    while not status.exists():
        if time.monotonic() > deadline:
            pytest.fail(f"the image build did not finish within {timeout_s:g} s (log: {log})")
        time.sleep(0.25)
    code = status.read_text().strip()
    if code != "0":
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-20:]) if log.exists() else ""
        pytest.fail(f"the image build failed (exit {code}; log: {log}):\n{tail}")
