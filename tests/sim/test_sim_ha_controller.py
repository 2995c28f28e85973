"""The shipped ha-controller-failover experiment, simulated: RocketMQ 5's controller replaces a killed
master with its slave; nothing acknowledged is lost, the route names the new master, and the old master
comes back as a slave of the new epoch. Deterministic for its seed."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from kit.ha import SHIPPED, lines, read_run

from rmqlab.sim.sim_cluster import SimCluster
from rmqlab.sim.sim_table import load
from rmqlab.sim.sim_table import parse as parse_sim


def events(run_dir: Path, kind: str) -> list[dict[str, Any]]:
    found = [e for e in lines(run_dir, "*.jsonl") if e["event"] == kind]
    return sorted(found, key=lambda e: e["ts_ms"])  # a restarted node writes a second file


def test_the_controller_elects_the_slave_and_consumers_continue_on_it(tmp_path: Path) -> None:
    result = SimCluster(
        load(SHIPPED / "ha-controller-failover.toml"), tmp_path, out=io.StringIO(), progress=False
    ).run()
    assert not result.errors, result.errors
    assert result.drained
    run = read_run(tmp_path, "TradeTopic")
    assert ("kill", "broker-a") in run.nemeses and ("start", "broker-a") in run.nemeses
    assert len(run.sent) == 300 and run.lost == 0
    elected = [e for e in events(tmp_path, "master_elected") if e["trigger"] == "master_inactive"]
    first = elected[0]
    assert (first["broker"], first["old_master_id"], first["master_id"]) == ("broker-a", 1, 2)
    assert first["master_epoch"] == 2 and first["sync_state_set"] == [2]
    promoted = [e for e in events(tmp_path, "broker_role_changed") if e["node"] == "broker-a-s1"]
    assert promoted[-1]["broker_role"] == "SYNC_MASTER" and promoted[-1]["broker_id"] == 0
    routes = [e for e in events(tmp_path, "route_master_changed") if e["broker"] == "broker-a"]
    assert routes[-1]["state_version"] == 2
    # the rest of broker-a's backlog was consumed after the election: from the new master
    later = [
        e
        for e in events(tmp_path, "message_consumed")
        if e.get("broker") == "broker-a" and e["ts_ms"] > first["ts_ms"]
    ]
    assert later and run.duplicates == 0
    # the old master, started again, is a slave of epoch 2 and rejoins the SyncStateSet
    back = [e for e in events(tmp_path, "broker_role_changed") if e["node"] == "broker-a"]
    assert (back[-1]["broker_role"], back[-1]["master_epoch"]) == ("SLAVE", 2)
    assert any(
        e["sync_state_set"] == [1, 2]
        for e in events(tmp_path, "sync_state_set_changed")
        if e["broker"] == "broker-a" and e["master_epoch"] == 2
    )


def simulate_with(tmp_path: Path, nemesis: str, errors: frozenset[str] = frozenset()) -> Path:
    text = (SHIPPED / "ha-controller-failover.toml").read_text()
    text = text[: text.index("[[nemesis]]")] + nemesis
    result = SimCluster(parse_sim(text, "controller.toml"), tmp_path, out=io.StringIO(), progress=False).run()
    assert set(result.errors) <= errors
    assert result.drained
    return tmp_path


def test_failover_under_the_controller_elects_the_slave_and_demotes_the_running_master(
    tmp_path: Path,
) -> None:
    d = simulate_with(tmp_path, '[[nemesis]]\naction = "failover"\ntarget = "broker-a"\nat = 150\n')
    run = read_run(d, "TradeTopic")
    assert ("failover", "broker-a") in run.nemeses and ("stop", "broker-a") not in run.nemeses
    assert len(run.sent) == 300 and run.lost == 0
    [e] = [e for e in events(d, "master_elected") if e["trigger"] == "designated"]
    assert (e["broker"], e["old_master_id"], e["master_id"], e["master_epoch"]) == ("broker-a", 1, 2, 2)
    demoted = [e for e in events(d, "broker_role_changed") if e["node"] == "broker-a"][-1]
    assert (demoted["broker_role"], demoted["master_epoch"], demoted["broker_id"]) == ("SLAVE", 2, 1)


def test_a_paused_master_loses_its_set_after_the_heartbeat_timeout_and_comes_back_a_slave(
    tmp_path: Path,
) -> None:
    # sends to the paused master time out: a producer that gives one up (send_abandoned) exits 1
    d = simulate_with(
        tmp_path,
        '[[nemesis]]\naction = "pause"\ntarget = "broker-a"\nat = 50\nfor = 100\n',
        frozenset({"producer-1 exited with code 1"}),
    )
    run = read_run(d, "TradeTopic")
    assert len(run.sent) + len(events(d, "send_abandoned")) == 300 and run.lost == 0
    [inactive] = [e for e in events(d, "controller_broker_inactive") if e["reason"] == "heartbeat_timeout"]
    assert (inactive["broker"], inactive["broker_id"]) == ("broker-a", 1)
    [e] = [
        e
        for e in events(d, "master_elected")
        if e["trigger"] == "master_inactive" and e["ts_ms"] < inactive["ts_ms"] + 1_000
    ]
    assert (e["master_id"], e["master_epoch"]) == (2, 2)
    back = [e for e in events(d, "broker_role_changed") if e["node"] == "broker-a"][-1]
    assert (back["broker_role"], back["master_epoch"]) == ("SLAVE", 2)
    # while it did not know, the resumed master's registrations did not take the route back
    assert all(
        e["broker_addr"] != r["master_addr"]
        for e in events(d, "broker_registration_ignored")
        for r in events(d, "route_master_changed")
        if r["ts_ms"] > inactive["ts_ms"]
    )


def test_a_master_cut_off_from_the_controller_is_replaced_and_rejoins_as_a_slave(tmp_path: Path) -> None:
    d = simulate_with(
        tmp_path,
        '[[nemesis]]\naction = "blackhole"\ntarget = "broker-a"\npeer = "namesrv"\nat = 150\nfor = 100\n',
    )
    run = read_run(d, "TradeTopic")
    assert len(run.sent) == 300 and run.lost == 0
    [inactive] = [e for e in events(d, "controller_broker_inactive") if e["reason"] == "heartbeat_timeout"]
    elected = [e for e in events(d, "master_elected") if e["trigger"] == "master_inactive"]
    assert (elected[0]["master_id"], elected[0]["master_epoch"]) == (2, 2)
    assert elected[0]["ts_ms"] == inactive["ts_ms"]
    # healed, the old master still registers as brokerId 0 with epoch 1 until it hears of epoch 2: ignored
    ignored = events(d, "broker_registration_ignored")
    assert ignored and all(e["broker_id"] == 0 and e["state_version"] == 1 for e in ignored)
    back = [e for e in events(d, "broker_role_changed") if e["node"] == "broker-a"][-1]
    assert (back["broker_role"], back["master_epoch"]) == ("SLAVE", 2)
