"""A client's rebalancing, from the broker's NOTIFY_CONSUMER_IDS_CHANGED to the PullRequests of new queues.

``RebalanceService`` (RocketMQ's thread of that name, one of MQClientInstance's services) answers the
notification by waking up, and its round (MQClientInstance#doRebalance) runs each registered consumer's
``RebalanceImpl`` in turn. ``RebalanceImpl`` / ``RebalancePushImpl`` / ``RebalanceLitePullImpl`` are
RocketMQ's: rebalanceByTopic for both message models, updateProcessQueueTableInRebalance,
messageQueueChanged, truncateMessageQueueNotMyTopic, and the orderly lock / unlock calls.

The tables and decisions are the group's ``client.group_state.GroupState``: for each topic a round asks it
once for a ``RebalancePlan`` and carries the plan out here, making the broker calls it needs through the
ports of ``client.ports`` and writing the events the analysis reads (``notify_received``, ``rebalance``,
``mq_added``, ``mq_removed``, lock events). New queues' PullRequests go to the ``pulls`` port, the
client's PullMessageService (``client.pull_service``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Mapping
from collections.abc import Set as AbstractSet
from typing import Any, Protocol

from rmqlab.client.client_config import ClientConfig, ConsumerConfig
from rmqlab.client.errors import MQClientError
from rmqlab.client.group_state import (
    AllocationFailed,
    DropReason,
    GroupState,
    RebalancePlan,
    StartKind,
    StartPlan,
    StartRule,
    member_set,
    rebalance_event_fields,
    shorts,
)
from rmqlab.client.offset_store import ReadOffsetType
from rmqlab.client.ports import EventSink, GroupApi, GroupOffsets, MessageQueueListener, PullDispatcher
from rmqlab.client.process_queue import ProcessQueue, PullRequest
from rmqlab.client.pull_service import PullingConsumer
from rmqlab.client.scheduler import Wakeup
from rmqlab.protocol.clock import Clock
from rmqlab.protocol.codes import RequestCode
from rmqlab.protocol.command import RemotingCommand
from rmqlab.protocol.model import MessageModel, MessageQueue, is_retry_topic
from rmqlab.protocol.remoting import Connection, RemotingClient
from rmqlab.protocol.route import MASTER_ID


def emit_queue_event(
    events: EventSink, group: str, client_id: str, event: str, mq: MessageQueue, **fields: Any
) -> None:
    """Write an event about one message queue of a consumer group (EVENTS.md's queue fields)."""
    events.emit(
        event,
        group=group,
        client_id=client_id,
        topic=mq.topic,
        broker=mq.broker_name,
        queue_id=mq.queue_id,
        **fields,
    )


class RegisteredConsumer(PullingConsumer, Protocol):
    """A consumer registered in the client, as its RebalanceService and PullMessageService see it."""

    @property
    def rebalance_impl(self) -> RebalanceImpl: ...


class RebalanceService:
    """RocketMQ's RebalanceService: a round every ``rebalance_wait_interval`` and whenever woken (a
    broker's NOTIFY_CONSUMER_IDS_CHANGED, a consumer's start); wakeups during a round coalesce.

    ``consumers`` is the client's consumer table (group -> registered consumer), read at each round.
    """

    def __init__(
        self,
        config: ClientConfig,
        clock: Clock,
        events: EventSink,
        client_id: str,
        consumers: Mapping[str, RegisteredConsumer],
        remoting: RemotingClient,
    ) -> None:
        self.config = config
        self.clock = clock
        self.log = events
        self.client_id = client_id
        self.consumers = consumers
        self._wakeup = Wakeup()
        self._coalesced = 0  # NOTIFYs since the last notify_received that found a wakeup pending
        self.rounds = 0
        # RocketMQ starts the clock at construction: the first round after start may wait minInterval (>=5.2)
        self._last_rebalance = clock.monotonic_ms()
        remoting.register(RequestCode.NOTIFY_CONSUMER_IDS_CHANGED, self.on_notify_consumer_ids_changed)

    def on_notify_consumer_ids_changed(self, conn: Connection, cmd: RemotingCommand) -> None:
        """ClientRemotingProcessor#notifyConsumerIdsChanged: rebalanceImmediately, nothing else.

        ``notify_received`` is written for a NOTIFY that wakes the service. One that arrives while a
        wakeup is already pending changes nothing (the coming round serves both, as ServiceThread#wakeup
        is then a no-op); it is counted in the next event's ``coalesced``. A membership change reaches
        every member from every broker, so at a thousand members these were most of a run's lines."""
        if self._wakeup.is_set():
            self._coalesced += 1
            return None
        group = cmd.ext.get("consumerGroup")
        self.log.emit(
            "notify_received",
            client_id=self.client_id,
            group=str(group) if group is not None else "",
            broker_addr=conn.remote_addr,
            coalesced=self._coalesced,
        )
        self._coalesced = 0
        # RocketMQ wakes the rebalance of every group of this client, not only the notified one.
        self.wakeup()
        return None

    def wakeup(self) -> None:
        self._wakeup.set()

    async def run(self) -> None:
        cfg = self.config
        wait_ms = getattr(cfg, "rebalance_wait_interval", 20_000)
        min_ms = getattr(cfg, "rebalance_min_interval", 1_000)
        retry_5x = bool(getattr(cfg, "rebalance_retry_when_unbalanced", False))
        clock = self.clock
        real_wait = cfg.seconds(wait_ms)
        while True:
            await self._wakeup.wait(real_wait)
            self._wakeup.clear()
            if retry_5x:
                # >=5.2: rounds are never closer than minInterval; an unbalanced round retries after it
                elapsed = clock.monotonic_ms() - self._last_rebalance
                if elapsed < cfg.ms(min_ms):
                    real_wait = (cfg.ms(min_ms) - elapsed) / 1000.0
                    continue
            balanced = await self.do_rebalance()
            self.rounds += 1
            if retry_5x:
                real_wait = cfg.seconds(wait_ms if balanced else min_ms)
                self._last_rebalance = clock.monotonic_ms()

    async def do_rebalance(self) -> bool:
        """MQClientInstance#doRebalance: every registered consumer's rebalance, one after another."""
        balanced = True
        for group, consumer in list(self.consumers.items()):
            try:
                if not await consumer.rebalance_impl.try_rebalance():
                    balanced = False
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.log.error("doRebalance failed", group=group, error=repr(exc))
                balanced = False
        return balanced


class RebalanceImpl:
    """The rebalance of one consumer group in one client: the calls and events around its GroupState.

    The consumer builds it from its GroupState and ports: ``api`` (the client's broker calls), ``pulls``
    (the client's PullMessageService), ``offsets`` (the group's offset store) and ``events``.
    """

    read_offset_type = ReadOffsetType.READ_FROM_STORE

    def __init__(
        self,
        state: GroupState,
        api: GroupApi,
        pulls: PullDispatcher,
        offsets: GroupOffsets,
        events: EventSink,
        *,
        clock: Clock,
    ) -> None:
        self.state = state
        self.api = api
        self.pulls = pulls
        self.offsets = offsets
        self.log = events
        self.clock = clock
        self.group = state.group
        self.client_id = state.client_id
        # per topic: the member set and allocation of the last rebalance event written
        # per topic: (the member list object last seen, its member set, the allocation's shorts)
        self._last_rebalance_seen: dict[str, tuple[list[str], frozenset[str], tuple[str, ...]]] = {}

    @property
    def config(self) -> ConsumerConfig:
        return self.state.config

    def _now(self) -> int:
        return self.clock.monotonic_ms()

    def _emit_mq(self, event: str, mq: MessageQueue, **fields: Any) -> None:
        emit_queue_event(self.log, self.group, self.client_id, event, mq, **fields)

    # -- doRebalance ----------------------------------------------------------------------------------
    async def try_rebalance(self) -> bool:
        """The consumer's doRebalance as the round calls it: nothing while the consumer is suspended or
        not running (unbalanced), nor for queues given by assign() (balanced); see GroupState rule 6."""
        state = self.state
        if state.assigned:
            return True
        if state.paused or not state.running:
            return False
        return await self.do_rebalance(state.consume_orderly)

    async def do_rebalance(self, is_order: bool) -> bool:
        balanced = True
        for topic in list(self.state.subscription_inner):
            try:
                if not await self.rebalance_by_topic(topic, is_order):
                    balanced = False
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if not is_retry_topic(topic):
                    self.log.warning(
                        "rebalanceByTopic failed", group=self.group, topic=topic, error=repr(exc)
                    )
                    balanced = False
        self.truncate_message_queue_not_my_topic()
        return balanced

    async def rebalance_by_topic(self, topic: str, is_order: bool) -> bool:
        state = self.state
        mq_set = state.topic_subscribe_info_table.get(topic)
        if state.message_model is MessageModel.BROADCASTING:
            if mq_set is None:
                self.log.warning("doRebalance: topic has no route", group=self.group, topic=topic)
                if self.config.message_queue_changed_without_route:
                    await self.message_queue_changed(topic, set(), set())
                return True
            plan = state.plan_rebalance(topic, None, is_order, self._now())
            changed = await self.update_process_queue_table_in_rebalance(plan)
            self._emit_rebalance(topic, plan.cid_all, plan.allocated, changed, "BROADCASTING")
            if changed:
                await self.message_queue_changed(topic, mq_set, mq_set)
            return mq_set == state.working_set(topic)

        cid_all = await self.api.find_consumer_id_list(topic, self.group)
        if mq_set is None and not is_retry_topic(topic):
            self.log.warning("doRebalance: topic has no route", group=self.group, topic=topic)
            if self.config.message_queue_changed_without_route:  # >=5.0: the listener hears of it
                await self.message_queue_changed(topic, set(), set())
        if cid_all is None:
            self.log.warning("doRebalance: get consumer id list failed", group=self.group, topic=topic)
        if mq_set is None or cid_all is None:
            return True
        try:
            plan = state.plan_rebalance(topic, cid_all, is_order, self._now())
        except AllocationFailed as exc:
            self.log.error(
                "allocate failed",
                group=self.group,
                topic=topic,
                strategy=state.strategy.name,
                error=repr(exc.cause),
            )
            return False
        changed = await self.update_process_queue_table_in_rebalance(plan)
        self._emit_rebalance(topic, plan.cid_all, plan.allocated, changed, state.strategy.name)
        if changed:
            await self.message_queue_changed(topic, mq_set, set(plan.allocated))
        return plan.allocated == state.working_set(topic)

    def _emit_rebalance(
        self,
        topic: str,
        cid_all: list[str],
        allocated: AbstractSet[MessageQueue],
        changed: bool,
        strategy: str,
    ) -> None:
        cfg = self.config
        alloc = shorts(allocated)
        members: frozenset[str] | None = None
        if cfg.omit_repeated_rebalance_events:
            # The allocation cache answers an unchanged view with the same member list object: its set
            # is then the one made last time (kept with it, so the list's id is not reused), instead of
            # a set of the whole group made and compared every round; a new view's set is shared by the
            # clients of the process that see it (member_set).
            last = self._last_rebalance_seen.get(topic)
            members = last[1] if last is not None and last[0] is cid_all else member_set(cid_all)
            shown = tuple(alloc)
            self._last_rebalance_seen[topic] = (cid_all, members, shown)
            if (
                not changed
                and last is not None
                and last[2] == shown
                and (last[1] is members or last[1] == members)
            ):
                return
        self.log.emit(
            "rebalance",
            group=self.group,
            client_id=self.client_id,
            topic=topic,
            strategy=strategy,
            **rebalance_event_fields(cid_all, alloc, cfg.rebalance_event_digest_over, members),
            changed=bool(changed),
        )

    def truncate_message_queue_not_my_topic(self) -> None:
        for mq in self.state.truncate_message_queue_not_my_topic():
            self._emit_mq("mq_removed", mq, reason=str(DropReason.NOT_MY_TOPIC))

    async def update_process_queue_table_in_rebalance(self, plan: RebalancePlan) -> bool:
        """Carry out ``plan`` (RocketMQ's updateProcessQueueTableInRebalance): release and remove the drops,
        then lock (orderly), start and add the new queues, and hand their PullRequests to ``pulls``. True
        when the table changed."""
        state = self.state
        changed = False
        if self.config.mark_dropped_before_release:
            # 5.x: every queue leaving is marked dropped before the first one is released, so none of
            # them keeps consuming while an earlier one waits for its consume lock
            for drop in plan.drop:
                state.mark_dropped(drop.mq)
        for drop in plan.drop:
            mq = drop.mq
            pq = state.mark_dropped(mq)
            assert pq is not None
            if await self.remove_unnecessary_message_queue(mq, pq):
                state.remove_process_queue(mq, pq)
                changed = True
                self._emit_mq("mq_removed", mq, reason=str(drop.reason))
            else:
                self.log.warning(
                    "queue dropped but kept until it can be released", group=self.group, mq=mq.short
                )

        all_locked = True
        new_requests: list[PullRequest] = []
        held = state.process_queue_table
        for add in [add for add in plan.add if add.mq not in held]:  # a failed release keeps its queue
            mq = add.mq
            if mq in plan.lock and not await self.lock(mq):
                all_locked = False
                self.log.warning(
                    "add a new mq failed, because lock failed",
                    group=self.group,
                    mq=mq.short,
                    topic=plan.topic,
                )
                continue
            self.offsets.remove_offset(mq)  # removeDirtyOffset
            pq = state.new_process_queue(self._now())
            try:
                next_offset = await self.compute_pull_from_where_with_exception(mq, add.start)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.log.info(
                    "compute offset failed", group=self.group, mq=mq.short, topic=plan.topic, error=repr(exc)
                )
                continue
            if next_offset < 0:
                self.log.warning("add new mq failed", group=self.group, mq=mq.short, topic=plan.topic)
                continue
            if not state.add_process_queue(mq, pq, next_offset):
                continue
            new_requests.append(PullRequest(self.group, mq, pq, next_offset))
            changed = True
            self._emit_mq("mq_added", mq, next_offset=int(next_offset))
        if not all_locked and self.config.rebalance_later_on_lock_failure:
            self.api.rebalance_later(500)
        self.dispatch_pull_request(new_requests)
        return changed

    # -- hooks ----------------------------------------------------------------------------------------
    async def remove_unnecessary_message_queue(self, mq: MessageQueue, pq: ProcessQueue) -> bool:
        await self.offsets.persist(mq)
        self.offsets.remove_offset(mq)
        return True

    async def compute_pull_from_where_with_exception(
        self, mq: MessageQueue, start: StartRule | None = None
    ) -> int:
        """Where ``mq`` starts: the offset store's answer through ``start`` (by default the group's rule
        for the queue's topic), then the broker call that answer asks for, if any."""
        last = await self.offsets.read_offset(mq, self.read_offset_type)
        rule = start if start is not None else self.state.start_rule(mq.topic)
        return await self._resolve_start(mq, rule.given(last))

    def dispatch_pull_request(self, requests: list[PullRequest]) -> None:
        return None

    async def message_queue_changed(
        self, topic: str, mq_all: set[MessageQueue], mq_divided: set[MessageQueue]
    ) -> None:
        return None

    async def remove_process_queue(self, mq: MessageQueue, reason: DropReason) -> None:
        pq = self.state.remove_process_queue(mq)
        if pq is not None:
            await self.remove_unnecessary_message_queue(mq, pq)
            self._emit_mq("mq_removed", mq, reason=str(reason))

    async def _resolve_start(self, mq: MessageQueue, plan: StartPlan) -> int:
        if plan.kind is StartKind.OFFSET:
            return plan.offset
        if plan.kind is StartKind.FAIL:
            raise MQClientError(f"cannot compute the start offset of {mq}: {plan.reason}")
        addr = await self._offset_broker_addr(mq)
        timeout = self.config.seconds(self.config.mq_admin_timeout)
        if plan.kind is StartKind.MAX_OFFSET:
            return int(await self.api.get_max_offset(addr, mq, timeout))
        return int(await self.api.search_offset(addr, mq, plan.timestamp_ms, timeout))

    async def _offset_broker_addr(self, mq: MessageQueue) -> str:
        addr = await self.api.find_broker_address_in_publish_or_update(mq.topic, mq.broker_name)
        if addr is None:
            raise MQClientError(f"the broker[{mq.broker_name}] not exist")
        return addr

    # -- locks ----------------------------------------------------------------------------------------
    async def lock(self, mq: MessageQueue) -> bool:
        cfg = self.config
        addr = self.api.find_broker_address_in_subscribe(mq.broker_name, MASTER_ID, True)
        if addr is None:
            self._emit_mq("mq_lock", mq, result="no_broker")
            return False
        try:
            locked = await self.api.lock_batch_mq(
                addr, self.group, self.client_id, [mq], cfg.seconds(cfg.lock_batch_timeout)
            )
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self._emit_mq("mq_lock", mq, result="error", error=repr(exc))
            return False
        self.state.set_locked(locked, True, self._now())
        ok = mq in locked
        self._emit_mq("mq_lock", mq, result="ok" if ok else "failed")
        return ok

    def _by_broker(self) -> Iterator[tuple[str, str, set[MessageQueue]]]:
        """buildProcessQueueTableByBrokerName: (broker name, master address, queues) for every broker
        whose master address is known. 4.9 takes every queue of the table, so a dropped orderly queue
        still held by its listener keeps its broker lock; 5.x leaves dropped ones out. The queues are
        taken when iteration starts; each address is looked up when its turn comes, after the previous
        call."""
        include_dropped = not self.config.lock_all_skips_dropped
        for broker_name, mqs in self.state.queues_by_broker(include_dropped=include_dropped):
            addr = self.api.find_broker_address_in_subscribe(broker_name, MASTER_ID, True)
            if addr is not None:
                yield broker_name, addr, mqs

    async def lock_all(self) -> None:
        cfg = self.config
        for broker_name, addr, mqs in self._by_broker():
            try:
                ok = await self.api.lock_batch_mq(
                    addr, self.group, self.client_id, mqs, cfg.seconds(cfg.lock_batch_timeout)
                )
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                # nothing changes: the client-side lock ages toward its 30 s expiry
                self.log.warning("lockBatchMQ failed", group=self.group, broker=broker_name, error=repr(exc))
                continue
            self.state.set_locked(ok, True, self._now())
            lost = sorted(mq for mq in mqs if mq not in ok)
            self.state.set_locked(lost, False, 0)
            self.log.emit(
                "lock_all",
                group=self.group,
                client_id=self.client_id,
                broker=broker_name,
                locked=sorted(f"{mq.topic}@{mq.short}" for mq in ok if mq in mqs),
                failed=[f"{mq.topic}@{mq.short}" for mq in lost],
            )

    async def unlock(self, mq: MessageQueue, oneway: bool) -> None:
        cfg = self.config
        addr = self.api.find_broker_address_in_subscribe(mq.broker_name, MASTER_ID, True)
        if addr is None:
            return
        try:
            await self.api.unlock_batch_mq(
                addr, self.group, self.client_id, [mq], cfg.seconds(cfg.lock_batch_timeout), oneway=oneway
            )
            self._emit_mq("mq_unlock", mq, oneway=oneway)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self.log.warning("unlockBatchMQ failed", group=self.group, mq=mq.short, error=repr(exc))

    async def unlock_all(self, oneway: bool) -> None:
        cfg = self.config
        for broker_name, addr, mqs in self._by_broker():
            try:
                await self.api.unlock_batch_mq(
                    addr, self.group, self.client_id, mqs, cfg.seconds(cfg.lock_batch_timeout), oneway=oneway
                )
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.log.warning(
                    "unlockBatchMQ failed", group=self.group, broker=broker_name, error=repr(exc)
                )
                continue
            self.state.set_locked(mqs, False, 0)
            self.log.emit(
                "unlock_all",
                group=self.group,
                client_id=self.client_id,
                broker=broker_name,
                queues=[f"{mq.topic}@{mq.short}" for mq in sorted(mqs)],
            )

    def destroy(self, reason: DropReason = DropReason.SHUTDOWN) -> None:
        for mq in self.state.destroy():
            self._emit_mq("mq_removed", mq, reason=str(reason))


class RebalancePushImpl(RebalanceImpl):
    """RebalancePushImpl: new queues become PullRequests; orderly queues are unlocked when dropped."""

    async def message_queue_changed(
        self, topic: str, mq_all: set[MessageQueue], mq_divided: set[MessageQueue]
    ) -> None:
        self.state.message_queue_changed(topic, self.clock.now_ms())
        await self.api.send_heartbeat_to_all_broker_with_lock()

    async def remove_unnecessary_message_queue(self, mq: MessageQueue, pq: ProcessQueue) -> bool:
        if not self.state.orderly_release_needs_lock():
            return await super().remove_unnecessary_message_queue(mq, pq)
        if self.config.orderly_unlock_5x:
            return await self._try_remove_order_message_queue_5x(mq, pq)
        return await self._remove_order_message_queue_49(mq, pq)

    async def _remove_order_message_queue_49(self, mq: MessageQueue, pq: ProcessQueue) -> bool:
        cfg = self.config
        await self.offsets.persist(mq)
        self.offsets.remove_offset(mq)
        if not await _try_acquire(pq.consume_lock, cfg.seconds(1000)):
            pq.try_unlock_times += 1
            self.log.warning("mq is consuming, so can not unlock it", group=self.group, mq=mq.short)
            return False
        try:
            if pq.has_temp_message():
                # messages still cached: keep the broker lock a while so the next owner cannot overtake;
                # unlockDelay runs on MQClientInstance's scheduled thread
                self.api.schedule(
                    lambda: self.unlock(mq, True), cfg.seconds(cfg.unlock_delay_time_mills), "unlock delay"
                )
            else:
                await self.unlock(mq, True)
            return True
        finally:
            pq.consume_lock.release()

    async def _try_remove_order_message_queue_5x(self, mq: MessageQueue, pq: ProcessQueue) -> bool:
        cfg = self.config
        await self.offsets.persist(mq)  # "commit offset immediately", before trying to release the queue
        force = self.state.may_force_unlock(pq, self._now())
        acquired = False
        if not force:
            acquired = await _try_acquire(pq.consume_lock, cfg.seconds(500))
            if not acquired:
                pq.try_unlock_times += 1
                return False
        try:
            await self.offsets.persist(mq)
            self.offsets.remove_offset(mq)
            pq.locked = False
            await self.unlock(mq, True)
            return True
        finally:
            if acquired:
                pq.consume_lock.release()

    async def compute_pull_from_where_with_exception(
        self, mq: MessageQueue, start: StartRule | None = None
    ) -> int:
        result = await super().compute_pull_from_where_with_exception(mq, start)
        if result < 0:
            raise MQClientError(f"found unexpected result {result} for {mq}")
        return result

    def dispatch_pull_request(self, requests: list[PullRequest]) -> None:
        cfg = self.config
        for req in requests:
            if cfg.pull_request_dispatch_delay > 0:
                self.pulls.execute_pull_request_later(req, cfg.ms(cfg.pull_request_dispatch_delay))
            else:
                self.pulls.execute_pull_request_immediately(req)


class RebalanceLitePullImpl(RebalanceImpl):
    """RebalanceLitePullImpl: the result goes to the consumer's MessageQueueListener."""

    read_offset_type = ReadOffsetType.MEMORY_FIRST_THEN_STORE

    def __init__(self, *args: Any, listener: MessageQueueListener | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)  # RebalanceImpl's state, ports and clock
        self.listener = listener

    async def message_queue_changed(
        self, topic: str, mq_all: set[MessageQueue], mq_divided: set[MessageQueue]
    ) -> None:
        if self.listener is None:
            return
        try:
            await self.listener(topic, mq_all, mq_divided)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self.log.error("messageQueueChanged listener failed", group=self.group, error=repr(exc))


async def _try_acquire(lock: asyncio.Lock, timeout_s: float) -> bool:
    try:
        async with asyncio.timeout(timeout_s):
            await lock.acquire()
        return True
    except TimeoutError:
        return False
