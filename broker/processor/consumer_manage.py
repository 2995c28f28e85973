"""QUERY/UPDATE_CONSUMER_OFFSET and LOCK/UNLOCK_BATCH_MQ (RocketMQ's ConsumerManageProcessor and the
lock part of AdminBrokerProcessor)."""

from __future__ import annotations

from broker.offset_manager import resolve_query_offset
from broker.processor.common import ext_name, ext_queue_id
from broker.processor.services import BrokerServices, Handler
from protocol.codes import RequestCode, ResponseCode
from protocol.command import (
    CommandError,
    InvalidParameter,
    RemotingCommand,
    field_bool,
    field_list,
    field_str,
)
from protocol.model import MessageQueue
from protocol.remoting import Connection


def parse_lock_body(cmd: RemotingCommand) -> tuple[str, str, list[MessageQueue]]:
    body = cmd.body_map()
    group = field_str(body, "consumerGroup", "body")
    client_id = field_str(body, "clientId", "body")
    if not group:
        raise InvalidParameter("body.consumerGroup", "is empty")
    if not client_id:
        raise InvalidParameter("body.clientId", "is empty")
    field_bool(body, "onlyThisBroker", "body", False)
    mqs = [
        MessageQueue.from_wire(d, f"body.mqSet[{i}]") for i, d in enumerate(field_list(body, "mqSet", "body"))
    ]
    return group, client_id, mqs


class ConsumerManageProcessor:
    """Consumer offsets and the orderly consumers' queue locks."""

    def __init__(self, broker: BrokerServices) -> None:
        self.broker = broker

    def handlers(self) -> dict[int, Handler]:
        return {
            RequestCode.QUERY_CONSUMER_OFFSET: self.query_consumer_offset,
            RequestCode.UPDATE_CONSUMER_OFFSET: self.update_consumer_offset,
            RequestCode.LOCK_BATCH_MQ: self.lock_batch_mq,
            RequestCode.UNLOCK_BATCH_MQ: self.unlock_batch_mq,
        }

    async def query_consumer_offset(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        group = ext_name(cmd, "consumerGroup")
        topic = ext_name(cmd, "topic")
        queue_id = ext_queue_id(cmd)
        set_zero = cmd.ext_bool("setZeroIfNotFound", True)
        b = self.broker
        committed = b.offset_manager.query_offset(group, topic, queue_id)
        offset = resolve_query_offset(
            committed,
            b.store.get_min_offset(topic, queue_id),
            set_zero,
            max_offset=b.store.get_max_offset(topic, queue_id),
            rocketmq5=b.config.rocketmq5,
        )
        if offset is None:
            raise CommandError(
                ResponseCode.QUERY_NOT_FOUND,
                "Not found, V3_0_6_SNAPSHOT maybe this group consumer boot first",
            )
        return cmd.response(ext={"offset": offset})

    async def update_consumer_offset(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        group = ext_name(cmd, "consumerGroup")
        topic = ext_name(cmd, "topic")
        queue_id = ext_queue_id(cmd)
        offset = cmd.ext_int("commitOffset")
        if offset < 0:
            raise InvalidParameter("commitOffset", f"must be >= 0, got {offset}")
        self.broker.commit_offset(conn, group, topic, queue_id, offset)
        return cmd.response()

    async def lock_batch_mq(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        group, client_id, mqs = parse_lock_body(cmd)
        b = self.broker
        result = b.lock_manager.try_lock_batch(group, mqs, client_id, b.clock.monotonic_ms())
        for mq, previous in result.acquired:
            b.emit_lock("lock_acquired", group, client_id, mq, previous_client_id=previous)
        return cmd.response(body={"lockOKMQSet": [mq.to_wire() for mq in result.locked]})

    async def unlock_batch_mq(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        group, client_id, mqs = parse_lock_body(cmd)
        b = self.broker
        for mq in b.lock_manager.unlock_batch(group, mqs, client_id):
            b.emit_lock("lock_released", group, client_id, mq, reason="unlock")
        return cmd.response()
