"""The proxy's decisions, without sockets or clocks: validation, routes, settings and message conversion.

Each function follows the Java proxy of RocketMQ 5 (``proxy/.../grpc/v2`` on ``develop``): what it checks,
in which order, and which ``apache.rocketmq.v2.Code`` it answers. Times are passed in as numbers.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from rmqlab.protocol.codes import ResponseCode
from rmqlab.protocol.model import SubscriptionData
from rmqlab.protocol.route import PERM_READ, PERM_WRITE, TopicRouteData
from rmqlab.proxy.v5 import Code, Duration, Timestamp, pb

# RocketMQ's defaults (ProxyConfig, SubscriptionGroupConfig), in ms unless named otherwise.
DEFAULT_INVISIBLE_MS = 60_000
MIN_INVISIBLE_MS_FOR_RECV = 10_000
MAX_INVISIBLE_MS = 12 * 3600 * 1000
MIN_LONG_POLLING_MS = 5_000
MAX_LONG_POLLING_MS = 20_000
LONG_POLLING_BATCH_SIZE = 32
MAX_MESSAGE_SIZE = 4 * 1024 * 1024
PRODUCER_MAX_ATTEMPTS = 3
PRODUCER_BACKOFF_INITIAL_MS = 10
PRODUCER_BACKOFF_MAX_MS = 1000
PRODUCER_BACKOFF_MULTIPLIER = 2
RETRY_MAX_TIMES = 16  # SubscriptionGroupConfig.retryMaxTimes: max_attempts is one more
# CustomizedRetryPolicy's default: the broker's delay levels, in seconds
RETRY_DELAYS_S = (1, 5, 10, 30, 60, 120, 180, 240, 300, 360, 420, 480, 540, 600, 1200, 1800, 3600, 7200)
# Clients older than this get BAD_REQUEST instead of ILLEGAL_POLLING_TIME (ReceiveMessageActivity).
ILLEGAL_POLLING_TIME_CLIENT_VERSION = "5.0.3"

_NAME_RE = re.compile(r"^[%|a-zA-Z0-9_-]+$")
TOPIC_MAX_LENGTH = 127
# TopicValidator's system topics (with every topic starting rmq_sys_), which clients may not use
SYSTEM_TOPICS = frozenset(
    {
        "TBW102",
        "SCHEDULE_TOPIC_XXXX",
        "BenchmarkTest",
        "OFFSET_MOVED_EVENT",
        "RMQ_SYS_TRANS_HALF_TOPIC",
        "RMQ_SYS_TRACE_TOPIC",
        "RMQ_SYS_TRANS_OP_HALF_TOPIC",
        "TRANS_CHECK_MAX_TIME_TOPIC",
        "SELF_TEST_TOPIC",
        "CHECKPOINT_TOPIC",
    }
)
GROUP_MAX_LENGTH = 255
# Properties the broker or the proxy own: they travel as system properties, never as user properties.
SYSTEM_PROPERTY_KEYS = frozenset(
    {
        "TAGS",
        "KEYS",
        "UNIQ_KEY",
        "POP_CK",
        "1ST_POP_TIME",
        "ORIGIN_MESSAGE_ID",
        "RETRY_TOPIC",
        "REAL_TOPIC",
        "REAL_QID",
        "RECONSUME_TIME",
        "MAX_RECONSUME_TIMES",
        "DELAY",
        "WAIT",
        "CLUSTER",
        "MIN_OFFSET",
        "MAX_OFFSET",
    }
)


class ProxyError(Exception):
    """A request the proxy answers with a v5 status other than OK (GrpcProxyException)."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(f"{Code.Name(code)}: {message}")
        self.code = code
        self.message = message

    def status(self) -> Any:
        return pb.Status(code=self.code, message=self.message)


def ok_status() -> Any:
    return pb.Status(code=Code.OK, message="OK")


