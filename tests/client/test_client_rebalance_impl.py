"""RebalanceImpl over its ports, without sockets: fakes of GroupApi, PullDispatcher and the offset store
record the calls. Ports RocketMQ's RebalancePushImplTest (thresholds, computePullFromWhereWithException)
and covers the orderly lock / unlock rules of 4.9 and 5.x; RebalanceService's timing with a fake round.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from types import SimpleNamespace
from typing import Any

import pytest
from kit.broker import RecordingLog

from rmqlab.client.client_config import ConsumerConfig
from rmqlab.client.consumer_base import normalize_enums
from rmqlab.client.group_state import GroupState
from rmqlab.client.offset_store import ReadOffsetType
from rmqlab.client.process_queue import ProcessQueue, PullRequest
from rmqlab.client.rebalance import RebalanceLitePullImpl, RebalancePushImpl, RebalanceService
from rmqlab.protocol.allocate import get_strategy
from rmqlab.protocol.clock import ManualClock
from rmqlab.protocol.codes import RequestCode
from rmqlab.protocol.command import RemotingCommand
from rmqlab.protocol.event_log import EventLog
from rmqlab.protocol.model import ConsumeType, Message, MessageQueue
from rmqlab.protocol.remoting import RemotingClient


class FakeGroupApi:
    """The GroupApi calls rebalancing makes, answered from fields the test sets."""

    def __init__(self, cids: list[str]) -> None:
        self.cids = cids
        self.max_offset = 12345
        self.search = 12345
        self.lockable: set[MessageQueue] | None = None  # None: everything locks
        self.calls: list[tuple[str, Any]] = []
        self.heartbeats = 0
        self.rebalance_later_calls: list[float] = []
        self.timeouts: list[float] = []
        self.scheduled: list[tuple[Any, float]] = []

    def schedule(self, fn: Any, delay_s: float, what: str = "task") -> None:
        self.scheduled.append((fn, delay_s))

    def spawn(self, coro: Any, what: str = "task") -> asyncio.Task[Any]:
        return asyncio.get_running_loop().create_task(coro)

    async def consumer_send_msg_back(
        self, addr: str, msg: Message, group: str, delay_level: int, max_times: int, timeout_s: float
    ) -> None:
        self.calls.append(("send_back", msg.queue_offset))

    def find_broker_address_in_subscribe(self, *a: Any) -> str:
        return "127.0.0.1:1"

    async def find_broker_address_in_publish_or_update(self, *a: Any) -> str:
        return "127.0.0.1:1"

    async def find_consumer_id_list(self, topic: str, group: str) -> list[str]:
        return list(self.cids)

    async def get_max_offset(self, addr: str, mq: MessageQueue, timeout_s: float) -> int:
        self.calls.append(("max", mq))
        self.timeouts.append(timeout_s)
        return self.max_offset

    async def search_offset(self, addr: str, mq: MessageQueue, ts: int, timeout_s: float) -> int:
        self.calls.append(("search", mq))
        self.timeouts.append(timeout_s)
        return self.search

    async def lock_batch_mq(
        self, addr: str, group: str, cid: str, mqs: Iterable[MessageQueue], timeout_s: float
    ) -> set[MessageQueue]:
        self.calls.append(("lock", sorted(mqs)))
        return set(mqs) if self.lockable is None else set(mqs) & self.lockable

    async def unlock_batch_mq(
        self, addr: str, group: str, cid: str, mqs: Iterable[MessageQueue], timeout_s: float, *, oneway: bool
    ) -> None:
        self.calls.append(("unlock", sorted(mqs)))

    async def send_heartbeat_to_all_broker_with_lock(self) -> bool:
        self.heartbeats += 1
        return True

    def rebalance_later(self, delay_ms: float) -> None:
        self.rebalance_later_calls.append(delay_ms)


class FakePulls:
    def __init__(self) -> None:
        self.now: list[PullRequest] = []
        self.later: list[tuple[PullRequest, float]] = []
        self.tasks: list[tuple[Any, float]] = []

    def execute_pull_request_immediately(self, req: PullRequest) -> None:
        self.now.append(req)

    def execute_pull_request_later(self, req: PullRequest, delay_ms: float) -> None:
        self.later.append((req, delay_ms))

    def execute_task_later(self, fn: Any, delay_ms: float) -> None:
        self.tasks.append((fn, delay_ms))


class FakeOffsets:
    """The committed offsets a broker would answer (-1: none) and what was persisted or forgotten."""

    def __init__(self) -> None:
        self.committed: dict[MessageQueue, int] = {}
        self.memory: dict[MessageQueue, int] = {}
        self.reads: list[ReadOffsetType] = []
        self.persisted: list[MessageQueue] = []
        self.removed: list[MessageQueue] = []

    async def read_offset(self, mq: MessageQueue, read_type: ReadOffsetType) -> int:
        self.reads.append(read_type)
        if read_type is ReadOffsetType.MEMORY_FIRST_THEN_STORE and mq in self.memory:
            return self.memory[mq]
        return self.committed.get(mq, -1)

    async def persist(self, mq: MessageQueue) -> None:
        self.persisted.append(mq)

    def remove_offset(self, mq: MessageQueue) -> None:
        self.removed.append(mq)

    def update_offset(self, mq: MessageQueue, offset: int, increase_only: bool) -> None:
        self.memory[mq] = offset


class Rig:
    """A RebalancePushImpl over fakes, for group "g" and client "c1" subscribed to "T"."""

    def __init__(self, orderly: bool = False, **options: Any) -> None:
        self.clock = ManualClock()
        self.state = GroupState(
            "g",
            "c1",
            ConsumerConfig(**normalize_enums(options)),
            get_strategy("AVG"),
            ConsumeType.CONSUME_PASSIVELY,
        )
        self.state.consume_orderly = orderly
        self.state.subscribe("T", "*", self.clock.now_ms())
        self.api = FakeGroupApi(["c1"])
        self.pulls = FakePulls()
        self.offsets = FakeOffsets()
        self.impl = RebalancePushImpl(
            self.state, self.api, self.pulls, self.offsets, EventLog.null(), clock=self.clock
        )

    def route(self, *mqs: MessageQueue) -> None:
        self.state.update_topic_subscribe_info("T", set(mqs))

    def hold(self, m: MessageQueue, pq: ProcessQueue) -> None:
        assert self.state.add_process_queue(m, pq, 0)

    async def rebalance(self) -> bool:
        return await self.impl.do_rebalance(self.state.consume_orderly)


def mq(q: int, topic: str = "T") -> MessageQueue:
    return MessageQueue(topic, "BrokerA", q)


async def test_message_queue_changed_recomputes_count_and_size_thresholds() -> None:
    r = Rig(pull_threshold_for_queue=1024, pull_threshold_size_for_queue=1024)
    r.route(mq(0), mq(1))
    await r.rebalance()
    assert (r.state.pull_threshold_for_queue, r.state.pull_threshold_size_for_queue) == (1024, 1024)
    assert r.api.heartbeats == 1  # the change was announced at once

    r2 = Rig(pull_threshold_for_topic=1024, pull_threshold_size_for_topic=1024)
    r2.route(mq(0), mq(1))
    await r2.rebalance()
    assert (r2.state.pull_threshold_for_queue, r2.state.pull_threshold_size_for_queue) == (512, 512)
    r2.route(mq(0), mq(1), mq(2))
    await r2.rebalance()
    assert (r2.state.pull_threshold_for_queue, r2.state.pull_threshold_size_for_queue) == (341, 341)
    await r2.rebalance()  # nothing changed: no heartbeat
    assert r2.api.heartbeats == 2


async def test_message_queue_changed_bumps_the_subscription_version() -> None:
    r = Rig()
    before = r.state.subscription_inner["T"].sub_version
    r.clock.advance(5)
    r.route(mq(0))
    await r.rebalance()
    assert r.state.subscription_inner["T"].sub_version == before + 5


async def test_compute_pull_from_where_with_exception_like_rocketmq() -> None:
    retry = MessageQueue("%RETRY%g", "BrokerA", 0)
    for where, topic_mq, want in (
        ("last", mq(0), 12345),
        ("last", retry, 0),
        ("first", mq(0), 0),
        ("timestamp", mq(0), 12345),
    ):
        r = Rig(consume_from_where=where)
        assert await r.impl.compute_pull_from_where_with_exception(topic_mq) == want
        assert r.offsets.reads == [ReadOffsetType.READ_FROM_STORE]
    r = Rig(consume_from_where="timestamp")
    r.api.max_offset = 23456
    assert await r.impl.compute_pull_from_where_with_exception(retry) == 23456
    for where in ("last", "first", "timestamp"):
        r = Rig(consume_from_where=where)
        r.offsets.committed[mq(1)] = 0
        assert await r.impl.compute_pull_from_where_with_exception(mq(1)) == 0
    r = Rig()
    r.offsets.committed[mq(1)] = -2  # the store could not be read
    with pytest.raises(Exception, match="start offset"):
        await r.impl.compute_pull_from_where_with_exception(mq(1))
    r.api.max_offset = -1  # a broker answering a negative max offset
    with pytest.raises(Exception, match="unexpected result"):
        await r.impl.compute_pull_from_where_with_exception(mq(0))


async def test_lite_pull_reads_memory_first_and_tells_its_listener() -> None:
    clock = ManualClock()
    st = GroupState("g", "c1", ConsumerConfig(), get_strategy("AVG"), ConsumeType.CONSUME_ACTIVELY)
    st.subscribe("T", "*", 0)
    st.update_topic_subscribe_info("T", {mq(0), mq(1)})
    offsets = FakeOffsets()
    offsets.memory[mq(0)] = 4
    offsets.committed[mq(1)] = -2  # lite pull: -1 instead of an exception, so the queue is skipped
    heard: list[tuple[str, set[MessageQueue], set[MessageQueue]]] = []

    async def listener(topic: str, mq_all: set[MessageQueue], mq_divided: set[MessageQueue]) -> None:
        heard.append((topic, mq_all, mq_divided))

    api, pulls = FakeGroupApi(["c1"]), FakePulls()
    impl = RebalanceLitePullImpl(st, api, pulls, offsets, EventLog.null(), clock=clock, listener=listener)
    assert await impl.do_rebalance(False) is False  # mq(1) allocated but not held
    assert set(st.process_queue_table) == {mq(0)}
    assert heard == [("T", {mq(0), mq(1)}, {mq(0), mq(1)})]
    assert pulls.now == [] and api.heartbeats == 0  # lite pull runs its own pull tasks


async def test_new_queue_gets_process_queue_offset_and_pull_request() -> None:
    r = Rig(consume_from_where="first")
    r.offsets.committed[mq(1)] = 7
    r.route(mq(0), mq(1))
    assert await r.rebalance() is True
    reqs = {q.message_queue: q.next_offset for q in r.pulls.now}
    assert reqs == {mq(0): 0, mq(1): 7}
    assert all(r.state.process_queue_table[m].locked for m in reqs)  # marked locked at creation (4.9.5+)
    assert sorted(r.offsets.removed) == [mq(0), mq(1)]  # removeDirtyOffset before reading


async def test_pull_request_dispatch_delay_5x() -> None:
    r = Rig(pull_request_dispatch_delay=500, time_scale=0.1)
    r.route(mq(0))
    await r.rebalance()
    assert r.pulls.now == [] and [d for _, d in r.pulls.later] == [50.0]


async def test_pull_expired_queue_is_dropped_and_readded() -> None:
    r = Rig()
    r.route(mq(0))
    await r.rebalance()
    old = r.state.process_queue_table[mq(0)]
    r.clock.advance(120_001)
    await r.rebalance()
    assert old.dropped and r.state.process_queue_table[mq(0)] is not old
    assert r.offsets.persisted == [mq(0)]


async def test_not_my_topic_is_truncated_without_persisting() -> None:
    r = Rig()
    gone = MessageQueue("Gone", "BrokerA", 0)
    r.state.subscribe("Gone", "*", 0)
    pq = ProcessQueue()
    r.hold(gone, pq)
    r.state.unsubscribe("Gone")
    r.route(mq(0))
    await r.rebalance()
    assert gone not in r.state.process_queue_table and pq.dropped
    assert gone not in r.offsets.persisted


async def test_orderly_new_queue_needs_the_broker_lock() -> None:
    r = Rig(orderly=True)
    r.api.lockable = {mq(1)}
    r.route(mq(0), mq(1))
    assert await r.rebalance() is False  # not balanced: mq(0) is allocated but not held
    assert set(r.state.process_queue_table) == {mq(1)}
    assert r.api.rebalance_later_calls == []  # 4.9: no early retry

    r5 = Rig(orderly=True, rebalance_later_on_lock_failure=True)
    r5.api.lockable = set()
    r5.route(mq(0))
    await r5.rebalance()
    assert r5.api.rebalance_later_calls == [500]


def _cached_pq(clock: ManualClock) -> ProcessQueue:
    pq = ProcessQueue(clock.monotonic_ms())
    pq.put_messages([Message("m", "T", "BrokerA", 0, 0, b"x")])
    return pq


async def test_orderly_drop_49_waits_for_the_consume_lock_then_unlocks_late() -> None:
    r = Rig(orderly=True, time_scale=0.01)
    pq = _cached_pq(r.clock)
    r.hold(mq(0), pq)
    r.api.cids = ["c1", "zzz"]
    r.route(mq(1), mq(2))  # AVG: mq(1) for us, mq(2) for "zzz"; mq(0) goes
    await pq.consume_lock.acquire()  # a listener is running
    await r.rebalance()
    assert pq.dropped and mq(0) in r.state.process_queue_table  # kept until it can be released
    assert pq.try_unlock_times == 1
    pq.consume_lock.release()
    await r.rebalance()
    assert mq(0) not in r.state.process_queue_table
    # messages were still cached: the broker lock is released 20 s later, not now
    assert not [x for x in r.api.calls if x[0] == "unlock"]
    fn, delay = r.api.scheduled[-1]  # unlockDelay: on MQClientInstance's scheduled thread
    assert delay == pytest.approx(0.2)  # 20 s scaled by 0.01
    await fn()
    assert ("unlock", [mq(0)]) in r.api.calls


async def test_orderly_drop_5x_force_unlocks_after_the_unlock_delay() -> None:
    r = Rig(orderly=True, orderly_unlock_5x=True, time_scale=0.01)
    pq = _cached_pq(r.clock)
    pq.locked = True
    r.hold(mq(0), pq)
    r.route(mq(1))
    await pq.consume_lock.acquire()
    await r.rebalance()
    assert mq(0) in r.state.process_queue_table  # lock busy, last lock recent
    r.clock.advance(201)  # unlockDelay (20 s) since the last lock, scaled
    await r.rebalance()
    assert mq(0) not in r.state.process_queue_table and not pq.locked
    assert ("unlock", [mq(0)]) in r.api.calls
    pq.consume_lock.release()


async def test_lock_all_and_unlock_all_follow_the_broker_answer() -> None:
    r = Rig(orderly=True)
    r.route(mq(0), mq(1))
    await r.rebalance()
    r.api.lockable = {mq(1)}
    r.clock.advance(10)
    await r.impl.lock_all()
    table = r.state.process_queue_table
    assert not table[mq(0)].locked and table[mq(1)].locked and table[mq(1)].last_lock_timestamp == 10
    await r.impl.unlock_all(False)
    assert ("unlock", [mq(0), mq(1)]) in r.api.calls and not table[mq(1)].locked


class _Round:
    """A registered consumer whose rebalance records when it ran and answers ``results`` in turn."""

    def __init__(self, results: list[bool], **cfg: Any) -> None:
        self.config = ConsumerConfig(time_scale=0.01, **cfg)
        self.clock = ManualClock()
        self.results = results
        self.rounds: list[float] = []
        self.rebalance_impl = self

    async def try_rebalance(self) -> bool:
        self.rounds.append(asyncio.get_running_loop().time())
        return self.results.pop(0) if self.results else True

    def service(self) -> RebalanceService:
        consumers = {"g": self}
        return RebalanceService(self.config, self.clock, EventLog.null(), "cid", consumers, RemotingClient())


async def test_rebalance_service_wakeups_coalesce() -> None:
    inst = _Round([])
    svc = inst.service()
    task = asyncio.create_task(svc.run())
    try:
        for _ in range(5):
            svc.wakeup()
        await asyncio.sleep(0.05)
        assert len(inst.rounds) == 1  # five wakeups, one round; the 20 s (0.2 s) period has not elapsed
        await asyncio.sleep(0.25)
        assert len(inst.rounds) == 2
    finally:
        task.cancel()


async def test_a_notify_that_finds_a_wakeup_pending_is_counted_in_the_next_event() -> None:
    inst = _Round([])
    log = RecordingLog()
    svc = RebalanceService(inst.config, inst.clock, log, "cid", {"g": inst}, RemotingClient())
    broker = SimpleNamespace(remote_addr="10.0.0.1:10911")

    async def notify() -> None:
        cmd = RemotingCommand.request(RequestCode.NOTIFY_CONSUMER_IDS_CHANGED, {"consumerGroup": "g"})
        svc.on_notify_consumer_ids_changed(broker, cmd)  # type: ignore[arg-type]

    for _ in range(3):  # one wakes the service, two find it already woken
        await notify()
    assert [e["coalesced"] for e in log.of("notify_received")] == [0]
    task = asyncio.create_task(svc.run())
    try:
        await asyncio.sleep(0.02)
        assert len(inst.rounds) == 1  # the three made one round
        await notify()
        await notify()
        events = log.of("notify_received", client_id="cid", group="g", broker_addr="10.0.0.1:10911")
        assert [e["coalesced"] for e in events] == [0, 2]
        await asyncio.sleep(0.02)
        assert len(inst.rounds) == 2
    finally:
        task.cancel()


async def test_rebalance_service_5x_retries_after_min_interval_when_unbalanced() -> None:
    inst = _Round([False, True], rebalance_retry_when_unbalanced=True, rebalance_wait_interval=100_000)
    svc = inst.service()
    inst.clock.advance(2000)  # the service was created "long ago"
    task = asyncio.create_task(svc.run())
    try:
        svc.wakeup()
        await asyncio.sleep(0.005)
        assert len(inst.rounds) == 1
        inst.clock.advance(1000)
        await asyncio.sleep(0.03)  # unbalanced: next round after minInterval (1 s -> 10 ms)
        assert len(inst.rounds) == 2
        inst.clock.advance(1000)
        await asyncio.sleep(0.05)
        assert len(inst.rounds) == 2  # balanced: back to the long period
    finally:
        task.cancel()


@pytest.mark.parametrize(
    ("running", "paused", "assigned", "result", "rounds"),
    [
        (True, False, False, True, 1),
        (False, False, False, False, 0),
        (True, True, False, False, 0),
        (True, False, True, True, 0),
    ],
)
async def test_try_rebalance_runs_only_for_a_running_unsuspended_rebalanced_consumer(
    running: bool, paused: bool, assigned: bool, result: bool, rounds: int
) -> None:
    """GroupState rule 6: suspend() and a stopped consumer make the round unbalanced without a broker
    call; assign() makes it balanced without one."""
    r = Rig()
    r.route(mq(0))
    r.state.running, r.state.paused, r.state.assigned = running, paused, assigned
    assert await r.impl.try_rebalance() is result
    assert len(r.api.calls) == rounds and (mq(0) in r.state.process_queue_table) is bool(rounds)


@pytest.mark.parametrize("rocketmq5", [False, True])
async def test_lock_all_and_unlock_all_take_dropped_queues_in_4_9_only(rocketmq5: bool) -> None:
    """4.9.8's buildProcessQueueTableByBrokerName takes every process queue, so a reassigned orderly
    queue whose listener still holds the consume lock keeps its broker lock renewed and is unlocked at
    shutdown; 5.x leaves dropped queues out."""
    options = ConsumerConfig.rocketmq5() if rocketmq5 else {}
    r = Rig(orderly=True, time_scale=0.01, **options)
    pq = _cached_pq(r.clock)
    r.hold(mq(0), pq)
    r.api.cids = ["c1", "zzz"]
    r.route(mq(1), mq(2))
    await pq.consume_lock.acquire()  # a listener is running: the drop cannot finish
    await r.rebalance()
    assert pq.dropped and mq(0) in r.state.process_queue_table
    r.api.calls.clear()
    await r.impl.lock_all()
    await r.impl.unlock_all(False)
    expected = [mq(1)] if rocketmq5 else [mq(0), mq(1)]
    calls = [x for x in r.api.calls if x[0] in ("lock", "unlock")]
    assert calls == [("lock", expected), ("unlock", expected)]
    pq.consume_lock.release()


async def test_max_offset_and_search_offset_wait_six_seconds_as_mq_admin_impl() -> None:
    r = Rig(time_scale=0.01, consume_from_where="timestamp")
    await r.impl.compute_pull_from_where_with_exception(mq(0))  # not committed: search
    await r.impl.compute_pull_from_where_with_exception(mq(0, "%RETRY%g"))  # retry topic: max
    assert [x[0] for x in r.api.calls] == ["search", "max"]
    assert r.api.timeouts == [pytest.approx(0.06), pytest.approx(0.06)]


@pytest.mark.parametrize("first", [False, True])
async def test_5x_marks_every_leaving_queue_dropped_before_releasing_one(first: bool) -> None:
    r = Rig(orderly=True, time_scale=1.0, mark_dropped_before_release=first)
    busy, other = _cached_pq(r.clock), _cached_pq(r.clock)
    r.hold(mq(0), busy)
    r.hold(mq(1), other)
    r.route(mq(5))  # both queues leave
    await busy.consume_lock.acquire()  # the first release waits up to 1 s for the listener
    task = asyncio.create_task(r.rebalance())
    await asyncio.sleep(0.2)
    assert busy.dropped
    assert other.dropped is first  # 4.9 drops each queue only when its turn comes
    busy.consume_lock.release()
    await task


async def test_5x_orderly_release_persists_the_offset_before_trying_the_consume_lock() -> None:
    r = Rig(orderly=True, time_scale=0.01, **ConsumerConfig.rocketmq5())
    pq = _cached_pq(r.clock)
    r.hold(mq(0), pq)
    r.route(mq(5))
    await pq.consume_lock.acquire()  # the release fails: the listener holds the queue
    await r.rebalance()
    assert mq(0) in r.state.process_queue_table and pq.dropped
    assert r.offsets.persisted == [mq(0)]
    pq.consume_lock.release()


@pytest.mark.parametrize("rocketmq5", [False, True])
async def test_a_topic_without_route_calls_message_queue_changed_in_5x(rocketmq5: bool) -> None:
    """5.x rebalanceByTopic calls messageQueueChanged(topic, {}, {}) when the topic has no route; the
    push consumer's hook then heartbeats."""
    r = Rig(**(ConsumerConfig.rocketmq5() if rocketmq5 else {}))
    await r.rebalance()  # "T" has no route
    assert r.api.heartbeats == (1 if rocketmq5 else 0)


