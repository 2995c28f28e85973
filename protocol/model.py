"""RocketMQ's model types (MessageQueue, subscriptions, heartbeats, messages) and their wire forms.

Field names on the wire are RocketMQ's JSON keys (see PROTOCOL.md "Shared structures").
"""

from __future__ import annotations

import enum
import functools
import operator
import zlib
from dataclasses import dataclass, field
from typing import Any

SUB_ALL = "*"

# Java's ``long`` and ``int``: every number on the wire is one of them in RocketMQ, so larger values
# are refused up front (SQLite and the native record format hold 64 bits, nothing more).
JAVA_LONG_MIN = -(2**63)
JAVA_LONG_MAX = 2**63 - 1
JAVA_INT_MIN = -(2**31)
JAVA_INT_MAX = 2**31 - 1


class WireError(ValueError):
    """A structure on the wire is missing a field or has one of the wrong type.

    ``field`` names the offending field (dotted path) so that the broker can answer
    INVALID_PARAMETER with a remark naming it.
    """

    def __init__(self, field_name: str, problem: str) -> None:
        super().__init__(f"{field_name}: {problem}")
        self.field = field_name
        self.problem = problem


# Every field of every parsed structure (each pulled message, each heartbeat) passes here: the common
# case (a plain dict holding a value of exactly the wanted type, an int within a long) is answered
# inline; anything else goes the full way, which answers it as before.


def _req(d: Any, key: str, typ: type | tuple[type, ...], where: str) -> Any:
    if d.__class__ is dict:
        v = d.get(key)
        if v.__class__ is typ and (typ is not int or JAVA_LONG_MIN <= v <= JAVA_LONG_MAX):
            return v
    return _req_checked(d, key, typ, where)


def _req_checked(d: Any, key: str, typ: type | tuple[type, ...], where: str) -> Any:
    if not isinstance(d, dict):
        raise WireError(where or key, "expected a map")
    if key not in d or d[key] is None:
        raise WireError(f"{where}.{key}" if where else key, "missing")
    v = d[key]
    # bool is an int subclass; an int field must not accept True/False and vice versa
    if typ is int and (isinstance(v, bool) or not isinstance(v, int)):
        raise WireError(f"{where}.{key}" if where else key, f"expected int, got {type(v).__name__}")
    if typ is int and not JAVA_LONG_MIN <= v <= JAVA_LONG_MAX:
        raise WireError(f"{where}.{key}" if where else key, f"{v} is outside a 64-bit long")
    if not isinstance(v, typ):
        name = typ.__name__ if isinstance(typ, type) else "/".join(t.__name__ for t in typ)
        raise WireError(f"{where}.{key}" if where else key, f"expected {name}, got {type(v).__name__}")
    return v


def _opt(d: Any, key: str, typ: type | tuple[type, ...], where: str, default: Any) -> Any:
    if d.__class__ is dict:
        v = d.get(key)
        if v is None:
            return default
        if v.__class__ is typ and (typ is not int or JAVA_LONG_MIN <= v <= JAVA_LONG_MAX):
            return v
    elif not isinstance(d, dict):
        raise WireError(where or key, "expected a map")
    if key not in d or d[key] is None:
        return default
    return _req_checked(d, key, typ, where)


class MessageModel(enum.StrEnum):
    """CLUSTERING (each message to one consumer of the group) or BROADCASTING (to every one)."""

    BROADCASTING = "BROADCASTING"
    CLUSTERING = "CLUSTERING"


class ConsumeType(enum.StrEnum):
    """Push (CONSUME_PASSIVELY) or pull (CONSUME_ACTIVELY) consumption."""

    CONSUME_ACTIVELY = "CONSUME_ACTIVELY"  # pull / lite-pull consumers
    CONSUME_PASSIVELY = "CONSUME_PASSIVELY"  # push consumers


class ConsumeFromWhere(enum.StrEnum):
    """Where a consumer without a committed offset starts."""

    CONSUME_FROM_LAST_OFFSET = "CONSUME_FROM_LAST_OFFSET"
    CONSUME_FROM_FIRST_OFFSET = "CONSUME_FROM_FIRST_OFFSET"
    CONSUME_FROM_TIMESTAMP = "CONSUME_FROM_TIMESTAMP"


def _enum(d: dict, key: str, cls: type[enum.StrEnum], where: str, default: Any) -> Any:
    v = _opt(d, key, str, where, None)
    if v is None:
        return default
    try:
        return cls(v)
    except ValueError:
        raise WireError(f"{where}.{key}" if where else key, f"unknown value {v!r}") from None


@functools.total_ordering
@dataclass(frozen=True, slots=True, eq=True)
class MessageQueue:
    """A queue: (topic, broker_name, queue_id), ordered as RocketMQ's ``MessageQueue.compareTo``."""

    topic: str
    broker_name: str
    queue_id: int

    def __lt__(self, other: object) -> bool:
        if not isinstance(other, MessageQueue):
            return NotImplemented
        return (self.topic, self.broker_name, self.queue_id) < (
            other.topic,
            other.broker_name,
            other.queue_id,
        )

    def __str__(self) -> str:
        return f"MessageQueue [topic={self.topic}, brokerName={self.broker_name}, queueId={self.queue_id}]"

    @property
    def short(self) -> str:
        """``broker:queue_id``, the form EVENTS.md uses in lists."""
        return f"{self.broker_name}:{self.queue_id}"

    def to_wire(self) -> dict[str, Any]:
        return {"topic": self.topic, "brokerName": self.broker_name, "queueId": self.queue_id}

    @classmethod
    def from_wire(cls, d: Any, where: str = "mq") -> MessageQueue:
        return cls(
            _req(d, "topic", str, where),
            _req(d, "brokerName", str, where),
            _req(d, "queueId", int, where),
        )


# MessageQueue's own order (``__lt__``) as a sort key: the same order, compared in C instead of a Python
# call per comparison (a consumer sorts its queues every rebalance round).
MQ_ORDER = operator.attrgetter("topic", "broker_name", "queue_id")


def java_string_hash(s: str) -> int:
    """Java's ``String.hashCode`` over UTF-16 code units (used for SubscriptionData.codeSet)."""
    data = s.encode("utf-16-be")
    h = 0
    for i in range(0, len(data), 2):
        h = (31 * h + ((data[i] << 8) | data[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h >= (1 << 31) else h


def parse_tags(sub_string: str | None) -> list[str]:
    """Tags of a subscription expression; empty for ``*`` (everything)."""
    if sub_string is None:
        return []
    s = sub_string.strip()
    if not s or s == SUB_ALL:
        return []
    return [t.strip() for t in s.split("||") if t.strip()]


@dataclass(slots=True)
class SubscriptionData:
    """A topic subscription: its expression, tags and version."""

    topic: str
    sub_string: str = SUB_ALL
    tags_set: list[str] = field(default_factory=list)
    code_set: list[int] = field(default_factory=list)
    sub_version: int = 0
    expression_type: str = "TAG"

    @classmethod
    def build(cls, topic: str, sub_string: str | None, sub_version: int) -> SubscriptionData:
        expr = (sub_string or SUB_ALL).strip() or SUB_ALL
        tags = parse_tags(expr)
        return cls(topic, expr, tags, [java_string_hash(t) for t in tags], sub_version)

    def matches(self, tags: str | None) -> bool:
        return tag_matches(self.tags_set, tags)

    def to_wire(self) -> dict[str, Any]:
        return {
            "topic": self.topic,
            "subString": self.sub_string,
            "tagsSet": list(self.tags_set),
            "codeSet": list(self.code_set),
            "subVersion": self.sub_version,
            "expressionType": self.expression_type,
        }

    @classmethod
    def from_wire(cls, d: Any, where: str = "subscription") -> SubscriptionData:
        topic = _req(d, "topic", str, where)
        sub_string = _opt(d, "subString", str, where, SUB_ALL)
        tags = _opt(d, "tagsSet", list, where, None)
        if tags is None:
            tags = parse_tags(sub_string)
        for i, t in enumerate(tags):
            if not isinstance(t, str):
                raise WireError(f"{where}.tagsSet[{i}]", "expected str")
        codes = _opt(d, "codeSet", list, where, [])
        return cls(
            topic,
            sub_string,
            list(tags),
            [c for c in codes if isinstance(c, int)],
            _opt(d, "subVersion", int, where, 0),
            _opt(d, "expressionType", str, where, "TAG"),
        )


def tag_matches(tags_set: list[str] | set[str], tags: str | None) -> bool:
    """RocketMQ's tag filter: an empty set (``*``) matches everything, else the tag must be listed."""
    if not tags_set:
        return True
    return tags is not None and tags in tags_set


@dataclass(slots=True)
class ConsumerData:
    """A consumer group's part of a heartbeat."""

    group_name: str
    consume_type: ConsumeType = ConsumeType.CONSUME_PASSIVELY
    message_model: MessageModel = MessageModel.CLUSTERING
    consume_from_where: ConsumeFromWhere = ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET
    subscription_data_set: list[SubscriptionData] = field(default_factory=list)
    unit_mode: bool = False

    def to_wire(self) -> dict[str, Any]:
        return {
            "groupName": self.group_name,
            "consumeType": str(self.consume_type),
            "messageModel": str(self.message_model),
            "consumeFromWhere": str(self.consume_from_where),
            "subscriptionDataSet": [s.to_wire() for s in self.subscription_data_set],
            "unitMode": self.unit_mode,
        }

    @classmethod
    def from_wire(cls, d: Any, where: str = "consumerData") -> ConsumerData:
        subs = _opt(d, "subscriptionDataSet", list, where, [])
        return cls(
            _req(d, "groupName", str, where),
            _enum(d, "consumeType", ConsumeType, where, ConsumeType.CONSUME_PASSIVELY),
            _enum(d, "messageModel", MessageModel, where, MessageModel.CLUSTERING),
            _enum(d, "consumeFromWhere", ConsumeFromWhere, where, ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET),
            [SubscriptionData.from_wire(s, f"{where}.subscriptionDataSet[{i}]") for i, s in enumerate(subs)],
            _opt(d, "unitMode", bool, where, False),
        )


@dataclass(slots=True)
class ProducerData:
    """A producer group's part of a heartbeat."""

    group_name: str

    def to_wire(self) -> dict[str, Any]:
        return {"groupName": self.group_name}

    @classmethod
    def from_wire(cls, d: Any, where: str = "producerData") -> ProducerData:
        return cls(_req(d, "groupName", str, where))


@dataclass(slots=True)
class HeartbeatData:
    """HEARTBEAT's body: the client id and its producer and consumer groups."""

    client_id: str
    producer_data_set: list[ProducerData] = field(default_factory=list)
    consumer_data_set: list[ConsumerData] = field(default_factory=list)

    def to_wire(self) -> dict[str, Any]:
        return {
            "clientID": self.client_id,
            "producerDataSet": [p.to_wire() for p in self.producer_data_set],
            "consumerDataSet": [c.to_wire() for c in self.consumer_data_set],
        }

    @classmethod
    def from_wire(cls, d: Any) -> HeartbeatData:
        if not isinstance(d, dict):
            raise WireError("body", "expected a map")
        producers = _opt(d, "producerDataSet", list, "", [])
        consumers = _opt(d, "consumerDataSet", list, "", [])
        return cls(
            _req(d, "clientID", str, ""),
            [ProducerData.from_wire(p, f"producerDataSet[{i}]") for i, p in enumerate(producers)],
            [ConsumerData.from_wire(c, f"consumerDataSet[{i}]") for i, c in enumerate(consumers)],
        )


@dataclass(slots=True)
class Message:
    """A stored message as a pull returns it (RocketMQ's MessageExt)."""

    msg_id: str
    topic: str
    broker_name: str
    queue_id: int
    queue_offset: int
    body: bytes
    tags: str | None = None
    keys: str | None = None
    born_timestamp: int = 0
    store_timestamp: int = 0
    reconsume_times: int = 0
    properties: dict[str, str] = field(default_factory=dict)
    # The commit-log offset of a message pulled over RocketMQ's native protocol (MessageExt's), which
    # CONSUMER_SEND_MSG_BACK names it by there; None over msgpack, which names the queue offset.
    commit_log_offset: int | None = None

    @property
    def queue(self) -> MessageQueue:
        return MessageQueue(self.topic, self.broker_name, self.queue_id)

    @property
    def body_crc(self) -> int:
        return zlib.crc32(self.body)

    def to_wire(self) -> dict[str, Any]:
        wire = {
            "msgId": self.msg_id,
            "topic": self.topic,
            "brokerName": self.broker_name,
            "queueId": self.queue_id,
            "queueOffset": self.queue_offset,
            "body": self.body,
            "tags": self.tags,
            "keys": self.keys,
            "bornTimestamp": self.born_timestamp,
            "storeTimestamp": self.store_timestamp,
            "reconsumeTimes": self.reconsume_times,
            "properties": dict(self.properties),
        }
        if self.commit_log_offset is not None:
            wire["commitLogOffset"] = self.commit_log_offset
        return wire

    @classmethod
    def from_wire(cls, d: Any, where: str = "message") -> Message:
        props = _opt(d, "properties", dict, where, {})
        return cls(
            _req(d, "msgId", str, where),
            _req(d, "topic", str, where),
            _req(d, "brokerName", str, where),
            _req(d, "queueId", int, where),
            _req(d, "queueOffset", int, where),
            _req(d, "body", bytes, where),
            _opt(d, "tags", str, where, None),
            _opt(d, "keys", str, where, None),
            _opt(d, "bornTimestamp", int, where, 0),
            _opt(d, "storeTimestamp", int, where, 0),
            _opt(d, "reconsumeTimes", int, where, 0),
            {str(k): str(v) for k, v in props.items()},
            _opt(d, "commitLogOffset", int, where, None),
        )


def retry_topic(group: str) -> str:
    return f"%RETRY%{group}"


def dlq_topic(group: str) -> str:
    return f"%DLQ%{group}"


def is_retry_topic(topic: str) -> bool:
    return topic.startswith("%RETRY%")
