"""The sans-IO core of master-slave HA: the replication log, slaves' progress and SYNC_MASTER waits, what a
slave keeps, the suggested broker of a pull and the slave's offset copy (``broker.ha_state``)."""

from __future__ import annotations

import pytest

from rmqlab.broker.ha_state import (
    BrokerRole,
    ReplicaApplier,
    ReplicaProgress,
    ReplicationLog,
    decode_offset_table,
    encode_offset_table,
    slave_offset_moved,
    suggest_pulling_from_slave,
    suggest_which_broker_id,
    sync_consumer_offsets,
)
from rmqlab.broker.store import MemoryMessageStore, StoredMessage


def test_role_parse():
    assert BrokerRole.parse("sync_master") is BrokerRole.SYNC_MASTER
    assert BrokerRole.parse("SLAVE") is BrokerRole.SLAVE
    with pytest.raises(ValueError, match=r"ASYNC_MASTER, SYNC_MASTER, SLAVE.*'PRIMARY'"):
        BrokerRole.parse("PRIMARY")


def test_log_positions_and_batches():
    log = ReplicationLog()
    assert log.max_position == 0 and log.position_of(0) == 0
    assert log.append("a", 10) == 10
    assert log.append("b", 10) == 20
    assert log.append("c", 5) == 25
    assert log.append("d", 0) == 25
    assert len(log) == 4 and log.max_position == 25
    assert [log.position_of(i) for i in range(6)] == [0, 10, 20, 25, 25, 25]
    # at most max_bytes, measured from the batch's start, but always one entry
    assert log.batch(0, 20) == (["a", "b"], 2)
    assert log.batch(0, 19) == (["a"], 1)
    assert log.batch(1, 1) == (["b"], 2)
    assert log.batch(1, 15) == (["b", "c", "d"], 4)
    assert log.batch(4, 100) == ([], 4)
    assert log.batch(9, 100) == ([], 9)
    assert log.batch(-3, 10) == (["a"], 1)


def test_sync_master_waits_for_the_furthest_slave():
    p = ReplicaProgress(housekeeping_ms=20_000, fallbehind_max=100)
    assert not p.is_slave_ok(10, now_ms=0)  # SLAVE_NOT_AVAILABLE: nobody connected
    assert p.report(1, 0, now_ms=0) == []
    assert p.is_slave_ok(99, now_ms=0)
    assert not p.is_slave_ok(100, now_ms=0)  # too far behind
    t1, t2 = object(), object()
    assert p.wait_for(30, t1)
    assert p.wait_for(50, t2)
    assert p.report(1, 29, now_ms=1) == []
    assert p.report(2, 30, now_ms=1) == [t1]
    # a slower slave does not move push2SlaveMaxOffset back
    assert p.report(1, 10, now_ms=2) == []
    assert p.push2slave_max == 30
    assert not p.wait_for(30, object())  # already there: nothing to wait for
    assert p.report(1, 50, now_ms=3) == [t2]
    assert p.waiters == []


def test_cancel_and_housekeeping():
    p = ReplicaProgress(housekeeping_ms=100)
    t = object()
    p.report(7, 0, now_ms=0)
    p.wait_for(5, t)
    p.cancel(t)
    assert p.report(7, 5, now_ms=50) == []
    assert p.connection_count(150) == 1
    p.report(9, 5, now_ms=60)
    assert p.expire_silent(151) == [7]  # silent longer than haHousekeepingInterval
    assert p.connection_count(161) == 0
    p.report(8, 5, now_ms=200)
    p.remove(8)
    assert p.connection_count(200) == 0


def test_applier_epochs_and_idempotent_keep():
    a = ReplicaApplier()
    assert a.start(111)
    a.position = 7
    assert not a.start(111) and a.position == 7
    assert a.start(222) and a.position == 0  # a new master run: from its log's start
    assert ReplicaApplier.keep(3, 3) is True
    assert ReplicaApplier.keep(3, 2) is False
    assert ReplicaApplier.keep(3, 4) is None