@pytest.mark.parametrize("rocketmq5", [False, True])
async def test_a_failed_message_no_longer_cached_is_sent_back_in_4_9_only(rocketmq5: bool) -> None:
    """The "skip messages the process queue no longer holds" rule of processConsumeResult came with 5.1;
    4.9 sends every failed message back."""
    from rmqlab.client.consume import ConsumeConcurrentlyStatus, ConsumeMessageConcurrentlyService, Listener

    r = Rig(time_scale=0.01, **(ConsumerConfig.rocketmq5() if rocketmq5 else {}))
    pq = _cached_pq(r.clock)  # holds offset 0 only
    done = asyncio.Event()

    async def fail(msgs: list[Any]) -> ConsumeConcurrentlyStatus:
        done.set()
        return ConsumeConcurrentlyStatus.RECONSUME_LATER

    service = ConsumeMessageConcurrentlyService(
        r.state,
        Listener(fail, None),  # type: ignore[arg-type]
        rebalance=r.impl,
        api=r.api,  # type: ignore[arg-type]
        offsets=r.offsets,  # type: ignore[arg-type]
        events=EventLog.null(),
        clock=r.clock,
    )
    service.start()
    try:
        gone = Message("m1", "T", "BrokerA", 0, 1, b"y")  # offset 1: not in the process queue any more
        service.submit_consume_request([gone], pq, mq(0), True)
        await asyncio.wait_for(done.wait(), 2)
        for _ in range(20):
            await asyncio.sleep(0)
        sent_back = [x for x in r.api.calls if x[0] == "send_back"]
        assert sent_back == ([] if rocketmq5 else [("send_back", 1)])
    finally:
        await service.shutdown(0)
