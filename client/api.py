"""MQClientAPI: one async method per RPC the clients make (PROTOCOL.md field names and codes).

Each method builds the request, invokes it over the shared RemotingClient and turns the answer into a
value or an exception (MQBrokerError for error codes; RemotingError subclasses for transport failures),
as RocketMQ's MQClientAPIImpl does.
"""

from __future__ import annotations

from collections.abc import Awaitable, Iterable
from dataclasses import dataclass, field
from typing import Any

from rmqlab.client.errors import MQBrokerError, OffsetNotFoundError
from rmqlab.client.pull_core import PullStatus, pull_status
from rmqlab.protocol.codes import RequestCode, ResponseCode
from rmqlab.protocol.command import RemotingCommand, field_int, field_list, field_str
from rmqlab.protocol.model import HeartbeatData, Message, MessageModel, MessageQueue, is_retry_topic
from rmqlab.protocol.remoting import RemotingClient
from rmqlab.protocol.route import TopicRouteData

# PullSysFlag bits
FLAG_COMMIT_OFFSET = 0x1
FLAG_SUSPEND = 0x2
FLAG_SUBSCRIPTION = 0x4
_STR_ONLY = frozenset({str})
_CHECKED_LISTS = 4  # consumer lists remembered per group as checked


@dataclass(slots=True)
class PullResult:
    """A PULL_MESSAGE answer: RocketMQ's PullStatus, the next offset, the queue's bounds and the messages."""

    status: PullStatus
    next_begin_offset: int
    min_offset: int
    max_offset: int
    messages: list[Message] = field(default_factory=list)
    suggest_which_broker_id: int = 0


_SEND_STATUS = {
    ResponseCode.SUCCESS: "SEND_OK",
    ResponseCode.FLUSH_SLAVE_TIMEOUT: "FLUSH_SLAVE_TIMEOUT",
    ResponseCode.SLAVE_NOT_AVAILABLE: "SLAVE_NOT_AVAILABLE",
}


@dataclass(frozen=True, slots=True)
class SendResult:
    """RocketMQ's SendResult: SEND_OK, or FLUSH_SLAVE_TIMEOUT / SLAVE_NOT_AVAILABLE from a SYNC_MASTER
    that stored the message but could not see it on a slave in time."""

    send_status: str
    msg_id: str
    message_queue: MessageQueue
    queue_offset: int

    @property
    def broker_name(self) -> str:
        return self.message_queue.broker_name

    @property
    def queue_id(self) -> int:
        return self.message_queue.queue_id


def _check(resp: RemotingCommand, addr: str) -> RemotingCommand:
    if resp.code != ResponseCode.SUCCESS:
        raise MQBrokerError(resp.code, resp.remark, addr)
    return resp


