"""Message stores: the in-memory one and the durable SQLite one behind the same interface."""

from __future__ import annotations

import re

import pytest

from rmqlab.broker.sqlite_store import SqliteMessageStore
from rmqlab.broker.store import GetMessageStatus, MemoryMessageStore, MessageDraft, MessageIdFactory
from rmqlab.broker.topic_config import TopicConfig
from rmqlab.protocol.clock import ManualClock


def draft(i: int, tags: str | None = None, topic: str = "T", qid: int = 0, size: int = 8) -> MessageDraft:
    return MessageDraft(topic, qid, bytes([i % 256]) * size, tags, f"k{i}", 1000 + i, 0, {"i": str(i)})


@pytest.fixture(params=["memory", "sqlite"])
async def store(request, tmp_path):
    clock = ManualClock()
    s: MemoryMessageStore
    if request.param == "memory":
        s = MemoryMessageStore("broker-a", clock=clock)
    else:
        s = SqliteMessageStore(str(tmp_path / "store"), "broker-a", clock=clock)
    await s.open()
    yield s
    await s.close()


async def test_put_assigns_offsets_ids_and_wire_form(store):
    arrived = []
    store.add_arrival_listener(arrived.append)
    m0 = await store.put_message(draft(0, "a"))
    m1 = await store.put_message(draft(1, "b"))
    m2 = await store.put_message(draft(2, qid=1))
    assert (m0.queue_offset, m1.queue_offset, m2.queue_offset) == (0, 1, 0)
    assert len({m0.msg_id, m1.msg_id, m2.msg_id}) == 3
    assert re.fullmatch(r"[0-9A-F]{32}", m0.msg_id)
    assert arrived == [m0, m1, m2]
    assert store.get_max_offset("T", 0) == 2 and store.get_min_offset("T", 0) == 0
    assert store.get_max_offset("T", 7) == 0 and store.get_max_offset("nope", 0) == 0
    w = m1.wire
    assert w["brokerName"] == "broker-a" and w["queueOffset"] == 1 and w["tags"] == "b"
    assert w["properties"] == {"i": "1"} and w["bornTimestamp"] == 1001


async def test_get_message_statuses(store):
    for i in range(5):
        await store.put_message(draft(i, "a" if i % 2 == 0 else "b"))
    r = store.get_message("T", 0, 0, 32, 1 << 20)
    assert r.status is GetMessageStatus.FOUND and [m.queue_offset for m in r.messages] == [0, 1, 2, 3, 4]
    assert (r.next_begin_offset, r.min_offset, r.max_offset) == (5, 0, 5)
    r = store.get_message("T", 0, 1, 2, 1 << 20)
    assert [m.queue_offset for m in r.messages] == [1, 2] and r.next_begin_offset == 3
    r = store.get_message("T", 0, 0, 32, 1 << 20, ["b"])
    assert [m.queue_offset for m in r.messages] == [1, 3] and r.next_begin_offset == 5
    r = store.get_message("T", 0, 4, 32, 1 << 20, ["b"])
    assert r.status is GetMessageStatus.NO_MATCHED_MESSAGE and r.next_begin_offset == 5
    r = store.get_message("T", 0, 5, 32, 1 << 20)
    assert r.status is GetMessageStatus.OFFSET_OVERFLOW_ONE and r.next_begin_offset == 5
    r = store.get_message("T", 0, 9, 32, 1 << 20)
    assert r.status is GetMessageStatus.OFFSET_MOVED and r.next_begin_offset == 5
    r = store.get_message("T", 0, -3, 32, 1 << 20)
    assert r.status is GetMessageStatus.OFFSET_MOVED and r.next_begin_offset == 0
    r = store.get_message("empty", 0, 0, 32, 1 << 20)
    assert r.status is GetMessageStatus.OFFSET_OVERFLOW_ONE
    r = store.get_message("empty", 0, 3, 32, 1 << 20)
    assert r.status is GetMessageStatus.OFFSET_MOVED and r.next_begin_offset == 0


async def test_byte_limit_returns_at_least_one(store):
    for i in range(4):
        await store.put_message(draft(i, size=100))
    r = store.get_message("T", 0, 0, 32, 250)
    assert len(r.messages) == 2 and r.next_begin_offset == 2
    r = store.get_message("T", 0, 0, 32, 10)
    assert len(r.messages) == 1


async def test_scan_limit_bounds_filtered_pull(store):
    for i in range(10):
        await store.put_message(draft(i, "x"))
    r = store.get_message("T", 0, 0, 2, 1 << 20, ["y"], max_scan=4)
    assert r.status is GetMessageStatus.NO_MATCHED_MESSAGE and r.next_begin_offset == 4


