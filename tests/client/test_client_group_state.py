"""GroupState without sockets, an event loop or a client instance: its tables, allocation,
computePullFromWhere's table, thresholds, locks, and the pull-side flow control and status mapping (a round's
plan is tested in test_client_rebalance_plan.py)."""

from __future__ import annotations

from typing import Any

import pytest

from rmqlab.client.client_config import ConsumerConfig
from rmqlab.client.group_state import (
    GroupState,
    StartKind,
    per_queue_threshold,
    plan_pull_from_where,
    plan_pull_from_where_lite,
    shorts,
)
from rmqlab.client.process_queue import ProcessQueue
from rmqlab.client.pull_core import (
    FlowControl,
    PullStatus,
    flow_control_check,
    pull_exception_delay_ms,
    pull_status,
)
from rmqlab.protocol.allocate import get_strategy
from rmqlab.protocol.codes import ResponseCode
from rmqlab.protocol.model import ConsumeFromWhere, ConsumeType, Message, MessageModel, MessageQueue
from rmqlab.protocol.route import TopicRouteData

LAST = ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET
FIRST = ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET
TS = ConsumeFromWhere.CONSUME_FROM_TIMESTAMP


def mq(q: int, topic: str = "T", broker: str = "b") -> MessageQueue:
    return MessageQueue(topic, broker, q)


def state(
    consume_type: ConsumeType = ConsumeType.CONSUME_PASSIVELY, strategy: str = "AVG", **cfg: Any
) -> GroupState:
    s = GroupState("g", "c1", ConsumerConfig(**cfg), get_strategy(strategy), consume_type)
    s.subscribe("T", "*", 1000)
    return s


def added(s: GroupState, *mqs: MessageQueue, now_ms: int = 0) -> list[ProcessQueue]:
    out = []
    for m in mqs:
        pq = s.new_process_queue(now_ms)
        assert s.add_process_queue(m, pq, 0)
        out.append(pq)
    return out


def test_a_queue_enters_locked_once_its_offset_is_known_and_only_once() -> None:
    s = state()
    pq = s.new_process_queue(5)
    assert pq.locked and pq.last_pull_timestamp == 5
    assert not s.add_process_queue(mq(0), pq, -1)  # no usable start offset
    assert mq(0) not in s.process_queue_table
    assert s.add_process_queue(mq(0), pq, 0)
    assert not s.add_process_queue(mq(0), s.new_process_queue(6), 7)  # added meanwhile
    assert s.process_queue_table[mq(0)] is pq


def test_remove_only_the_process_queue_asked_for() -> None:
    s = state()
    (old,) = added(s, mq(0))
    assert s.remove_process_queue(mq(0), ProcessQueue()) is None
    assert s.process_queue_table[mq(0)] is old and not old.dropped
    assert s.remove_process_queue(mq(0), old) is old and old.dropped
    assert s.remove_process_queue(mq(0)) is None
    (pq,) = added(s, mq(1))
    assert s.mark_dropped(mq(1)) is pq and pq.dropped and mq(1) in s.process_queue_table
    assert s.mark_dropped(mq(9)) is None


def test_truncate_not_my_topic_working_set_owned_and_destroy() -> None:
    s = state()
    s.subscribe("Gone", "*", 0)
    gone, kept, dropped = added(s, mq(0, "Gone"), mq(0), mq(1))
    dropped.dropped = True
    s.unsubscribe("Gone")
    assert s.truncate_message_queue_not_my_topic() == [mq(0, "Gone")]
    assert gone.dropped and not kept.dropped
    assert s.truncate_message_queue_not_my_topic() == []
    assert s.working_set("T") == {mq(0)}
    assert s.owned_queues() == [mq(0)]
    assert s.destroy() == [mq(0), mq(1)]
    assert kept.dropped and not s.process_queue_table


def test_the_tables_are_read_only_outside_group_state() -> None:
    s = state()
    with pytest.raises(TypeError):
        s.process_queue_table[mq(0)] = ProcessQueue()  # type: ignore[index]
    with pytest.raises(TypeError):
        del s.subscription_inner["T"]  # type: ignore[attr-defined]
    with pytest.raises(TypeError):
        s.topic_subscribe_info_table["T"] = set()  # type: ignore[index]