# -- validation (GrpcValidator) -----------------------------------------------------------------------
def validate_topic(resource: Any, has: bool = True) -> str:
    """The topic's name, or ILLEGAL_TOPIC saying what is wrong with it."""
    name = resource.name if has else ""
    if not name.strip():
        raise ProxyError(Code.ILLEGAL_TOPIC, "topic name is missing or blank")
    if len(name) > TOPIC_MAX_LENGTH:
        raise ProxyError(Code.ILLEGAL_TOPIC, f"topic name is longer than {TOPIC_MAX_LENGTH} characters")
    if not _NAME_RE.match(name):
        raise ProxyError(Code.ILLEGAL_TOPIC, f"topic name {name!r} has characters outside [%|a-zA-Z0-9_-]")
    if name.startswith("rmq_sys_") or name in SYSTEM_TOPICS:
        raise ProxyError(Code.ILLEGAL_TOPIC, f"topic {name!r} is a system topic")
    return str(name)


def validate_group(resource: Any, has: bool = True) -> str:
    """The consumer group's name, or ILLEGAL_CONSUMER_GROUP saying what is wrong with it."""
    name = resource.name if has else ""
    if not name.strip():
        raise ProxyError(Code.ILLEGAL_CONSUMER_GROUP, "consumer group is missing or blank")
    if len(name) > GROUP_MAX_LENGTH:
        raise ProxyError(
            Code.ILLEGAL_CONSUMER_GROUP, f"consumer group is longer than {GROUP_MAX_LENGTH} characters"
        )
    if not _NAME_RE.match(name):
        raise ProxyError(
            Code.ILLEGAL_CONSUMER_GROUP, f"consumer group {name!r} has characters outside [%|a-zA-Z0-9_-]"
        )
    return str(name)


def validate_invisible_ms(
    ms: int, min_ms: int = MIN_INVISIBLE_MS_FOR_RECV, max_ms: int = MAX_INVISIBLE_MS
) -> int:
    if ms < min_ms:
        raise ProxyError(
            Code.ILLEGAL_INVISIBLE_TIME, f"the invisible time {ms} ms is below the minimum {min_ms} ms"
        )
    if ms > max_ms:
        raise ProxyError(
            Code.ILLEGAL_INVISIBLE_TIME, f"the invisible time {ms} ms is above the maximum {max_ms} ms"
        )
    return ms


def validate_tag(tag: str) -> None:
    if not tag.strip():
        raise ProxyError(Code.ILLEGAL_MESSAGE_TAG, "tag is blank")
    if "|" in tag:
        raise ProxyError(Code.ILLEGAL_MESSAGE_TAG, "tag contains '|'")
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in tag):
        raise ProxyError(Code.ILLEGAL_MESSAGE_TAG, "tag contains a control character")


def duration_ms(d: Any) -> int:
    return int(d.seconds) * 1000 + int(d.nanos) // 1_000_000


