"""Pure rebalance decisions: the drop/add diff, computePullFromWhere's table, thresholds, flow control."""

from __future__ import annotations

import pytest

from client.process_queue import ProcessQueue
from client.rebalance_core import (
    DropReason,
    FlowControl,
    PullStatus,
    StartKind,
    flow_control_check,
    per_queue_threshold,
    plan_pull_from_where,
    plan_pull_from_where_lite,
    pull_exception_delay_ms,
    pull_status,
    queues_not_my_topic,
    select_queues_to_add,
    select_queues_to_drop,
    working_set,
)
from protocol.codes import ResponseCode
from protocol.model import ConsumeFromWhere, ConsumeType, Message, MessageQueue

LAST = ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET
FIRST = ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET
TS = ConsumeFromWhere.CONSUME_FROM_TIMESTAMP


def mq(q: int, topic: str = "T", broker: str = "b") -> MessageQueue:
    return MessageQueue(topic, broker, q)


def test_drop_not_assigned_and_pull_expired_only_for_push() -> None:
    now = 200_000
    fresh, stale = ProcessQueue(now_ms=now), ProcessQueue(now_ms=now - 120_001)
    other_topic = ProcessQueue(now_ms=0)
    table = {mq(0): fresh, mq(1): stale, mq(2): ProcessQueue(now_ms=now), mq(0, "U"): other_topic}
    allocated = {mq(0), mq(1), mq(3)}
    drops = select_queues_to_drop("T", table, allocated, ConsumeType.CONSUME_PASSIVELY, now, 120_000)
    assert drops == [(mq(1), DropReason.PULL_EXPIRED), (mq(2), DropReason.REALLOCATED)]
    lite = select_queues_to_drop("T", table, allocated, ConsumeType.CONSUME_ACTIVELY, now, 120_000)
    assert lite == [(mq(2), DropReason.REALLOCATED)]


def test_add_is_sorted_and_skips_existing() -> None:
    table = {mq(1): ProcessQueue()}
    assert select_queues_to_add({mq(3), mq(1), mq(0, broker="a")}, table) == [mq(0, broker="a"), mq(3)]


def test_truncate_not_my_topic_and_working_set() -> None:
    dropped = ProcessQueue()
    dropped.dropped = True
    table = {mq(0): ProcessQueue(), mq(1): dropped, mq(0, "Gone"): ProcessQueue()}
    assert queues_not_my_topic(table, ["T", "%RETRY%g"]) == [mq(0, "Gone")]
    assert working_set(table, "T") == {mq(0)}


# Port of RocketMQ's RebalancePushImplTest computePullFromWhereWithException cases.
@pytest.mark.parametrize("where", [LAST, FIRST, TS])
def test_compute_pull_from_where_committed_offset_wins(where: ConsumeFromWhere) -> None:
    assert plan_pull_from_where(where, 0, "T", 0) == plan_pull_from_where(where, 0, "%RETRY%g", 0)
    plan = plan_pull_from_where(where, 0, "T", 0)
    assert (plan.kind, plan.offset) == (StartKind.OFFSET, 0)
    assert plan_pull_from_where(where, 42, "T", 0).offset == 42


def test_compute_pull_from_where_last_not_found() -> None:
    assert plan_pull_from_where(LAST, -1, "T", 0).kind is StartKind.MAX_OFFSET
    retry = plan_pull_from_where(LAST, -1, "%RETRY%g", 0)
    assert (retry.kind, retry.offset) == (StartKind.OFFSET, 0)


def test_compute_pull_from_where_first_not_found() -> None:
    for topic in ("T", "%RETRY%g"):
        plan = plan_pull_from_where(FIRST, -1, topic, 0)
        assert (plan.kind, plan.offset) == (StartKind.OFFSET, 0)


def test_compute_pull_from_where_timestamp_not_found() -> None:
    plan = plan_pull_from_where(TS, -1, "T", 1234)
    assert (plan.kind, plan.timestamp_ms) == (StartKind.SEARCH_OFFSET, 1234)
    assert plan_pull_from_where(TS, -1, "%RETRY%g", 1234).kind is StartKind.MAX_OFFSET


@pytest.mark.parametrize("where", [LAST, FIRST, TS])
@pytest.mark.parametrize("err", [-2, -3])
def test_compute_pull_from_where_store_error_fails(where: ConsumeFromWhere, err: int) -> None:
    assert plan_pull_from_where(where, err, "T", 0).kind is StartKind.FAIL
    lite = plan_pull_from_where_lite(where, err, "T", 0)
    assert (lite.kind, lite.offset) == (StartKind.OFFSET, -1)


def test_per_queue_threshold_like_rebalance_push_impl_test() -> None:
    assert per_queue_threshold(-1, 2, 1024) == 1024
    assert per_queue_threshold(1024, 2, 1000) == 512
    assert per_queue_threshold(1024, 3, 1000) == 341
    assert per_queue_threshold(1, 5, 1000) == 1
    assert per_queue_threshold(1024, 0, 1000) == 1000


def _pq_with(offsets: list[int], size: int = 1) -> ProcessQueue:
    pq = ProcessQueue()
    pq.put_messages([Message(str(o), "T", "b", 0, o, bytes(size)) for o in offsets])
    return pq


def test_flow_control_branches_in_order() -> None:
    kw = {
        "pull_threshold_for_queue": 3,
        "pull_threshold_size_for_queue_mib": 1,
        "consume_concurrently_max_span": 10,
    }
    assert flow_control_check(_pq_with([0, 1, 2]), orderly=False, **kw) is None
    assert flow_control_check(_pq_with([0, 1, 2, 3]), orderly=False, **kw) is FlowControl.CACHE_COUNT
    big = _pq_with([0, 1], size=1024 * 1024)
    assert flow_control_check(big, orderly=False, **kw) is FlowControl.CACHE_SIZE
    wide = _pq_with([0, 11])
    assert flow_control_check(wide, orderly=False, **kw) is FlowControl.MAX_SPAN
    assert flow_control_check(wide, orderly=True, **kw) is None


def test_pull_status_mapping_and_error_delays() -> None:
    assert pull_status(ResponseCode.SUCCESS) is PullStatus.FOUND
    assert pull_status(ResponseCode.PULL_NOT_FOUND) is PullStatus.NO_NEW_MSG
    assert pull_status(ResponseCode.PULL_RETRY_IMMEDIATELY) is PullStatus.NO_MATCHED_MSG
    assert pull_status(ResponseCode.PULL_OFFSET_MOVED) is PullStatus.OFFSET_ILLEGAL
    assert pull_status(ResponseCode.SUBSCRIPTION_NOT_EXIST) is None
    assert pull_status(12345) is None
    kw = {"when_exception": 1000, "when_broker_flow_control": 20}
    assert pull_exception_delay_ms(ResponseCode.FLOW_CONTROL, **kw) == 20
    assert pull_exception_delay_ms(ResponseCode.SUBSCRIPTION_NOT_EXIST, **kw) == 1000
    assert pull_exception_delay_ms(None, **kw) == 1000
