"""Consume services: ConsumeMessageConcurrentlyService and ConsumeMessageOrderlyService.

Listeners may be plain functions (run in a bounded thread pool, like RocketMQ's consume threads) or
``async def`` functions (awaited on the loop). A listener takes ``(msgs)`` or ``(msgs, context)`` and returns
a status; returning None counts as success, raising counts as RECONSUME_LATER (concurrently) or
SUSPEND_CURRENT_QUEUE_A_MOMENT (orderly). Every message whose listener call succeeded is written as a
``message_consumed`` event.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import enum
import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rmqlab.client.errors import MQClientError
from rmqlab.client.group_state import GroupState
from rmqlab.client.offset_store import OffsetStore
from rmqlab.client.ports import EventSink, GroupApi, RetrySender
from rmqlab.client.process_queue import ProcessQueue
from rmqlab.client.rebalance import RebalanceImpl
from rmqlab.protocol.clock import Clock, TimerSet
from rmqlab.protocol.model import Message, MessageModel, MessageQueue, is_retry_topic, retry_topic

PROPERTY_RETRY_TOPIC = "RETRY_TOPIC"
PROPERTY_ORIGIN_MESSAGE_ID = "ORIGIN_MESSAGE_ID"
PROPERTY_CONSUME_START_TIME = "CONSUME_START_TIME"


class ConsumeConcurrentlyStatus(enum.StrEnum):
    """What a concurrent listener returns."""

    CONSUME_SUCCESS = "CONSUME_SUCCESS"
    RECONSUME_LATER = "RECONSUME_LATER"


class ConsumeOrderlyStatus(enum.StrEnum):
    """What an orderly listener returns."""

    SUCCESS = "SUCCESS"
    SUSPEND_CURRENT_QUEUE_A_MOMENT = "SUSPEND_CURRENT_QUEUE_A_MOMENT"
    COMMIT = "COMMIT"  # deprecated in RocketMQ; treated as SUCCESS with autoCommit
    ROLLBACK = "ROLLBACK"


@dataclass(slots=True)
class ConsumeConcurrentlyContext:
    """Passed to a concurrent listener: ackIndex and the retry delay level of the failed rest."""

    message_queue: MessageQueue
    delay_level_when_next_consume: int = 0  # 0: the broker picks 3 + reconsumeTimes
    ack_index: int = 2**31 - 1


@dataclass(slots=True)
class ConsumeOrderlyContext:
    """Passed to an orderly listener: auto-commit and how long to suspend the queue after a failure."""

    message_queue: MessageQueue
    auto_commit: bool = True
    suspend_current_queue_time_millis: int = -1


def origin_msg_id(msg: Message) -> str:
    """The id the producer was given: a retried message carries it as ORIGIN_MESSAGE_ID."""
    return msg.properties.get(PROPERTY_ORIGIN_MESSAGE_ID) or msg.msg_id


def listener_view(msg: Message) -> Message:
    """What the listener sees: a message from the retry topic shows its original topic (resetRetryTopic)."""
    if is_retry_topic(msg.topic):
        origin = msg.properties.get(PROPERTY_RETRY_TOPIC)
        if origin:
            return dataclasses.replace(msg, topic=origin)
    return msg


class Listener:
    """Calls a user listener, sync in a thread pool or async on the loop; the context is passed when the
    listener has two required positional parameters (``fn(msgs, context)``)."""

    def __init__(self, fn: Callable[..., Any], executor: concurrent.futures.Executor) -> None:
        if not callable(fn):
            raise TypeError(f"message listener must be callable, got {fn!r}")
        self.fn = fn
        self.executor = executor
        self.is_async = inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
            getattr(fn, "__call__", None)  # noqa: B004 - async callable objects
        )
        self.with_context = _accepts_two(fn)

    async def __call__(self, msgs: list[Message], ctx: Any) -> Any:
        args = (msgs, ctx) if self.with_context else (msgs,)
        if self.is_async:
            return await self.fn(*args)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.executor, lambda: self.fn(*args))


def _accepts_two(fn: Callable[..., Any]) -> bool:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return False
    positional = 0
    for p in sig.parameters.values():
        if p.kind is p.VAR_POSITIONAL:
            return True
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty:
            positional += 1
    return positional >= 2


@dataclass(slots=True, eq=False)
class ConsumeRequest:
    """A batch of one queue's messages for a consume worker."""

    msgs: list[Message]
    pq: ProcessQueue
    mq: MessageQueue
    attempts: int = field(default=0)


