"""HEART_BEAT, UNREGISTER_CLIENT, GET_CONSUMER_LIST_BY_GROUP, GET_CONSUMER_CONNECTION_LIST
(RocketMQ's ClientManageProcessor and the consumer-list part of ConsumerManageProcessor)."""

from __future__ import annotations

from rmqlab.broker.consumer_manager import ClientChannelInfo
from rmqlab.broker.processor.common import (
    MAX_GROUPS_PER_HEARTBEAT,
    MAX_SUBSCRIPTIONS_PER_GROUP,
    YIELD_EVERY,
    check_count,
    ext_name,
    group_name_problem,
    yield_now,
)
from rmqlab.broker.processor.services import ATTR_CLIENT_ID, ATTR_GROUPS, BrokerServices, Handler
from rmqlab.protocol.codes import RequestCode, ResponseCode
from rmqlab.protocol.command import CommandError, InvalidParameter, RemotingCommand
from rmqlab.protocol.model import HeartbeatData
from rmqlab.protocol.remoting import Connection

_ATTR_LAST_HEARTBEAT = "last_heartbeat"


def parse_heartbeat(body: dict) -> HeartbeatData:
    check_count(body.get("consumerDataSet"), MAX_GROUPS_PER_HEARTBEAT, "consumerDataSet")
    check_count(body.get("producerDataSet"), MAX_GROUPS_PER_HEARTBEAT, "producerDataSet")
    consumers = body.get("consumerDataSet")
    for i, cd in enumerate(consumers if isinstance(consumers, list) else ()):
        if isinstance(cd, dict):
            subs = cd.get("subscriptionDataSet")
            check_count(subs, MAX_SUBSCRIPTIONS_PER_GROUP, f"consumerDataSet[{i}].subscriptionDataSet")
    hb = HeartbeatData.from_wire(body)
    if not hb.client_id:
        raise InvalidParameter("clientID", "is empty")
    for i, cd in enumerate(hb.consumer_data_set):
        if (problem := group_name_problem(cd.group_name)) is not None:
            raise InvalidParameter(f"consumerDataSet[{i}].groupName", problem)
    for i, pd in enumerate(hb.producer_data_set):
        if (problem := group_name_problem(pd.group_name)) is not None:
            raise InvalidParameter(f"producerDataSet[{i}].groupName", problem)
    return hb