def to_duration(ms: int) -> Any:
    return Duration(seconds=ms // 1000, nanos=(ms % 1000) * 1_000_000)


def to_timestamp(ms: int) -> Any:
    return Timestamp(seconds=ms // 1000, nanos=(ms % 1000) * 1_000_000)


def _version_tuple(v: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", v)[:3])


def polling_time_ms(
    requested_ms: int | None,
    remaining_ms: int,
    request_timeout_ms: int,
    client_version: str | None,
    min_ms: int = MIN_LONG_POLLING_MS,
    max_ms: int = MAX_LONG_POLLING_MS,
) -> int:
    """ReceiveMessageActivity's long-polling time: the request's (else the deadline less half the request
    timeout), clamped to [min, max] and to the time the call has left; too little time left is an error."""
    polling = requested_ms if requested_ms is not None else remaining_ms - request_timeout_ms // 2
    polling = min(max(polling, min_ms), max_ms)
    if polling > remaining_ms:
        if remaining_ms >= min_ms:
            return remaining_ms
        old = client_version is None or _version_tuple(client_version) < _version_tuple(
            ILLEGAL_POLLING_TIME_CLIENT_VERSION
        )
        raise ProxyError(
            Code.BAD_REQUEST if old else Code.ILLEGAL_POLLING_TIME,
            "the call's deadline leaves too little time for long polling",
        )
    return polling


# -- routes (RouteActivity) ---------------------------------------------------------------------------
def _permission(perm: int) -> int:
    readable, writable = bool(perm & PERM_READ), bool(perm & PERM_WRITE)
    if readable and writable:
        return pb.READ_WRITE
    if readable:
        return pb.READ
    if writable:
        return pb.WRITE
    return pb.NONE


def proxy_broker(name: str, endpoints: Any) -> Any:
    """A broker as a v5 client sees it in cluster mode: its name, id 0 and the proxy's own endpoints."""
    return pb.Broker(name=name, id=0, endpoints=endpoints)


def route_message_queues(route: TopicRouteData, topic: str, endpoints: Any) -> list[Any]:
    """RouteActivity.genMessageQueueFromQueueData: per broker, read-only queues, then write-only ones,
    then read-write ones (as many as both counts share), numbered from 0."""
    out: list[Any] = []
    for qd in route.queue_datas:
        if route.broker(qd.broker_name) is None:
            continue
        readable, writable = bool(qd.perm & PERM_READ), bool(qd.perm & PERM_WRITE)
        r = w = rw = 0
        if readable and writable:
            rw = min(qd.read_queue_nums, qd.write_queue_nums)
            r, w = qd.read_queue_nums - rw, qd.write_queue_nums - rw
        elif writable:
            w = qd.write_queue_nums
        elif readable:
            r = qd.read_queue_nums
        broker = proxy_broker(qd.broker_name, endpoints)
        qid = 0
        for count, perm in ((r, pb.READ), (w, pb.WRITE), (rw, pb.READ_WRITE)):
            for _ in range(count):
                out.append(
                    pb.MessageQueue(
                        topic=pb.Resource(name=topic),
                        id=qid,
                        permission=perm,
                        broker=broker,
                        accept_message_types=[pb.NORMAL],
                    )
                )
                qid += 1
    return out


def assignments(route: TopicRouteData, topic: str, endpoints: Any) -> list[Any]:
    """RouteActivity.queryAssignment (not FIFO): one assignment per broker with readable queues, queue id
    -1, "pop from any queue of this broker"; FORBIDDEN when there is none."""
    out: list[Any] = []
    for qd in route.queue_datas:
        if not qd.perm & PERM_READ or qd.read_queue_nums <= 0 or route.broker(qd.broker_name) is None:
            continue
        mq = pb.MessageQueue(
            topic=pb.Resource(name=topic),
            id=-1,
            permission=_permission(qd.perm),
            broker=proxy_broker(qd.broker_name, endpoints),
        )
        out.append(pb.Assignment(message_queue=mq))
    if not out:
        raise ProxyError(Code.FORBIDDEN, "no readable queue")
    return out


# -- settings (GrpcClientSettingsManager) --------------------------------------------------------------
CONSUMER_TYPES = frozenset({pb.PUSH_CONSUMER, pb.SIMPLE_CONSUMER})


def answer_settings(settings: Any) -> Any:
    """The settings the proxy sends back on the telemetry stream: the client's own, merged with the
    server's (retry policy, batch size, long polling, body size limit), and metrics off."""
    out = pb.Settings()
    out.CopyFrom(settings)
    if settings.client_type == pb.PRODUCER:
        policy = out.backoff_policy
        policy.Clear()
        policy.max_attempts = PRODUCER_MAX_ATTEMPTS
        policy.exponential_backoff.initial.CopyFrom(to_duration(PRODUCER_BACKOFF_INITIAL_MS))
        policy.exponential_backoff.max.CopyFrom(to_duration(PRODUCER_BACKOFF_MAX_MS))
        policy.exponential_backoff.multiplier = PRODUCER_BACKOFF_MULTIPLIER
        out.publishing.validate_message_type = True
        out.publishing.max_body_size = MAX_MESSAGE_SIZE
    elif settings.client_type in CONSUMER_TYPES:
        sub = out.subscription
        sub.receive_batch_size = LONG_POLLING_BATCH_SIZE
        sub.long_polling_timeout.CopyFrom(to_duration(MAX_LONG_POLLING_MS))
        sub.fifo = False
        policy = out.backoff_policy
        policy.Clear()
        policy.max_attempts = RETRY_MAX_TIMES + 1
        for s in RETRY_DELAYS_S:
            policy.customized_backoff.next.add(seconds=s)
    out.metric.Clear()
    out.metric.on = False
    return out


def expression_sub_string(expr: Any, has: bool) -> str:
    """A v5 filter expression as our SubscriptionData's subString; TAG only (SQL92 is not emulated)."""
    if not has:
        return "*"
    if expr.type == pb.SQL:
        raise ProxyError(
            Code.ILLEGAL_FILTER_EXPRESSION, "SQL92 filters are not emulated; use a TAG expression"
        )
    text = expr.expression.strip()
    return text or "*"


def subscriptions(settings: Any) -> list[SubscriptionData]:
    """The topics and tag expressions a consumer's settings name, as heartbeat subscriptions."""
    out: list[SubscriptionData] = []
    for entry in settings.subscription.subscriptions:
        topic = validate_topic(entry.topic)
        sub = expression_sub_string(entry.expression, entry.HasField("expression"))
        out.append(SubscriptionData.build(topic, sub, 0))
    return out


# -- broker answers -----------------------------------------------------------------------------------
_BROKER_CODES = {
    ResponseCode.SUCCESS: Code.OK,
    ResponseCode.SYSTEM_BUSY: Code.TOO_MANY_REQUESTS,
    ResponseCode.REQUEST_CODE_NOT_SUPPORTED: Code.NOT_IMPLEMENTED,
    ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST: Code.CONSUMER_GROUP_NOT_FOUND,
    ResponseCode.TOPIC_NOT_EXIST: Code.TOPIC_NOT_FOUND,
    ResponseCode.NO_PERMISSION: Code.FORBIDDEN,
    ResponseCode.MESSAGE_ILLEGAL: Code.MESSAGE_BODY_TOO_LARGE,
}


def broker_status(code: int, remark: str | None) -> Any:
    """ResponseBuilder.buildStatus for a broker's answer: the known codes mapped, the rest an internal
    error that carries the broker's remark."""
    mapped = _BROKER_CODES.get(code, Code.INTERNAL_SERVER_ERROR)
    try:
        name = ResponseCode(code).name
    except ValueError:
        name = str(code)
    return pb.Status(code=mapped, message=f"{name}: {remark or ''}".rstrip(": "))


def receipt_status(code: int, remark: str | None) -> Any:
    """A broker's answer to an ack or an invisible-time change: a receipt it no longer holds in flight
    (revived, acked, superseded) is the client's INVALID_RECEIPT_HANDLE, the rest as broker_status."""
    if code == ResponseCode.NO_MESSAGE:
        return pb.Status(
            code=Code.INVALID_RECEIPT_HANDLE, message=f"receipt handle is not in flight: {remark or ''}"
        )
    return broker_status(code, remark)


def merged_status(statuses: Sequence[Any]) -> Any:
    """One status for a batch (send, ack): the entries' common status, else MULTIPLE_RESULTS."""
    if not statuses:
        return ok_status()
    first = statuses[0]
    if all(s.code == first.code for s in statuses):
        return pb.Status(code=first.code, message=first.message)
    return pb.Status(code=Code.MULTIPLE_RESULTS, message="the entries have different results")


# -- messages -----------------------------------------------------------------------------------------
def md5_hex(body: bytes) -> str:
    """GrpcConverter's body digest: MD5 in uppercase hex (BinaryUtil.generateMd5), what every v5 client
    checks a received body against."""
    return hashlib.md5(body).hexdigest().upper()


def message_id_of(msg_id: str, properties: dict[str, str]) -> str:
    """The id a v5 client sees: the producer's (UNIQ_KEY), which a retried copy keeps; else the id of the
    original (ORIGIN_MESSAGE_ID) or the stored one."""
    return properties.get("UNIQ_KEY") or properties.get("ORIGIN_MESSAGE_ID") or msg_id


@dataclass(frozen=True, slots=True)
class Delivery:
    """What the proxy knows of one popped message besides the message itself."""

    receipt_handle: str
    invisible_ms: int
    store_host: str


def outgoing_message(topic: str, msg: Any, delivery: Delivery) -> Any:
    """GrpcConverter.buildMessage: a stored message (protocol.model.Message) as a v5 Message."""
    props = dict(msg.properties)
    system = pb.SystemProperties(
        message_id=message_id_of(msg.msg_id, props),
        body_digest=pb.Digest(type=pb.MD5, checksum=md5_hex(msg.body)),
        body_encoding=pb.IDENTITY,
        message_type=pb.NORMAL,
        born_host="",
        store_host=delivery.store_host,
        queue_id=msg.queue_id,
        queue_offset=msg.queue_offset,
        receipt_handle=delivery.receipt_handle,
        delivery_attempt=msg.reconsume_times + 1,
    )
    if msg.tags:
        system.tag = msg.tags
    if msg.keys:
        system.keys.extend(k for k in msg.keys.split(" ") if k)
    system.born_timestamp.CopyFrom(to_timestamp(msg.born_timestamp))
    system.store_timestamp.CopyFrom(to_timestamp(msg.store_timestamp))
    system.invisible_duration.CopyFrom(to_duration(delivery.invisible_ms))
    user = {k: v for k, v in props.items() if k not in SYSTEM_PROPERTY_KEYS}
    return pb.Message(
        topic=pb.Resource(name=topic), user_properties=user, system_properties=system, body=msg.body
    )


@dataclass(slots=True)
class OutgoingSend:
    """One message of a SendMessageRequest, checked and ready for SEND_MESSAGE."""

    topic: str
    message_id: str
    body: bytes
    tags: str | None
    keys: str | None
    properties: dict[str, str] = field(default_factory=dict)


def incoming_message(m: Any, max_body: int = MAX_MESSAGE_SIZE) -> OutgoingSend:
    """SendMessageActivity.buildMessage: checks a producer's message and maps it to our send fields."""
    topic = validate_topic(m.topic, m.HasField("topic"))
    sp = m.system_properties
    if not sp.message_id:
        raise ProxyError(Code.ILLEGAL_MESSAGE_ID, "message id is missing")
    if len(m.body) > max_body:
        raise ProxyError(Code.MESSAGE_BODY_TOO_LARGE, f"message body is {len(m.body)} bytes, over {max_body}")
    if sp.HasField("delivery_timestamp"):
        raise ProxyError(Code.UNSUPPORTED, "delay messages (delivery_timestamp) are not emulated")
    if sp.message_type == pb.TRANSACTION:
        raise ProxyError(Code.UNSUPPORTED, "transactional messages are not emulated")
    tags = sp.tag if sp.HasField("tag") else None
    if tags is not None:
        validate_tag(tags)
    for key in sp.keys:
        if not key.strip():
            raise ProxyError(Code.ILLEGAL_MESSAGE_KEY, "message key is blank")
    props = {str(k): str(v) for k, v in m.user_properties.items()}
    clash = sorted(set(props) & SYSTEM_PROPERTY_KEYS)
    if clash:
        raise ProxyError(
            Code.ILLEGAL_MESSAGE_PROPERTY_KEY, f"user property {clash[0]!r} is a system property"
        )
    props["UNIQ_KEY"] = sp.message_id
    if sp.HasField("message_group"):
        props["__SHARDINGKEY"] = sp.message_group
    keys = " ".join(sp.keys) or None
    return OutgoingSend(topic, sp.message_id, bytes(m.body), tags, keys, props)


def send_topic(messages: Iterable[OutgoingSend]) -> str:
    """The one topic a SendMessageRequest's messages share (BAD_REQUEST when they differ or none)."""
    topics = {m.topic for m in messages}
    if not topics:
        raise ProxyError(Code.BAD_REQUEST, "no message to send")
    if len(topics) > 1:
        raise ProxyError(Code.BAD_REQUEST, "the messages of one request must share their topic")
    return topics.pop()