class _ServiceBase:
    mode = "CONCURRENTLY"

    def __init__(
        self,
        state: GroupState,
        listener: Listener,
        *,
        rebalance: RebalanceImpl,
        api: GroupApi,
        offsets: OffsetStore,
        events: EventSink,
        clock: Clock,
        retry_sender: RetrySender | None = None,
    ) -> None:
        self.state = state
        self.retry_sender = retry_sender
        self.config = state.config
        self.group = state.group
        self.client_id = state.client_id
        self.listener = listener
        self.rebalance = rebalance
        self.api = api
        self.offsets = offsets
        self.log = events
        self.clock = clock
        self._mq_locks: dict[MessageQueue, asyncio.Lock] = {}  # orderly: one consumer of a queue at a time
        self._queue: asyncio.Queue[Any] = asyncio.Queue()
        self._workers: list[asyncio.Task[None]] = []
        self._timers = TimerSet()
        self._inflight = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._stopped = False

    def _submit_in_batches(self, msgs: list[Message], request: Callable[[list[Message]], Any]) -> None:
        """submitConsumeRequest's split: one request per consumeMessageBatchMaxSize messages, none once
        the service is shut down."""
        if self._stopped:
            return
        batch = self.config.consume_message_batch_max_size
        for i in range(0, len(msgs), batch):
            self._queue.put_nowait(request(msgs[i : i + batch]))

    def _spawn_workers(self, n: int) -> None:
        for _ in range(n):
            task = self.api.spawn(self._worker(), "consume worker")
            if task is not None:
                self._workers.append(task)

    async def _worker(self) -> None:
        while True:
            item = await self._queue.get()
            self._inflight += 1
            self._idle.clear()
            try:
                await self._run(item)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.log.error("consume request failed", error=repr(exc), mode=self.mode)
            finally:
                self._inflight -= 1
                if self._inflight == 0:
                    self._idle.set()

    async def _run(self, item: Any) -> None:
        raise NotImplementedError

    async def consume_concurrently(
        self, msgs: list[Message], ctx: ConsumeConcurrentlyContext
    ) -> tuple[int, ConsumeConcurrentlyStatus]:
        """Call a concurrent listener with a batch (stamped with its start time, retry topics shown as
        their original topic); returns the start time and the status, an exception or an unknown answer
        counting as RECONSUME_LATER."""
        started = self.clock.now_ms()
        for msg in msgs:
            msg.properties[PROPERTY_CONSUME_START_TIME] = str(started)
        views = [listener_view(m) for m in msgs]
        try:
            status = await self.listener(views, ctx)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self.log.warning("listener raised; reconsume later", group=self.group, error=repr(exc))
            status = ConsumeConcurrentlyStatus.RECONSUME_LATER
        if status is None or status is True:
            status = ConsumeConcurrentlyStatus.CONSUME_SUCCESS
        elif status is False:
            status = ConsumeConcurrentlyStatus.RECONSUME_LATER
        try:
            status = ConsumeConcurrentlyStatus(status)
        except ValueError:
            self.log.warning("listener returned an unknown status; reconsume later", status=repr(status))
            status = ConsumeConcurrentlyStatus.RECONSUME_LATER
        return started, status

    def _later(self, delay_ms: float, fn: Callable[[], object]) -> None:
        self._timers.call_later(delay_ms, fn)

    def _emit_consumed(self, msgs: list[Message], mq: MessageQueue, started_ms: int) -> None:
        for msg in msgs:
            self.log.emit(
                "message_consumed",
                group=self.group,
                client_id=self.client_id,
                msg_id=origin_msg_id(msg),
                topic=mq.topic,
                broker=mq.broker_name,
                queue_id=mq.queue_id,
                queue_offset=msg.queue_offset,
                started_ms=started_ms,
                mode=self.mode,
            )

    async def shutdown(self, await_ms: float) -> None:
        """Stop taking work; wait up to ``await_ms`` (scaled) for running listeners, then cancel."""
        self._stopped = True
        self._timers.cancel_all()
        if await_ms > 0 and self._inflight:
            try:
                async with asyncio.timeout(await_ms / 1000.0):
                    await self._idle.wait()
            except TimeoutError:
                pass
        for task in self._workers:
            task.cancel()
        for task in self._workers:
            try:
                await task
            except (asyncio.CancelledError, Exception):
                pass
        self._workers.clear()

    async def send_message_back(self, msg: Message, delay_level: int, max_reconsume_times: int) -> bool:
        """DefaultMQPushConsumerImpl#sendMessageBack: CONSUMER_SEND_MSG_BACK to the master of the
        message's broker; when that fails, the message goes to ``%RETRY%<group>`` through the client's
        internal producer (any broker, with retries). False only when both failed."""
        cfg = self.config
        try:
            addr = await self.api.find_broker_address_in_publish_or_update(msg.topic, msg.broker_name)
            if addr is None:
                raise MQClientError(f"the broker[{msg.broker_name}] not exist")
            await self.api.consumer_send_msg_back(
                addr,
                msg,
                self.group,
                delay_level,
                max_reconsume_times,
                cfg.seconds(cfg.send_msg_back_timeout),
            )
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self.log.warning("send message back failed", group=self.group, msg_id=msg.msg_id, error=repr(exc))
            return await self.send_to_retry_topic(msg, msg.reconsume_times + 1, max_reconsume_times)
        self._emit_sent_back(msg, delay_level, "send_back")
        return True

    async def send_to_retry_topic(self, msg: Message, reconsume_times: int, max_reconsume_times: int) -> bool:
        """A plain send of the message to ``%RETRY%<group>`` (delay level 3 + reconsumeTimes) through the
        internal producer; the broker diverts it to the DLQ at ``max_reconsume_times``."""
        if self.retry_sender is None:
            return False
        props = dict(msg.properties)
        props[PROPERTY_ORIGIN_MESSAGE_ID] = origin_msg_id(msg)
        props[PROPERTY_RETRY_TOPIC] = msg.properties.get(PROPERTY_RETRY_TOPIC) or msg.topic
        props["RECONSUME_TIME"] = str(reconsume_times)
        props["MAX_RECONSUME_TIMES"] = str(max_reconsume_times)
        props.pop("TRAN_MSG", None)
        delay_level = 3 + msg.reconsume_times
        props["DELAY"] = str(delay_level)
        try:
            await self.retry_sender(retry_topic(self.group), msg.body, msg.tags, msg.keys, props)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self.log.warning(
                "send to the retry topic failed", group=self.group, msg_id=msg.msg_id, error=repr(exc)
            )
            return False
        self._emit_sent_back(msg, delay_level, "retry_topic")
        return True

    def _emit_sent_back(self, msg: Message, delay_level: int, via: str) -> None:
        self.log.emit(
            "message_sent_back",
            group=self.group,
            client_id=self.client_id,
            msg_id=origin_msg_id(msg),
            topic=msg.topic,
            broker=msg.broker_name,
            queue_id=msg.queue_id,
            queue_offset=msg.queue_offset,
            delay_level=delay_level,
            via=via,
        )


