"""PULL_MESSAGE with long polling (RocketMQ's PullMessageProcessor and PullRequestHoldService).

Checks run in PROTOCOL.md's order. A pull that finds nothing new at ``queueOffset`` is held up to
``suspendTimeoutMillis`` (used as sent, not time-scaled). When the hold service wakes it, the whole
request runs again without suspending, checks included (PullMessageProcessor#executeRequestWhenWakeup):
a group or subscription that changed meanwhile answers with its error code.
"""

from __future__ import annotations

import asyncio

from rmqlab.broker.ha_state import (
    BrokerRole,
    slave_offset_moved,
    suggest_pulling_from_slave,
    suggest_which_broker_id,
)
from rmqlab.broker.long_polling import HeldPull
from rmqlab.broker.processor.common import ext_name
from rmqlab.broker.processor.services import ATTR_CLIENT_ID, ATTR_GROUPS, BrokerServices, Handler
from rmqlab.broker.store import GetMessageResult, GetMessageStatus
from rmqlab.protocol.codes import RequestCode, ResponseCode
from rmqlab.protocol.command import CommandError, InvalidParameter, RemotingCommand
from rmqlab.protocol.model import parse_tags
from rmqlab.protocol.remoting import Connection

_STATUS_CODE = {
    GetMessageStatus.FOUND: ResponseCode.SUCCESS,
    GetMessageStatus.NO_MATCHED_MESSAGE: ResponseCode.PULL_RETRY_IMMEDIATELY,
    GetMessageStatus.OFFSET_OVERFLOW_ONE: ResponseCode.PULL_NOT_FOUND,
    GetMessageStatus.OFFSET_MOVED: ResponseCode.PULL_OFFSET_MOVED,
}


