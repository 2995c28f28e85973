"""ha-controller-failover on the docker backend: the name server's controller (RocketMQ 5) replaces the
killed master of broker-a, a container, with its slave. Counts depend on timing; the test checks the
mechanism and that nothing acknowledged is lost."""

from __future__ import annotations

from pathlib import Path

import pytest
from kit.docker import chaos_run
from kit.ha import SHIPPED, lines, read_run

from rmqlab.chaos.container import ImageInfo

pytestmark = pytest.mark.slow


def test_the_controller_fails_broker_a_over_in_containers(image: ImageInfo, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    proc = chaos_run(SHIPPED / "ha-controller-failover.toml", run_dir, backend="docker")
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out
    run = read_run(run_dir, "TradeTopic")
    assert ("kill", "broker-a") in run.nemeses
    assert len(run.sent) == 300 and run.lost == 0 and run.duplicates == 0
    events = sorted(lines(run_dir, "*.jsonl"), key=lambda e: e["ts_ms"])
    elected = [e for e in events if e["event"] == "master_elected" and e["trigger"] == "master_inactive"]
    assert (elected[0]["broker"], elected[0]["master_id"], elected[0]["master_epoch"]) == ("broker-a", 2, 2)
    roles = [e for e in events if e["event"] == "broker_role_changed" and e["node"] == "broker-a"]
    assert ("SLAVE", 2) in [(e["broker_role"], e["master_epoch"]) for e in roles]
