"""A rebalance round's plan: ``plan_process_queue_table`` and GroupState's ``plan_rebalance`` /
``plan_assignment`` without an event loop, and RebalanceImpl carrying a plan out in RocketMQ's order
(updateProcessQueueTableInRebalance: drops released first, then adds locked, started and dispatched)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from test_client_rebalance_impl import Rig

from rmqlab.client.client_config import ConsumerConfig
from rmqlab.client.group_state import (
    AllocationFailed,
    DropReason,
    GroupState,
    QueueAdd,
    QueueDrop,
    RebalancePlan,
    StartKind,
    StartRule,
    plan_process_queue_table,
)
from rmqlab.client.process_queue import ProcessQueue
from rmqlab.protocol.allocate import get_strategy
from rmqlab.protocol.model import ConsumeFromWhere, ConsumeType, MessageModel, MessageQueue

LAST = ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET
FIRST = ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET
TS = ConsumeFromWhere.CONSUME_FROM_TIMESTAMP
RULE = StartRule("T", LAST, 0)
NOW = 1_000_000
IDLE = 120_000.0


def mq(q: int, topic: str = "T", broker: str = "b") -> MessageQueue:
    return MessageQueue(topic, broker, q)


def table(**last_pull: int) -> dict[MessageQueue, ProcessQueue]:
    """Process queues of topic T on broker b by queue id (``q3=...``), each last pulled at the time given."""
    return {mq(int(k[1:])): ProcessQueue(now_ms=v) for k, v in last_pull.items()}


def plan(
    allocated: set[MessageQueue],
    held: dict[MessageQueue, ProcessQueue],
    *,
    idle: float | None = IDLE,
    lock: bool = False,
    topic: str = "T",
) -> tuple[tuple[QueueDrop, ...], tuple[QueueAdd, ...], frozenset[MessageQueue]]:
    return plan_process_queue_table(
        topic, allocated, held, now_ms=NOW, pull_max_idle_ms=idle, lock=lock, start=RULE
    )


def drops(*pairs: tuple[MessageQueue, DropReason]) -> tuple[QueueDrop, ...]:
    return tuple(QueueDrop(m, r) for m, r in pairs)


def adds(*mqs: MessageQueue) -> tuple[QueueAdd, ...]:
    return tuple(QueueAdd(m, RULE) for m in mqs)


# -- the pure function ---------------------------------------------------------------------------------


def test_nothing_to_do_when_the_table_holds_the_allocation() -> None:
    assert plan({mq(0), mq(1)}, table(q0=NOW, q1=NOW)) == ((), (), frozenset())


def test_a_queue_no_longer_allocated_is_dropped_and_a_new_one_added() -> None:
    assert plan({mq(0), mq(2)}, table(q0=NOW, q1=NOW)) == (
        drops((mq(1), DropReason.REALLOCATED)),
        adds(mq(2)),
        frozenset(),
    )


def test_drops_and_adds_are_in_message_queue_order() -> None:
    held = {m: ProcessQueue(NOW) for m in (mq(10), mq(2), mq(1, broker="a"), mq(3, broker="c"))}
    allocated = {mq(11), mq(9), mq(0, broker="a"), mq(0, broker="c")}
    got_drops, got_adds, _ = plan(allocated, held)
    assert [d.mq for d in got_drops] == [mq(1, broker="a"), mq(2), mq(10), mq(3, broker="c")]
    assert [a.mq for a in got_adds] == [mq(0, broker="a"), mq(9), mq(11), mq(0, broker="c")]


def test_other_topics_in_the_table_are_left_alone() -> None:
    held = {mq(0, "U"): ProcessQueue(0), mq(0): ProcessQueue(NOW)}
    assert plan({mq(0)}, held) == ((), (), frozenset())


def test_a_stalled_queue_is_dropped_and_added_again() -> None:
    """pullMaxIdleTime: more than the limit since the last pull, not exactly the limit."""
    held = table(q0=NOW - int(IDLE) - 1, q1=NOW - int(IDLE), q2=NOW)
    assert plan({mq(0), mq(1), mq(2)}, held) == (
        drops((mq(0), DropReason.PULL_EXPIRED)),
        adds(mq(0)),
        frozenset(),
    )


def test_no_stall_check_without_an_idle_limit() -> None:
    """Lite-pull consumers (CONSUME_ACTIVELY) are never dropped for stalled pulls."""
    assert plan({mq(0)}, table(q0=0), idle=None) == ((), (), frozenset())


def test_a_queue_not_allocated_is_reallocated_even_when_stalled() -> None:
    assert plan(set(), table(q0=0)) == (drops((mq(0), DropReason.REALLOCATED)), (), frozenset())


def test_lock_lists_every_add_when_asked() -> None:
    held = table(q0=0, q1=NOW)
    got = plan({mq(0), mq(1), mq(2), mq(3)}, held, lock=True)
    assert got[2] == frozenset({mq(0), mq(2), mq(3)})  # the stalled queue comes back locked too
    assert plan({mq(0), mq(1), mq(2)}, held, lock=False)[2] == frozenset()
    assert plan({mq(1)}, held, lock=True)[2] == frozenset()  # nothing to add, nothing to lock


def test_planning_changes_nothing() -> None:
    held = table(q0=0, q1=NOW)
    before = dict(held)
    plan({mq(0), mq(2)}, held, lock=True)
    assert held == before and not any(pq.dropped or pq.locked for pq in held.values())


# -- where a new queue starts --------------------------------------------------------------------------


def test_start_rule_push_and_lite() -> None:
    push = StartRule("T", LAST, 0)
    assert (push.given(7).kind, push.given(7).offset) == (StartKind.OFFSET, 7)
    assert push.given(-1).kind is StartKind.MAX_OFFSET
    assert push.given(-2).kind is StartKind.FAIL
    lite = StartRule("T", LAST, 0, lite=True)
    assert (lite.given(-2).kind, lite.given(-2).offset) == (StartKind.OFFSET, -1)
    assert StartRule("%RETRY%g", LAST, 0).given(-1).offset == 0  # a retry topic starts at 0
    ts = StartRule("T", TS, 1234).given(-1)
    assert (ts.kind, ts.timestamp_ms) == (StartKind.SEARCH_OFFSET, 1234)
    assert StartRule("T", FIRST, 0).given(-1).offset == 0


def test_group_start_rule_follows_the_consumer_type_and_config() -> None:
    s = state(consume_from_where=TS, consume_timestamp="20240102030405")
    rule = s.start_rule("T")
    assert rule == StartRule("T", TS, s.config.consume_timestamp_ms(), lite=False)
    assert state(ConsumeType.CONSUME_ACTIVELY).start_rule("U") == StartRule(
        "U", LAST, ConsumerConfig().consume_timestamp_ms(), lite=True
    )


# -- GroupState's one call per topic -------------------------------------------------------------------


def state(consume_type: ConsumeType = ConsumeType.CONSUME_PASSIVELY, **cfg: Any) -> GroupState:
    s = GroupState("g", "c1", ConsumerConfig(**cfg), get_strategy("AVG"), consume_type)
    s.subscribe("T", "*", 0)
    s.update_topic_subscribe_info("T", {mq(i) for i in range(4)})
    return s


def hold(s: GroupState, *mqs: MessageQueue, now_ms: int = NOW) -> None:
    for m in mqs:
        assert s.add_process_queue(m, s.new_process_queue(now_ms), 0)


def test_clustering_plan_allocates_then_diffs() -> None:
    s = state()
    hold(s, mq(2), mq(3))
    p = s.plan_rebalance("T", ["c2", "c1"], False, NOW)
    assert p == RebalancePlan(
        "T",
        ["c1", "c2"],
        {mq(0), mq(1)},
        drops((mq(2), DropReason.REALLOCATED), (mq(3), DropReason.REALLOCATED)),
        tuple(QueueAdd(m, s.start_rule("T")) for m in (mq(0), mq(1))),
        frozenset(),
    )
    assert s.plan_rebalance("T", ["c1", "c2"], True, NOW).lock == {mq(0), mq(1)}  # orderly
    assert s.plan_rebalance("T", ["c0"], False, NOW).allocated == set()  # not a member: nothing
    assert set(s.process_queue_table) == {mq(2), mq(3)}  # asking changed nothing


def test_the_plan_is_frozen() -> None:
    p = state().plan_rebalance("T", ["c1"], False, NOW)
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.drop = ()  # type: ignore[misc]


def test_a_strategy_error_is_an_allocation_failure() -> None:
    s = GroupState("g", "c1", ConsumerConfig(), get_strategy("AVG"), ConsumeType.CONSUME_PASSIVELY)
    s.subscribe("T", "*", 0)
    with pytest.raises(AllocationFailed) as ei:
        s.plan_rebalance("T", ["c1"], False, NOW)  # no route known: the strategy refuses
    assert isinstance(ei.value.cause, ValueError) and "mqAll" in str(ei.value.cause)


def test_stall_check_only_for_push_consumers_and_through_the_time_scale() -> None:
    for consume_type, reasons in (
        (ConsumeType.CONSUME_PASSIVELY, [DropReason.PULL_EXPIRED]),
        (ConsumeType.CONSUME_ACTIVELY, []),
    ):
        s = state(consume_type)
        hold(s, mq(0), now_ms=NOW - 120_001)
        assert [d.reason for d in s.plan_rebalance("T", ["c1"], False, NOW).drop] == reasons
    scaled = state(time_scale=0.5)
    hold(scaled, mq(0), now_ms=NOW - 60_001)
    assert [d.mq for d in scaled.plan_rebalance("T", ["c1"], False, NOW).drop] == [mq(0)]


def test_broadcasting_plan_takes_every_queue_and_locks_by_option() -> None:
    s = state(message_model=MessageModel.BROADCASTING)
    p = s.plan_rebalance("T", None, True, NOW)
    assert p.cid_all == ["c1"] and p.allocated is s.topic_subscribe_info_table["T"]
    assert [a.mq for a in p.add] == [mq(i) for i in range(4)] and p.lock == p.allocated  # < 5.3.2
    quiet = state(message_model=MessageModel.BROADCASTING, lock_in_broadcasting=False)
    assert quiet.plan_rebalance("T", None, True, NOW).lock == frozenset()


def test_assignment_plan_takes_the_brokers_queues() -> None:
    s = state()
    hold(s, mq(0))
    p = s.plan_assignment("T", {mq(1)}, True, NOW)
    assert (p.cid_all, p.allocated) == ([], {mq(1)})
    assert p.drop == drops((mq(0), DropReason.REALLOCATED)) and p.lock == {mq(1)}


# -- carrying a plan out -------------------------------------------------------------------------------


class TracingRig(Rig):
    """A Rig whose broker calls, offset-store calls, events and dispatched pulls go to one list, in order."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.trace: list[tuple[str, Any]] = []
        trace = self.trace
        api, offsets, pulls, impl = self.api, self.offsets, self.pulls, self.impl
        lock_batch_mq, persist = api.lock_batch_mq, offsets.persist

        async def traced_lock(*a: Any) -> Any:
            trace.append(("lock", sorted(a[3])))
            return await lock_batch_mq(*a)

        async def traced_persist(m: MessageQueue) -> None:
            trace.append(("persist", m))
            await persist(m)

        api.lock_batch_mq = traced_lock  # type: ignore[method-assign]
        offsets.persist = traced_persist  # type: ignore[method-assign]
        pulls.execute_pull_request_immediately = lambda req: trace.append(("pull", req.message_queue))  # type: ignore[method-assign]
        impl._emit_mq = lambda event, m, **f: trace.append((event, m))  # type: ignore[method-assign]


