"""The RocketMQ 5 push consumer's server-side path (``client_rebalance = false``): RebalanceImpl asking
the broker for its queues (getRebalanceResultFromBroker), updateMessageQueueAssignment splitting PULL and
POP queues, DefaultMQPushConsumerImpl#popMessage, and ConsumeMessagePopConcurrentlyService (ack on
success, a longer invisible time on failure).

PULL assignments go through the 4.x machinery unchanged (process queues, pull requests); POP ones get a
PopProcessQueue and a PopRequest that the pull service runs, 500 ms after the rebalance that added it.
"""

from __future__ import annotations

import asyncio
import random
from typing import Any

from rmqlab.client.api import PopClientAPI
from rmqlab.client.consume import (
    ConsumeConcurrentlyContext,
    ConsumeConcurrentlyStatus,
    Listener,
    _ServiceBase,
    origin_msg_id,
)
from rmqlab.client.errors import MQBrokerError
from rmqlab.client.group_state import DropReason, GroupState, shorts
from rmqlab.client.pop_core import (
    CONSUME_INIT_MODE_MAX,
    CONSUME_INIT_MODE_MIN,
    MODE_POP,
    PopProcessQueue,
    PopRequest,
    change_invisible_delay_s,
    effective_invisible_time,
    is_pop_timeout,
    past_max_decision,
    receipt_of,
    split_assignments,
)
from rmqlab.client.ports import EventSink, GroupApi
from rmqlab.client.rebalance import RebalancePushImpl
from rmqlab.protocol.clock import Clock
from rmqlab.protocol.codes import ResponseCode
from rmqlab.protocol.model import ConsumeFromWhere, Message, MessageModel, MessageQueue, is_retry_topic
from rmqlab.protocol.pop_receipt import pop_retry_topic, real_topic
from rmqlab.protocol.route import MASTER_ID, TopicRouteData

QUERY_ASSIGNMENT_TIMEOUT_MS = 3_000  # RebalanceImpl.QUERY_ASSIGNMENT_TIMEOUT
TIMEOUT_CHECK_TIMES = 3  # RebalanceImpl.TIMEOUT_CHECK_TIMES (5.0.0 to 5.3.1): tryQueryAssignment's tries
POP_DISPATCH_DELAY_MS = 500  # dispatchPopPullRequest(popRequestList, 500)
ACK_TIMEOUT_MS = 3_000  # ackAsync / changePopInvisibleTimeAsync: invokeAsync with 3 s


