"""POP_MESSAGE with long polling, ACK_MESSAGE, BATCH_ACK_MESSAGE and CHANGE_MESSAGE_INVISIBLETIME
(RocketMQ 5's PopMessageProcessor, AckMessageProcessor and ChangeInvisibleTimeProcessor), and the revive
of checkpoints whose invisible time ran out (PopReviveService).

The state lives in ``broker.pop_state.PopState``; this module reads requests, moves messages between the store
and that state, and holds pops that found nothing until a message arrives or their poll time ends.
PROTOCOL.md ("POP") gives the rules and the receipt format.
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass, field
from typing import Any

from rmqlab.broker.pop_state import (
    MAX_POP_BATCH,
    POP_FROM_RETRY_PROBABILITY,
    POP_POLLING_SIZE,
    REVIVE_DELAY_MS,
    TIMEOUT_TOO_MUCH_MS,
    AckResult,
    PopCheckPoint,
    QueueKey,
)
from rmqlab.broker.processor.common import ext_name
from rmqlab.broker.processor.services import ATTR_CLIENT_ID, ATTR_GROUPS, BrokerServices, Handler
from rmqlab.broker.store import (
    PROPERTY_ORIGIN_MESSAGE_ID,
    PROPERTY_RETRY_TOPIC,
    GetMessageStatus,
    MessageDraft,
    StoredMessage,
)
from rmqlab.broker.topic_config import TopicConfig
from rmqlab.protocol.codes import RequestCode, ResponseCode
from rmqlab.protocol.command import (
    CommandError,
    InvalidParameter,
    RemotingCommand,
    field_int,
    field_list,
    field_str,
)
from rmqlab.protocol.model import parse_tags
from rmqlab.protocol.pop_receipt import (
    POP_ORDER_REVIVE_QUEUE,
    PROPERTY_FIRST_POP_TIME,
    PROPERTY_POP_CK,
    ExtraInfo,
    offset_info,
    pop_retry_topic,
    real_topic,
    retry_flag,
)
from rmqlab.protocol.remoting import Connection

CONSUME_INIT_MODE_MIN = 0  # ConsumeInitMode.MIN: a new queue is popped from its first message
CONSUME_INIT_MODE_MAX = 1  # ConsumeInitMode.MAX: from its last message


@dataclass(eq=False, slots=True)
class _HeldPop:
    topic: str
    group: str
    queue_id: int  # -1: any queue of the topic
    conn_id: int
    waiter: asyncio.Future[str]


class PopLongPollingService:
    """Pops that found nothing, by (topic, group, queue id); an arrival on the topic, or on the group's
    pop retry topic, wakes those of its queue and those that pop every queue (-1)."""

    def __init__(self, max_per_key: int = POP_POLLING_SIZE) -> None:
        self.max_per_key = max_per_key
        self.table: dict[tuple[str, str, int], list[_HeldPop]] = {}
        self.retry_topics: dict[str, tuple[str, str]] = {}  # pop retry topic -> (topic, group)

    def __len__(self) -> int:
        return sum(len(v) for v in self.table.values())

    def add(self, held: _HeldPop) -> bool:
        waiting = self.table.setdefault((held.topic, held.group, held.queue_id), [])
        if len(waiting) >= self.max_per_key:
            return False
        waiting.append(held)
        self.retry_topics[pop_retry_topic(held.topic, held.group)] = (held.topic, held.group)
        return True

    def remove(self, held: _HeldPop) -> None:
        key = (held.topic, held.group, held.queue_id)
        waiting = self.table.get(key)
        if waiting and held in waiting:
            waiting.remove(held)
            if not waiting:
                del self.table[key]

    def notify(self, topic: str, queue_id: int, group: str | None = None) -> None:
        """A message arrived on (topic, queue_id), or a queue of ``group`` was unblocked."""
        retry = self.retry_topics.get(topic)
        for (t, g, q), waiting in list(self.table.items()):
            if retry is not None:
                wake = (t, g) == retry  # a revived message: every pop of the original topic by its group
            else:
                wake = t == topic and q in (queue_id, -1) and group in (None, g)
            if wake:
                self._wake(waiting)

    def wake_connection(self, conn_id: int) -> None:
        for waiting in list(self.table.values()):
            self._wake([h for h in waiting if h.conn_id == conn_id])

    def wake_all(self) -> None:
        for waiting in list(self.table.values()):
            self._wake(waiting)

    @staticmethod
    def _wake(waiting: list[_HeldPop]) -> None:
        for held in waiting:
            if not held.waiter.done():
                held.waiter.set_result("arrived")


@dataclass(slots=True)
class _PopRequest:
    group: str
    topic: str
    queue_id: int
    max_msg_nums: int
    invisible_time: int
    poll_time: int
    born_time: int
    init_mode: int
    order: bool
    attempt_id: str | None
    tags_set: list[str]


@dataclass(slots=True)
class _PopResult:
    messages: list[dict[str, Any]] = field(default_factory=list)
    rest_num: int = 0
    start_offset_info: list[str] = field(default_factory=list)
    msg_offset_info: list[str] = field(default_factory=list)
    order_count_info: list[str] = field(default_factory=list)


class PopMessageProcessor:
    """The four POP requests; ``revive`` is called by the broker's revive timer."""

    def __init__(self, broker: BrokerServices, rng: random.Random | None = None) -> None:
        self.broker = broker
        self.random = rng or random.Random()

    def handlers(self) -> dict[int, Handler]:
        return {
            RequestCode.POP_MESSAGE: self.pop_message,
            RequestCode.ACK_MESSAGE: self.ack_message,
            RequestCode.BATCH_ACK_MESSAGE: self.batch_ack_message,
            RequestCode.CHANGE_MESSAGE_INVISIBLETIME: self.change_invisible_time,
        }

    # -- POP_MESSAGE --------------------------------------------------------------------------------
    def _parse_pop(self, cmd: RemotingCommand) -> tuple[_PopRequest, TopicConfig]:
        b = self.broker
        group = ext_name(cmd, "consumerGroup")
        topic = ext_name(cmd, "topic")
        queue_id = cmd.ext_int32("queueId")
        max_msg_nums = cmd.ext_int32("maxMsgNums")
        invisible_time = cmd.ext_int("invisibleTime")
        poll_time = cmd.ext_int("pollTime")
        born_time = cmd.ext_int("bornTime", 0) or b.clock.now_ms()
        init_mode = cmd.ext_int32("initMode", CONSUME_INIT_MODE_MAX)
        order = cmd.ext_bool("order", False)
        attempt_id = cmd.ext_str("attemptId", None)
        exp = cmd.ext_str("exp", None)
        if b.clock.now_ms() - born_time - poll_time > TIMEOUT_TOO_MUCH_MS:
            raise CommandError(ResponseCode.POLLING_TIMEOUT, "the broker pop message is timeout too much")
        if max_msg_nums > MAX_POP_BATCH:
            raise CommandError(
                ResponseCode.INVALID_PARAMETER,
                f"the broker pop message's num is greater than {MAX_POP_BATCH}",
            )
        if max_msg_nums <= 0:
            raise InvalidParameter("maxMsgNums", f"must be > 0, got {max_msg_nums}")
        if invisible_time <= 0:
            raise InvalidParameter("invisibleTime", f"must be > 0 ms, got {invisible_time}")
        if init_mode not in (CONSUME_INIT_MODE_MIN, CONSUME_INIT_MODE_MAX):
            raise InvalidParameter("initMode", f"must be 0 (MIN) or 1 (MAX), got {init_mode}")
        tc = b.topic_manager.select(topic)
        if tc is None:
            raise CommandError(ResponseCode.TOPIC_NOT_EXIST, f"topic[{topic}] not exist, apply first please!")
        if not tc.readable:
            raise CommandError(ResponseCode.NO_PERMISSION, f"the topic[{topic}] peeking message is forbidden")
        if queue_id >= tc.read_queue_nums or queue_id < -1:
            raise InvalidParameter(
                "queueId",
                f"queueId[{queue_id}] is illegal, topic:[{topic}] "
                f"topicConfig.readQueueNums:[{tc.read_queue_nums}]",
            )
        gi = b.consumer_manager.find(group)
        if gi is None:
            raise CommandError(
                ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST,
                f"subscription group [{group}] does not exist: "
                "no consumer of it is registered on this broker",
            )
        sd = gi.find_subscription(topic)
        if sd is None:
            raise CommandError(
                ResponseCode.SUBSCRIPTION_NOT_EXIST,
                f"the consumer's subscription not exist, group: {group}, topic: {topic}",
            )
        tags_set = parse_tags(exp) if exp else list(sd.tags_set)
        return (
            _PopRequest(
                group,
                topic,
                queue_id,
                max_msg_nums,
                invisible_time,
                poll_time,
                born_time,
                init_mode,
                order,
                attempt_id,
                tags_set,
            ),
            tc,
        )

    async def pop_message(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        req, tc = self._parse_pop(cmd)
        b = self.broker
        deadline = req.born_time + req.poll_time
        while True:
            pop_time = b.clock.now_ms()
            result, revive_qid = self._pop(conn, req, tc, pop_time)
            if result.messages:
                return self._response(conn, cmd, req, result, pop_time, revive_qid, ResponseCode.SUCCESS)
            now = b.clock.now_ms()
            if req.poll_time <= 0 or now >= deadline or conn.closed:
                return self._response(
                    conn, cmd, req, result, pop_time, revive_qid, ResponseCode.POLLING_TIMEOUT
                )
            held = _HeldPop(
                req.topic, req.group, req.queue_id, conn.id, asyncio.get_running_loop().create_future()
            )
            if not b.pop_polling.add(held):
                return self._response(conn, cmd, req, result, pop_time, revive_qid, ResponseCode.POLLING_FULL)
            try:
                async with asyncio.timeout((deadline - now) / 1000):
                    await held.waiter
            except TimeoutError:
                pass
            finally:
                b.pop_polling.remove(held)
            tc = b.topic_manager.select(req.topic) or tc

    def _pop(
        self, conn: Connection, req: _PopRequest, tc: TopicConfig, pop_time: int
    ) -> tuple[_PopResult, int]:
        b = self.broker
        result = _PopResult()
        revive_qid = POP_ORDER_REVIVE_QUEUE if req.order else b.pop_state.next_revive_qid()
        rand = self.random.randrange(100)
        need_retry = rand < POP_FROM_RETRY_PROBABILITY
        retry_tc = b.topic_manager.select(pop_retry_topic(req.topic, req.group))
        if need_retry and not req.order and retry_tc is not None:
            self._pop_topic(conn, req, retry_tc, True, rand, revive_qid, pop_time, result)
        if req.queue_id < 0:
            self._pop_topic(conn, req, tc, False, rand, revive_qid, pop_time, result)
        else:
            self._pop_queue(conn, req, tc.topic_name, req.queue_id, False, revive_qid, pop_time, result)
        if (
            not need_retry
            and len(result.messages) < req.max_msg_nums
            and not req.order
            and retry_tc is not None
        ):
            self._pop_topic(conn, req, retry_tc, True, rand, revive_qid, pop_time, result)
        return result, revive_qid

    def _pop_topic(
        self,
        conn: Connection,
        req: _PopRequest,
        tc: TopicConfig,
        is_retry: bool,
        rand: int,
        revive_qid: int,
        pop_time: int,
        result: _PopResult,
    ) -> None:
        n = tc.read_queue_nums
        for i in range(n):
            self._pop_queue(conn, req, tc.topic_name, (rand + i) % n, is_retry, revive_qid, pop_time, result)

    def _init_offset(self, req: _PopRequest, topic: str, queue_id: int) -> int:
        """getInitOffset: MIN mode and retry topics start at the first message; MAX mode at the last one,
        or at 0 when the queue still holds its first message (initPopOffsetByCheckMsgInMem, from 5.1.4:
        before, a queue the group meets for the first time, such as a new broker's, skipped what it held)."""
        store = self.broker.store
        if req.init_mode == CONSUME_INIT_MODE_MIN or topic.startswith("%RETRY%"):
            return store.get_min_offset(topic, queue_id)
        if (
            self.broker.config.init_pop_offset_by_check_msg_in_mem
            and store.get_min_offset(topic, queue_id) <= 0
            and store.lookup(topic, queue_id, 0) is not None
        ):
            return 0
        return max(0, store.get_max_offset(topic, queue_id) - 1)

    def _pop_queue(
        self,
        conn: Connection,
        req: _PopRequest,
        topic: str,
        queue_id: int,
        is_retry: bool,
        revive_qid: int,
        pop_time: int,
        result: _PopResult,
    ) -> None:
        b = self.broker
        store = b.store
        state = b.pop_state
        key: QueueKey = (req.group, topic, queue_id)
        committed = b.offset_manager.query_offset(req.group, topic, queue_id)
        if committed < 0:
            committed = self._init_offset(req, topic, queue_id)
            b.commit_offset(conn, req.group, topic, queue_id, committed)
        offset = committed if req.order else state.pop_offset(key, committed)
        if req.order and state.check_block(key, req.attempt_id, pop_time):
            return
        wanted = req.max_msg_nums - len(result.messages)
        if wanted <= 0:
            result.rest_num += store.get_max_offset(topic, queue_id) - offset
            return
        tags_set = None if is_retry else req.tags_set
        cfg = b.config
        got = store.get_message(
            topic, queue_id, offset, wanted, cfg.max_transfer_bytes, tags_set, cfg.max_filter_scan
        )
        if got.status is GetMessageStatus.OFFSET_MOVED:
            # "Pop initial offset, because store is no correct": start again where the store says
            offset = got.next_begin_offset
            b.commit_offset(conn, req.group, topic, queue_id, offset)
            got = store.get_message(
                topic, queue_id, offset, wanted, cfg.max_transfer_bytes, tags_set, cfg.max_filter_scan
            )
        if got.messages:
            offsets = [m.queue_offset for m in got.messages]
            counts: dict[int, int] = {}
            if req.order:
                counts = state.update_order(key, req.attempt_id, pop_time, req.invisible_time, offsets)
                b.commit_offset(conn, req.group, topic, queue_id, offset)
                result.order_count_info.append(offset_info(topic, queue_id, min(counts.values(), default=0)))
            else:
                ck = PopCheckPoint(
                    req.group,
                    topic,
                    queue_id,
                    offset,
                    pop_time,
                    req.invisible_time,
                    revive_qid,
                    cfg.broker_name,
                    tuple(offsets),
                )
                state.add_checkpoint(ck, got.next_begin_offset)
            result.start_offset_info.append(offset_info(topic, queue_id, offset))
            result.msg_offset_info.append(offset_info(topic, queue_id, offsets))
            for m in got.messages:
                receipt = ExtraInfo(
                    offset,
                    pop_time,
                    req.invisible_time,
                    revive_qid,
                    retry_flag(topic),
                    cfg.broker_name,
                    queue_id,
                    m.queue_offset,
                )
                result.messages.append(self._popped(m, req, receipt, counts.get(m.queue_offset)))
        elif got.status is GetMessageStatus.NO_MATCHED_MESSAGE:
            if req.order:
                b.commit_offset(conn, req.group, topic, queue_id, got.next_begin_offset)
            else:
                state.skip(key, got.next_begin_offset)
                self._commit(conn, key)
        result.rest_num += got.max_offset - got.next_begin_offset

    def _popped(
        self, m: StoredMessage, req: _PopRequest, receipt: ExtraInfo, consumed_count: int | None
    ) -> dict[str, Any]:
        props = dict(m.properties)
        props[PROPERTY_POP_CK] = receipt.build()
        wire = dict(m.wire, properties=props, topic=req.topic)
        if consumed_count is not None:  # orderly: the broker counts re-deliveries of the same offset
            wire["reconsumeTimes"] = consumed_count
        return wire

    def _response(
        self,
        conn: Connection,
        cmd: RemotingCommand,
        req: _PopRequest,
        result: _PopResult,
        pop_time: int,
        revive_qid: int,
        code: int,
    ) -> RemotingCommand:
        b = self.broker
        ext: dict[str, Any] = {
            "popTime": pop_time,
            "invisibleTime": req.invisible_time,
            "reviveQid": revive_qid,
            "restNum": result.rest_num,
            "startOffsetInfo": ";".join(result.start_offset_info),
            "msgOffsetInfo": ";".join(result.msg_offset_info),
        }
        if req.order:
            ext["orderCountInfo"] = ";".join(result.order_count_info)
        client_id = (
            conn.attrs.get(ATTR_GROUPS, {}).get(req.group)
            or conn.attrs.get(ATTR_CLIENT_ID)
            or conn.remote_addr
        )
        for m in result.messages:
            receipt = m["properties"][PROPERTY_POP_CK]
            b.log.emit(
                "message_popped",
                group=req.group,
                client_id=client_id,
                msg_id=m["properties"].get(PROPERTY_ORIGIN_MESSAGE_ID) or m["msgId"],
                topic=req.topic,
                broker=b.config.broker_name,
                queue_id=int(m["queueId"]),
                queue_offset=int(m["queueOffset"]),
                receipt=receipt,
                invisible_until=pop_time + req.invisible_time,
                reconsume_times=int(m["reconsumeTimes"]),
                order=req.order,
            )
        if code == ResponseCode.SUCCESS:
            return cmd.response(code, ext=ext, body={"messages": result.messages}, remark="FOUND")
        return cmd.response(
            code,
            ext=ext,
            remark="NO_MESSAGE_IN_QUEUE" if code != ResponseCode.POLLING_FULL else "POLLING_FULL",
        )

    def _commit(self, conn: Connection | None, key: QueueKey) -> None:
        """Move the group's consumer offset of a queue to what POP's state says is safe."""
        b = self.broker
        offset = b.pop_state.commit_offset(key)
        group, topic, queue_id = key
        if offset is not None and offset > b.offset_manager.query_offset(group, topic, queue_id):
            b.commit_offset(conn, group, topic, queue_id, offset)

    # -- ACK_MESSAGE / BATCH_ACK_MESSAGE --------------------------------------------------------------
    def _receipt(self, cmd: RemotingCommand) -> ExtraInfo:
        text = cmd.ext_str("extraInfo")
        try:
            return ExtraInfo.parse(text)
        except ValueError as exc:
            raise InvalidParameter("extraInfo", str(exc)) from None

    def _check_queue_offset(self, topic: str, queue_id: int, offset: int, *, exclusive_max: bool) -> None:
        b = self.broker
        tc = b.topic_manager.select(topic)
        if tc is None:
            raise CommandError(ResponseCode.TOPIC_NOT_EXIST, f"topic[{topic}] not exist, apply first please!")
        if not 0 <= queue_id < tc.read_queue_nums:
            raise CommandError(
                ResponseCode.MESSAGE_ILLEGAL,
                f"queueId[{queue_id}] is illegal, topic:[{topic}] "
                f"topicConfig.readQueueNums:[{tc.read_queue_nums}]",
            )
        lo, hi = b.store.get_min_offset(topic, queue_id), b.store.get_max_offset(topic, queue_id)
        if offset < lo or offset > hi or (exclusive_max and offset == hi):
            raise CommandError(
                ResponseCode.NO_MESSAGE,
                f"offset is illegal, key:{topic}@{queue_id}, commit:{offset}, store:{lo}~{hi}",
            )

    async def ack_message(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        group = ext_name(cmd, "consumerGroup")
        topic = ext_name(cmd, "topic")
        queue_id = cmd.ext_int32("queueId")
        offset = cmd.ext_int("offset")
        receipt = self._receipt(cmd)
        self._check_queue_offset(topic, queue_id, offset, exclusive_max=False)
        if receipt.is_order:
            self._ack_orderly(conn, group, topic, queue_id, offset, receipt.pop_time)
            return cmd.response(ResponseCode.SUCCESS)
        outcome = self._ack(conn, group, topic, queue_id, receipt.ck_queue_offset, receipt.pop_time, offset)
        if outcome is AckResult.NO_CHECKPOINT:
            raise CommandError(
                ResponseCode.NO_MESSAGE,
                f"no message in flight for this receipt (group {group}, {topic}@{queue_id}, offset {offset}, "
                f"popped at {receipt.pop_time}): its invisible time ran out and it was revived, or it was "
                "never popped",
            )
        if outcome is AckResult.NOT_IN_CHECKPOINT:
            raise CommandError(
                ResponseCode.NO_MESSAGE,
                f"offset {offset} was not popped with this receipt (checkpoint {receipt.ck_queue_offset})",
            )
        return cmd.response(ResponseCode.SUCCESS)

    def _ack(
        self,
        conn: Connection | None,
        group: str,
        topic: str,
        queue_id: int,
        start: int,
        pop_time: int,
        offset: int,
    ) -> AckResult:
        b = self.broker
        outcome, _ = b.pop_state.ack(group, topic, queue_id, start, pop_time, offset)
        if outcome is AckResult.ACKED:
            self._commit(conn, (group, topic, queue_id))
            self._emit_acked(conn, group, topic, queue_id, offset, pop_time)
        return outcome

    def _emit_acked(
        self, conn: Connection | None, group: str, topic: str, queue_id: int, offset: int, pop_time: int
    ) -> None:
        b = self.broker
        b.log.emit(
            "message_acked",
            group=group,
            client_id=_client_id(conn, group),
            topic=topic,
            broker=b.config.broker_name,
            queue_id=queue_id,
            queue_offset=offset,
            pop_time=pop_time,
        )

    def _ack_orderly(
        self, conn: Connection, group: str, topic: str, queue_id: int, offset: int, pop_time: int
    ) -> None:
        b = self.broker
        old = b.offset_manager.query_offset(group, topic, queue_id)
        if offset < old:
            return  # acked before
        key: QueueKey = (group, topic, queue_id)
        nxt = b.pop_state.ack_order(key, offset, pop_time)
        if nxt == -1:
            raise CommandError(
                ResponseCode.MESSAGE_ILLEGAL,
                f"offset is illegal, key:{topic}@{group}@{queue_id}, old:{old}, commit:{offset}, next:{nxt}",
            )
        if nxt < 0:
            return  # a receipt of an older pop of this queue: nothing to do (RocketMQ answers SUCCESS)
        b.commit_offset(conn, group, topic, queue_id, nxt)
        self._emit_acked(conn, group, topic, queue_id, offset, pop_time)
        if not b.pop_state.check_block(key, None, b.clock.now_ms()):
            b.pop_polling.notify(topic, queue_id, group)

    async def batch_ack_message(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        body = cmd.body_map()
        acks = field_list(body, "acks", "body", [])
        if not acks:
            raise CommandError(ResponseCode.NO_MESSAGE, "no ack in body.acks")
        b = self.broker
        for i, ack in enumerate(acks):
            where = f"body.acks[{i}]"
            group = field_str(ack, "c", where)
            retry = field_str(ack, "r", where, "0")
            try:
                topic = real_topic(field_str(ack, "t", where), group, retry)
            except ValueError as exc:
                raise InvalidParameter(f"{where}.r", str(exc)) from None
            start = field_int(ack, "so", where)
            queue_id = field_int(ack, "q", where)
            revive_qid = field_int(ack, "rq", where)
            pop_time = field_int(ack, "pt", where)
            bits = field_list(ack, "b", where)
            if not all(isinstance(x, int) and not isinstance(x, bool) and 0 <= x < 1 << 20 for x in bits):
                raise InvalidParameter(f"{where}.b", "must be a list of bit indices (offset - startOffset)")
            lo, hi = b.store.get_min_offset(topic, queue_id), b.store.get_max_offset(topic, queue_id)
            for bit in sorted(set(bits)):
                offset = start + bit
                if offset < lo or offset > hi:
                    continue
                if revive_qid == POP_ORDER_REVIVE_QUEUE:
                    self._ack_orderly(conn, group, topic, queue_id, offset, pop_time)
                else:
                    self._ack(conn, group, topic, queue_id, start, pop_time, offset)
        return cmd.response(ResponseCode.SUCCESS)

    # -- CHANGE_MESSAGE_INVISIBLETIME -------------------------------------------------------------------
    async def change_invisible_time(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        group = ext_name(cmd, "consumerGroup")
        topic = ext_name(cmd, "topic")
        queue_id = cmd.ext_int32("queueId")
        offset = cmd.ext_int("offset")
        invisible_time = cmd.ext_int("invisibleTime")
        receipt = self._receipt(cmd)
        if invisible_time < 0:
            raise InvalidParameter("invisibleTime", f"must be >= 0 ms, got {invisible_time}")
        self._check_queue_offset(topic, queue_id, offset, exclusive_max=True)
        b = self.broker
        now = b.clock.now_ms()
        if receipt.is_order:
            key: QueueKey = (group, topic, queue_id)
            if offset >= b.offset_manager.query_offset(group, topic, queue_id):
                b.pop_state.change_order_invisible_time(key, offset, now + invisible_time)
            new = ExtraInfo(
                receipt.ck_queue_offset,
                receipt.pop_time,
                now + invisible_time - receipt.pop_time,
                receipt.revive_qid,
                receipt.retry,
                receipt.broker_name,
                queue_id,
                offset,
            )
        else:
            ck = b.pop_state.find(group, topic, queue_id, receipt.ck_queue_offset, receipt.pop_time)
            if ck is None or offset not in ck.offsets or offset in ck.acked:
                raise CommandError(
                    ResponseCode.NO_MESSAGE,
                    f"no message in flight for this receipt (group {group}, {topic}@{queue_id}, "
                    f"offset {offset}, popped at {receipt.pop_time}): acked, revived, or never popped",
                )
            # appendCheckPointThenAckOrigin: a new one-message checkpoint from now, then ack the old one
            revive_qid = receipt.revive_qid
            while b.pop_state.find(group, topic, queue_id, offset, now) is not None:
                now += 1  # a checkpoint is named by its pop time: two in one millisecond need two names
            new_ck = PopCheckPoint(
                group,
                topic,
                queue_id,
                offset,
                now,
                invisible_time,
                revive_qid,
                b.config.broker_name,
                (offset,),
            )
            b.pop_state.add_checkpoint(new_ck, 0)
            b.pop_state.ack(group, topic, queue_id, receipt.ck_queue_offset, receipt.pop_time, offset)
            self._commit(conn, (group, topic, queue_id))
            new = ExtraInfo(
                offset, now, invisible_time, revive_qid, receipt.retry, receipt.broker_name, queue_id, offset
            )
        b.log.emit(
            "invisible_time_changed",
            group=group,
            client_id=_client_id(conn, group),
            topic=topic,
            broker=b.config.broker_name,
            queue_id=queue_id,
            queue_offset=offset,
            invisible_until=now + invisible_time,
            receipt=new.build(),
        )
        return cmd.response(
            ResponseCode.SUCCESS,
            ext={
                "popTime": new.pop_time,
                "invisibleTime": new.invisible_time,
                "reviveQid": new.revive_qid,
                "extraInfo": new.build(),
            },
        )

    # -- revive ---------------------------------------------------------------------------------------
    async def revive(self) -> int:
        """PopReviveService: every checkpoint past its revive time puts its unacked messages into the pop
        retry topic (one more reconsume time) and closes. Returns the number of messages revived."""
        b = self.broker
        revived = 0
        for ck in b.pop_state.due(b.clock.now_ms(), b.config.scaled(REVIVE_DELAY_MS)):
            if b.pop_state.find(*ck.key) is not ck:
                continue  # acked meanwhile
            for offset in ck.unacked():
                msg = b.store.lookup(ck.topic, ck.queue_id, offset)
                if msg is None:
                    continue  # no longer in the store
                await self._revive_one(ck, msg)
                revived += 1
            b.pop_state.revived(ck)
            self._commit(None, (ck.group, ck.topic, ck.queue_id))
        return revived

    async def _revive_one(self, ck: PopCheckPoint, msg: StoredMessage) -> None:
        b = self.broker
        origin_topic = msg.properties.get(PROPERTY_RETRY_TOPIC) or ck.topic
        target = ck.topic if ck.topic.startswith("%RETRY%") else pop_retry_topic(ck.topic, ck.group)
        props = dict(msg.properties)
        props.pop(PROPERTY_POP_CK, None)
        props.setdefault(PROPERTY_RETRY_TOPIC, origin_topic)
        props[PROPERTY_ORIGIN_MESSAGE_ID] = msg.properties.get(PROPERTY_ORIGIN_MESSAGE_ID) or msg.msg_id
        if msg.reconsume_times == 0 or PROPERTY_FIRST_POP_TIME not in props:
            props[PROPERTY_FIRST_POP_TIME] = str(ck.pop_time)
        if b.topic_manager.select(target) is None:
            tc, created = b.topic_manager.create_retry_topic(
                target.removeprefix("%RETRY%"), b.config.retry_queue_nums
            )
            if created:
                b.topic_created(tc)
        draft = MessageDraft(
            target,
            0,
            msg.body,
            msg.tags,
            msg.keys,
            msg.born_timestamp,
            msg.reconsume_times + 1,
            props,
        )
        stored = await b.store.put_message(draft)
        b.log.emit(
            "message_revived",
            group=ck.group,
            msg_id=props[PROPERTY_ORIGIN_MESSAGE_ID],
            topic=ck.topic,
            broker=b.config.broker_name,
            queue_id=ck.queue_id,
            queue_offset=msg.queue_offset,
            retry_topic=target,
            retry_offset=stored.queue_offset,
            reconsume_times=msg.reconsume_times + 1,
            pop_time=ck.pop_time,
            invisible_until=ck.revive_time,
        )


def _client_id(conn: Connection | None, group: str) -> str:
    if conn is None:
        return ""
    return conn.attrs.get(ATTR_GROUPS, {}).get(group) or conn.attrs.get(ATTR_CLIENT_ID) or conn.remote_addr
