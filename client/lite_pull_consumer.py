"""LitePullConsumer: RocketMQ's DefaultLitePullConsumer. Queues come from the rebalance (``subscribe``) or
from the caller (``assign``); one pull task per queue fills a cache that ``poll`` drains; consume offsets
move on ``poll`` and are committed automatically every 5 s (or by ``commit``)."""

from __future__ import annotations

import asyncio
from typing import Any

from rmqlab.client.api import FLAG_COMMIT_OFFSET, FLAG_SUSPEND
from rmqlab.client.consume import listener_view
from rmqlab.client.consumer_base import ConsumerBase
from rmqlab.client.errors import MQBrokerError, MQClientError
from rmqlab.client.group_state import DropReason
from rmqlab.client.process_queue import ProcessQueue
from rmqlab.client.producer import start_instance
from rmqlab.client.pull_core import PullStatus
from rmqlab.client.rebalance import RebalanceLitePullImpl
from rmqlab.protocol.model import ConsumeType, Message, MessageModel, MessageQueue


class _Cached:
    __slots__ = ("mq", "msgs", "pq")

    def __init__(self, msgs: list[Message], mq: MessageQueue, pq: ProcessQueue) -> None:
        self.msgs = msgs
        self.mq = mq
        self.pq = pq


class LitePullConsumer(ConsumerBase):
    """A lite-pull consumer: ``subscribe`` (rebalanced) or ``assign`` queues, then ``poll`` messages."""

    consume_type = ConsumeType.CONSUME_ACTIVELY

    def __init__(self, group: str, **kwargs: Any) -> None:
        super().__init__(group, **kwargs)
        self._assigned: dict[MessageQueue, ProcessQueue] = {}
        self._pull_offset: dict[MessageQueue, int] = {}
        self._consume_offset: dict[MessageQueue, int] = {}
        self._seek: dict[MessageQueue, int] = {}
        self._tasks: dict[MessageQueue, asyncio.Task[None]] = {}
        self._cache: asyncio.Queue[_Cached] = asyncio.Queue()
        self._cached_count = 0
        self._last_commit = 0

    def _build_rebalance_impl(self) -> RebalanceLitePullImpl:
        return RebalanceLitePullImpl(
            self.state,
            self.api,
            self.pulls,
            self.offset_store,
            self.log,
            clock=self.clock,
            listener=self.message_queue_changed,
        )

    def _copy_subscription(self) -> None:
        return None  # lite pull never sends messages back, so it does not pull the retry topic

    # -- public API -----------------------------------------------------------------------------------
    def subscribe(self, topic: str, expression: str | None = "*") -> None:
        if self.state.assigned:
            raise MQClientError("subscribe and assign are exclusive")
        super().subscribe(topic, expression)

    def assign(self, mqs: list[MessageQueue]) -> None:
        """Consume exactly these queues, without rebalancing."""
        if self.state.subscription_inner and not self.state.assigned:
            raise MQClientError("subscribe and assign are exclusive")
        if not mqs:
            raise MQClientError("assign needs at least one queue")
        self.state.assigned = True
        for mq in mqs:
            if mq.topic not in self.state.subscription_inner:
                super().subscribe(mq.topic, "*")
        wanted = set(mqs)
        for mq in list(self._assigned):
            if mq not in wanted:
                self._drop(mq)
        for mq in sorted(wanted):
            if mq not in self._assigned:
                self._assigned[mq] = ProcessQueue(self.clock.monotonic_ms())
        if self.running:
            self._start_pull_tasks()

    def assignment(self) -> list[MessageQueue]:
        return sorted(self._assigned)

    def seek(self, mq: MessageQueue, offset: int) -> None:
        if mq not in self._assigned:
            raise MQClientError(f"{mq} is not assigned to this consumer")
        self._seek[mq] = offset

    async def start(self) -> None:
        if self.running:
            raise MQClientError("the consumer is already running")
        if self.state.assigned:
            # assign(): no rebalance; drop the automatic retry subscription and only learn routes
            self.instance.register_consumer(self.group, self)  # type: ignore[arg-type]
            await start_instance(self.instance, self.config, self.instance_name, self.clock)
            self.running = True
            for topic in sorted(self.state.subscription_inner):
                await self.instance.update_topic_route_info_from_name_server(topic)
            await self.instance.send_heartbeat_to_all_broker_with_lock()
            self.log.emit("consumer_started", group=self.group, client_id=self.client_id)
        else:
            await self._start_client()
        self._last_commit = self.clock.monotonic_ms()
        self._start_pull_tasks()

    async def poll(self, timeout_ms: int | None = None) -> list[Message]:
        """Messages pulled so far (at most one pull batch), waiting up to ``timeout_ms`` (default
        pollTimeoutMillis, 5 s; like every interval it goes through the time scale)."""
        if not self.running:
            raise MQClientError("the consumer is not running")
        cfg = self.config
        if cfg.auto_commit and self.clock.monotonic_ms() - self._last_commit >= cfg.ms(
            cfg.auto_commit_interval_millis
        ):
            await self.commit()
        wait_s = cfg.seconds(cfg.poll_timeout_millis if timeout_ms is None else timeout_ms)
        deadline = asyncio.get_running_loop().time() + wait_s
        while True:
            remaining = deadline - asyncio.get_running_loop().time()
            try:
                async with asyncio.timeout(max(0.0, remaining)):
                    item = await self._cache.get()
            except TimeoutError:
                return []
            self._cached_count -= len(item.msgs)
            if item.pq.dropped or self._assigned.get(item.mq) is not item.pq:
                continue  # pulled for an assignment that is gone
            self._consume_offset[item.mq] = item.msgs[-1].queue_offset + 1
            item.pq.remove_messages(item.msgs, self.clock.monotonic_ms())
            return [listener_view(m) for m in item.msgs]

    async def commit(self) -> None:
        """commitAll: move the store's offsets to what poll() returned; persist them."""
        self._last_commit = self.clock.monotonic_ms()
        for mq, off in self._consume_offset.items():
            if mq in self._assigned:
                self.offset_store.update_offset(mq, off, increase_only=False)
        await self.offset_store.persist_all(set(self._assigned))

    def committed(self, mq: MessageQueue) -> int:
        return self.offset_store.read_offset_from_memory(mq)

    async def shutdown(self) -> None:
        if not self.running:
            return
        for task in list(self._tasks.values()):
            task.cancel()
        for task in list(self._tasks.values()):
            try:
                await task
            except (asyncio.CancelledError, Exception):
                pass
        self._tasks.clear()
        if self.config.auto_commit:
            await self.commit()
        await self._stop_client()
        self.log.emit("consumer_stopped", group=self.group, client_id=self.client_id)

    async def __aenter__(self) -> LitePullConsumer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.shutdown()

    async def persist_consumer_offset(self) -> None:
        await self.offset_store.persist_all(set(self._assigned))

    # -- MessageQueueListener: the rebalance result becomes the assignment --------------------------
    async def message_queue_changed(
        self, topic: str, mq_all: set[MessageQueue], mq_divided: set[MessageQueue]
    ) -> None:
        wanted = mq_all if self.message_model is MessageModel.BROADCASTING else mq_divided
        for mq in [m for m in self._assigned if m.topic == topic and m not in wanted]:
            self._drop(mq)
        table = self.state.process_queue_table
        for mq in sorted(wanted):
            if mq not in self._assigned:
                self._assigned[mq] = table.get(mq) or ProcessQueue(self.clock.monotonic_ms())
        self._start_pull_tasks()

    def _drop(self, mq: MessageQueue) -> None:
        pq = self._assigned.pop(mq, None)
        if pq is not None:
            pq.dropped = True
        task = self._tasks.pop(mq, None)
        if task is not None:
            task.cancel()
        self._pull_offset.pop(mq, None)
        self._consume_offset.pop(mq, None)
        self._seek.pop(mq, None)
        if self.state.assigned:
            self.emit_queue_event("mq_removed", mq, reason=str(DropReason.UNASSIGNED))

    def _start_pull_tasks(self) -> None:
        for mq, pq in self._assigned.items():
            if mq not in self._tasks or self._tasks[mq].done():
                task = self.api.spawn(self._pull_loop(mq, pq), "lite pull")
                if task is not None:
                    self._tasks[mq] = task

    # -- pull task ------------------------------------------------------------------------------------
    async def _next_pull_offset(self, mq: MessageQueue) -> int:
        if mq in self._seek:
            off = self._seek.pop(mq)
            self._pull_offset[mq] = off
            self._consume_offset[mq] = off
            return off
        if mq in self._pull_offset:
            return self._pull_offset[mq]
        off = await self.rebalance_impl.compute_pull_from_where_with_exception(mq)
        if off >= 0:
            self._pull_offset[mq] = off
        return off

    async def _pull_loop(self, mq: MessageQueue, pq: ProcessQueue) -> None:
        cfg = self.config
        err_delay = cfg.seconds(cfg.pull_time_delay_mills_when_exception)
        flow_delay = cfg.seconds(cfg.pull_time_delay_mills_when_cache_flow_control)
        while self.running and not pq.dropped and self._assigned.get(mq) is pq:
            pq.last_pull_timestamp = self.clock.monotonic_ms()
            if self.paused:
                await asyncio.sleep(cfg.seconds(cfg.pull_time_delay_mills_when_suspend))
                continue
            if self._cached_count > cfg.pull_threshold_for_all or pq.msg_count > cfg.pull_threshold_for_queue:
                await asyncio.sleep(flow_delay)
                continue
            try:
                offset = await self._next_pull_offset(mq)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.log.warning(
                    "lite pull: cannot compute offset", mq=mq.short, topic=mq.topic, error=repr(exc)
                )
                await asyncio.sleep(err_delay)
                continue
            if offset < 0:
                await asyncio.sleep(err_delay)
                continue
            found = await self.find_pull_broker(mq)
            sub = self.state.subscription_inner.get(mq.topic)
            if found is None or sub is None:
                await asyncio.sleep(err_delay)
                continue
            addr = found.broker_addr
            commit = self.offset_store.read_offset_from_memory(mq)
            flag = FLAG_SUSPEND | (
                FLAG_COMMIT_OFFSET
                if commit > 0 and self.message_model is MessageModel.CLUSTERING and not found.slave
                else 0
            )
            try:
                result = await self.api.pull_message(
                    addr,
                    group=self.group,
                    mq=mq,
                    queue_offset=offset,
                    max_msg_nums=cfg.lite_pull_batch_size,
                    sys_flag=flag,
                    commit_offset=max(commit, 0),
                    suspend_timeout_ms=int(cfg.ms(20_000)),
                    subscription=sub.sub_string,
                    sub_version=sub.sub_version,
                    timeout_s=cfg.seconds(cfg.consumer_timeout_millis_when_suspend),
                )
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                code = exc.code_name if isinstance(exc, MQBrokerError) else type(exc).__name__
                self.emit_queue_event(
                    "pull_failed",
                    mq,
                    code=code,
                    remark=str(exc),
                    delay_ms=int(cfg.ms(cfg.pull_time_delay_mills_when_exception)),
                )
                await asyncio.sleep(err_delay)
                continue
            if pq.dropped or self._assigned.get(mq) is not pq:
                return
            if self._seek.get(mq) is not None:
                continue  # a seek arrived while pulling: start again from there
            self.update_pull_from_which_node(mq, result.suggest_which_broker_id)
            self._pull_offset[mq] = result.next_begin_offset
            if result.status is PullStatus.FOUND:
                msgs = result.messages
                if sub.tags_set:
                    msgs = [m for m in msgs if m.tags in set(sub.tags_set)]
                if msgs:
                    pq.put_messages(msgs)
                    self._cached_count += len(msgs)
                    self._cache.put_nowait(_Cached(msgs, mq, pq))
            elif result.status is PullStatus.OFFSET_ILLEGAL:
                self.log.warning("lite pull: offset illegal", mq=mq.short, next=result.next_begin_offset)
