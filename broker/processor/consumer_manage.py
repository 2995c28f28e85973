"""QUERY/UPDATE_CONSUMER_OFFSET and LOCK/UNLOCK_BATCH_MQ (RocketMQ's ConsumerManageProcessor and the
lock part of AdminBrokerProcessor)."""

from __future__ import annotations

from rmqlab.broker.offset_manager import resolve_query_offset
from rmqlab.broker.processor.common import (
    MAX_QUEUES_PER_LOCK,
    YIELD_EVERY,
    check_count,
    ext_name,
    ext_queue_id,
    yield_now,
)
from rmqlab.broker.processor.services import ATTR_CLIENT_ID, BrokerServices, Handler
from rmqlab.protocol.codes import RequestCode, ResponseCode
from rmqlab.protocol.command import (
    CommandError,
    InvalidParameter,
    RemotingCommand,
    field_bool,
    field_list,
    field_str,
)
from rmqlab.protocol.model import MessageQueue
from rmqlab.protocol.remoting import Connection


def parse_lock_body(cmd: RemotingCommand) -> tuple[str, str, list[MessageQueue]]:
    body = cmd.body_map()
    group = field_str(body, "consumerGroup", "body")
    client_id = field_str(body, "clientId", "body")
    if not group:
        raise InvalidParameter("body.consumerGroup", "is empty")
    if not client_id:
        raise InvalidParameter("body.clientId", "is empty")
    field_bool(body, "onlyThisBroker", "body", False)
    raw = field_list(body, "mqSet", "body")
    check_count(raw, MAX_QUEUES_PER_LOCK, "body.mqSet")
    mqs = [MessageQueue.from_wire(d, f"body.mqSet[{i}]") for i, d in enumerate(raw)]
    return group, client_id, mqs


def check_lock_owner(conn: Connection, client_id: str) -> None:
    """Only the client registered on this connection (by its heartbeat) may lock or unlock for its id:
    naming another client's id would release or take that client's queues. Stricter than RocketMQ,
    which trusts the clientId in the body; a real client heartbeats on the connection it locks over."""
    registered = conn.attrs.get(ATTR_CLIENT_ID)
    if registered != client_id:
        who = (
            f"the client registered on this connection is {registered}" if registered else "no heartbeat yet"
        )
        raise CommandError(
            ResponseCode.NO_PERMISSION, f"clientId {client_id} may not lock or unlock here: {who}"
        )


def _chunks(mqs: list[MessageQueue]) -> list[list[MessageQueue]]:
    return [mqs[i : i + YIELD_EVERY] for i in range(0, len(mqs), YIELD_EVERY)] or [[]]


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

    def query_consumer_offset(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
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

    def update_consumer_offset(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand | None:
        group = ext_name(cmd, "consumerGroup")
        topic = ext_name(cmd, "topic")
        queue_id = ext_queue_id(cmd)
        offset = cmd.ext_int("commitOffset")
        if offset < 0:
            raise InvalidParameter("commitOffset", f"must be >= 0, got {offset}")
        self.broker.commit_offset(conn, group, topic, queue_id, offset)
        # persistAll sends it one-way (the usual case, each held queue every 5 s), and the remoting
        # layer answers no one-way request: no answer to build and drop
        return None if cmd.is_oneway else cmd.response()

    async def lock_batch_mq(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        group, client_id, mqs = parse_lock_body(cmd)
        check_lock_owner(conn, client_id)
        b = self.broker
        locked: list[MessageQueue] = []
        seen: set[MessageQueue] = set()
        for i, chunk in enumerate(_chunks(mqs)):
            if i:
                await yield_now()
            fresh = [mq for mq in chunk if mq not in seen]
            seen.update(fresh)
            result = b.lock_manager.try_lock_batch(group, fresh, client_id, b.clock.monotonic_ms())
            for mq, previous in result.acquired:
                b.emit_lock("lock_acquired", group, client_id, mq, previous_client_id=previous)
            locked.extend(result.locked)
        return cmd.response(body={"lockOKMQSet": [mq.to_wire() for mq in locked]})

    async def unlock_batch_mq(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        group, client_id, mqs = parse_lock_body(cmd)
        check_lock_owner(conn, client_id)
        b = self.broker
        for i, chunk in enumerate(_chunks(mqs)):
            if i:
                await yield_now()
            for mq in b.lock_manager.unlock_batch(group, chunk, client_id):
                b.emit_lock("lock_released", group, client_id, mq, reason="unlock")
        return cmd.response()
