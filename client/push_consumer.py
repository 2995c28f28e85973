"""PushConsumer: RocketMQ's DefaultMQPushConsumer(Impl), the pull loop and its callbacks included.

consumer = PushConsumer("GroupA", namesrv="127.0.0.1:9876", strategy="AVG")
consumer.subscribe("TopicA", "*")
consumer.register_message_listener(handle)        # or register_message_listener_orderly
await consumer.start()
...
await consumer.shutdown()
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import random
from collections.abc import Callable
from typing import Any

from rmqlab.client.api import FLAG_COMMIT_OFFSET, FLAG_SUBSCRIPTION, FLAG_SUSPEND, PullResult
from rmqlab.client.consume import (
    ConsumeMessageConcurrentlyService,
    ConsumeMessageOrderlyService,
    Listener,
)
from rmqlab.client.consumer_base import ConsumerBase
from rmqlab.client.errors import MQBrokerError, MQClientError
from rmqlab.client.group_state import DropReason
from rmqlab.client.process_queue import PullRequest
from rmqlab.client.producer import inner_producer, shutdown_instance
from rmqlab.client.pull_core import PullStatus, pull_exception_delay_ms
from rmqlab.client.rebalance import RebalancePushImpl
from rmqlab.protocol.codes import ResponseCode
from rmqlab.protocol.model import ConsumeType, Message, MessageModel, MessageQueue
from rmqlab.protocol.remoting import RemotingTimeoutError


class PushConsumer(ConsumerBase):
    """A push consumer: the client pulls with long polling and calls the listener for each batch.

    ``message_model`` ("CLUSTERING" / "BROADCASTING"), ``consume_from_where`` ("first", "last",
    "timestamp" or RocketMQ's enum names) and any ``ConsumerConfig`` field may be given as keywords.
    """

    consume_type = ConsumeType.CONSUME_PASSIVELY

    def __init__(self, group: str, **kwargs: Any) -> None:
        super().__init__(group, **kwargs)
        self.rebalance_impl: RebalancePushImpl
        self._listener_fn: Callable[..., Any] | None = None
        self.consume_service: ConsumeMessageConcurrentlyService | ConsumeMessageOrderlyService | None = None
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._stopping = False

    # -- public API -----------------------------------------------------------------------------------
    def register_message_listener(self, fn: Callable[..., Any]) -> None:
        """Concurrent: ``fn(msgs[, context])`` returns a ConsumeConcurrentlyStatus (None: success)."""
        self._set_listener(fn, orderly=False)

    def register_message_listener_orderly(self, fn: Callable[..., Any]) -> None:
        """Orderly consumption; ``fn(msgs[, context])`` returns ConsumeOrderlyStatus (None = success)."""
        self._set_listener(fn, orderly=True)

    def _set_listener(self, fn: Callable[..., Any], *, orderly: bool) -> None:
        if self.running:
            raise MQClientError("register the listener before start()")
        if not callable(fn):
            raise MQClientError(f"message listener must be callable, got {fn!r}")
        self._listener_fn = fn
        self.state.consume_orderly = orderly

    def _build_rebalance_impl(self) -> RebalancePushImpl:
        if not self.config.client_rebalance:  # RocketMQ 5: the broker assigns (client/pop_consumer.py)
            from rmqlab.client.api import PopClientAPI
            from rmqlab.client.pop_consumer import RebalancePush5Impl

            return RebalancePush5Impl(
                self.state,
                self.api,
                self.pulls,
                self.offset_store,
                self.log,
                clock=self.clock,
                pop_api=PopClientAPI(self.instance.remoting),
                routes=self.instance,
                rng=random.Random(self.config.random_seed),
            )
        return RebalancePushImpl(
            self.state, self.api, self.pulls, self.offset_store, self.log, clock=self.clock
        )

    async def start(self) -> None:
        if self.running:
            raise MQClientError("the consumer is already running")
        if self._listener_fn is None:
            raise MQClientError("register a message listener before start()")
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=self.config.consume_thread_max, thread_name_prefix=f"consume-{self.group}"
        )
        listener = Listener(self._listener_fn, self._executor)
        service_cls = (
            ConsumeMessageOrderlyService if self.consume_orderly else ConsumeMessageConcurrentlyService
        )
        self.consume_service = service_cls(
            self.state,
            listener,
            rebalance=self.rebalance_impl,
            api=self.api,
            offsets=self.offset_store,
            events=self.log,
            clock=self.clock,
            retry_sender=self._send_by_inner_producer,
        )
        pop_service = None
        if not self.consume_orderly and not self.config.client_rebalance:
            from rmqlab.client.pop_consumer import RebalancePush5Impl, attach_pop_service

            assert isinstance(self.rebalance_impl, RebalancePush5Impl)
            pop_service = attach_pop_service(
                self.rebalance_impl,
                self.state,
                listener,
                api=self.api,
                offsets=self.offset_store,
                events=self.log,
                clock=self.clock,
            )
        try:
            await self._start_client()
        except BaseException:
            self.running = False
            if self.instance.consumer_table.get(self.group) is self:
                self.instance.unregister_consumer_local(self.group)
            await shutdown_instance(self.instance)
            self._executor.shutdown(wait=False)
            raise
        self.consume_service.start()
        if pop_service is not None:
            pop_service.start()

    async def shutdown(self) -> None:
        """Stop consuming, unlock (orderly), persist offsets and UNREGISTER_CLIENT from every broker."""
        if not self.running or self._stopping:
            return
        self._stopping = True
        cfg = self.config
        if self.consume_service is not None:
            await self.consume_service.shutdown(cfg.ms(cfg.await_termination_millis_when_shutdown))
            if self.consume_orderly and self.message_model is MessageModel.CLUSTERING:
                await self.rebalance_impl.unlock_all(False)
        pop_service = getattr(self.rebalance_impl, "pop_service", None)
        if pop_service is not None:
            await pop_service.shutdown(cfg.ms(cfg.await_termination_millis_when_shutdown))
        await self._stop_client()
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
        self.log.emit("consumer_stopped", group=self.group, client_id=self.client_id)

    async def _send_by_inner_producer(
        self, topic: str, body: bytes, tags: str | None, keys: str | None, properties: dict[str, str]
    ) -> None:
        producer = await inner_producer(self.instance, self.config, self.instance_name, self.clock)
        await producer.send(topic, body, tags=tags, keys=keys, properties=properties)

    def suspend(self) -> None:
        self.paused = True

    def resume(self) -> None:
        self.paused = False
        self.api.rebalance_immediately()

    async def __aenter__(self) -> PushConsumer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.shutdown()

    # -- pullMessage ----------------------------------------------------------------------------------
    def _later(self, req: PullRequest, delay_ms: float) -> None:
        self.pulls.execute_pull_request_later(req, self.config.ms(delay_ms))

    def _now(self) -> int:
        return self.clock.monotonic_ms()

    async def pull_message(self, req: PullRequest) -> None:
        """DefaultMQPushConsumerImpl.pullMessage on the pull service's one thread: the checks and what
        blocks there in Java (the orderly first pull's offset query, a route lookup, connecting to the
        broker) run in line; only the wait for the answer runs as its own task (invokeAsync)."""
        cfg = self.config
        pop_message = getattr(self.rebalance_impl, "pop_message", None)
        if pop_message is not None and not isinstance(req, PullRequest):  # a RocketMQ 5 PopRequest
            await pop_message(req, running=self.running, paused=self.paused)
            return
        pq = req.process_queue
        if pq.dropped:
            return
        pq.last_pull_timestamp = self._now()
        if not self.running:
            self._later(req, cfg.pull_time_delay_mills_when_exception)
            return
        if self.paused:
            self._later(req, cfg.pull_time_delay_mills_when_suspend)
            return
        if self.state.flow_control(pq):
            self._later(req, cfg.pull_time_delay_mills_when_cache_flow_control)
            return
        if self.consume_orderly and not pq.locked:
            self._later(req, cfg.pull_time_delay_mills_when_exception)
            return
        if req.message_queue.topic not in self.state.subscription_inner:
            self._later(req, cfg.pull_time_delay_mills_when_exception)
            return
        await self._pull(req)

    async def _pull(self, req: PullRequest) -> None:
        cfg = self.config
        mq = req.message_queue
        pq = req.process_queue
        if self.consume_orderly and pq.locked and not req.previously_locked:
            # the first pull of a newly locked queue re-reads the committed offset from the broker
            try:
                offset = await self.rebalance_impl.compute_pull_from_where_with_exception(mq)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.log.warning("compute pull offset failed", mq=mq.short, topic=mq.topic, error=repr(exc))
                self._later(req, cfg.pull_time_delay_mills_when_exception)
                return
            if offset < req.next_offset:
                self.log.info("orderly queue starts before its last pull", mq=mq.short, offset=offset)
            req.previously_locked = True
            req.next_offset = offset
        sub = self.state.subscription_inner.get(mq.topic)
        if sub is None:
            self._later(req, cfg.pull_time_delay_mills_when_exception)
            return
        commit_offset = 0
        sys_flag = FLAG_SUSPEND
        if self.message_model is MessageModel.CLUSTERING:
            mem = self.offset_store.read_offset_from_memory(mq)  # readOffset(READ_FROM_MEMORY)
            if mem > 0:
                commit_offset = mem
                sys_flag |= FLAG_COMMIT_OFFSET
        expression = None
        if cfg.post_subscription_when_pull:
            expression = sub.sub_string
            sys_flag |= FLAG_SUBSCRIPTION
        found = await self.find_pull_broker(mq)
        if found is None:
            self._pull_failed(req, None, f"the broker[{mq.broker_name}] not exist", "NO_BROKER")
            return
        addr = found.broker_addr
        if found.slave:
            sys_flag &= ~FLAG_COMMIT_OFFSET  # a slave keeps no offset a pull carries
        try:
            await self.instance.remoting.connection(addr)  # getAndCreateChannel blocks the pull thread
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self._pull_failed(req, None, repr(exc), type(exc).__name__)
            return
        self.api.spawn_self_guarded(
            self._pull_rpc(req, addr, sys_flag, commit_offset, expression, sub.sub_version, sub.tags_set)
        )

    async def _pull_rpc(
        self,
        req: PullRequest,
        addr: str,
        sys_flag: int,
        commit_offset: int,
        expression: str | None,
        sub_version: int,
        tags_set: list[str],
    ) -> None:
        """invokeAsync and its InvokeCallback: a task of its own that catches everything itself (the
        guard ``spawn`` would wrap around it is inline here: a task per pull, no wrapper coroutine)."""
        try:
            cfg = self.config
            mq = req.message_queue
            try:
                result = await self.api.pull_message(
                    addr,
                    group=self.group,
                    mq=mq,
                    queue_offset=req.next_offset,
                    max_msg_nums=cfg.pull_batch_size,
                    sys_flag=sys_flag,
                    commit_offset=commit_offset,
                    suspend_timeout_ms=int(cfg.ms(cfg.broker_suspend_max_time_millis)),
                    subscription=expression,
                    sub_version=sub_version,
                    timeout_s=cfg.seconds(cfg.consumer_timeout_millis_when_suspend),
                    asynchronous=True,
                )
            except asyncio.CancelledError:
                raise
            except MQBrokerError as exc:
                self._pull_failed(req, exc.code, exc.remark, exc.code_name)
                return
            except RemotingTimeoutError as exc:
                self._pull_failed(req, None, str(exc), "TIMEOUT")
                return
            except Exception as exc:
                self._pull_failed(req, None, repr(exc), type(exc).__name__)
                return
            try:
                await self._on_pull_success(req, result, tags_set)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                # MQClientAPIImpl#pullMessageAsync: an exception in onSuccess goes to onException, which
                # pulls again after the exception delay instead of leaving the queue to the pull expiry
                self.log.error("pull result processing failed", mq=mq.short, error=repr(exc))
                self._pull_failed(req, None, repr(exc), type(exc).__name__)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a bug in one pull's handling must not end the instance's tasks
            self.log.error("client task failed", task="pull", error=repr(exc))

    def _pull_failed(self, req: PullRequest, code: int | None, remark: str, code_name: str) -> None:
        cfg = self.config
        delay = pull_exception_delay_ms(
            code,
            when_exception=cfg.pull_time_delay_mills_when_exception,
            when_broker_flow_control=cfg.pull_time_delay_mills_when_broker_flow_control,
        )
        mq = req.message_queue
        self.emit_queue_event(
            "pull_failed",
            mq,
            code=code_name,
            remark=remark or "",
            delay_ms=int(cfg.ms(delay)),
        )
        if code == ResponseCode.SUBSCRIPTION_NOT_LATEST:
            self.log.warning("the subscription is not latest, group", group=self.group, mq=mq.short)
        self._later(req, delay)

    async def _on_pull_success(self, req: PullRequest, result: PullResult, tags_set: list[str]) -> None:
        cfg = self.config
        pq = req.process_queue
        mq = req.message_queue
        self.update_pull_from_which_node(mq, result.suggest_which_broker_id)
        if result.status is PullStatus.FOUND:
            msgs = result.messages
            if tags_set:
                # the client filters by tag too (PullAPIWrapper.processPullResult)
                wanted = set(tags_set)
                msgs = [m for m in msgs if m.tags is not None and m.tags in wanted]
            for m in msgs:
                m.properties["MIN_OFFSET"] = str(result.min_offset)
                m.properties["MAX_OFFSET"] = str(result.max_offset)
            prev = req.next_offset
            req.next_offset = result.next_begin_offset
            if result.next_begin_offset < prev:
                self.log.warning(
                    "[BUG] pull result offset went back",
                    mq=mq.short,
                    prev=prev,
                    next=result.next_begin_offset,
                )
            if not msgs:
                self.pulls.execute_pull_request_immediately(req)
                return
            if pq.dropped:
                return
            dispatch = pq.put_messages(msgs)
            assert self.consume_service is not None
            self.consume_service.submit_consume_request(msgs, pq, mq, dispatch)
            if cfg.pull_interval > 0:
                self._later(req, cfg.pull_interval)
            else:
                self.pulls.execute_pull_request_immediately(req)
        elif result.status in (PullStatus.NO_NEW_MSG, PullStatus.NO_MATCHED_MSG):
            req.next_offset = result.next_begin_offset
            if pq.msg_count == 0:
                # correctTagsOffset: nothing cached, so the pulled-past offset may be committed
                self.offset_store.update_offset(mq, req.next_offset, increase_only=True)
            self.pulls.execute_pull_request_immediately(req)
        elif result.status is PullStatus.OFFSET_ILLEGAL:
            self.log.warning(
                "the pull request offset illegal", mq=mq.short, topic=mq.topic, next=result.next_begin_offset
            )
            req.next_offset = result.next_begin_offset
            pq.dropped = True
            if cfg.offset_illegal_5x:
                self.offset_store.update_and_freeze_offset(mq, req.next_offset)
                await self.offset_store.persist(mq)
                await self.rebalance_impl.remove_process_queue(mq, DropReason.OFFSET_MOVED)
                self.api.rebalance_immediately()
            else:

                async def fix() -> None:
                    self.offset_store.update_offset(mq, req.next_offset, increase_only=False)
                    await self.offset_store.persist(mq)
                    await self.rebalance_impl.remove_process_queue(mq, DropReason.OFFSET_MOVED)

                self.pulls.execute_task_later(fix, cfg.ms(cfg.offset_illegal_fix_delay))

    # -- introspection (tests, tools) -----------------------------------------------------------------
    def owned_queues(self) -> list[MessageQueue]:
        return self.state.owned_queues()

    def messages_cached(self) -> dict[MessageQueue, list[Message]]:
        return {mq: [pq._msgs[o] for o in pq.offsets()] for mq, pq in self.state.process_queue_table.items()}
