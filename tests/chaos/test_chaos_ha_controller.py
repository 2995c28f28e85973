"""ha-controller-failover on local processes (rmq-chaos run): the name server's controller replaces the
killed master of broker-a with its slave. Counts depend on timing here; the test checks the mechanism
and that nothing acknowledged is lost."""

from __future__ import annotations

from pathlib import Path

import pytest
from kit.chaos import run_experiment
from kit.ha import SHIPPED, lines, read_run

pytestmark = pytest.mark.slow


def test_the_controller_fails_broker_a_over_on_processes(tmp_path: Path) -> None:
    rc, run_dir, out = run_experiment(tmp_path, (SHIPPED / "ha-controller-failover.toml").read_text())
    assert rc == 0, out
    run = read_run(run_dir, "TradeTopic")
    assert ("kill", "broker-a") in run.nemeses
    assert len(run.sent) == 300 and run.lost == 0 and run.duplicates == 0
    events = sorted(lines(run_dir, "*.jsonl"), key=lambda e: e["ts_ms"])
    elected = [e for e in events if e["event"] == "master_elected" and e["trigger"] == "master_inactive"]
    assert (elected[0]["broker"], elected[0]["master_id"], elected[0]["master_epoch"]) == ("broker-a", 2, 2)
    roles = [e for e in events if e["event"] == "broker_role_changed" and e["node"] == "broker-a"]
    assert ("SLAVE", 2) in [(e["broker_role"], e["master_epoch"]) for e in roles]  # back as a slave
