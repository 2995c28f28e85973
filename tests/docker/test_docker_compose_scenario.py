"""The compose cluster run for real, as the README tells people to: the scenario script brings up four
consumers with docker compose, kills one and pauses another through ``rmq-chaos nemesis``, drains,
brings the cluster down and runs ``rmq-analyze`` on the run directory."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
from kit.docker import leftovers

from rmqlab.chaos.container import ImageInfo

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.spark
def test_compose_scenario_balances_survives_a_kill_and_loses_nothing(image: ImageInfo) -> None:
    proc = subprocess.run(
        ["bash", str(ROOT / "scripts/docker/compose_scenario.sh"), "--no-report"],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=ROOT,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert re.search(r"compose scenario: sent \d+, lost 0, duplicates \d+, the kill converged in \d+ ms", out)
    run = Path(re.search(r"rmq-analyze (\S+)", out).group(1))  # type: ignore[union-attr]
    # start-up followed the healthchecks: the jobs ran to completion, the servers were healthy
    health = re.search(r"health:(.*)", out).group(1).split()  # type: ignore[union-attr]
    assert {"run-dir=exited", "namesrv=healthy", "broker-a=healthy", "broker-b=healthy"} <= set(health)
    assert "setup=exited" in health and len([h for h in health if h.startswith("consumer=")]) == 4
    try:
        summary = json.loads((run / "summary.json").read_text())
        # told in RocketMQ time: the servers logged 0.05, and no chaos runner wrote another
        assert summary["run"]["time_scale"] == 0.05 and "time_scale_note" not in summary["run"]
        group = summary["groups"]["GID_compose"]
        assert group["verdict"] == "ok" and group["lost"] == 0 and group["sent"] > 0
        # four replicas with four distinct client ids, each in its own log named after its container;
        # replicas that start in the same millisecond share a change point ("start A; start B")
        starts = [
            part for c in group["convergence"] for part in c["cause"].split("; ") if part.startswith("start ")
        ]
        assert len({part.split(" ")[1] for part in starts}) == 4, starts
        nemesis = [json.loads(line) for line in (run / "nemesis.jsonl").read_text().splitlines()]
        assert [(e["action"], e["by"]) for e in nemesis] == [
            ("kill", "hand"),
            ("pause", "hand"),
            ("resume", "hand"),
        ]
        assert len(list(run.glob("consumer-*.jsonl"))) == 4
        # the compose project is gone
        ps = subprocess.run(
            ["docker", "ps", "-a", "--filter", "label=com.docker.compose.project", "--format", "{{.Names}}"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
        assert not [n for n in ps if n.startswith("rmqlab-scenario-")]
        assert leftovers() == {"containers": [], "networks": []}
    finally:
        subprocess.run(["rm", "-rf", str(run)], check=False)