class ConsumeMessageConcurrentlyService(_ServiceBase):
    """Consumes batches in parallel; failed messages are sent back to the broker for a later retry."""

    mode = "CONCURRENTLY"

    def start(self) -> None:
        self._spawn_workers(self.config.consume_thread_min)
        task = self.api.spawn(self._clean_expired_loop(), "clean expired messages")
        if task is not None:
            self._workers.append(task)

    def submit_consume_request(
        self, msgs: list[Message], pq: ProcessQueue, mq: MessageQueue, dispatch_to_consume: bool
    ) -> None:
        self._submit_in_batches(msgs, lambda batch: ConsumeRequest(batch, pq, mq))

    async def _run(self, req: ConsumeRequest) -> None:
        if req.pq.dropped:
            return
        ctx = ConsumeConcurrentlyContext(req.mq)
        started, status = await self.consume_concurrently(req.msgs, ctx)
        n = len(req.msgs)
        ack_index = min(ctx.ack_index, n - 1) if status is ConsumeConcurrentlyStatus.CONSUME_SUCCESS else -1
        if ack_index >= 0:
            self._emit_consumed(req.msgs[: ack_index + 1], req.mq, started)
        if req.pq.dropped:
            # a queue taken away meanwhile: nothing is acked or committed, the next owner consumes again
            return
        await self._process_consume_result(req, ctx, ack_index)

    async def _process_consume_result(
        self, req: ConsumeRequest, ctx: ConsumeConcurrentlyContext, ack_index: int
    ) -> None:
        msgs = req.msgs
        failed: list[Message] = []
        if self.state.message_model is MessageModel.BROADCASTING:
            for msg in msgs[ack_index + 1 :]:
                self.log.warning("BROADCASTING, the message consume failed, drop it", msg_id=msg.msg_id)
        else:
            max_times = self.config.max_reconsume_times_concurrently()
            for msg in msgs[ack_index + 1 :]:
                if self.config.send_back_only_cached and not req.pq.contains(msg.queue_offset):
                    continue  # >=5.1: a message no longer cached (its queue moved on) is not sent back
                if not await self.send_message_back(msg, ctx.delay_level_when_next_consume, max_times):
                    msg.reconsume_times += 1
                    failed.append(msg)
        if failed:
            failed_offsets = {m.queue_offset for m in failed}
            msgs = [m for m in msgs if m.queue_offset not in failed_offsets]
            retry = ConsumeRequest(failed, req.pq, req.mq)
            self._later(
                self.config.ms(self.config.consume_resubmit_delay), lambda: self._queue.put_nowait(retry)
            )
        offset = req.pq.remove_messages(msgs, self.clock.monotonic_ms())
        if offset >= 0 and not req.pq.dropped:
            self.offsets.update_offset(req.mq, offset, increase_only=True)

    async def _clean_expired_loop(self) -> None:
        cfg = self.config
        period = cfg.seconds(cfg.consume_timeout * 60_000)
        while True:
            await asyncio.sleep(period)
            await self.clean_expired_messages()

    async def clean_expired_messages(self) -> None:
        """ProcessQueue.cleanExpiredMsg: send back head messages stuck in a listener past consumeTimeout."""
        limit = self.config.ms(self.config.consume_timeout * 60_000)
        now = self.clock.now_ms()
        for mq, pq in list(self.state.process_queue_table.items()):
            for _ in range(min(pq.msg_count, 16)):
                first = pq.first_offset()
                if first is None:
                    break
                msg = pq._msgs[first]
                start = msg.properties.get(PROPERTY_CONSUME_START_TIME)
                if not start or not start.isdigit() or now - int(start) <= limit:
                    break
                await self.send_message_back(msg, 3, self.config.max_reconsume_times_concurrently())
                if pq.first_offset() == first:
                    pq.remove_messages([msg], self.clock.monotonic_ms())
                    self.log.warning("consume timeout: message sent back", mq=mq.short, offset=first)


