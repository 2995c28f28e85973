"""The shipped master-slave experiments on local processes (rmq-chaos run): masters and slaves as
rmq-broker processes, the failover nemesis, #1094's stale master offsets and #2705's minimum offset.
Counts depend on timing here, so the tests check the mechanism and its bounds, not the numbers."""

from __future__ import annotations

from pathlib import Path

import pytest
from kit.chaos import run_experiment
from kit.ha import SHIPPED, HaRun, read_run

pytestmark = pytest.mark.slow


def run_shipped(tmp_path: Path, name: str, topic: str) -> HaRun:
    rc, run_dir, out = run_experiment(tmp_path, (SHIPPED / f"{name}.toml").read_text())
    assert rc == 0, out
    for slave in ("broker-a-s1", "broker-b-s1"):
        assert (run_dir / f"{slave}.jsonl").exists(), out
    return read_run(run_dir, topic)


def test_a_failover_on_processes_reads_every_message_once(tmp_path: Path) -> None:
    run = run_shipped(tmp_path, "ha-failover", "TradeTopic")
    assert ("failover", "broker-a") in run.nemeses and ("stop", "broker-a") in run.nemeses
    assert run.skipped == []
    assert len(run.sent) == 300 and run.lost == 0 and run.duplicates == 0
    assert run.slave_commits > 0


def test_stale_master_offsets_on_processes(tmp_path: Path) -> None:
    run = run_shipped(tmp_path, "ha-stale-master-offsets", "OrderTopic")
    assert run.lost == 0 and run.slave_commits > 0
    assert run.regressions, "the slave's sync never put an older offset over a newer one"
    for q, _prev, new in run.regressions:
        assert run.restart_offsets[("broker-a", q)] <= new
    assert run.duplicates_of("broker-a") >= sum(prev - new for _q, prev, new in run.regressions)


def test_a_slave_without_offsets_on_processes_sends_the_group_to_the_minimum(tmp_path: Path) -> None:
    run = run_shipped(tmp_path, "ha-slave-without-offsets", "PayTopic")
    assert run.lost == 0
    starts = {q: off for (b, q), off in run.restart_offsets.items() if b == "broker-a"}
    assert starts and set(starts.values()) == {0}
    # every message broker-a stored is consumed again (some a third time when the master comes back
    # without its store and moves the offsets: timing decides how many)
    again = [n for mid, n in run.deliveries.items() if run.sent[mid] == "broker-a"]
    assert again and min(again) >= 2 and len(again) == run.sent_to("broker-a")
