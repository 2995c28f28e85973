"""RebalanceImpl for push and lite-pull consumers (RocketMQ's RebalanceImpl, RebalancePushImpl,
RebalanceLitePullImpl): rebalanceByTopic for both message models, updateProcessQueueTableInRebalance,
messageQueueChanged, truncateMessageQueueNotMyTopic, and the orderly lock / unlock calls.

The decisions come from ``client.rebalance_core``; this module performs the RPCs they need and writes the
events the analysis reads (``rebalance``, ``mq_added``, ``mq_removed``, lock events).
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

from client.allocate import sort_cid_all, sort_mq_all
from client.errors import MQClientError
from client.offset_store import ReadOffsetType
from client.process_queue import ProcessQueue, PullRequest
from client.rebalance_core import (
    DropReason,
    StartKind,
    StartPlan,
    per_queue_threshold,
    plan_pull_from_where,
    plan_pull_from_where_lite,
    queues_not_my_topic,
    select_queues_to_add,
    select_queues_to_drop,
    working_set,
)
from client.route import MASTER_ID
from protocol.model import (
    ConsumeFromWhere,
    ConsumeType,
    MessageModel,
    MessageQueue,
    SubscriptionData,
    is_retry_topic,
)

if TYPE_CHECKING:
    from client.consumer_base import ConsumerBase


def shorts(mqs: Iterable[MessageQueue]) -> list[str]:
    return [mq.short for mq in sort_mq_all(mqs)] if mqs else []


class RebalanceImpl:
    """The rebalance state of one consumer group in one client."""

    consume_type: ConsumeType = ConsumeType.CONSUME_PASSIVELY

    def __init__(self, consumer: ConsumerBase) -> None:
        self.consumer = consumer
        self.group = consumer.group
        self.message_model = consumer.config.message_model
        self.subscription_inner: dict[str, SubscriptionData] = {}
        self.topic_subscribe_info_table: dict[str, set[MessageQueue]] = {}
        self.process_queue_table: dict[MessageQueue, ProcessQueue] = {}

    # -- shortcuts ------------------------------------------------------------------------------------
    @property
    def instance(self) -> Any:
        return self.consumer.instance

    @property
    def log(self) -> Any:
        return self.consumer.log

    @property
    def client_id(self) -> str:
        return self.consumer.client_id

    def _now(self) -> int:
        return self.consumer.clock.monotonic_ms()

    def _emit_mq(self, event: str, mq: MessageQueue, **fields: Any) -> None:
        self.consumer.emit_queue_event(event, mq, **fields)

    # -- doRebalance ----------------------------------------------------------------------------------
    async def do_rebalance(self, is_order: bool) -> bool:
        balanced = True
        for topic in list(self.subscription_inner):
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
        cfg = self.consumer.config
        if self.message_model is MessageModel.BROADCASTING:
            mq_set = self.topic_subscribe_info_table.get(topic)
            if mq_set is None:
                self.log.warning("doRebalance: topic has no route", group=self.group, topic=topic)
                if cfg.message_queue_changed_without_route:
                    await self.message_queue_changed(topic, set(), set())
                return True
            need_lock = is_order and cfg.lock_in_broadcasting
            changed = await self.update_process_queue_table_in_rebalance(topic, mq_set, need_lock)
            self._emit_rebalance(topic, [self.client_id], mq_set, changed, "BROADCASTING")
            if changed:
                await self.message_queue_changed(topic, mq_set, mq_set)
            return mq_set == working_set(self.process_queue_table, topic)

        mq_set = self.topic_subscribe_info_table.get(topic)
        cid_all = await self.instance.find_consumer_id_list(topic, self.group)
        if mq_set is None and not is_retry_topic(topic):
            self.log.warning("doRebalance: topic has no route", group=self.group, topic=topic)
            if cfg.message_queue_changed_without_route:  # >=5.0: tell the listener about the empty set
                await self.message_queue_changed(topic, set(), set())
        if cid_all is None:
            self.log.warning("doRebalance: get consumer id list failed", group=self.group, topic=topic)
        if mq_set is None or cid_all is None:
            return True
        strategy = self.consumer.strategy
        try:
            mq_all = sort_mq_all(mq_set)
            cids = sort_cid_all(cid_all)
            allocated = set(strategy.allocate(self.group, self.client_id, mq_all, cids) or [])
        except Exception as exc:
            self.log.error(
                "allocate failed", group=self.group, topic=topic, strategy=strategy.name, error=repr(exc)
            )
            return False
        changed = await self.update_process_queue_table_in_rebalance(topic, allocated, is_order)
        self._emit_rebalance(topic, cids, allocated, changed, strategy.name)
        if changed:
            await self.message_queue_changed(topic, mq_set, allocated)
        return allocated == working_set(self.process_queue_table, topic)

    def _emit_rebalance(
        self, topic: str, cid_all: list[str], allocated: set[MessageQueue], changed: bool, strategy: str
    ) -> None:
        self.log.emit(
            "rebalance",
            group=self.group,
            client_id=self.client_id,
            topic=topic,
            strategy=strategy,
            cid_all=list(cid_all),
            allocated=shorts(allocated),
            changed=bool(changed),
        )

    def truncate_message_queue_not_my_topic(self) -> None:
        for mq in queues_not_my_topic(self.process_queue_table, self.subscription_inner):
            pq = self.process_queue_table.pop(mq, None)
            if pq is not None:
                pq.dropped = True
                self._emit_mq("mq_removed", mq, reason=str(DropReason.NOT_MY_TOPIC))

    async def update_process_queue_table_in_rebalance(
        self, topic: str, mq_set: set[MessageQueue], need_lock: bool
    ) -> bool:
        cfg = self.consumer.config
        changed = False
        drops = select_queues_to_drop(
            topic,
            self.process_queue_table,
            mq_set,
            self.consume_type,
            self._now(),
            cfg.ms(cfg.pull_max_idle_time),
        )
        if cfg.mark_dropped_before_release:
            # 5.x: every queue leaving is marked dropped before the first one is released, so none of
            # them keeps consuming while an earlier one waits for its consume lock
            for mq, _ in drops:
                self.process_queue_table[mq].dropped = True
        for mq, reason in drops:
            pq = self.process_queue_table[mq]
            pq.dropped = True
            if await self.remove_unnecessary_message_queue(mq, pq):
                if self.process_queue_table.get(mq) is pq:
                    del self.process_queue_table[mq]
                changed = True
                self._emit_mq("mq_removed", mq, reason=str(reason))
            else:
                self.log.warning(
                    "queue dropped but kept until it can be released", group=self.group, mq=mq.short
                )

        all_locked = True
        new_requests: list[PullRequest] = []
        for mq in select_queues_to_add(mq_set, self.process_queue_table):
            if need_lock and not await self.lock(mq):
                all_locked = False
                self.log.warning(
                    "add a new mq failed, because lock failed", group=self.group, mq=mq.short, topic=topic
                )
                continue
            self.remove_dirty_offset(mq)
            pq = ProcessQueue(now_ms=self._now())
            pq.locked = True
            try:
                next_offset = await self.compute_pull_from_where_with_exception(mq)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.log.info(
                    "compute offset failed", group=self.group, mq=mq.short, topic=topic, error=repr(exc)
                )
                continue
            if next_offset < 0:
                self.log.warning("add new mq failed", group=self.group, mq=mq.short, topic=topic)
                continue
            if mq in self.process_queue_table:
                continue
            self.process_queue_table[mq] = pq
            new_requests.append(PullRequest(self.group, mq, pq, next_offset))
            changed = True
            self._emit_mq("mq_added", mq, next_offset=int(next_offset))
        if not all_locked and cfg.rebalance_later_on_lock_failure:
            self.instance.rebalance_later(500)
        self.dispatch_pull_request(new_requests)
        return changed

    # -- hooks ----------------------------------------------------------------------------------------
    async def remove_unnecessary_message_queue(self, mq: MessageQueue, pq: ProcessQueue) -> bool:
        store = self.consumer.offset_store
        await store.persist(mq)
        store.remove_offset(mq)
        return True

    def remove_dirty_offset(self, mq: MessageQueue) -> None:
        self.consumer.offset_store.remove_offset(mq)

    async def compute_pull_from_where_with_exception(self, mq: MessageQueue) -> int:
        raise NotImplementedError

    def dispatch_pull_request(self, requests: list[PullRequest]) -> None:
        return None

    async def message_queue_changed(
        self, topic: str, mq_all: set[MessageQueue], mq_divided: set[MessageQueue]
    ) -> None:
        return None

    async def remove_process_queue(self, mq: MessageQueue, reason: DropReason) -> None:
        pq = self.process_queue_table.pop(mq, None)
        if pq is not None:
            pq.dropped = True
            await self.remove_unnecessary_message_queue(mq, pq)
            self._emit_mq("mq_removed", mq, reason=str(reason))

    async def _resolve_start(self, mq: MessageQueue, plan: StartPlan) -> int:
        if plan.kind is StartKind.OFFSET:
            return plan.offset
        if plan.kind is StartKind.FAIL:
            raise MQClientError(f"cannot compute the start offset of {mq}: {plan.reason}")
        addr = await self._offset_broker_addr(mq)
        timeout = self.consumer.config.seconds(self.consumer.config.mq_admin_timeout)
        if plan.kind is StartKind.MAX_OFFSET:
            return int(await self.instance.api.get_max_offset(addr, mq, timeout))
        return int(await self.instance.api.search_offset(addr, mq, plan.timestamp_ms, timeout))

    async def _offset_broker_addr(self, mq: MessageQueue) -> str:
        addr = await self.instance.find_broker_address_in_publish_or_update(mq.topic, mq.broker_name)
        if addr is None:
            raise MQClientError(f"the broker[{mq.broker_name}] not exist")
        return addr

    # -- locks ----------------------------------------------------------------------------------------
    async def lock(self, mq: MessageQueue) -> bool:
        cfg = self.consumer.config
        addr = self.instance.find_broker_address_in_subscribe(mq.broker_name, MASTER_ID, True)
        if addr is None:
            self._emit_mq("mq_lock", mq, result="no_broker")
            return False
        try:
            locked = await self.instance.api.lock_batch_mq(
                addr, self.group, self.client_id, [mq], cfg.seconds(cfg.lock_batch_timeout)
            )
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self._emit_mq("mq_lock", mq, result="error", error=repr(exc))
            return False
        self._set_locked(locked, True)
        ok = mq in locked
        self._emit_mq("mq_lock", mq, result="ok" if ok else "failed")
        return ok

    def _set_locked(self, mqs: Iterable[MessageQueue], locked: bool) -> None:
        """Record a broker's lock answer in the process queues of ``mqs``; a granted lock also renews
        ``last_lock_timestamp``, from which the client-side lock expires."""
        now = self._now() if locked else 0
        for mq in mqs:
            pq = self.process_queue_table.get(mq)
            if pq is not None:
                pq.locked = locked
                if locked:
                    pq.last_lock_timestamp = now

    def _by_broker(self) -> Iterator[tuple[str, str, set[MessageQueue]]]:
        """buildProcessQueueTableByBrokerName: (broker name, master address, queues) for every broker
        whose master address is known, in broker name order. 4.9 takes every queue of the table, so a
        dropped orderly queue still held by its listener keeps its broker lock; 5.x leaves dropped ones
        out. The queues are taken when iteration starts; each address is looked up when its turn
        comes, after the previous call."""
        skip_dropped = self.consumer.config.lock_all_skips_dropped
        by_name: dict[str, set[MessageQueue]] = defaultdict(set)
        for mq, pq in self.process_queue_table.items():
            if not (skip_dropped and pq.dropped):
                by_name[mq.broker_name].add(mq)
        for broker_name, mqs in sorted(by_name.items()):
            addr = self.instance.find_broker_address_in_subscribe(broker_name, MASTER_ID, True)
            if addr is not None:
                yield broker_name, addr, mqs

    async def lock_all(self) -> None:
        cfg = self.consumer.config
        for broker_name, addr, mqs in self._by_broker():
            try:
                ok = await self.instance.api.lock_batch_mq(
                    addr, self.group, self.client_id, mqs, cfg.seconds(cfg.lock_batch_timeout)
                )
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                # nothing changes: the client-side lock ages toward its 30 s expiry
                self.log.warning("lockBatchMQ failed", group=self.group, broker=broker_name, error=repr(exc))
                continue
            self._set_locked(ok, True)
            lost = sorted(mq for mq in mqs if mq not in ok)
            self._set_locked(lost, False)
            self.log.emit(
                "lock_all",
                group=self.group,
                client_id=self.client_id,
                broker=broker_name,
                locked=sorted(f"{mq.topic}@{mq.short}" for mq in ok if mq in mqs),
                failed=[f"{mq.topic}@{mq.short}" for mq in lost],
            )

    async def unlock(self, mq: MessageQueue, oneway: bool) -> None:
        cfg = self.consumer.config
        addr = self.instance.find_broker_address_in_subscribe(mq.broker_name, MASTER_ID, True)
        if addr is None:
            return
        try:
            await self.instance.api.unlock_batch_mq(
                addr, self.group, self.client_id, [mq], cfg.seconds(cfg.lock_batch_timeout), oneway=oneway
            )
            self._emit_mq("mq_unlock", mq, oneway=oneway)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self.log.warning("unlockBatchMQ failed", group=self.group, mq=mq.short, error=repr(exc))

    async def unlock_all(self, oneway: bool) -> None:
        cfg = self.consumer.config
        for broker_name, addr, mqs in self._by_broker():
            try:
                await self.instance.api.unlock_batch_mq(
                    addr, self.group, self.client_id, mqs, cfg.seconds(cfg.lock_batch_timeout), oneway=oneway
                )
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.log.warning(
                    "unlockBatchMQ failed", group=self.group, broker=broker_name, error=repr(exc)
                )
                continue
            self._set_locked(mqs, False)
            self.log.emit(
                "unlock_all",
                group=self.group,
                client_id=self.client_id,
                broker=broker_name,
                queues=[f"{mq.topic}@{mq.short}" for mq in sorted(mqs)],
            )

    def destroy(self, reason: DropReason = DropReason.SHUTDOWN) -> None:
        for mq, pq in sorted(self.process_queue_table.items()):
            pq.dropped = True
            self._emit_mq("mq_removed", mq, reason=str(reason))
        self.process_queue_table.clear()


class RebalancePushImpl(RebalanceImpl):
    consume_type = ConsumeType.CONSUME_PASSIVELY

    async def message_queue_changed(
        self, topic: str, mq_all: set[MessageQueue], mq_divided: set[MessageQueue]
    ) -> None:
        # a new subscription version tells the broker this client's view changed
        sub = self.subscription_inner.get(topic)
        if sub is not None:
            sub.sub_version = self.consumer.clock.now_ms()
        count = len(self.process_queue_table)
        c = self.consumer
        if count:
            cfg = c.config
            c.pull_threshold_for_queue = per_queue_threshold(
                cfg.pull_threshold_for_topic, count, c.pull_threshold_for_queue
            )
            c.pull_threshold_size_for_queue = per_queue_threshold(
                cfg.pull_threshold_size_for_topic, count, c.pull_threshold_size_for_queue
            )
        await self.instance.send_heartbeat_to_all_broker_with_lock()

    async def remove_unnecessary_message_queue(self, mq: MessageQueue, pq: ProcessQueue) -> bool:
        c = self.consumer
        if not (c.consume_orderly and self.message_model is MessageModel.CLUSTERING):
            return await super().remove_unnecessary_message_queue(mq, pq)
        if c.config.orderly_unlock_5x:
            return await self._try_remove_order_message_queue_5x(mq, pq)
        return await self._remove_order_message_queue_49(mq, pq)

    async def _remove_order_message_queue_49(self, mq: MessageQueue, pq: ProcessQueue) -> bool:
        cfg = self.consumer.config
        store = self.consumer.offset_store
        await store.persist(mq)
        store.remove_offset(mq)
        if not await _try_acquire(pq.consume_lock, cfg.seconds(1000)):
            pq.try_unlock_times += 1
            self.log.warning("mq is consuming, so can not unlock it", group=self.group, mq=mq.short)
            return False
        try:
            if pq.has_temp_message():
                # messages still cached: keep the broker lock a while so the next owner cannot overtake;
                # unlockDelay runs on MQClientInstance's scheduled thread
                self.instance.scheduler.schedule(
                    lambda: self.unlock(mq, True), cfg.seconds(cfg.unlock_delay_time_mills), "unlock delay"
                )
            else:
                await self.unlock(mq, True)
            return True
        finally:
            pq.consume_lock.release()

    async def _try_remove_order_message_queue_5x(self, mq: MessageQueue, pq: ProcessQueue) -> bool:
        cfg = self.consumer.config
        store = self.consumer.offset_store
        await store.persist(mq)  # "commit offset immediately", before trying to release the queue
        force = pq.dropped and self._now() > pq.last_lock_timestamp + cfg.ms(cfg.unlock_delay_time_mills)
        acquired = False
        if not force:
            acquired = await _try_acquire(pq.consume_lock, cfg.seconds(500))
            if not acquired:
                pq.try_unlock_times += 1
                return False
        try:
            await store.persist(mq)
            store.remove_offset(mq)
            pq.locked = False
            await self.unlock(mq, True)
            return True
        finally:
            if acquired:
                pq.consume_lock.release()

    async def compute_pull_from_where_with_exception(self, mq: MessageQueue) -> int:
        cfg = self.consumer.config
        last = await self.consumer.offset_store.read_offset(mq, ReadOffsetType.READ_FROM_STORE)
        plan = plan_pull_from_where(
            ConsumeFromWhere(cfg.consume_from_where), last, mq.topic, cfg.consume_timestamp_ms()
        )
        result = await self._resolve_start(mq, plan)
        if result < 0:
            raise MQClientError(f"found unexpected result {result} for {mq}")
        return result

    def dispatch_pull_request(self, requests: list[PullRequest]) -> None:
        cfg = self.consumer.config
        for req in requests:
            if cfg.pull_request_dispatch_delay > 0:
                self.instance.pull_service.execute_pull_request_later(
                    req, cfg.ms(cfg.pull_request_dispatch_delay)
                )
            else:
                self.instance.pull_service.execute_pull_request_immediately(req)


class RebalanceLitePullImpl(RebalanceImpl):
    consume_type = ConsumeType.CONSUME_ACTIVELY

    async def message_queue_changed(
        self, topic: str, mq_all: set[MessageQueue], mq_divided: set[MessageQueue]
    ) -> None:
        listener = getattr(self.consumer, "message_queue_changed", None)
        if listener is not None:
            try:
                await listener(topic, mq_all, mq_divided)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.log.error("messageQueueChanged listener failed", group=self.group, error=repr(exc))

    async def compute_pull_from_where_with_exception(self, mq: MessageQueue) -> int:
        cfg = self.consumer.config
        last = await self.consumer.offset_store.read_offset(mq, ReadOffsetType.MEMORY_FIRST_THEN_STORE)
        plan = plan_pull_from_where_lite(
            ConsumeFromWhere(cfg.consume_from_where), last, mq.topic, cfg.consume_timestamp_ms()
        )
        return await self._resolve_start(mq, plan)


async def _try_acquire(lock: asyncio.Lock, timeout_s: float) -> bool:
    try:
        async with asyncio.timeout(timeout_s):
            await lock.acquire()
        return True
    except TimeoutError:
        return False