class RebalancePush5Impl(RebalancePushImpl):
    """RebalancePushImpl with RocketMQ 5's server-side assignment for topics it does not balance itself."""

    def __init__(
        self, *args: Any, pop_api: PopClientAPI, routes: Any, rng: random.Random | None = None, **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)  # RebalanceImpl's state, ports and clock
        self.pop_api = pop_api
        self.routes = routes  # MQClientInstance: topic_route_table and the route refresh
        self.random = rng or random.Random()
        self.pop_process_queue_table: dict[MessageQueue, PopProcessQueue] = {}
        self.pop_service: ConsumeMessagePopConcurrentlyService | None = None
        self._last_assignment: dict[str, tuple[str, ...]] = {}
        # tryQueryAssignment's memory (before 5.3.2): topics the broker answered for, and topics given up to
        # the client's own allocation for good
        self._topic_broker_rebalance: set[str] = set()
        self._topic_client_rebalance: set[str] = set()

    def client_rebalance(self, topic: str) -> bool:
        """RebalancePushImpl#clientRebalance: orderly and broadcasting consumers always balance themselves."""
        return (
            self.config.client_rebalance
            or self.state.consume_orderly
            or self.state.message_model is MessageModel.BROADCASTING
        )

    async def rebalance_by_topic(self, topic: str, is_order: bool) -> bool:
        if self.client_rebalance(topic):
            return await super().rebalance_by_topic(topic, is_order)
        if self.config.query_assignment_fallback and not await self._try_query_assignment(topic):
            return await super().rebalance_by_topic(topic, is_order)
        return await self.get_rebalance_result_from_broker(topic, is_order)

    async def _try_query_assignment(self, topic: str) -> bool:
        """RebalanceImpl#tryQueryAssignment (5.0.0 to 5.3.1): until the broker has answered once, ask it
        up to three times (1, 2 and 3 s); three timeouts or any other error give the topic to the
        client's own allocation for good, whatever the group's other members do (ISSUE #8686)."""
        if topic in self._topic_client_rebalance:
            return False
        if topic in self._topic_broker_rebalance:
            return True
        for attempt in range(1, TIMEOUT_CHECK_TIMES + 1):
            try:
                await self._query_assignment(
                    topic, QUERY_ASSIGNMENT_TIMEOUT_MS // TIMEOUT_CHECK_TIMES * attempt
                )
            except asyncio.CancelledError:
                raise
            except TimeoutError:
                continue
            except Exception as exc:
                return self._give_up_query_assignment(topic, repr(exc))
            self._topic_broker_rebalance.add(topic)
            return True
        return self._give_up_query_assignment(topic, f"{TIMEOUT_CHECK_TIMES} timeouts")

    def _give_up_query_assignment(self, topic: str, error: str) -> bool:
        self._topic_client_rebalance.add(topic)
        self.log.warning(
            "tryQueryAssignment failed: the client balances the topic itself from now on",
            group=self.group,
            topic=topic,
            error=error,
        )
        return False

    async def _query_assignment(self, topic: str, timeout_ms: int) -> list[tuple[MessageQueue, str]] | None:
        """MQClientInstance#queryAssignment: QUERY_ASSIGNMENT to a broker of the topic (None without one)."""
        addr = self._broker_addr_by_topic(topic)
        if addr is None:
            await self.routes.update_topic_route_info_from_name_server(topic)
            addr = self._broker_addr_by_topic(topic)
        if addr is None:
            return None
        return await self.pop_api.query_assignment(
            addr,
            topic=topic,
            group=self.group,
            client_id=self.client_id,
            strategy_name=self.state.strategy.name,
            message_model=self.state.message_model,
            timeout_s=self.config.seconds(timeout_ms),
        )

    def _broker_addr_by_topic(self, topic: str) -> str | None:
        """MQClientInstance#findBrokerAddrByTopic: a random broker of the topic's route."""
        route: TopicRouteData | None = self.routes.topic_route_table.get(topic)
        if route is None or not route.broker_datas:
            return None
        return self.random.choice(route.broker_datas).select_addr()

    async def get_rebalance_result_from_broker(self, topic: str, is_order: bool) -> bool:
        try:
            assignments = await self._query_assignment(topic, QUERY_ASSIGNMENT_TIMEOUT_MS)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self.log.warning("queryAssignment failed", group=self.group, topic=topic, error=repr(exc))
            return False
        if assignments is None:
            return False
        mq_set = {mq for mq, _ in assignments}
        changed = await self.update_message_queue_assignment(topic, assignments, is_order)
        self._emit_assignment(topic, assignments, changed)
        if changed:
            await self.message_queue_changed(topic, set(), mq_set)
        return mq_set == self.working_message_queue(topic)

    def working_message_queue(self, topic: str) -> set[MessageQueue]:
        """getWorkingMessageQueue: the topic's pull and pop queues not dropped."""
        pops = {mq for mq, pq in self.pop_process_queue_table.items() if mq.topic == topic and not pq.dropped}
        return self.state.working_set(topic) | pops

    def _emit_assignment(
        self, topic: str, assignments: list[tuple[MessageQueue, str]], changed: bool
    ) -> None:
        alloc = tuple(f"{mq.short}:{mode}" for mq, mode in sorted(assignments))
        if not changed and self._last_assignment.get(topic) == alloc:
            return
        self._last_assignment[topic] = alloc
        pull, pop = split_assignments(assignments)
        self.log.emit(
            "assignment",
            group=self.group,
            client_id=self.client_id,
            topic=topic,
            strategy=self.state.strategy.name,
            pull=shorts(pull),
            pop=shorts(pop),
            changed=bool(changed),
        )

    async def update_message_queue_assignment(
        self, topic: str, assignments: list[tuple[MessageQueue, str]], is_order: bool
    ) -> bool:
        pull, pop = split_assignments(assignments)
        if not is_retry_topic(topic):
            retry = pop_retry_topic(topic, self.group)
            # all PULL: also drain what an earlier POP period left in the pop retry topic; all POP: the
            # broker pops the retry topic along with the topic itself
            if pull and not pop:
                self.state.subscribe(retry, "*", self.clock.now_ms())
            elif pop and not pull:
                self.state.unsubscribe(retry)
        changed = await self.update_process_queue_table_in_rebalance(
            self.state.plan_assignment(topic, pull, is_order, self._now())
        )
        now = self._now()
        max_idle = self.config.ms(self.config.pull_max_idle_time)
        for mq, ppq in list(self.pop_process_queue_table.items()):
            if mq.topic != topic:
                continue
            if mq not in pop:
                reason = "reallocated"
            elif ppq.is_pull_expired(now, max_idle):
                reason = "pull_expired"
            else:
                continue
            ppq.dropped = True
            del self.pop_process_queue_table[mq]
            changed = True
            self._emit_mq("pop_mq_removed", mq, reason=reason)
        requests: list[PopRequest] = []
        init_mode = (
            CONSUME_INIT_MODE_MIN
            if self.config.consume_from_where is ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET
            else CONSUME_INIT_MODE_MAX
        )
        for mq in sorted(pop):
            if mq in self.pop_process_queue_table:
                continue
            ppq = PopProcessQueue(now)
            self.pop_process_queue_table[mq] = ppq
            requests.append(PopRequest(topic, self.group, mq, ppq, init_mode))
            changed = True
            self._emit_mq("pop_mq_added", mq)
        for req in requests:
            self.pulls.execute_pull_request_later(req, self.config.ms(POP_DISPATCH_DELAY_MS))  # type: ignore[arg-type]
        return changed

    def truncate_message_queue_not_my_topic(self) -> None:
        super().truncate_message_queue_not_my_topic()
        topics = set(self.state.subscription_inner)
        for mq, ppq in list(self.pop_process_queue_table.items()):
            if mq.topic not in topics:
                ppq.dropped = True
                del self.pop_process_queue_table[mq]
                self._emit_mq("pop_mq_removed", mq, reason="not_my_topic")

    def destroy(self, reason: DropReason = DropReason.SHUTDOWN) -> None:
        super().destroy(reason)
        for mq, ppq in list(self.pop_process_queue_table.items()):
            ppq.dropped = True
            self._emit_mq("pop_mq_removed", mq, reason="shutdown")
        self.pop_process_queue_table.clear()

    # -- DefaultMQPushConsumerImpl#popMessage -------------------------------------------------------
    def _pop_later(self, req: PopRequest, delay_ms: float) -> None:
        self.pulls.execute_pull_request_later(req, self.config.ms(delay_ms))  # type: ignore[arg-type]

    async def pop_message(self, req: PopRequest, *, running: bool, paused: bool) -> None:
        cfg = self.config
        ppq = req.pop_process_queue
        if ppq.dropped:
            return
        ppq.last_pop_timestamp = self._now()
        if not running:
            self._pop_later(req, cfg.pull_time_delay_mills_when_exception)
            return
        if paused:
            self._pop_later(req, cfg.pull_time_delay_mills_when_suspend)
            return
        if ppq.wait_ack_count > cfg.pop_threshold_for_queue:
            self._pop_later(req, cfg.pull_time_delay_mills_when_cache_flow_control)
            return
        sub = self.state.subscription_inner.get(req.message_queue.topic)
        if sub is None:
            self._pop_later(req, cfg.pull_time_delay_mills_when_exception)
            return
        mq = req.message_queue
        addr = self.api.find_broker_address_in_subscribe(mq.broker_name, MASTER_ID, True)
        if addr is None:
            addr = await self.api.find_broker_address_in_subscribe_or_update(
                mq.topic, mq.broker_name, MASTER_ID, True
            )
        if addr is None:
            self._pop_later(req, cfg.pull_time_delay_mills_when_exception)
            return
        invisible = cfg.ms(effective_invisible_time(cfg.pop_invisible_time))
        poll = cfg.ms(cfg.broker_suspend_max_time_millis)
        timeout = cfg.seconds(cfg.consumer_timeout_millis_when_suspend)
        self.api.spawn(self._pop_rpc(req, addr, int(invisible), int(poll), sub.sub_string, timeout), "pop")

    async def _pop_rpc(
        self, req: PopRequest, addr: str, invisible: int, poll: int, expression: str, timeout_s: float
    ) -> None:
        cfg = self.config
        try:
            result = await self.pop_api.pop_message(
                addr,
                group=self.group,
                mq=req.message_queue,
                invisible_time=invisible,
                max_nums=cfg.pop_batch_nums,
                poll_time=poll,
                born_time=self.clock.now_ms(),
                init_mode=req.init_mode,
                expression=expression,
                timeout_s=timeout_s,
            )
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self.log.warning("pop failed", group=self.group, mq=req.message_queue.short, error=repr(exc))
            if isinstance(exc, MQBrokerError) and exc.code == ResponseCode.FLOW_CONTROL:
                self._pop_later(req, cfg.pull_time_delay_mills_when_broker_flow_control)
            else:
                self._pop_later(req, cfg.pull_time_delay_mills_when_exception)
            return
        if result.status == "FOUND" and result.messages:
            ppq = req.pop_process_queue
            ppq.inc_found_msg(len(result.messages))
            if self.pop_service is not None:
                self.pop_service.submit_pop_consume_request(result.messages, ppq, req.message_queue)
            if cfg.pull_interval > 0:
                self._pop_later(req, cfg.pull_interval)
            else:
                self.pulls.execute_pull_request_immediately(req)  # type: ignore[arg-type]
        elif result.status in ("FOUND", "POLLING_NOT_FOUND"):
            self.pulls.execute_pull_request_immediately(req)  # type: ignore[arg-type]
        else:
            self._pop_later(req, cfg.pull_time_delay_mills_when_exception)