def test_subscriptions_retry_copy_and_heartbeat_view() -> None:
    s = state()
    assert s.subscription_inner["T"].sub_version == 1000
    s.copy_subscription(2000)
    assert set(s.subscription_inner) == {"T", "%RETRY%g"}
    s.copy_subscription(3000)  # already there: unchanged
    assert s.subscription_inner["%RETRY%g"].sub_version == 2000
    assert [x.topic for x in s.subscriptions()] == ["%RETRY%g", "T"]
    s.subscriptions()[1].tags_set.append("x")  # a copy: the table does not change
    assert s.subscription_inner["T"].tags_set == []
    tagged = s.subscribe("U", " a || b ", 5)
    assert tagged.tags_set == ["a", "b"] and s.subscription_inner["U"] is tagged
    b = state(message_model=MessageModel.BROADCASTING)
    b.copy_subscription(2000)
    assert set(b.subscription_inner) == {"T"}  # broadcasting has no retry topic


def test_route_table_changes_only_on_a_different_set() -> None:
    s = state()
    assert s.is_subscribe_topic_need_update("T") and not s.is_subscribe_topic_need_update("U")
    assert s.update_topic_subscribe_info("T", {mq(0), mq(1)})
    assert not s.update_topic_subscribe_info("T", {mq(1), mq(0)})
    assert not s.is_subscribe_topic_need_update("T")
    assert s.update_topic_subscribe_info("T", {mq(0)})
    assert s.topic_subscribe_info_table["T"] == {mq(0)}


def test_equal_routes_share_their_queue_set_and_a_changed_route_does_not() -> None:
    def route(a_read: int, b_perm: int = 6) -> TopicRouteData:
        # decoded from the wire each time, as every route poll does
        return TopicRouteData.from_wire(
            {
                "brokerDatas": [],
                "queueDatas": [
                    {"brokerName": "b", "readQueueNums": 2, "writeQueueNums": 2, "perm": b_perm},
                    {"brokerName": "a", "readQueueNums": a_read, "writeQueueNums": 4, "perm": 6},
                ],
            }
        )

    first = route(3).subscribe_queues("T")
    assert first == {MessageQueue("T", b, i) for b, n in (("a", 3), ("b", 2)) for i in range(n)}
    assert route(3).subscribe_queues("T") is first
    write_only_b = route(3, b_perm=2).subscribe_queues("T")
    assert write_only_b == {MessageQueue("T", "a", i) for i in range(3)}
    assert route(4).subscribe_queues("T") == first | {MessageQueue("T", "a", 3)}
    assert route(3).subscribe_queues("U") == {MessageQueue("U", q.broker_name, q.queue_id) for q in first}
    s = state()
    assert s.update_topic_subscribe_info("T", route(3).subscribe_queues("T"))
    assert not s.update_topic_subscribe_info("T", route(3).subscribe_queues("T"))
    assert s.update_topic_subscribe_info("T", route(4).subscribe_queues("T"))


def test_allocate_sorts_both_lists_before_the_strategy() -> None:
    s = state()
    s.update_topic_subscribe_info("T", {mq(3), mq(0), mq(2), mq(1)})
    cids, mine = s.allocate("T", ["c2", "c1"])
    assert cids == ["c1", "c2"] and mine == {mq(0), mq(1)}
    other = GroupState("g", "c2", ConsumerConfig(), get_strategy("AVG"), ConsumeType.CONSUME_PASSIVELY)
    with pytest.raises(ValueError, match="mqAll"):
        other.allocate("T", ["c1", "c2"])  # no route known: the strategy refuses, the round is unbalanced
    assert s.allocate("T", ["c0"])[1] == set()  # not in cid_all: nothing


def test_need_lock_orderly_clustering_or_broadcasting_by_option() -> None:
    assert state().need_lock(True) and not state().need_lock(False)
    assert state(message_model=MessageModel.BROADCASTING).need_lock(True)  # < 5.3.2
    bc = state(message_model=MessageModel.BROADCASTING, lock_in_broadcasting=False)
    assert not bc.need_lock(True) and not bc.need_lock(False)