async def test_a_round_releases_drops_before_it_locks_starts_and_dispatches_adds() -> None:
    r = TracingRig(orderly=True)
    r.route(mq(0), mq(1), mq(2))
    r.hold(mq(3), ProcessQueue())
    r.hold(mq(4), ProcessQueue())
    r.api.lockable = {mq(0), mq(2)}
    await r.rebalance()
    assert [t for t in r.trace if t[0] != "mq_unlock"] == [
        ("persist", mq(3)),
        ("mq_removed", mq(3)),
        ("persist", mq(4)),
        ("mq_removed", mq(4)),
        ("lock", [mq(0)]),
        ("mq_lock", mq(0)),
        ("mq_added", mq(0)),
        ("lock", [mq(1)]),
        ("mq_lock", mq(1)),  # refused: mq(1) is skipped
        ("lock", [mq(2)]),
        ("mq_lock", mq(2)),
        ("mq_added", mq(2)),
        ("pull", mq(0)),  # the PullRequests go out after every add, in order
        ("pull", mq(2)),
    ]


async def test_a_stalled_queue_whose_release_fails_is_not_added_again() -> None:
    r = TracingRig(orderly=True, time_scale=0.001)
    r.route(mq(0))
    pq = ProcessQueue(r.clock.monotonic_ms())
    r.hold(mq(0), pq)
    r.clock.advance(120_001)
    await pq.consume_lock.acquire()  # a listener is running: the orderly release cannot take the lock
    await r.rebalance()
    assert pq.dropped and r.state.process_queue_table[mq(0)] is pq  # kept until it can be released
    assert not [t for t in r.trace if t[0] in ("lock", "mq_added", "pull")]  # no second ProcessQueue
    pq.consume_lock.release()
    await r.rebalance()  # released now, and allocated: it comes back with a new ProcessQueue
    assert r.state.process_queue_table[mq(0)] is not pq
    assert [t for t in r.trace if t[0] in ("mq_removed", "lock", "mq_added", "pull")] == [
        ("mq_removed", mq(0)),
        ("lock", [mq(0)]),
        ("mq_added", mq(0)),
        ("pull", mq(0)),
    ]


async def test_the_plan_is_asked_once_per_topic_and_round() -> None:
    r = Rig()
    r.route(mq(0), mq(1))
    asked: list[str] = []
    plan_rebalance = r.state.plan_rebalance

    def counting(topic: str, *a: Any) -> RebalancePlan:
        asked.append(topic)
        return plan_rebalance(topic, *a)

    r.state.plan_rebalance = counting  # type: ignore[method-assign]
    r.state.copy_subscription(0)  # T and its retry topic
    r.state.update_topic_subscribe_info("%RETRY%g", {mq(0, "%RETRY%g")})
    await r.rebalance()
    await r.rebalance()
    assert asked == ["T", "%RETRY%g"] * 2