def test_suggest_which_broker_id():
    assert suggest_which_broker_id(slave_read_enable=False, suggest_pulling_from_slave=True) == 0
    assert suggest_which_broker_id(slave_read_enable=True, suggest_pulling_from_slave=True) == 1
    assert suggest_which_broker_id(slave_read_enable=True, suggest_pulling_from_slave=False) == 0
    assert (
        suggest_which_broker_id(
            slave_read_enable=True,
            suggest_pulling_from_slave=True,
            which_broker_when_consume_slowly=2,
            group_broker_id=3,
        )
        == 2
    )
    assert (
        suggest_which_broker_id(slave_read_enable=True, suggest_pulling_from_slave=False, group_broker_id=3)
        == 3
    )
    assert suggest_pulling_from_slave(1_000, 899, 100)
    assert not suggest_pulling_from_slave(1_000, 900, 100)
    assert slave_offset_moved(False) and not slave_offset_moved(True)


def test_offset_sync_is_put_all_per_topic_and_group():
    local = {("T", "g"): {0: 50, 1: 60, 3: 9}, ("T", "other"): {0: 5}, ("U", "g"): {0: 1}}
    master = {("T", "g"): {0: 10, 1: 60, 2: 7}, ("V", "g"): {0: 4}}
    changed = sync_consumer_offsets(local, master)
    # the master's older offsets win, and queue 3 that only the slave had is gone with the entry
    assert local == {
        ("T", "g"): {0: 10, 1: 60, 2: 7},
        ("T", "other"): {0: 5},
        ("U", "g"): {0: 1},
        ("V", "g"): {0: 4},
    }
    assert changed == [
        ("g", "T", 0, 50, 10),
        ("g", "T", 2, -1, 7),
        ("g", "T", 3, 9, -1),
        ("g", "V", 0, -1, 4),
    ]
    assert sync_consumer_offsets(local, master) == []


def test_offset_table_wire_round_trip_and_errors():
    rows = [("g", "T", 0, 3), ("g", "T", 1, 4), ("h", "%RETRY%h", 0, 0)]
    wire = encode_offset_table(rows)
    assert wire == {"T@g": {0: 3, 1: 4}, "%RETRY%h@h": {0: 0}}
    assert decode_offset_table(wire) == {("T", "g"): {0: 3, 1: 4}, ("%RETRY%h", "h"): {0: 0}}
    with pytest.raises(ValueError, match="expected a map"):
        decode_offset_table([])
    with pytest.raises(ValueError, match="not 'topic@group'"):
        decode_offset_table({"Tg": {}})
    with pytest.raises(ValueError, match=r"T@g: expected a map"):
        decode_offset_table({"T@g": 3})
    with pytest.raises(ValueError, match="must be ints"):
        decode_offset_table({"T@g": {"0": 3}})


def _replica(offset: int, msg_id: str) -> StoredMessage:
    return StoredMessage(msg_id, "T", 0, offset, b"x", None, None, 1, 2, 0, {}, "broker-a")


async def test_store_keeps_a_replica_only_as_its_queues_next():
    store = MemoryMessageStore()
    arrived: list[str] = []
    store.add_arrival_listener(lambda m: arrived.append(m.msg_id))
    assert await store.put_replica(_replica(0, "A"), ReplicaApplier.keep) is True
    assert await store.put_replica(_replica(0, "A"), ReplicaApplier.keep) is False
    assert await store.put_replica(_replica(2, "C"), ReplicaApplier.keep) is None
    assert await store.put_replica(_replica(1, "B"), ReplicaApplier.keep) is True
    assert arrived == ["A", "B"]
    assert [m.msg_id for m in store.consume_queue("T", 0).messages] == ["A", "B"]
    assert store.lookup("T", 0, 1).store_timestamp == 2  # the master's store time, kept
