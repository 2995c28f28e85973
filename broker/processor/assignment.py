"""QUERY_ASSIGNMENT and SET_MESSAGE_REQUEST_MODE (RocketMQ 5's QueryAssignmentProcessor).

The answer is computed by ``broker.assignment.do_load_balance`` from the topic's queue set (the name
server's route, cached by the broker), the group's members on this broker and the (topic, group) mode.
"""

from __future__ import annotations

from rmqlab.broker.assignment import (
    MessageRequestMode,
    RequestMode,
    do_load_balance,
    effective_mode,
    parse_mode,
)
from rmqlab.broker.processor.services import BrokerServices, Handler
from rmqlab.protocol.codes import RequestCode, ResponseCode
from rmqlab.protocol.command import CommandError, InvalidParameter, RemotingCommand, field_int, field_str
from rmqlab.protocol.model import MessageModel, is_retry_topic
from rmqlab.protocol.remoting import Connection


def _non_empty(body: object, name: str) -> str:
    value = field_str(body, name, "body")
    if not value:
        raise InvalidParameter(f"body.{name}", "is empty")
    return value


class QueryAssignmentProcessor:
    """Server-side assignment: which queues a consumer serves, and in which mode."""

    def __init__(self, broker: BrokerServices) -> None:
        self.broker = broker

    def handlers(self) -> dict[int, Handler]:
        return {
            RequestCode.QUERY_ASSIGNMENT: self.query_assignment,
            RequestCode.SET_MESSAGE_REQUEST_MODE: self.set_message_request_mode,
        }

    async def query_assignment(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        body = cmd.body_map()
        topic = _non_empty(body, "topic")
        group = _non_empty(body, "consumerGroup")
        client_id = _non_empty(body, "clientId")
        strategy_name = field_str(body, "strategyName", "body")
        model_name = field_str(body, "messageModel", "body", "CLUSTERING")
        try:
            model = MessageModel(model_name)
        except ValueError:
            raise InvalidParameter(
                "body.messageModel", f"must be CLUSTERING or BROADCASTING, got {model_name!r}"
            ) from None
        b = self.broker
        cfg = b.config
        mode = effective_mode(
            b.request_modes.get(topic, group),
            topic,
            group,
            MessageRequestMode(cfg.default_message_request_mode),
            cfg.default_pop_share_queue_num,
        )
        mq_set = await b.topic_subscribe_info(topic)
        gi = b.consumer_manager.find(group)
        queues = do_load_balance(
            group=group,
            client_id=client_id,
            message_model=model,
            strategy_name=strategy_name,
            mode=mode,
            mq_set=mq_set,
            cid_all=gi.all_client_ids() if gi is not None else None,
            server_load_balancer_enable=cfg.server_load_balancer_enable,
        )
        b.log.emit(
            "assignment_queried",
            group=group,
            client_id=client_id,
            topic=topic,
            strategy=strategy_name,
            mode=mode.mode.value,
            pop_share_queue_num=mode.pop_share_queue_num,
            assigned=None if queues is None else [mq.short for mq in queues],
        )
        assignments = None
        if queues is not None:
            assignments = [
                {"messageQueue": mq.to_wire(), "mode": mode.mode.value, "attachments": {}} for mq in queues
            ]
        return cmd.response(ResponseCode.SUCCESS, body={"messageQueueAssignments": assignments})

    async def set_message_request_mode(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        body = cmd.body_map()
        topic = _non_empty(body, "topic")
        group = _non_empty(body, "consumerGroup")
        try:
            mode = parse_mode(body.get("mode"))
        except ValueError as exc:
            raise InvalidParameter("body.mode", str(exc)) from None
        share = field_int(body, "popShareQueueNum", "body", 0)
        if is_retry_topic(topic):
            raise CommandError(ResponseCode.NO_PERMISSION, "retry topic is not allowed to set mode")
        b = self.broker
        if b.topic_manager.select(topic) is None:
            raise CommandError(ResponseCode.TOPIC_NOT_EXIST, f"topic[{topic}] not exist")
        request_mode = RequestMode(topic, group, mode, share)
        b.request_modes.set(request_mode)
        await b.persist_request_modes()
        b.log.emit(
            "message_request_mode_set", group=group, topic=topic, mode=mode.value, pop_share_queue_num=share
        )
        return cmd.response(ResponseCode.SUCCESS)