class ConsumeMessageOrderlyService(_ServiceBase):
    """Consumes one queue at a time, in offset order, while the client holds the queue's broker lock."""

    mode = "ORDERLY"

    def start(self) -> None:
        self._spawn_workers(self.config.consume_thread_min)
        if self.state.message_model is MessageModel.CLUSTERING:
            task = self.api.spawn(self._lock_periodically(), "lock mq periodically")
            if task is not None:
                self._workers.append(task)

    async def _lock_periodically(self) -> None:
        cfg = self.config
        await asyncio.sleep(cfg.seconds(cfg.lock_first_delay))
        while True:
            try:
                await self.rebalance.lock_all()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.log.error("lockAll failed", error=repr(exc))
            await asyncio.sleep(cfg.seconds(cfg.lock_interval))

    def submit_consume_request(
        self, msgs: list[Message] | None, pq: ProcessQueue, mq: MessageQueue, dispatch_to_consume: bool
    ) -> None:
        if dispatch_to_consume and not self._stopped:
            self._queue.put_nowait(ConsumeRequest([], pq, mq))

    def _submit_later(self, pq: ProcessQueue, mq: MessageQueue, delay_ms: float) -> None:
        self._later(delay_ms, lambda: self.submit_consume_request(None, pq, mq, True))

    def _try_lock_later_and_reconsume(self, pq: ProcessQueue, mq: MessageQueue, delay_ms: float) -> None:
        cfg = self.config

        async def attempt() -> None:
            ok = await self.rebalance.lock(mq)
            self._submit_later(pq, mq, cfg.ms(10 if ok else 3000))

        self._later(cfg.ms(delay_ms), lambda: self.api.spawn(attempt(), "lock and reconsume"))

    async def _run(self, req: ConsumeRequest) -> None:
        cfg = self.config
        pq, mq = req.pq, req.mq
        if pq.dropped:
            return
        lock = self._mq_locks.setdefault(mq, asyncio.Lock())
        async with lock:
            clustering = self.state.message_model is MessageModel.CLUSTERING
            lock_ms = cfg.ms(cfg.lock_max_live_time)
            if clustering and not (pq.locked and not pq.is_lock_expired(self.clock.monotonic_ms(), lock_ms)):
                if not pq.dropped:
                    self._try_lock_later_and_reconsume(pq, mq, 100)
                return
            begin = self.clock.monotonic_ms()
            while True:
                if pq.dropped:
                    break
                now = self.clock.monotonic_ms()
                if clustering and (not pq.locked or pq.is_lock_expired(now, lock_ms)):
                    self._try_lock_later_and_reconsume(pq, mq, 10)
                    break
                if now - begin > cfg.ms(cfg.max_time_consume_continuously):
                    self._submit_later(pq, mq, cfg.ms(10))
                    break
                msgs = pq.take_messages(cfg.consume_message_batch_max_size, now)
                if not msgs:
                    break
                ctx = ConsumeOrderlyContext(mq)
                status: Any
                async with pq.consume_lock:
                    if pq.dropped:
                        pq.make_message_to_consume_again(msgs)
                        break
                    started = self.clock.now_ms()
                    try:
                        status = await self.listener([listener_view(m) for m in msgs], ctx)
                    except asyncio.CancelledError:
                        raise
                    except Exception as exc:
                        self.log.warning(
                            "orderly listener raised; suspend", group=self.group, error=repr(exc)
                        )
                        status = ConsumeOrderlyStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT
                status = _orderly_status(status, self.log)
                if status in (ConsumeOrderlyStatus.SUCCESS, ConsumeOrderlyStatus.COMMIT):
                    self._emit_consumed(msgs, mq, started)
                if not await self._process_consume_result(msgs, status, ctx, pq, mq):
                    break

    async def _process_consume_result(
        self,
        msgs: list[Message],
        status: ConsumeOrderlyStatus,
        ctx: ConsumeOrderlyContext,
        pq: ProcessQueue,
        mq: MessageQueue,
    ) -> bool:
        commit_offset = -1
        keep_going = True
        if ctx.auto_commit:
            if status in (
                ConsumeOrderlyStatus.SUCCESS,
                ConsumeOrderlyStatus.COMMIT,
                ConsumeOrderlyStatus.ROLLBACK,
            ):
                commit_offset = pq.commit()
            elif await self._check_reconsume_times(msgs):
                pq.make_message_to_consume_again(msgs)
                self._submit_later(pq, mq, self._suspend_ms(ctx))
                keep_going = False
            else:
                commit_offset = pq.commit()
        else:
            if status is ConsumeOrderlyStatus.COMMIT:
                commit_offset = pq.commit()
            elif status is ConsumeOrderlyStatus.ROLLBACK:
                pq.rollback()
                self._submit_later(pq, mq, self._suspend_ms(ctx))
                keep_going = False
            elif status is ConsumeOrderlyStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT and (
                await self._check_reconsume_times(msgs)
            ):
                pq.make_message_to_consume_again(msgs)
                self._submit_later(pq, mq, self._suspend_ms(ctx))
                keep_going = False
        if commit_offset >= 0 and not pq.dropped:
            self.offsets.update_offset(mq, commit_offset, increase_only=False)
        return keep_going

    def _suspend_ms(self, ctx: ConsumeOrderlyContext) -> float:
        cfg = self.config
        ms = ctx.suspend_current_queue_time_millis
        if ms == -1:
            ms = cfg.suspend_current_queue_time_millis
        return cfg.ms(min(max(ms, 10), 30_000))

    async def _check_reconsume_times(self, msgs: list[Message]) -> bool:
        """True: suspend the queue and retry these messages; past maxReconsumeTimes they go to the DLQ."""
        suspend = False
        max_times = self.config.max_reconsume_times_orderly()
        for msg in msgs:
            if msg.reconsume_times >= max_times:
                # ConsumeMessageOrderlyService#sendMessageBack: a plain send to the retry topic, which the
                # broker diverts to %DLQ%<group>
                if not await self.send_to_retry_topic(msg, msg.reconsume_times, max_times):
                    suspend = True
                    msg.reconsume_times += 1
            else:
                suspend = True
                msg.reconsume_times += 1
        return suspend


def _orderly_status(status: Any, log: EventSink) -> ConsumeOrderlyStatus:
    if status is None or status is True:
        return ConsumeOrderlyStatus.SUCCESS
    if status is False:
        return ConsumeOrderlyStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT
    try:
        return ConsumeOrderlyStatus(status)
    except ValueError:
        log.warning("orderly listener returned an unknown status; suspend", status=repr(status))
        return ConsumeOrderlyStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT
