"""SEND_MESSAGE (and SEND_MESSAGE_V2) and CONSUMER_SEND_MSG_BACK (RocketMQ's SendMessageProcessor)."""

from __future__ import annotations

from typing import Any

from rmqlab.broker.ha_state import BrokerRole
from rmqlab.broker.processor.common import ext_name, ext_queue_id
from rmqlab.broker.processor.services import BrokerServices, Handler
from rmqlab.broker.store import (
    PROPERTY_DELAY_TIME_LEVEL,
    PROPERTY_ORIGIN_MESSAGE_ID,
    PROPERTY_RETRY_TOPIC,
    MessageDraft,
    StoredMessage,
)
from rmqlab.broker.topic_config import TopicConfig, topic_name_problem
from rmqlab.protocol.codes import RequestCode, ResponseCode
from rmqlab.protocol.command import CommandError, InvalidParameter, RemotingCommand, field_map
from rmqlab.protocol.model import JAVA_LONG_MAX as _LONG_MAX
from rmqlab.protocol.model import JAVA_LONG_MIN as _LONG_MIN
from rmqlab.protocol.model import is_retry_topic, retry_topic
from rmqlab.protocol.remoting import Connection


def _delay_level(properties: dict[str, str]) -> int:
    raw = properties.get(PROPERTY_DELAY_TIME_LEVEL)
    if raw is None:
        return 0
    try:
        return int(raw)
    except ValueError:
        where = f"body.properties.{PROPERTY_DELAY_TIME_LEVEL}"
        raise InvalidParameter(where, f"not an int: {raw!r}") from None


def parse_properties(body: dict[str, Any]) -> dict[str, str]:
    props = field_map(body, "properties", "body", {})
    for k, v in props.items():
        if not isinstance(k, str) or not isinstance(v, str):
            raise InvalidParameter(f"body.properties.{k}", "keys and values must be str")
    return dict(props)


class SendMessageProcessor:
    """SEND_MESSAGE and CONSUMER_SEND_MSG_BACK (retry topic, delay levels, DLQ)."""

    def __init__(self, broker: BrokerServices) -> None:
        self.broker = broker

    def handlers(self) -> dict[int, Handler]:
        return {
            RequestCode.SEND_MESSAGE: self.send_message,
            RequestCode.SEND_MESSAGE_V2: self.send_message,
            RequestCode.CONSUMER_SEND_MSG_BACK: self.consumer_send_msg_back,
        }

    def _check_master(self) -> None:
        # DefaultMessageStore#putMessage: a slave stores nothing but what it copies from its master
        if self.broker.role is BrokerRole.SLAVE:
            raise CommandError(
                ResponseCode.SERVICE_NOT_AVAILABLE, "service not available now: this broker is a slave"
            )

    async def send_message(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        self._check_master()
        ext = cmd.ext
        group = ext.get("producerGroup")
        topic = ext.get("topic")
        queue_id = ext.get("queueId")
        born = ext.get("bornTimestamp")
        # The hot path reads well-typed headers directly; anything else takes the typed accessors,
        # which raise INVALID_PARAMETER naming the field.
        if not (
            type(group) is str and group and type(topic) is str and topic
            and type(queue_id) is int and type(born) is int and _LONG_MIN <= born <= _LONG_MAX
        ):  # fmt: skip
            ext_name(cmd, "producerGroup")
            topic = ext_name(cmd, "topic")
            queue_id = cmd.ext_int32("queueId")
            born = cmd.ext_int("bornTimestamp")
        tags = cmd.ext_str("tags", None) if "tags" in ext else None
        keys = cmd.ext_str("keys", None) if "keys" in ext else None
        reconsume_times = cmd.ext_int32("reconsumeTimes", 0) if "reconsumeTimes" in ext else 0
        max_reconsume_times = cmd.ext_int32("maxReconsumeTimes", None) if "maxReconsumeTimes" in ext else None
        body_map = cmd.body_map()
        payload = body_map.get("body")
        if not isinstance(payload, bytes):
            raise InvalidParameter(
                "body.body", "missing" if payload is None else f"expected bin, got {type(payload).__name__}"
            )
        props = body_map.get("properties")
        properties = {} if props is None or props == {} else parse_properties(body_map)
        b = self.broker
        if topic not in b.topic_manager.table and (problem := topic_name_problem(topic)) is not None:
            raise InvalidParameter("topic", problem)
        if len(payload) > b.config.max_message_size:
            raise CommandError(
                ResponseCode.MESSAGE_ILLEGAL,
                f"the message body size {len(payload)} is over the limit {b.config.max_message_size}",
            )
        tc, created = b.topic_manager.create_in_send(topic)
        if tc is None:
            raise CommandError(ResponseCode.TOPIC_NOT_EXIST, f"topic[{topic}] not exist, apply first please!")
        if created:
            b.topic_created(tc, conn)
        if not tc.writeable:
            raise CommandError(ResponseCode.NO_PERMISSION, f"the topic[{topic}] sending message is forbidden")
        if not 0 <= queue_id < tc.write_queue_nums:
            raise InvalidParameter(
                "queueId", f"{queue_id} is outside the topic's write queues [0, {tc.write_queue_nums})"
            )
        if is_retry_topic(topic):
            # handleRetryAndDLQ: a retry message at maxReconsumeTimes goes to the DLQ (4.9.8:
            # reconsumeTimes >= max); RocketMQ 5 sends past max, and sends at once while the group
            # holds queue locks (an orderly group)
            group = topic.removeprefix("%RETRY%")
            limit = (
                b.config.default_max_reconsume_times if max_reconsume_times is None else max_reconsume_times
            )
            if b.config.rocketmq5:
                now = b.clock.monotonic_ms()
                to_dlq = reconsume_times > limit or not b.lock_manager.is_lock_all_expired(group, now)
            else:
                to_dlq = reconsume_times >= limit
            if to_dlq:
                tc = self._dlq(group, conn)
                topic, queue_id = tc.topic_name, 0
        level = _delay_level(properties) if not topic.startswith("%DLQ%") else 0
        if level > 0:
            # CommitLog#putMessage: a delay level parks the message in the schedule topic until due
            draft = b.schedule_service.schedule_draft(
                b.schedule_service.clamp_level(level),
                topic,
                queue_id,
                payload,
                tags=tags,
                keys=keys,
                born_timestamp=born,
                reconsume_times=reconsume_times,
                properties=properties,
            )
        else:
            draft = MessageDraft(topic, queue_id, payload, tags, keys, born, reconsume_times, properties)
        msg = await b.store.put_message(draft)
        # SYNC_MASTER: SUCCESS once a slave holds it, else SLAVE_NOT_AVAILABLE or FLUSH_SLAVE_TIMEOUT,
        # the message stored all the same (handlePutMessageResult's sendOK cases)
        code = await b.wait_replica(msg)
        return cmd.response(
            code, ext={"msgId": msg.msg_id, "queueId": msg.queue_id, "queueOffset": msg.queue_offset}
        )

    def _dlq(self, group: str, conn: Connection) -> TopicConfig:
        tc, created = self.broker.topic_manager.create_dlq_topic(group)
        if created:
            self.broker.topic_created(tc, conn)
        return tc

    def _find_original(
        self, group: str, origin_topic: str, queue_id: int, offset: int, origin_msg_id: str | None
    ) -> StoredMessage | None:
        """The message being sent back. A consumer may name the real topic for a message it pulled from
        the retry topic, so both are tried; a candidate whose id matches ``originMsgId`` wins."""
        store = self.broker.store
        candidates = [store.lookup(origin_topic, queue_id, offset)]
        if not is_retry_topic(origin_topic):
            candidates.append(store.lookup(retry_topic(group), queue_id, offset))
        found = [m for m in candidates if m is not None]
        if origin_msg_id:
            for m in found:
                if origin_msg_id in (m.msg_id, m.properties.get(PROPERTY_ORIGIN_MESSAGE_ID)):
                    return m
        return found[0] if found else None

    async def consumer_send_msg_back(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        self._check_master()
        group = ext_name(cmd, "group")
        origin_topic = ext_name(cmd, "originTopic")
        queue_id = ext_queue_id(cmd)
        offset = cmd.ext_int("offset")
        origin_msg_id = cmd.ext_str("originMsgId", None)
        delay_level = cmd.ext_int32("delayLevel", 0)
        b = self.broker
        max_reconsume = cmd.ext_int32("maxReconsumeTimes", b.config.default_max_reconsume_times)
        orig = self._find_original(group, origin_topic, queue_id, offset, origin_msg_id)
        if orig is None:
            raise CommandError(
                ResponseCode.SYSTEM_ERROR,
                f"look message by offset failed, {origin_topic}:{queue_id}@{offset}",
            )
        rt, created = b.topic_manager.create_retry_topic(group, b.config.retry_queue_nums)
        if created:
            b.topic_created(rt, conn)
        props = dict(orig.properties)
        props.setdefault(PROPERTY_RETRY_TOPIC, orig.topic)
        props[PROPERTY_ORIGIN_MESSAGE_ID] = orig.properties.get(PROPERTY_ORIGIN_MESSAGE_ID) or orig.msg_id
        reconsume = orig.reconsume_times + 1
        to_dlq = orig.reconsume_times >= max_reconsume or delay_level < 0
        if to_dlq:
            tc = self._dlq(group, conn)
            draft = MessageDraft(
                tc.topic_name, 0, orig.body, orig.tags, orig.keys, orig.born_timestamp, reconsume, props
            )
            level = 0
        else:
            level = b.schedule_service.clamp_level(
                delay_level if delay_level > 0 else 3 + orig.reconsume_times
            )
            draft = b.schedule_service.schedule_draft(
                level,
                rt.topic_name,
                b.random.randrange(rt.write_queue_nums),
                orig.body,
                tags=orig.tags,
                keys=orig.keys,
                born_timestamp=orig.born_timestamp,
                reconsume_times=reconsume,
                properties=props,
            )
        stored = await b.store.put_message(draft)
        code = await b.wait_replica(stored)
        b.log.emit(
            "message_sent_back",
            group=group,
            msg_id=orig.msg_id,
            origin_msg_id=props[PROPERTY_ORIGIN_MESSAGE_ID],
            topic=orig.topic,
            queue_id=orig.queue_id,
            queue_offset=orig.queue_offset,
            reconsume_times=reconsume,
            delay_level=level,
            dlq=to_dlq,
            new_msg_id=stored.msg_id,
        )
        if code != ResponseCode.SUCCESS:
            # asyncConsumerSendMsgBack: any status but PUT_OK is a SYSTEM_ERROR naming it
            raise CommandError(ResponseCode.SYSTEM_ERROR, code.name)
        return cmd.response()