class PullMessageProcessor:
    """PULL_MESSAGE, with long polling and the committed offset it may carry."""

    def __init__(self, broker: BrokerServices) -> None:
        self.broker = broker

    def handlers(self) -> dict[int, Handler]:
        return {RequestCode.PULL_MESSAGE: self.pull_message}

    async def pull_message(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        resp = self._process(conn, cmd, allow_suspend=True)
        if isinstance(resp, HeldPull):  # held until woken, then the request again, as if just come in
            try:
                await resp.waiter
            finally:
                self.broker.hold_service.remove(resp)
            resp = self._process(conn, cmd, allow_suspend=False)
            assert not isinstance(resp, HeldPull)
        return resp

    def _process(
        self, conn: Connection, cmd: RemotingCommand, *, allow_suspend: bool
    ) -> RemotingCommand | HeldPull:
        """One run of the request: its answer, or the HeldPull now waiting for messages, which the
        caller awaits (a plain call: most runs answer at once and need no coroutine of their own)."""
        group = ext_name(cmd, "consumerGroup")
        topic = ext_name(cmd, "topic")
        queue_id = cmd.ext_int32("queueId")
        queue_offset = cmd.ext_int("queueOffset")
        max_msg_nums = cmd.ext_int32("maxMsgNums")
        commit_offset = cmd.ext_int("commitOffset", 0)
        suspend_ms = max(0, cmd.ext_int("suspendTimeoutMillis", 0))
        sub_string = cmd.ext_str("subscription", None)
        sub_version = cmd.ext_int("subVersion", 0)
        b = self.broker

        tc = b.topic_manager.select(topic)
        if tc is None:
            raise CommandError(ResponseCode.TOPIC_NOT_EXIST, f"topic[{topic}] not exist, apply first please!")
        if not tc.readable:
            raise CommandError(ResponseCode.NO_PERMISSION, f"the topic[{topic}] pulling message is forbidden")
        if not 0 <= queue_id < tc.read_queue_nums:
            raise InvalidParameter(
                "queueId", f"{queue_id} is outside the topic's read queues [0, {tc.read_queue_nums})"
            )
        if max_msg_nums <= 0:
            raise InvalidParameter("maxMsgNums", f"must be > 0, got {max_msg_nums}")
        gi = b.consumer_manager.find(group)
        if gi is None:
            raise CommandError(
                ResponseCode.SUBSCRIPTION_NOT_EXIST, f"the consumer's group info not exist, group: {group}"
            )
        sd = gi.find_subscription(topic)
        if sd is None:
            raise CommandError(
                ResponseCode.SUBSCRIPTION_NOT_EXIST,
                f"the consumer's subscription not exist, group: {group}, topic: {topic}",
            )
        if sub_version > sd.sub_version:
            raise CommandError(
                ResponseCode.SUBSCRIPTION_NOT_LATEST,
                f"the consumer's subscription not latest, group: {group}, topic: {topic}, "
                f"registered version {sd.sub_version} < {sub_version}",
            )
        tags_set = parse_tags(sub_string) if sub_string is not None else sd.tags_set
        # a woken pull does not commit again, and a slave never commits a pull's offset (4.9.x)
        if commit_offset > 0 and allow_suspend and b.role is not BrokerRole.SLAVE:
            b.commit_offset(conn, group, topic, queue_id, commit_offset)

        cfg = b.config
        count = min(max_msg_nums, cfg.max_transfer_count)
        store = b.store
        result = store.get_message(
            topic, queue_id, queue_offset, count, cfg.max_transfer_bytes, tags_set, cfg.max_filter_scan
        )
        if (
            allow_suspend
            and result.status is GetMessageStatus.OFFSET_OVERFLOW_ONE
            and suspend_ms > 0
            and not conn.closed
        ):
            fut: asyncio.Future[str] = asyncio.get_running_loop().create_future()
            req = HeldPull(
                topic,
                queue_id,
                queue_offset,
                list(tags_set),
                b.clock.monotonic_ms() + suspend_ms,
                conn.id,
                fut,
            )
            b.hold_pull(req)
            return req
        return self._response(conn, cmd, group, topic, queue_id, queue_offset, result)

    def _response(
        self,
        conn: Connection,
        cmd: RemotingCommand,
        group: str,
        topic: str,
        queue_id: int,
        queue_offset: int,
        result: GetMessageResult,
    ) -> RemotingCommand:
        code = _STATUS_CODE[result.status]
        b = self.broker
        cfg = b.config
        slow = False
        if cfg.slave_read_enable and result.messages:
            slow = suggest_pulling_from_slave(
                b.replication_log.max_position,
                result.messages[-1].log_end,
                cfg.access_message_in_memory_max_bytes,
            )
        suggest = suggest_which_broker_id(
            slave_read_enable=cfg.slave_read_enable,
            suggest_pulling_from_slave=slow,
            which_broker_when_consume_slowly=cfg.which_broker_when_consume_slowly,
            group_broker_id=cfg.group_broker_id,
        )
        if (
            code == ResponseCode.PULL_OFFSET_MOVED
            and b.role is BrokerRole.SLAVE
            and slave_offset_moved(cfg.offset_check_in_slave)
        ):
            code = ResponseCode.PULL_RETRY_IMMEDIATELY
            suggest = cfg.group_broker_id
        if b.pull_events:
            # a puller that never sent a heartbeat is named by its address
            client_id = (
                conn.attrs.get(ATTR_GROUPS, {}).get(group)
                or conn.attrs.get(ATTR_CLIENT_ID)
                or conn.remote_addr
            )
            b.log.emit(
                "pull_served",
                group=group,
                client_id=client_id,
                topic=topic,
                broker=b.config.broker_name,
                queue_id=queue_id,
                queue_offset=queue_offset,
                count=len(result.messages),
                code=int(code),
                broker_id=cfg.broker_id,
                suggest_broker_id=suggest,
            )
        if b.metrics is not None and result.messages:
            size = sum(len(m.body) for m in result.messages)
            b.metrics.pulled(topic, group, len(result.messages), size)
        ext = {
            "nextBeginOffset": result.next_begin_offset,
            "minOffset": result.min_offset,
            "maxOffset": result.max_offset,
            "suggestWhichBrokerId": suggest,
        }
        if code == ResponseCode.SUCCESS:
            return cmd.response(code, ext=ext, body={"messages": [m.wire for m in result.messages]})
        return cmd.response(code, ext=ext)