class MQClientAPI:
    """The client's requests to brokers and name servers (RocketMQ's MQClientAPIImpl), one per code."""

    def __init__(self, remoting: RemotingClient) -> None:
        self.remoting = remoting
        # per group, copies of the last consumer lists found to hold only strings, newest first (see
        # get_consumer_id_list): each broker lists the members in its own order, and a round asks one of
        # them at random
        self._checked_consumer_ids: dict[str, list[list[str]]] = {}

    async def _invoke(self, addr: str, cmd: RemotingCommand, timeout_s: float) -> RemotingCommand:
        return await self.remoting.invoke(addr, cmd, timeout_s)

    # -- name server ----------------------------------------------------------------------------------
    async def get_topic_route(self, namesrv: str, topic: str, timeout_s: float) -> TopicRouteData | None:
        """None when the name server does not know the topic (TOPIC_NOT_EXIST)."""
        cmd = RemotingCommand.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": topic})
        resp = await self._invoke(namesrv, cmd, timeout_s)
        if resp.code == ResponseCode.TOPIC_NOT_EXIST:
            return None
        _check(resp, namesrv)
        return TopicRouteData.from_wire(resp.body)

    # -- membership -----------------------------------------------------------------------------------
    async def send_heartbeat(self, addr: str, hb: HeartbeatData, timeout_s: float) -> None:
        cmd = RemotingCommand.request(RequestCode.HEART_BEAT, body=hb.to_wire())
        _check(await self._invoke(addr, cmd, timeout_s), addr)

    async def unregister_client(
        self,
        addr: str,
        client_id: str,
        *,
        producer_group: str | None = None,
        consumer_group: str | None = None,
        timeout_s: float,
    ) -> None:
        ext: dict[str, Any] = {"clientID": client_id}
        if producer_group is not None:
            ext["producerGroup"] = producer_group
        if consumer_group is not None:
            ext["consumerGroup"] = consumer_group
        cmd = RemotingCommand.request(RequestCode.UNREGISTER_CLIENT, ext)
        _check(await self._invoke(addr, cmd, timeout_s), addr)

    async def get_consumer_id_list(self, addr: str, group: str, timeout_s: float) -> list[str]:
        cmd = RemotingCommand.request(RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": group})
        resp = _check(await self._invoke(addr, cmd, timeout_s), addr)
        if not isinstance(resp.body, dict):
            raise MQBrokerError(ResponseCode.SYSTEM_ERROR, "consumer list response without a body", addr)
        ids = field_list(resp.body, "consumerIdList", "body")
        # Nothing msgpack decodes equals a string but a string, so an answer equal to one checked before
        # is all strings: comparing the two costs less than looking at each type, and every member asks
        # every 20 s and after every NOTIFY (at 1,000 members, lists of 1,000 ids, mostly unchanged).
        checked = self._checked_consumer_ids.get(group)
        if checked is None:
            checked = self._checked_consumer_ids[group] = []
        for known in checked:  # (an unequal list differs in its length or within its first few ids)
            if ids == known:
                return ids
        if _STR_ONLY.issuperset(map(type, ids)):  # checked in C without a set made
            checked.insert(0, ids.copy())
            del checked[_CHECKED_LISTS:]
            return ids
        return [c for c in ids if isinstance(c, str)]

    # -- offsets --------------------------------------------------------------------------------------
    async def query_consumer_offset(self, addr: str, group: str, mq: MessageQueue, timeout_s: float) -> int:
        ext = {"consumerGroup": group, "topic": mq.topic, "queueId": mq.queue_id}
        resp = await self._invoke(
            addr, RemotingCommand.request(RequestCode.QUERY_CONSUMER_OFFSET, ext), timeout_s
        )
        if resp.code == ResponseCode.QUERY_NOT_FOUND:
            raise OffsetNotFoundError(resp.remark, addr)
        _check(resp, addr)
        return field_int(resp.ext, "offset", "ext")

    def update_consumer_offset_oneway(
        self, addr: str, group: str, mq: MessageQueue, offset: int
    ) -> Awaitable[None] | None:
        """One-way, and without a coroutine while the connection is open and takes the write: None once
        written, otherwise what is left to await (``RemotingClient.send_oneway``). persistAll sends one
        per held queue every 5 s, thousands a second in a large simulated group."""
        ext = {"consumerGroup": group, "topic": mq.topic, "queueId": mq.queue_id, "commitOffset": offset}
        return self.remoting.send_oneway(
            addr, RemotingCommand.request(RequestCode.UPDATE_CONSUMER_OFFSET, ext)
        )

    async def get_max_offset(self, addr: str, mq: MessageQueue, timeout_s: float) -> int:
        ext = {"topic": mq.topic, "queueId": mq.queue_id}
        resp = _check(
            await self._invoke(addr, RemotingCommand.request(RequestCode.GET_MAX_OFFSET, ext), timeout_s),
            addr,
        )
        return field_int(resp.ext, "offset", "ext")

    async def search_offset(self, addr: str, mq: MessageQueue, timestamp_ms: int, timeout_s: float) -> int:
        ext = {"topic": mq.topic, "queueId": mq.queue_id, "timestamp": timestamp_ms}
        cmd = RemotingCommand.request(RequestCode.SEARCH_OFFSET_BY_TIMESTAMP, ext)
        resp = _check(await self._invoke(addr, cmd, timeout_s), addr)
        return field_int(resp.ext, "offset", "ext")

    # -- pull -----------------------------------------------------------------------------------------
    async def pull_message(
        self,
        addr: str,
        *,
        group: str,
        mq: MessageQueue,
        queue_offset: int,
        max_msg_nums: int,
        sys_flag: int,
        commit_offset: int,
        suspend_timeout_ms: int,
        subscription: str | None,
        sub_version: int,
        timeout_s: float,
        asynchronous: bool = False,
    ) -> PullResult:
        """``asynchronous``: the push consumer's CommunicationMode.ASYNC, whose timeout leaves the
        connection open; the lite pull consumer pulls synchronously (a timeout closes it)."""
        ext: dict[str, Any] = {
            "consumerGroup": group,
            "topic": mq.topic,
            "queueId": mq.queue_id,
            "queueOffset": queue_offset,
            "maxMsgNums": max_msg_nums,
            "sysFlag": sys_flag,
            "commitOffset": commit_offset,
            "suspendTimeoutMillis": suspend_timeout_ms,
            "subVersion": sub_version,
            "expressionType": "TAG",
        }
        if subscription is not None:
            ext["subscription"] = subscription
        cmd = RemotingCommand.request(RequestCode.PULL_MESSAGE, ext)
        if asynchronous:
            resp = await self.remoting.invoke_async(addr, cmd, timeout_s)
        else:
            resp = await self._invoke(addr, cmd, timeout_s)
        status = pull_status(resp.code)
        if status is None:
            raise MQBrokerError(resp.code, resp.remark, addr)
        msgs: list[Message] = []
        if status is PullStatus.FOUND and isinstance(resp.body, dict):
            for i, raw in enumerate(field_list(resp.body, "messages", "body", [])):
                if isinstance(raw, dict) and "brokerName" not in raw:
                    # a native record names no broker: the queue pulled does (processPullResult)
                    raw = {**raw, "brokerName": mq.broker_name}
                msgs.append(Message.from_wire(raw, f"body.messages[{i}]"))
        return PullResult(
            status,
            field_int(resp.ext, "nextBeginOffset", "ext"),
            field_int(resp.ext, "minOffset", "ext", 0),
            field_int(resp.ext, "maxOffset", "ext", 0),
            msgs,
            field_int(resp.ext, "suggestWhichBrokerId", "ext", 0),
        )

    # -- orderly locks --------------------------------------------------------------------------------
    @staticmethod
    def _lock_body(group: str, client_id: str, mqs: Iterable[MessageQueue]) -> dict[str, Any]:
        return {
            "consumerGroup": group,
            "clientId": client_id,
            "onlyThisBroker": False,
            "mqSet": [mq.to_wire() for mq in sorted(mqs)],
        }

    async def lock_batch_mq(
        self, addr: str, group: str, client_id: str, mqs: Iterable[MessageQueue], timeout_s: float
    ) -> set[MessageQueue]:
        cmd = RemotingCommand.request(RequestCode.LOCK_BATCH_MQ, body=self._lock_body(group, client_id, mqs))
        resp = _check(await self._invoke(addr, cmd, timeout_s), addr)
        if not isinstance(resp.body, dict):
            return set()
        return {
            MessageQueue.from_wire(raw, f"body.lockOKMQSet[{i}]")
            for i, raw in enumerate(field_list(resp.body, "lockOKMQSet", "body", []))
        }

    async def unlock_batch_mq(
        self,
        addr: str,
        group: str,
        client_id: str,
        mqs: Iterable[MessageQueue],
        timeout_s: float,
        *,
        oneway: bool,
    ) -> None:
        body = self._lock_body(group, client_id, mqs)
        if oneway:
            await self.remoting.invoke_oneway(
                addr, RemotingCommand.request(RequestCode.UNLOCK_BATCH_MQ, body=body)
            )
            return
        cmd = RemotingCommand.request(RequestCode.UNLOCK_BATCH_MQ, body=body)
        _check(await self._invoke(addr, cmd, timeout_s), addr)

    # -- consume results ------------------------------------------------------------------------------
    async def consumer_send_msg_back(
        self,
        addr: str,
        msg: Message,
        group: str,
        delay_level: int,
        max_reconsume_times: int,
        timeout_s: float,
    ) -> None:
        ext = {
            "group": group,
            "originTopic": msg.topic,
            "queueId": msg.queue_id,
            "offset": msg.queue_offset,
            "originMsgId": msg.msg_id,
            "delayLevel": delay_level,
            "maxReconsumeTimes": max_reconsume_times,
        }
        if msg.commit_log_offset is not None:
            ext["commitLogOffset"] = msg.commit_log_offset  # for the native codec, which sends it
        cmd = RemotingCommand.request(RequestCode.CONSUMER_SEND_MSG_BACK, ext)
        _check(await self._invoke(addr, cmd, timeout_s), addr)

    # -- produce --------------------------------------------------------------------------------------
    async def send_message(
        self,
        addr: str,
        *,
        producer_group: str,
        mq: MessageQueue,
        body: bytes,
        tags: str | None,
        keys: str | None,
        properties: dict[str, str] | None,
        born_timestamp: int,
        timeout_s: float,
    ) -> SendResult:
        ext: dict[str, Any] = {
            "producerGroup": producer_group,
            "topic": mq.topic,
            "queueId": mq.queue_id,
            "bornTimestamp": born_timestamp,
        }
        if tags is not None:
            ext["tags"] = tags
        if keys is not None:
            ext["keys"] = keys
        props = dict(properties or {})
        if is_retry_topic(mq.topic):
            # sendKernelImpl: a retry message's counters travel in the header, not as properties
            headers = (("RECONSUME_TIME", "reconsumeTimes"), ("MAX_RECONSUME_TIMES", "maxReconsumeTimes"))
            for prop, header in headers:
                raw = props.pop(prop, None)
                if raw is not None:
                    ext[header] = int(raw)
        payload: dict[str, Any] = {"body": body}
        if props:
            payload["properties"] = props
        cmd = RemotingCommand.request(RequestCode.SEND_MESSAGE, ext, payload)
        resp = await self._invoke(addr, cmd, timeout_s)
        # processSendResponse: a SYNC_MASTER's stored-but-not-copied answers are results, not errors
        status = _SEND_STATUS.get(resp.code)
        if status is None:
            raise MQBrokerError(resp.code, resp.remark, addr)
        queue_id = field_int(resp.ext, "queueId", "ext", mq.queue_id)
        return SendResult(
            status,
            field_str(resp.ext, "msgId", "ext"),
            MessageQueue(mq.topic, mq.broker_name, queue_id),
            field_int(resp.ext, "queueOffset", "ext"),
        )


@dataclass(slots=True)
class PopResult:
    """A POP_MESSAGE answer (RocketMQ's PopResult): FOUND with messages, or nothing within the poll time."""

    status: str  # FOUND, POLLING_NOT_FOUND or POLLING_FULL
    pop_time: int
    invisible_time: int
    rest_num: int
    messages: list[Message] = field(default_factory=list)


class PopClientAPI:
    """The RocketMQ 5 calls of MQClientAPIImpl: queryAssignment, popMessageAsync, ackMessageAsync and
    changeInvisibleTimeAsync."""

    def __init__(self, remoting: RemotingClient) -> None:
        self.remoting = remoting

    async def query_assignment(
        self,
        addr: str,
        *,
        topic: str,
        group: str,
        client_id: str,
        strategy_name: str,
        message_model: MessageModel,
        timeout_s: float,
    ) -> list[tuple[MessageQueue, str]] | None:
        """(queue, mode) pairs, or None when the broker has no valid answer."""
        body = {
            "topic": topic,
            "consumerGroup": group,
            "clientId": client_id,
            "strategyName": strategy_name,
            "messageModel": str(message_model),
        }
        cmd = RemotingCommand.request(RequestCode.QUERY_ASSIGNMENT, body=body)
        resp = _check(await self.remoting.invoke(addr, cmd, timeout_s), addr)
        raw = resp.body.get("messageQueueAssignments") if isinstance(resp.body, dict) else None
        if raw is None:
            return None
        out: list[tuple[MessageQueue, str]] = []
        for i, a in enumerate(raw if isinstance(raw, list) else []):
            where = f"body.messageQueueAssignments[{i}]"
            mq = MessageQueue.from_wire(a.get("messageQueue") if isinstance(a, dict) else None, where)
            out.append((mq, field_str(a, "mode", where, "PULL")))
        return out

    async def pop_message(
        self,
        addr: str,
        *,
        group: str,
        mq: MessageQueue,
        invisible_time: int,
        max_nums: int,
        poll_time: int,
        born_time: int,
        init_mode: int,
        expression: str | None,
        timeout_s: float,
    ) -> PopResult:
        ext: dict[str, Any] = {
            "consumerGroup": group,
            "topic": mq.topic,
            "queueId": mq.queue_id,
            "maxMsgNums": max_nums,
            "invisibleTime": invisible_time,
            "pollTime": poll_time,
            "bornTime": born_time,
            "initMode": init_mode,
            "expType": "TAG",
            "order": False,
        }
        if expression is not None:
            ext["exp"] = expression
        resp = await self.remoting.invoke_async(
            addr, RemotingCommand.request(RequestCode.POP_MESSAGE, ext), timeout_s
        )
        status = {
            ResponseCode.SUCCESS: "FOUND",
            ResponseCode.POLLING_TIMEOUT: "POLLING_NOT_FOUND",
            ResponseCode.PULL_NOT_FOUND: "POLLING_NOT_FOUND",
            ResponseCode.POLLING_FULL: "POLLING_FULL",
        }.get(resp.code)
        if status is None:
            raise MQBrokerError(resp.code, resp.remark, addr)
        msgs: list[Message] = []
        if status == "FOUND" and isinstance(resp.body, dict):
            for i, raw in enumerate(field_list(resp.body, "messages", "body", [])):
                if isinstance(raw, dict) and "brokerName" not in raw:
                    raw = {**raw, "brokerName": mq.broker_name}  # as a pull's (see pull_message)
                msgs.append(Message.from_wire(raw, f"body.messages[{i}]"))
        return PopResult(
            status,
            field_int(resp.ext, "popTime", "ext", 0),
            field_int(resp.ext, "invisibleTime", "ext", invisible_time),
            field_int(resp.ext, "restNum", "ext", 0),
            msgs,
        )

    async def ack_message(
        self,
        addr: str,
        *,
        group: str,
        topic: str,
        queue_id: int,
        offset: int,
        extra_info: str,
        timeout_s: float,
    ) -> None:
        ext = {
            "consumerGroup": group,
            "topic": topic,
            "queueId": queue_id,
            "extraInfo": extra_info,
            "offset": offset,
        }
        cmd = RemotingCommand.request(RequestCode.ACK_MESSAGE, ext)
        _check(await self.remoting.invoke_async(addr, cmd, timeout_s), addr)

    async def change_invisible_time(
        self,
        addr: str,
        *,
        group: str,
        topic: str,
        queue_id: int,
        offset: int,
        extra_info: str,
        invisible_time: int,
        timeout_s: float,
    ) -> str:
        """The new receipt."""
        ext = {
            "consumerGroup": group,
            "topic": topic,
            "queueId": queue_id,
            "extraInfo": extra_info,
            "offset": offset,
            "invisibleTime": invisible_time,
        }
        cmd = RemotingCommand.request(RequestCode.CHANGE_MESSAGE_INVISIBLETIME, ext)
        resp = _check(await self.remoting.invoke_async(addr, cmd, timeout_s), addr)
        return str(field_str(resp.ext, "extraInfo", "ext", extra_info))
