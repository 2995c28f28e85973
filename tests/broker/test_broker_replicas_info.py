"""RocketMQ 5's controller state without sockets: the elect policy, the master epoch, the SyncStateSet and
the replicas' heartbeats (ReplicasInfoManager, DefaultElectPolicy, DefaultBrokerHeartbeatManager)."""

from __future__ import annotations

import pytest

from rmqlab.broker.replicas_info import ControllerRefused, ReplicaLive, ReplicasInfoManager, elect_policy
from rmqlab.protocol.codes import ResponseCode


def live(broker_id: int, epoch: int = 1, max_offset: int = 0, priority: int = 0) -> ReplicaLive:
    return ReplicaLive(broker_id, f"h:{broker_id}", 0, 10_000, epoch, max_offset, priority)


def policy(sss, all_replicas=None, old=None, prefer=None, alive=None, infos=None):
    infos = infos or {b: live(b) for b in set(sss) | set(all_replicas or ())}
    alive = set(infos) if alive is None else alive
    return elect_policy(sss, all_replicas, old, prefer, lambda b: b in alive, infos.get)


def test_policy_keeps_a_valid_old_master_and_otherwise_the_newest_log():
    assert policy({1, 2, 3}, old=1) == 1
    infos = {1: live(1), 2: live(2, epoch=3, max_offset=10), 3: live(3, epoch=3, max_offset=50)}
    assert policy({1, 2, 3}, old=1, alive={2, 3}, infos=infos) == 3  # same epoch: the larger offset
    infos[2] = live(2, epoch=4, max_offset=0)
    assert policy({1, 2, 3}, old=1, alive={2, 3}, infos=infos) == 2  # a newer epoch wins over offsets
    infos = {2: live(2, max_offset=5, priority=2), 3: live(3, max_offset=5, priority=1)}
    assert policy({2, 3}, infos=infos) == 3  # then the lower election priority


def test_policy_elects_only_in_the_sync_state_set_unless_unclean():
    assert policy({1}, old=1, alive={2}, infos={1: live(1), 2: live(2)}) is None
    assert policy({1}, {1, 2}, old=1, alive={2}, infos={1: live(1), 2: live(2)}) == 2


def test_policy_takes_a_preferred_replica_or_nobody():
    assert policy({1, 2}, old=1, prefer=2) == 2
    assert policy({1, 2}, old=1, prefer=3) is None
    assert policy({1, 2}, old=1, prefer=2, alive={1}) is None


def _set_with_master(now: int = 0) -> ReplicasInfoManager:
    m = ReplicasInfoManager()
    m.register_broker("C", "broker-a", 1, "h:1")
    m.register_broker("C", "broker-a", 2, "h:2")
    for b in (1, 2):
        m.heartbeat("broker-a", b, f"h:{b}", now, timeout_ms=10_000, epoch=0, max_offset=0)
    e = m.elect_master("broker-a", 1, now)
    assert (e.master_id, e.master_epoch, e.sync_state_set) == (1, 1, frozenset({1}))
    return m


def test_first_election_takes_the_asking_replica_then_the_set_grows_with_the_epochs_checked():
    m = _set_with_master()
    with pytest.raises(ControllerRefused) as exc:
        m.elect_master("broker-a", 2, 0)  # the master is alive: nothing changes
    assert exc.value.code == ResponseCode.CONTROLLER_MASTER_STILL_EXIST
    with pytest.raises(ControllerRefused) as exc:
        m.alter_sync_state_set("broker-a", 1, 0, {1, 2}, 1, 0)
    assert exc.value.code == ResponseCode.CONTROLLER_FENCED_MASTER_EPOCH
    with pytest.raises(ControllerRefused) as exc:
        m.alter_sync_state_set("broker-a", 2, 1, {1, 2}, 1, 0)
    assert exc.value.code == ResponseCode.CONTROLLER_INVALID_MASTER
    with pytest.raises(ControllerRefused) as exc:
        m.alter_sync_state_set("broker-a", 1, 1, {1, 2}, 0, 0)
    assert exc.value.code == ResponseCode.CONTROLLER_FENCED_SYNC_STATE_SET_EPOCH
    with pytest.raises(ControllerRefused) as exc:
        m.alter_sync_state_set("broker-a", 1, 1, {2}, 1, 0)
    assert exc.value.code == ResponseCode.CONTROLLER_ALTER_SYNC_STATE_SET_FAILED  # without the master
    assert m.alter_sync_state_set("broker-a", 1, 1, {1, 2}, 1, 0) == 2
    assert m.sets["broker-a"].sync_state_set == {1, 2}