async def test_search_by_timestamp_and_truncate(store):
    clock = store.clock
    for i in range(4):
        await store.put_message(draft(i))
        clock.advance(10)
    t0 = store.lookup("T", 0, 0).store_timestamp
    assert store.search_offset_by_timestamp("T", 0, t0) == 0
    assert store.search_offset_by_timestamp("T", 0, t0 + 1) == 1
    assert store.search_offset_by_timestamp("T", 0, t0 + 30) == 3
    assert store.search_offset_by_timestamp("T", 0, t0 + 31) == 4
    await store.truncate("T", 0, 2)
    assert store.get_min_offset("T", 0) == 2 and store.lookup("T", 0, 1) is None
    r = store.get_message("T", 0, 1, 32, 1 << 20)
    assert r.status is GetMessageStatus.OFFSET_MOVED and r.next_begin_offset == 2
    m = await store.put_message(draft(9))
    assert m.queue_offset == 4


def test_msg_id_factory_is_unique_and_carries_epoch():
    a = MessageIdFactory("10.0.0.1", 10911, 1_700_000_000_000)
    b = MessageIdFactory("10.0.0.1", 10911, 1_700_000_000_001)
    ids = {a.next_id() for _ in range(100)} | {b.next_id() for _ in range(100)}
    assert len(ids) == 200
    assert a.next_id().startswith("0A000001" + "2A9F")


async def test_sqlite_survives_reopen(tmp_path):
    d = str(tmp_path / "s")
    s = SqliteMessageStore(d, "broker-a")
    await s.open()
    ids = [(await s.put_message(draft(i, "t"))).msg_id for i in range(3)]
    await s.wait_durable(s.persist_offset("g", "T", 0, 2))
    await s.wait_durable(s.persist_topic(TopicConfig("T", 4, 4, 6)))
    await s.truncate("T", 0, 1)
    await s.close()

    s2 = SqliteMessageStore(d, "broker-a")
    await s2.open()
    try:
        assert s2.loaded_offsets == [("g", "T", 0, 2)]
        assert s2.loaded_topics == [TopicConfig("T", 4, 4, 6)]
        assert s2.get_min_offset("T", 0) == 1 and s2.get_max_offset("T", 0) == 3
        assert [s2.lookup("T", 0, i).msg_id for i in (1, 2)] == ids[1:]
        m = s2.lookup("T", 0, 2)
        assert (m.tags, m.keys, m.properties, m.body) == ("t", "k2", {"i": "2"}, bytes([2]) * 8)
        new = await s2.put_message(draft(7))
        assert new.queue_offset == 3 and new.msg_id not in ids
        assert s2.msg_ids.epoch_ms > s.msg_ids.epoch_ms or s2.msg_ids.epoch_ms == s.msg_ids.epoch_ms + 1
    finally:
        await s2.close()


async def test_sqlite_write_is_visible_only_after_commit(tmp_path):
    s = SqliteMessageStore(str(tmp_path / "s"), "broker-a")
    await s.open()
    try:
        import asyncio

        task = asyncio.ensure_future(s.put_message(draft(0)))
        await asyncio.sleep(0)
        # reserved but not yet visible until the writer commits
        assert s.get_max_offset("T", 0) in (0, 1)
        m = await task
        assert s.get_max_offset("T", 0) == 1 and s.lookup("T", 0, 0) is m
        assert s.batches_committed >= 1
    finally:
        await s.close()


async def test_truncate_tail_drops_a_queues_last_messages_and_reuses_their_offsets(store):
    ids = [(await store.put_message(draft(i))).msg_id for i in range(5)]
    assert await store.truncate_tail("T", 0, 7) == [] and await store.truncate_tail("U", 0, 0) == []
    cut = await store.truncate_tail("T", 0, 3)
    assert [m.msg_id for m in cut] == ids[3:]
    assert store.get_max_offset("T", 0) == 3 and store.lookup("T", 0, 3) is None
    m = await store.put_message(draft(9))
    assert m.queue_offset == 3 and m.msg_id not in ids


async def test_sqlite_truncated_tail_stays_gone_after_reopen(tmp_path):
    d = str(tmp_path / "s")
    s = SqliteMessageStore(d, "broker-a")
    await s.open()
    ids = [(await s.put_message(draft(i))).msg_id for i in range(4)]
    await s.truncate_tail("T", 0, 2)
    again = await s.put_message(draft(8))
    await s.close()
    s2 = SqliteMessageStore(d, "broker-a")
    await s2.open()
    try:
        assert [s2.lookup("T", 0, i).msg_id for i in range(3)] == [*ids[:2], again.msg_id]
        assert s2.get_max_offset("T", 0) == 3
    finally:
        await s2.close()