class ClientManageProcessor:
    """HEART_BEAT, UNREGISTER_CLIENT, and a group's consumer list and connections."""

    def __init__(self, broker: BrokerServices) -> None:
        self.broker = broker

    def handlers(self) -> dict[int, Handler]:
        return {
            RequestCode.HEART_BEAT: self.heart_beat,
            RequestCode.UNREGISTER_CLIENT: self.unregister_client,
            RequestCode.GET_CONSUMER_LIST_BY_GROUP: self.get_consumer_list_by_group,
            RequestCode.GET_CONSUMER_CONNECTION_LIST: self.get_consumer_connection_list,
        }

    async def heart_beat(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        body = cmd.body_map()
        # A client sends the same heartbeat again and again: reuse the parse of an identical body.
        cached = conn.attrs.get(_ATTR_LAST_HEARTBEAT)
        if cached is not None and cached[0] == body:
            hb = cached[1]
        else:
            hb = parse_heartbeat(body)
            conn.attrs[_ATTR_LAST_HEARTBEAT] = (body, hb)
        b = self.broker
        now = b.clock.monotonic_ms()
        wall = b.clock.now_ms()
        conn.attrs[ATTR_CLIENT_ID] = hb.client_id
        groups: dict[str, str] = conn.attrs.setdefault(ATTR_GROUPS, {})
        for n, cd in enumerate(hb.consumer_data_set, 1):
            if n % YIELD_EVERY == 0:
                await yield_now()
                if conn.closed:
                    return cmd.response()
            group = cd.group_name
            tc, created = b.topic_manager.create_retry_topic(group, b.config.retry_queue_nums)
            if created:
                b.topic_created(tc, conn)
            info = ClientChannelInfo(conn.id, hb.client_id, conn.remote_addr, now, wall)
            r = b.consumer_manager.register_consumer(
                group,
                info,
                cd.consume_type,
                cd.message_model,
                cd.consume_from_where,
                cd.subscription_data_set,
            )
            groups[group] = hb.client_id
            if r.replaced_client_id is not None:
                b.consumer_ids_listener.consumer_unregistered(
                    group, r.replaced_client_id, "replaced", conn.remote_addr
                )
            if r.new_channel or r.replaced_client_id is not None:
                b.log.emit(
                    "consumer_registered",
                    group=group,
                    client_id=hb.client_id,
                    client_addr=conn.remote_addr,
                    topics=sorted(s.topic for s in cd.subscription_data_set),
                    message_model=str(cd.message_model),
                    consume_type=str(cd.consume_type),
                )
            if r.inconsistency is not None:
                inc = r.inconsistency
                b.log.emit(
                    "subscription_inconsistent",
                    group=group,
                    client_id=inc.client_id,
                    topics=inc.topics,
                    previous_topics=inc.previous_topics,
                    other_client_id=inc.other_client_id,
                    other_topics=inc.other_topics,
                )
                b.log.warning(
                    "consumers of one group subscribe to different topics; the last heartbeat wins",
                    group=group,
                    client_id=inc.client_id,
                    topics=inc.topics,
                    previous_topics=inc.previous_topics,
                )
            if r.changed:
                cause = "register" if r.new_channel else "subscription_changed"
                b.consumer_ids_listener.notify_group(group, cause)
        for pd in hb.producer_data_set:
            b.producer_manager.register_producer(
                pd.group_name, ClientChannelInfo(conn.id, hb.client_id, conn.remote_addr, now, wall)
            )
        return cmd.response()

    async def unregister_client(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        client_id = ext_name(cmd, "clientID")
        consumer_group = cmd.ext_str("consumerGroup", None)
        producer_group = cmd.ext_str("producerGroup", None)
        if not consumer_group and not producer_group:
            raise InvalidParameter("consumerGroup", "missing (give consumerGroup and/or producerGroup)")
        b = self.broker
        if producer_group:
            b.producer_manager.unregister_producer(producer_group, conn.id)
        if consumer_group:
            removed = b.consumer_manager.unregister_consumer(consumer_group, conn.id)
            conn.attrs.get(ATTR_GROUPS, {}).pop(consumer_group, None)
            if removed is not None:
                b.consumer_ids_listener.consumer_unregistered(
                    consumer_group,
                    removed.client_id,
                    "unregister",
                    conn.remote_addr,
                    request_client_id=client_id,
                )
            b.consumer_ids_listener.notify_group(consumer_group, "unregister")
            b.forget_group(consumer_group)
        return cmd.response()

    def get_consumer_list_by_group(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        group = ext_name(cmd, "consumerGroup")
        gi = self.broker.consumer_manager.find(group)
        if gi is None or not gi.channels:
            raise CommandError(ResponseCode.SYSTEM_ERROR, f"no consumer for this group, {group}")
        return cmd.response(body={"consumerIdList": gi.client_ids()})

    async def get_consumer_connection_list(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        group = ext_name(cmd, "consumerGroup")
        gi = self.broker.consumer_manager.find(group)
        if gi is None or not gi.channels:
            raise CommandError(ResponseCode.CONSUMER_NOT_ONLINE, f"the consumer group[{group}] not online")
        body = {
            "connectionSet": [
                {
                    "clientId": c.client_id,
                    "clientAddr": c.client_addr,
                    "lastUpdateTimestamp": c.last_update_wall_ms,
                }
                for c in gi.channels.values()
            ],
            "subscriptionTable": {t: s.to_wire() for t, s in gi.subscription_table.items()},
            "consumeType": str(gi.consume_type),
            "messageModel": str(gi.message_model),
            "consumeFromWhere": str(gi.consume_from_where),
        }
        return cmd.response(body=body)