def test_message_queue_changed_bumps_version_and_splits_thresholds() -> None:
    s = state(pull_threshold_for_topic=1024, pull_threshold_size_for_topic=512)
    s.message_queue_changed("T", 5000)  # empty table: thresholds stay
    assert (s.pull_threshold_for_queue, s.pull_threshold_size_for_queue) == (1000, 100)
    assert s.subscription_inner["T"].sub_version == 5000
    added(s, mq(0), mq(1), mq(2))
    s.message_queue_changed("T", 6000)
    assert (s.pull_threshold_for_queue, s.pull_threshold_size_for_queue) == (341, 170)
    s.message_queue_changed("Unknown", 7000)  # no subscription: only the thresholds
    assert s.subscription_inner["T"].sub_version == 6000
    unset = state()
    added(unset, mq(0), mq(1))
    unset.message_queue_changed("T", 1)
    assert (unset.pull_threshold_for_queue, unset.pull_threshold_size_for_queue) == (1000, 100)


def test_flow_control_uses_the_current_thresholds_and_the_listener_kind() -> None:
    s = state(pull_threshold_for_topic=4, consume_concurrently_max_span=10)
    added(s, mq(0), mq(1))
    s.message_queue_changed("T", 0)  # 2 per queue
    assert s.flow_control(_pq_with([0, 1])) is None
    assert s.flow_control(_pq_with([0, 1, 2])) is FlowControl.CACHE_COUNT
    s2 = state(consume_concurrently_max_span=10)
    wide = _pq_with([0, 11])
    assert s2.flow_control(wide) is FlowControl.MAX_SPAN
    s2.consume_orderly = True
    assert s2.flow_control(wide) is None


def test_lock_answers_and_queues_by_broker() -> None:
    s = state()
    a0, b0, a1 = added(s, mq(0, broker="a"), mq(0, broker="b"), mq(1, broker="a"), now_ms=0)
    s.set_locked([mq(0, broker="a"), mq(5)], True, 70)
    assert a0.locked and a0.last_lock_timestamp == 70 and b0.last_lock_timestamp == 0
    s.set_locked([mq(1, broker="a")], False, 80)
    assert not a1.locked and a1.last_lock_timestamp == 0
    b0.dropped = True
    assert s.queues_by_broker() == [("a", {mq(0, broker="a"), mq(1, broker="a")})]


def test_orderly_release_rules() -> None:
    s = state(time_scale=0.01)
    assert not s.orderly_release_needs_lock()
    s.consume_orderly = True
    assert s.orderly_release_needs_lock()
    assert not state(message_model=MessageModel.BROADCASTING).orderly_release_needs_lock()
    pq = ProcessQueue(now_ms=1000)
    assert not s.may_force_unlock(pq, 5000)  # not dropped
    pq.dropped = True
    assert not s.may_force_unlock(pq, 1200)  # unlockDelayTimeMills (20 s, scaled: 200 ms) not passed
    assert s.may_force_unlock(pq, 1201)


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


def test_shorts_of_one_shared_queue_set_are_sorted_once(monkeypatch: pytest.MonkeyPatch) -> None:
    import rmqlab.client.group_state as group_state

    sorts = 0
    sort_mq_all = group_state.sort_mq_all

    def counting(mqs: Any) -> list[MessageQueue]:
        nonlocal sorts
        sorts += 1
        return sort_mq_all(mqs)

    monkeypatch.setattr(group_state, "sort_mq_all", counting)
    queues = frozenset(MessageQueue("T", b, q) for b in ("broker-b", "broker-a") for q in (10, 2))
    expected = ["broker-a:2", "broker-a:10", "broker-b:2", "broker-b:10"]
    first = shorts(queues)
    first.append("changed by its caller")  # each caller gets its own list
    assert shorts(queues) == expected and sorts == 1
    assert shorts(frozenset(set(queues))) == expected and sorts == 2  # an equal set of its own: sorted for it
    assert shorts(set(queues)) == expected and shorts([]) == [] and sorts == 3


def test_before_4_9_5_a_new_queue_waits_unlocked_for_lock_all() -> None:
    # ISSUE #2621: the queue was locked at the broker, but its new ProcessQueue did not say so
    s = state(lock_new_process_queue=False)
    pq = s.new_process_queue(5)
    assert not pq.locked
    s.add_process_queue(mq(0), pq, 0)
    s.set_locked([mq(0)], True, 9)  # lockAll's answer
    assert pq.locked and pq.last_lock_timestamp == 9
