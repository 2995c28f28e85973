"""ProcessQueue: a port of RocketMQ's ProcessQueueTest plus the commit-offset and orderly rules."""

from __future__ import annotations

from rmqlab.client.process_queue import MIB, ProcessQueue
from rmqlab.protocol.model import Message


def msgs(n: int, start: int = 0, size: int = 123) -> list[Message]:
    return [Message(f"id{i}", "T", "b", 0, i, bytes(size), keys=f"keys{i}") for i in range(start, start + n)]


def test_cached_message_count() -> None:
    pq = ProcessQueue()
    pq.put_messages(msgs(100))
    assert pq.msg_count == 100
    pq.take_messages(10, now_ms=1)
    pq.commit()
    assert pq.msg_count == 90
    last = pq.last_offset()
    assert last == 99
    pq.remove_messages([msgs(1, start=99)[0]], now_ms=2)
    assert pq.msg_count == 89


def test_cached_message_size() -> None:
    pq = ProcessQueue()
    pq.put_messages(msgs(100))
    assert pq.msg_size == 100 * 123
    pq.take_messages(10, now_ms=1)
    pq.commit()
    assert pq.msg_size == 90 * 123
    pq.remove_messages(msgs(1, start=99), now_ms=2)
    assert pq.msg_size == 89 * 123


def test_contains_message() -> None:
    pq = ProcessQueue()
    two = msgs(2)
    pq.put_messages([two[0]])
    assert pq.contains(two[0].queue_offset)
    assert not pq.contains(two[1].queue_offset)


def test_cached_size_in_mib_as_fill_process_queue_info() -> None:
    pq = ProcessQueue()
    pq.put_messages(msgs(102400))
    assert pq.cached_size_mib == 12
    pq.take_messages(10000, now_ms=0)
    pq.commit()
    assert pq.cached_size_mib == 10
    pq.take_messages(10000, now_ms=0)
    pq.commit()
    assert pq.cached_size_mib == 9
    pq.take_messages(80000, now_ms=0)
    pq.commit()
    assert pq.cached_size_mib == 0
    assert pq.msg_size < MIB


def test_rollback_and_has_temp_message() -> None:
    pq = ProcessQueue()
    pq.rollback()
    assert pq.consuming_orderly_count == 0
    assert not pq.has_temp_message()
    pq.put_messages(msgs(5))
    taken = pq.take_messages(3, now_ms=0)
    assert [m.queue_offset for m in taken] == [0, 1, 2]
    assert pq.offsets() == [3, 4]
    pq.rollback()
    assert pq.offsets() == [0, 1, 2, 3, 4]
    assert pq.consuming_orderly_count == 0
    assert pq.msg_count == 5


def test_put_returns_dispatch_once_until_take_finds_nothing() -> None:
    pq = ProcessQueue()
    assert pq.put_messages(msgs(2)) is True
    assert pq.put_messages(msgs(2, start=2)) is False  # already consuming
    pq.take_messages(10, now_ms=0)
    pq.commit()
    assert pq.take_messages(10, now_ms=0) == []
    assert pq.consuming is False
    assert pq.put_messages(msgs(1, start=4)) is True


def test_duplicate_offsets_count_once() -> None:
    pq = ProcessQueue()
    pq.put_messages(msgs(3))
    pq.put_messages(msgs(3))
    assert pq.msg_count == 3
    assert pq.msg_size == 3 * 123


def test_remove_message_returns_min_unconsumed_offset() -> None:
    pq = ProcessQueue()
    batch = msgs(5, start=10)
    pq.put_messages(batch)
    # consumed out of order: the commit offset stays at the smallest unconsumed message
    assert pq.remove_messages([batch[2]], now_ms=0) == 10
    assert pq.remove_messages([batch[0]], now_ms=0) == 11
    assert pq.remove_messages([batch[1], batch[3]], now_ms=0) == 14
    assert pq.remove_messages([batch[4]], now_ms=0) == 15  # empty: queueOffsetMax + 1
    assert pq.remove_messages([batch[4]], now_ms=0) == -1  # already empty
    assert pq.msg_count == 0 and pq.msg_size == 0


def test_max_span() -> None:
    pq = ProcessQueue()
    assert pq.max_span() == 0
    pq.put_messages(msgs(1, start=5) + msgs(1, start=2500))
    assert pq.max_span() == 2495


def test_orderly_commit_and_consume_again() -> None:
    pq = ProcessQueue()
    pq.put_messages(msgs(4))
    taken = pq.take_messages(2, now_ms=0)
    pq.make_message_to_consume_again(taken[1:])
    assert pq.offsets() == [1, 2, 3]
    assert pq.commit() == 1  # only offset 0 was consumed
    assert pq.msg_count == 3
    assert pq.commit() == -1  # nothing taken


def test_pull_and_lock_expiry() -> None:
    pq = ProcessQueue(now_ms=1000)
    assert not pq.is_pull_expired(121_000, 120_000)
    assert pq.is_pull_expired(121_001, 120_000)
    assert not pq.is_lock_expired(31_000, 30_000)
    assert pq.is_lock_expired(31_001, 30_000)


def test_msg_acc_cnt_from_max_offset_property() -> None:
    pq = ProcessQueue()
    batch = msgs(3)
    batch[-1].properties["MAX_OFFSET"] = "10"
    pq.put_messages(batch)
    assert pq.msg_acc_cnt == 8