def test_a_silent_master_is_replaced_by_its_in_sync_slave_with_a_new_epoch():
    m = _set_with_master()
    m.alter_sync_state_set("broker-a", 1, 1, {1, 2}, 1, 0)
    m.heartbeat("broker-a", 2, "h:2", 9_000, timeout_ms=10_000)
    assert m.scan_not_active(10_001) == [("broker-a", 1)]
    assert m.inactive_masters(10_001) == ["broker-a"]
    e = m.elect_master("broker-a", None, 10_001)
    assert (e.master_id, e.master_addr, e.old_master_id) == (2, "h:2", 1)
    assert (e.master_epoch, e.sync_state_set, e.sync_state_set_epoch) == (2, frozenset({2}), 3)
    # the old master comes back: it registers and is told the new master; it cannot take the set back
    bs = m.register_broker("C", "broker-a", 1, "h:1")
    assert (bs.master_id, bs.master_epoch) == (2, 2)
    m.heartbeat("broker-a", 1, "h:1", 10_002)
    with pytest.raises(ControllerRefused):
        m.elect_master("broker-a", 1, 10_002)


def test_a_slave_outside_the_sync_state_set_is_not_elected_and_the_set_is_left_without_master():
    m = _set_with_master()
    assert m.on_connection_closed(999) == []
    m.live[("broker-a", 1)].conn_id = 7
    assert m.on_connection_closed(7) == [("broker-a", 1)]
    e = m.elect_master("broker-a", None, 1)
    assert (e.master_id, e.reason, e.master_epoch) == (None, "no_candidate", 1)
    with pytest.raises(ControllerRefused) as exc:
        m.elect_master("broker-a", None, 1)
    assert exc.value.code == ResponseCode.CONTROLLER_MASTER_NOT_AVAILABLE
    unclean = _set_with_master()
    unclean.enable_elect_unclean_master = True
    del unclean.live[("broker-a", 1)]
    assert unclean.elect_master("broker-a", None, 1).master_id == 2


def test_designated_election_moves_the_master_to_a_live_replica_of_the_set():
    m = _set_with_master()
    m.alter_sync_state_set("broker-a", 1, 1, {1, 2}, 1, 0)
    e = m.elect_master("broker-a", 2, 5, designate=True)
    assert (e.master_id, e.old_master_id, e.master_epoch) == (2, 1, 2)


def test_heartbeats_keep_the_newest_log_position():
    m = ReplicasInfoManager()
    m.heartbeat("b", 1, "h:1", 0, epoch=2, max_offset=100)
    m.heartbeat("b", 1, "h:1", 1, epoch=1, max_offset=500)  # an older epoch does not replace it
    assert (m.live[("b", 1)].epoch, m.live[("b", 1)].max_offset) == (2, 100)
    m.heartbeat("b", 1, "h:1", 2, epoch=2, max_offset=150)
    assert m.live[("b", 1)].max_offset == 150 and m.is_alive("b", 1, 2)
    with pytest.raises(ValueError):
        m.register_broker("C", "b", 0, "h:0")
    with pytest.raises(ControllerRefused) as exc:
        m.elect_master("unknown", 1, 0)
    assert exc.value.code == ResponseCode.CONTROLLER_BROKER_NEED_TO_BE_REGISTERED
