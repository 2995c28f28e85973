"""RebalanceImpl and RebalanceService without sockets: a fake client instance records the RPCs.

Ports RocketMQ's RebalancePushImplTest (thresholds, computePullFromWhereWithException) and covers the
orderly lock / unlock rules of 4.9 and 5.x.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from client.config import ConsumerConfig
from client.errors import OffsetNotFoundError
from client.instance import RebalanceService
from client.process_queue import ProcessQueue
from client.push_consumer import PushConsumer
from protocol.model import Message, MessageQueue
from protocol.runtime import ManualClock


class FakeApi:
    def __init__(self) -> None:
        self.max_offset = 12345
        self.search = 12345
        self.committed: dict[MessageQueue, int] = {}
        self.lockable: set[MessageQueue] | None = None  # None: everything locks
        self.calls: list[tuple[str, Any]] = []
        self.timeouts: list[float] = []

    async def get_max_offset(self, addr: str, mq: MessageQueue, timeout_s: float) -> int:
        self.calls.append(("max", mq))
        self.timeouts.append(timeout_s)
        return self.max_offset

    async def search_offset(self, addr: str, mq: MessageQueue, ts: int, timeout_s: float) -> int:
        self.calls.append(("search", mq))
        self.timeouts.append(timeout_s)
        return self.search

    async def query_consumer_offset(self, addr: str, group: str, mq: MessageQueue, timeout_s: float) -> int:
        if mq not in self.committed:
            raise OffsetNotFoundError()
        return self.committed[mq]

    async def update_consumer_offset_oneway(
        self, addr: str, group: str, mq: MessageQueue, offset: int
    ) -> None:
        self.calls.append(("commit", (mq, offset)))
        self.committed[mq] = offset

    async def lock_batch_mq(
        self, addr: str, group: str, cid: str, mqs: Any, timeout_s: float
    ) -> set[MessageQueue]:
        self.calls.append(("lock", sorted(mqs)))
        return set(mqs) if self.lockable is None else set(mqs) & self.lockable

    async def consumer_send_msg_back(
        self, addr: str, msg: Message, group: str, delay_level: int, max_times: int, timeout_s: float
    ) -> None:
        self.calls.append(("send_back", msg.queue_offset))

    async def unlock_batch_mq(
        self, addr: str, group: str, cid: str, mqs: Any, timeout_s: float, *, oneway: bool
    ) -> None:
        self.calls.append(("unlock", sorted(mqs)))


class FakePullService:
    def __init__(self) -> None:
        self.now: list[Any] = []
        self.later: list[tuple[Any, float]] = []
        self.tasks: list[tuple[Any, float]] = []

    def execute_pull_request_immediately(self, req: Any) -> None:
        self.now.append(req)

    def execute_pull_request_later(self, req: Any, delay_ms: float) -> None:
        self.later.append((req, delay_ms))

    def execute_task_later(self, fn: Any, delay_ms: float) -> None:
        self.tasks.append((fn, delay_ms))


class FakeScheduler:
    def __init__(self) -> None:
        self.tasks: list[tuple[Any, float]] = []

    def schedule(self, fn: Any, delay_s: float, what: str = "task") -> None:
        self.tasks.append((fn, delay_s))


class FakeInstance:
    def __init__(self, cids: list[str]) -> None:
        self.api = FakeApi()
        self.pull_service = FakePullService()
        self.scheduler = FakeScheduler()
        self.cids = cids
        self.heartbeats = 0
        self.rebalance_later_calls: list[float] = []

    def find_broker_address_in_subscribe(self, *a: Any) -> str:
        return "127.0.0.1:1"

    def find_broker_address_in_publish(self, *a: Any) -> str:
        return "127.0.0.1:1"

    async def find_broker_address_in_subscribe_or_update(self, *a: Any) -> str:
        return "127.0.0.1:1"

    async def find_broker_address_in_publish_or_update(self, *a: Any) -> str:
        return "127.0.0.1:1"

    async def update_topic_route_info_from_name_server(self, topic: str) -> bool:
        return True

    async def find_consumer_id_list(self, topic: str, group: str) -> list[str]:
        return list(self.cids)

    async def send_heartbeat_to_all_broker_with_lock(self) -> bool:
        self.heartbeats += 1
        return True

    def rebalance_later(self, delay_ms: float) -> None:
        self.rebalance_later_calls.append(delay_ms)

    def spawn(self, coro: Any, what: str = "task") -> asyncio.Task[Any]:
        return asyncio.get_running_loop().create_task(coro)


def make(orderly: bool = False, **options: Any) -> tuple[PushConsumer, FakeInstance, ManualClock]:
    clock = ManualClock()
    c = PushConsumer("g", namesrv="127.0.0.1:9876", clock=clock, **options)
    inst = FakeInstance([c.client_id])
    c.instance = inst  # type: ignore[assignment]
    c.consume_orderly = orderly
    c.running = True
    c.subscribe("T")
    return c, inst, clock


def mq(q: int, topic: str = "T") -> MessageQueue:
    return MessageQueue(topic, "BrokerA", q)


async def test_message_queue_changed_recomputes_count_and_size_thresholds() -> None:
    c, inst, _ = make(pull_threshold_for_queue=1024, pull_threshold_size_for_queue=1024)
    impl = c.rebalance_impl
    impl.topic_subscribe_info_table["T"] = {mq(0), mq(1)}
    await c.do_rebalance()
    assert c.pull_threshold_for_queue == 1024 and c.pull_threshold_size_for_queue == 1024
    assert inst.heartbeats == 1  # the change was announced at once

    c2, _, _ = make(pull_threshold_for_topic=1024, pull_threshold_size_for_topic=1024)
    c2.rebalance_impl.topic_subscribe_info_table["T"] = {mq(0), mq(1)}
    await c2.do_rebalance()
    assert (c2.pull_threshold_for_queue, c2.pull_threshold_size_for_queue) == (512, 512)
    c2.rebalance_impl.topic_subscribe_info_table["T"] = {mq(0), mq(1), mq(2)}
    await c2.do_rebalance()
    assert (c2.pull_threshold_for_queue, c2.pull_threshold_size_for_queue) == (341, 341)


async def test_message_queue_changed_bumps_the_subscription_version() -> None:
    c, _, clock = make()
    before = c.rebalance_impl.subscription_inner["T"].sub_version
    clock.advance(5)
    c.rebalance_impl.topic_subscribe_info_table["T"] = {mq(0)}
    await c.do_rebalance()
    assert c.rebalance_impl.subscription_inner["T"].sub_version == before + 5


async def test_compute_pull_from_where_with_exception_like_rocketmq() -> None:
    c, inst, _ = make()
    impl = c.rebalance_impl
    retry = MessageQueue("%RETRY%g", "BrokerA", 0)
    for where, topic_mq, want in (
        ("last", mq(0), 12345),
        ("last", retry, 0),
        ("first", mq(0), 0),
        ("timestamp", mq(0), 12345),
    ):
        c.config = c.config.replace(consume_from_where=where_enum(where))
        assert await impl.compute_pull_from_where_with_exception(topic_mq) == want
    inst.api.max_offset = 23456
    c.config = c.config.replace(consume_from_where=where_enum("timestamp"))
    assert await impl.compute_pull_from_where_with_exception(retry) == 23456
    inst.api.committed[mq(1)] = 0
    for where in ("last", "first", "timestamp"):
        c.config = c.config.replace(consume_from_where=where_enum(where))
        assert await impl.compute_pull_from_where_with_exception(mq(1)) == 0


def where_enum(short: str) -> Any:
    from client.consumer_base import normalize_enums

    return normalize_enums({"consume_from_where": short})["consume_from_where"]


async def test_new_queue_gets_process_queue_offset_and_pull_request() -> None:
    c, inst, _ = make(consume_from_where="first")
    impl = c.rebalance_impl
    inst.api.committed[mq(1)] = 7
    impl.topic_subscribe_info_table["T"] = {mq(0), mq(1)}
    assert await c.do_rebalance() is True
    reqs = {r.message_queue: r.next_offset for r in inst.pull_service.now}
    assert reqs == {mq(0): 0, mq(1): 7}
    assert all(impl.process_queue_table[m].locked for m in reqs)  # marked locked at creation (4.9.5+)


async def test_pull_request_dispatch_delay_5x() -> None:
    c, inst, _ = make(pull_request_dispatch_delay=500, time_scale=0.1)
    c.rebalance_impl.topic_subscribe_info_table["T"] = {mq(0)}
    await c.do_rebalance()
    assert inst.pull_service.now == [] and [d for _, d in inst.pull_service.later] == [50.0]


async def test_pull_expired_queue_is_dropped_and_readded() -> None:
    c, _inst, clock = make()
    impl = c.rebalance_impl
    impl.topic_subscribe_info_table["T"] = {mq(0)}
    await c.do_rebalance()
    old = impl.process_queue_table[mq(0)]
    clock.advance(120_001)
    await c.do_rebalance()
    assert old.dropped and impl.process_queue_table[mq(0)] is not old


async def test_not_my_topic_is_truncated_without_persisting() -> None:
    c, inst, _ = make()
    impl = c.rebalance_impl
    gone = MessageQueue("Gone", "BrokerA", 0)
    pq = ProcessQueue()
    impl.process_queue_table[gone] = pq
    impl.topic_subscribe_info_table["T"] = {mq(0)}
    await c.do_rebalance()
    assert gone not in impl.process_queue_table and pq.dropped
    assert not [x for x in inst.api.calls if x[0] == "commit" and x[1][0] == gone]


async def test_orderly_new_queue_needs_the_broker_lock() -> None:
    c, inst, _ = make(orderly=True)
    impl = c.rebalance_impl
    inst.api.lockable = {mq(1)}
    impl.topic_subscribe_info_table["T"] = {mq(0), mq(1)}
    assert await c.do_rebalance() is False  # not balanced: mq(0) is allocated but not held
    assert set(impl.process_queue_table) == {mq(1)}
    assert inst.rebalance_later_calls == []  # 4.9: no early retry

    c5, inst5, _ = make(orderly=True, rebalance_later_on_lock_failure=True)
    inst5.api.lockable = set()
    c5.rebalance_impl.topic_subscribe_info_table["T"] = {mq(0)}
    await c5.do_rebalance()
    assert inst5.rebalance_later_calls == [500]


def _cached_pq(clock: ManualClock) -> ProcessQueue:
    pq = ProcessQueue(clock.monotonic_ms())
    pq.put_messages([Message("m", "T", "BrokerA", 0, 0, b"x")])
    return pq


async def test_orderly_drop_49_waits_for_the_consume_lock_then_unlocks_late() -> None:
    c, inst, clock = make(orderly=True, time_scale=0.01)
    impl = c.rebalance_impl
    pq = _cached_pq(clock)
    impl.process_queue_table[mq(0)] = pq
    inst.cids = [c.client_id, "zzz"]
    impl.topic_subscribe_info_table["T"] = {mq(1), mq(2)}  # AVG: mq(1) for us, mq(2) for "zzz"; mq(0) goes
    await pq.consume_lock.acquire()  # a listener is running
    await c.do_rebalance()
    assert pq.dropped and mq(0) in impl.process_queue_table  # kept until it can be released
    assert pq.try_unlock_times == 1
    pq.consume_lock.release()
    await c.do_rebalance()
    assert mq(0) not in impl.process_queue_table
    # messages were still cached: the broker lock is released 20 s later, not now
    assert not [x for x in inst.api.calls if x[0] == "unlock"]
    fn, delay = inst.scheduler.tasks[-1]  # unlockDelay: on MQClientInstance's scheduled thread
    assert delay == pytest.approx(0.2)  # 20 s scaled by 0.01
    await fn()
    assert ("unlock", [mq(0)]) in inst.api.calls


@pytest.mark.parametrize("rocketmq5", [False, True])
async def test_lock_all_and_unlock_all_take_dropped_queues_in_4_9_only(rocketmq5: bool) -> None:
    """4.9.8's buildProcessQueueTableByBrokerName takes every process queue, so a reassigned orderly
    queue whose listener still holds the consume lock keeps its broker lock renewed and is unlocked at
    shutdown; 5.x leaves dropped queues out."""
    options = ConsumerConfig.rocketmq5() if rocketmq5 else {}
    c, inst, clock = make(orderly=True, time_scale=0.01, **options)
    impl = c.rebalance_impl
    pq = _cached_pq(clock)
    impl.process_queue_table[mq(0)] = pq
    inst.cids = [c.client_id, "zzz"]
    impl.topic_subscribe_info_table["T"] = {mq(1), mq(2)}
    await pq.consume_lock.acquire()  # a listener is running: the drop cannot finish
    await c.do_rebalance()
    assert pq.dropped and mq(0) in impl.process_queue_table
    inst.api.calls.clear()
    await impl.lock_all()
    await impl.unlock_all(False)
    expected = [mq(1)] if rocketmq5 else [mq(0), mq(1)]
    calls = [x for x in inst.api.calls if x[0] in ("lock", "unlock")]
    assert calls == [("lock", expected), ("unlock", expected)]
    pq.consume_lock.release()


async def test_max_offset_and_search_offset_wait_six_seconds_as_mq_admin_impl() -> None:
    c, inst, _ = make(time_scale=0.01, consume_from_where="timestamp")
    await c.rebalance_impl.compute_pull_from_where_with_exception(mq(0))  # not committed: search
    await c.rebalance_impl.compute_pull_from_where_with_exception(mq(0, "%RETRY%g"))  # retry topic: max
    assert [x[0] for x in inst.api.calls] == ["search", "max"]
    assert inst.api.timeouts == [pytest.approx(0.06), pytest.approx(0.06)]


async def test_orderly_drop_5x_force_unlocks_after_the_unlock_delay() -> None:
    c, inst, clock = make(orderly=True, orderly_unlock_5x=True, time_scale=0.01)
    impl = c.rebalance_impl
    pq = _cached_pq(clock)
    pq.locked = True
    impl.process_queue_table[mq(0)] = pq
    impl.topic_subscribe_info_table["T"] = {mq(1)}
    await pq.consume_lock.acquire()
    await c.do_rebalance()
    assert mq(0) in impl.process_queue_table  # lock busy, last lock recent
    clock.advance(201)  # unlockDelay (20 s) since the last lock, scaled
    await c.do_rebalance()
    assert mq(0) not in impl.process_queue_table and not pq.locked
    assert ("unlock", [mq(0)]) in inst.api.calls
    pq.consume_lock.release()


class _Inst:
    def __init__(self, results: list[bool], **cfg: Any) -> None:
        self.config = ConsumerConfig(time_scale=0.01, **cfg)
        self.clock = ManualClock()
        self.results = results
        self.rounds: list[float] = []

    async def do_rebalance(self) -> bool:
        self.rounds.append(asyncio.get_running_loop().time())
        return self.results.pop(0) if self.results else True


async def test_rebalance_service_wakeups_coalesce() -> None:
    inst = _Inst([])
    svc = RebalanceService(inst)  # type: ignore[arg-type]
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


async def test_rebalance_service_5x_retries_after_min_interval_when_unbalanced() -> None:
    inst = _Inst([False, True], rebalance_retry_when_unbalanced=True, rebalance_wait_interval=100_000)
    svc = RebalanceService(inst)  # type: ignore[arg-type]
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


@pytest.mark.parametrize("rocketmq5", [False, True])
async def test_a_failed_message_no_longer_cached_is_sent_back_in_4_9_only(rocketmq5: bool) -> None:
    """The "skip messages the process queue no longer holds" rule of processConsumeResult came with 5.1;
    4.9 sends every failed message back."""
    from client.consume import ConsumeConcurrentlyStatus, ConsumeMessageConcurrentlyService, Listener

    options = ConsumerConfig.rocketmq5() if rocketmq5 else {}
    c, inst, clock = make(time_scale=0.01, **options)
    pq = _cached_pq(clock)  # holds offset 0 only
    done = asyncio.Event()

    async def fail(msgs: list[Any]) -> ConsumeConcurrentlyStatus:
        done.set()
        return ConsumeConcurrentlyStatus.RECONSUME_LATER

    service = ConsumeMessageConcurrentlyService(c, Listener(fail, None))  # type: ignore[arg-type]
    service.start()
    try:
        gone = Message("m1", "T", "BrokerA", 0, 1, b"y")  # offset 1: not in the process queue any more
        service.submit_consume_request([gone], pq, mq(0), True)
        await asyncio.wait_for(done.wait(), 2)
        for _ in range(20):
            await asyncio.sleep(0)
        sent_back = [x for x in inst.api.calls if x[0] == "send_back"]
        assert sent_back == ([] if rocketmq5 else [("send_back", 1)])
    finally:
        await service.shutdown(0)


@pytest.mark.parametrize("first", [False, True])
async def test_5x_marks_every_leaving_queue_dropped_before_releasing_one(first: bool) -> None:
    c, _, clock = make(orderly=True, time_scale=1.0, mark_dropped_before_release=first)
    impl = c.rebalance_impl
    busy, other = _cached_pq(clock), _cached_pq(clock)
    impl.process_queue_table[mq(0)] = busy
    impl.process_queue_table[mq(1)] = other
    impl.topic_subscribe_info_table["T"] = {mq(5)}  # both queues leave
    await busy.consume_lock.acquire()  # the first release waits up to 1 s for the listener
    task = asyncio.create_task(c.do_rebalance())
    await asyncio.sleep(0.2)
    assert busy.dropped
    assert other.dropped is first  # 4.9 drops each queue only when its turn comes
    busy.consume_lock.release()
    await task


async def test_5x_orderly_release_persists_the_offset_before_trying_the_consume_lock() -> None:
    c, inst, clock = make(orderly=True, time_scale=0.01, **ConsumerConfig.rocketmq5())
    impl = c.rebalance_impl
    pq = _cached_pq(clock)
    impl.process_queue_table[mq(0)] = pq
    c.offset_store.update_offset(mq(0), 7, increase_only=False)
    impl.topic_subscribe_info_table["T"] = {mq(5)}
    await pq.consume_lock.acquire()  # the release fails: the listener holds the queue
    await c.do_rebalance()
    assert mq(0) in impl.process_queue_table and pq.dropped
    assert ("commit", (mq(0), 7)) in inst.api.calls
    pq.consume_lock.release()


@pytest.mark.parametrize("rocketmq5", [False, True])
async def test_a_topic_without_route_calls_message_queue_changed_in_5x(rocketmq5: bool) -> None:
    """5.x rebalanceByTopic calls messageQueueChanged(topic, {}, {}) when the topic has no route; the
    push consumer's hook then heartbeats."""
    options = ConsumerConfig.rocketmq5() if rocketmq5 else {}
    c, inst, _ = make(**options)
    await c.do_rebalance()  # "T" has no route in topic_subscribe_info_table
    assert inst.heartbeats == (1 if rocketmq5 else 0)