class _PopConsumeRequest:
    __slots__ = ("mq", "msgs", "ppq")

    def __init__(self, msgs: list[Message], ppq: PopProcessQueue, mq: MessageQueue) -> None:
        self.msgs = msgs
        self.ppq = ppq
        self.mq = mq


class ConsumeMessagePopConcurrentlyService(_ServiceBase):
    """ConsumeMessagePopConcurrentlyService: its own workers; success acks each message, failure makes it
    invisible for a delay that grows with its reconsume times; past maxReconsumeTimes a message is delayed
    until it is twice the longest delay old, then acked (dropped), as RocketMQ's remoting client does."""

    mode = "CONCURRENTLY"

    def __init__(self, *args: Any, pop_api: PopClientAPI, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.pop_api = pop_api

    def start(self) -> None:
        self._spawn_workers(self.config.consume_thread_min)

    def submit_pop_consume_request(self, msgs: list[Message], ppq: PopProcessQueue, mq: MessageQueue) -> None:
        self._submit_in_batches(msgs, lambda batch: _PopConsumeRequest(batch, ppq, mq))

    async def _run(self, req: _PopConsumeRequest) -> None:
        if req.ppq.dropped:
            return
        if is_pop_timeout(req.msgs, self.clock.now_ms()):
            req.ppq.dec_found_msg(-len(req.msgs))
            self.log.info("pop messages timed out before consumption", group=self.group, mq=req.mq.short)
            return
        ctx = ConsumeConcurrentlyContext(req.mq)
        started, status = await self.consume_concurrently(req.msgs, ctx)
        n = len(req.msgs)
        ack_index = min(ctx.ack_index, n - 1) if status is ConsumeConcurrentlyStatus.CONSUME_SUCCESS else -1
        if req.ppq.dropped or is_pop_timeout(req.msgs, self.clock.now_ms()):
            # the broker may have given the messages to someone else already: neither ack nor change
            req.ppq.dec_found_msg(-n)
            return
        for msg in req.msgs[: ack_index + 1]:
            self._emit_pop_consumed(msg, started)
            req.ppq.ack()
            self._spawn_ack(msg)
        max_times = self.config.max_reconsume_times_concurrently()
        for msg in req.msgs[ack_index + 1 :]:
            req.ppq.ack()
            if msg.reconsume_times >= max_times:
                level = past_max_decision(msg.born_timestamp, self.clock.now_ms())
                if level is None:
                    self._spawn_ack(msg)
                elif level >= 0:
                    self._spawn_change(msg, level)
                continue
            self._spawn_change(msg, ctx.delay_level_when_next_consume)

    def _emit_pop_consumed(self, msg: Message, started_ms: int) -> None:
        r = receipt_of(msg)
        topic = real_topic(msg.topic, self.group, r.retry) if r is not None else msg.topic
        self.log.emit(
            "message_consumed",
            group=self.group,
            client_id=self.client_id,
            msg_id=origin_msg_id(msg),
            topic=topic,
            broker=msg.broker_name,
            queue_id=r.queue_id if r is not None else msg.queue_id,
            queue_offset=r.queue_offset if r is not None else msg.queue_offset,
            started_ms=started_ms,
            mode=self.mode,
        )

    def _addr(self, msg: Message) -> str | None:
        return self.api.find_broker_address_in_subscribe(msg.broker_name, MASTER_ID, True)

    def _spawn_ack(self, msg: Message) -> None:
        self.api.spawn(self._ack(msg), "pop ack")

    def _spawn_change(self, msg: Message, delay_level: int) -> None:
        self.api.spawn(self._change(msg, delay_level), "pop change invisible time")

    def _receipt_target(self, msg: Message) -> tuple[str, dict[str, Any]] | None:
        """The broker and the header fields that name a popped message in an ack or an invisible-time
        change: its receipt, with the topic it was really popped from; None without a receipt or broker."""
        r = receipt_of(msg)
        addr = self._addr(msg)
        if r is None or addr is None:
            return None
        return addr, {
            "group": self.group,
            "topic": real_topic(msg.topic, self.group, r.retry),
            "queue_id": r.queue_id,
            "offset": r.queue_offset,
            "extra_info": r.build(),
            "timeout_s": self.config.seconds(ACK_TIMEOUT_MS),
        }

    async def _ack(self, msg: Message) -> None:
        """DefaultMQPushConsumerImpl#ackAsync: ACK_MESSAGE on the message's broker, with its real topic."""
        target = self._receipt_target(msg)
        if target is None:
            return
        addr, fields = target
        try:
            await self.pop_api.ack_message(addr, **fields)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self.log.warning("ack failed", group=self.group, msg_id=origin_msg_id(msg), error=repr(exc))

    async def _change(self, msg: Message, delay_level: int) -> None:
        """changePopInvisibleTime: the message stays invisible for its delay level's time, then returns."""
        target = self._receipt_target(msg)
        if target is None:
            return
        addr, fields = target
        delay_ms = self.config.ms(change_invisible_delay_s(msg.reconsume_times, delay_level) * 1000)
        try:
            await self.pop_api.change_invisible_time(addr, invisible_time=int(delay_ms), **fields)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self.log.warning(
                "change invisible time failed", group=self.group, msg_id=origin_msg_id(msg), error=repr(exc)
            )


def attach_pop_service(
    rebalance: RebalancePush5Impl,
    state: GroupState,
    listener: Listener,
    *,
    api: GroupApi,
    offsets: Any,
    events: EventSink,
    clock: Clock,
) -> ConsumeMessagePopConcurrentlyService:
    """Create the consumer's pop consume service (DefaultMQPushConsumerImpl#start does when the listener
    is concurrent) and give it to the rebalance, which hands it popped batches."""
    service = ConsumeMessagePopConcurrentlyService(
        state,
        listener,
        rebalance=rebalance,
        api=api,
        offsets=offsets,
        events=events,
        clock=clock,
        pop_api=rebalance.pop_api,
    )
    rebalance.pop_service = service
    return service


__all__ = ["MODE_POP", "ConsumeMessagePopConcurrentlyService", "RebalancePush5Impl", "attach_pop_service"]
