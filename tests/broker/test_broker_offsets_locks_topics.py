"""ConsumerOffsetManager, RebalanceLockManager and TopicConfigManager, without sockets."""

from __future__ import annotations

from rmqlab.broker.lock_manager import RebalanceLockManager
from rmqlab.broker.offset_manager import ConsumerOffsetManager, resolve_query_offset
from rmqlab.broker.topic_config import TopicConfigManager, topic_name_problem
from rmqlab.protocol.model import MessageQueue


def mq(i: int, topic: str = "T") -> MessageQueue:
    return MessageQueue(topic, "broker-a", i)


def test_offsets_commit_unconditionally():
    om = ConsumerOffsetManager()
    assert om.query_offset("g", "T", 0) == -1
    assert om.commit_offset("g", "T", 0, 10) == -1
    assert om.commit_offset("g", "T", 0, 4) == 10  # backwards is allowed
    assert om.query_offset("g", "T", 0) == 4
    assert om.query_offset("g", "T", 1) == -1
    assert om.query_offset("h", "T", 0) == -1
    assert sorted(om.entries()) == [("g", "T", 0, 4)]


def test_query_offset_rule():
    assert resolve_query_offset(7, 5, False) == 7
    assert resolve_query_offset(-1, 0, True) == 0
    assert resolve_query_offset(-1, 0, False) is None
    assert resolve_query_offset(-1, 3, True) is None
    # RocketMQ 5: min offset 0 answers 0 only when offset 0 holds a message
    assert resolve_query_offset(-1, 0, True, max_offset=0, rocketmq5=True) is None
    assert resolve_query_offset(-1, 0, True, max_offset=1, rocketmq5=True) == 0
    assert resolve_query_offset(-1, 0, True, max_offset=0) == 0
    assert resolve_query_offset(4, 0, True, max_offset=0, rocketmq5=True) == 4


def test_lock_rules():
    lm = RebalanceLockManager(60_000)
    r = lm.try_lock_batch("g", [mq(0), mq(1)], "c1", 0)
    assert r.locked == [mq(0), mq(1)] and [m for m, _ in r.acquired] == [mq(0), mq(1)]
    # another client cannot take a live lock
    r = lm.try_lock_batch("g", [mq(1), mq(2)], "c2", 30_000)
    assert r.locked == [mq(2)]
    # renewal by the holder at 50 s keeps mq1 alive until 110 s
    r = lm.try_lock_batch("g", [mq(1)], "c1", 50_000)
    assert r.locked == [mq(1)] and r.acquired == []
    assert lm.try_lock_batch("g", [mq(0), mq(1)], "c2", 100_000).locked == [mq(0)]
    assert lm.try_lock_batch("g", [mq(1)], "c2", 110_000).locked == []  # exactly 60 s: still live
    r = lm.try_lock_batch("g", [mq(1)], "c2", 110_001)
    assert r.locked == [mq(1)] and r.acquired == [(mq(1), "c1")]
    # only the holder unlocks; expiry does not matter
    assert lm.unlock_batch("g", [mq(1)], "c1") == []
    assert lm.unlock_batch("g", [mq(1), mq(2)], "c2") == [mq(1), mq(2)]
    assert lm.holder("g", mq(1), 110_002) is None
    # groups are independent
    assert lm.try_lock_batch("other", [mq(0)], "c9", 110_002).locked == [mq(0)]


def test_lock_all_expired_and_release_client():
    lm = RebalanceLockManager(1_000)
    assert lm.is_lock_all_expired("g", 0)
    lm.try_lock_batch("g", [mq(0), mq(1)], "c1", 0)
    lm.try_lock_batch("g", [mq(2)], "c2", 0)
    assert not lm.is_lock_all_expired("g", 1_000)
    assert lm.is_lock_all_expired("g", 1_001)
    assert sorted(lm.release_client("g", "c1")) == [mq(0), mq(1)]
    assert lm.lock_count() == 1


def test_topic_config_manager():
    tm = TopicConfigManager(default_queue_nums=4, auto_create=True)
    tc, created = tm.create_in_send("T")
    assert created and (tc.read_queue_nums, tc.write_queue_nums, tc.perm) == (4, 4, 6)
    assert tm.create_in_send("T") == (tc, False)
    rt, created = tm.create_retry_topic("g")
    assert created and rt.topic_name == "%RETRY%g" and rt.queue_nums == 1
    dlq, _ = tm.create_dlq_topic("g")
    assert dlq.topic_name == "%DLQ%g" and dlq.readable and dlq.writeable
    off = TopicConfigManager(auto_create=False)
    assert off.create_in_send("T") == (None, False)
    v = tm.data_version
    assert not tm.put(tc) and tm.data_version == v


def test_topic_names():
    assert topic_name_problem("TopicA") is None
    assert topic_name_problem("%RETRY%g-1") is None
    assert topic_name_problem("") == "is empty"
    assert topic_name_problem("a b") is not None
    assert topic_name_problem("x" * 128) is not None
