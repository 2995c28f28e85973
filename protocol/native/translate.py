"""Translation between RocketMQ's native commands and the project's typed commands (sans-IO).

Requests from real clients: extFields (strings, numbers or booleans) become typed ``ext`` per a schema for
each request code; JSON bodies become the body maps of PROTOCOL.md (enums given as integers by the C++
client become names); SEND_MESSAGE_V2's one-letter header names become SEND_MESSAGE's; PULL_MESSAGE's
``sysFlag`` bits decide whether ``commitOffset``, ``suspendTimeoutMillis`` and ``subscription`` count, as
RocketMQ's broker decides. Answers go back the other way: every ext value as a string, bodies as JSON, and
pulled messages as concatenated MessageExt records.

A value that cannot be converted is passed on unchanged, so the handler's typed access answers
INVALID_PARAMETER naming the field instead of the connection being dropped.
"""

from __future__ import annotations

import base64
import json
import re
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from rmqlab.protocol.acl_signing import native_signed_content
from rmqlab.protocol.codes import Flag, RequestCode, ResponseCode, code_name
from rmqlab.protocol.command import RemotingCommand
from rmqlab.protocol.model import retry_topic
from rmqlab.protocol.native.frame import LANGUAGE, NativeFrame, encode_frame
from rmqlab.protocol.native.message_ext import (
    COMPRESSED_FLAG,
    PROPERTY_KEYS,
    PROPERTY_TAGS,
    PROPERTY_UNIQ_KEY,
    MessageRecord,
    RecordError,
    StoreHost,
    decode_records,
    encode_record,
    offset_msg_id,
    pack_physical_offset,
    properties_to_string,
    string_to_properties,
    unpack_physical_offset,
)
from rmqlab.protocol.pop_receipt import bitset_indices

INT: Final = "int"
STR: Final = "str"
BOOL: Final = "bool"

# The language our client announces in its requests (answers say JAVA, as a broker's do).
CLIENT_LANGUAGE: Final = "PYTHON"

# ClientRPCHook's fields, sent by some clients on every request; the emulator has no ACL.
RPC_HOOK_FIELDS: Final = frozenset({"AccessKey", "SecretKey", "Signature", "OnsChannel", "SecurityToken"})

_OFFSET_FIELDS = {"topic": STR, "queueId": INT}

# Header fields of each request RocketMQ clients send (the *RequestHeader classes), with their types.
REQUEST_SCHEMAS: Final[dict[int, dict[str, str]]] = {
    RequestCode.SEND_MESSAGE: {
        "producerGroup": STR,
        "topic": STR,
        "defaultTopic": STR,
        "defaultTopicQueueNums": INT,
        "queueId": INT,
        "sysFlag": INT,
        "bornTimestamp": INT,
        "flag": INT,
        "properties": STR,
        "reconsumeTimes": INT,
        "unitMode": BOOL,
        "batch": BOOL,
        "maxReconsumeTimes": INT,
        "brokerName": STR,
    },
    RequestCode.PULL_MESSAGE: {
        "consumerGroup": STR,
        "topic": STR,
        "queueId": INT,
        "queueOffset": INT,
        "maxMsgNums": INT,
        "sysFlag": INT,
        "commitOffset": INT,
        "suspendTimeoutMillis": INT,
        "subscription": STR,
        "subVersion": INT,
        "expressionType": STR,
        "maxMsgBytes": INT,
    },
    RequestCode.QUERY_CONSUMER_OFFSET: {
        "consumerGroup": STR,
        "topic": STR,
        "queueId": INT,
        "setZeroIfNotFound": BOOL,
    },
    RequestCode.UPDATE_CONSUMER_OFFSET: {
        "consumerGroup": STR,
        "topic": STR,
        "queueId": INT,
        "commitOffset": INT,
    },
    RequestCode.UPDATE_AND_CREATE_TOPIC: {
        "topic": STR,
        "defaultTopic": STR,
        "readQueueNums": INT,
        "writeQueueNums": INT,
        "perm": INT,
        "topicFilterType": STR,
        "topicSysFlag": INT,
        "order": BOOL,
    },
    RequestCode.SEARCH_OFFSET_BY_TIMESTAMP: {**_OFFSET_FIELDS, "timestamp": INT},
    RequestCode.GET_MAX_OFFSET: dict(_OFFSET_FIELDS),
    RequestCode.GET_MIN_OFFSET: dict(_OFFSET_FIELDS),
    RequestCode.UNREGISTER_CLIENT: {"clientID": STR, "producerGroup": STR, "consumerGroup": STR},
    RequestCode.CONSUMER_SEND_MSG_BACK: {
        "group": STR,
        "offset": INT,
        "delayLevel": INT,
        "originMsgId": STR,
        "originTopic": STR,
        "unitMode": BOOL,
        "maxReconsumeTimes": INT,
    },
    RequestCode.GET_CONSUMER_LIST_BY_GROUP: {"consumerGroup": STR},
    RequestCode.NOTIFY_CONSUMER_IDS_CHANGED: {"consumerGroup": STR},
    RequestCode.REGISTER_BROKER: {
        "brokerName": STR,
        "brokerAddr": STR,
        "clusterName": STR,
        "haServerAddr": STR,
        "brokerId": INT,
    },
    RequestCode.UNREGISTER_BROKER: {
        "brokerName": STR,
        "brokerAddr": STR,
        "clusterName": STR,
        "brokerId": INT,
    },
    RequestCode.GET_ROUTEINFO_BY_TOPIC: {"topic": STR},
    RequestCode.GET_CONSUMER_CONNECTION_LIST: {"consumerGroup": STR},
    RequestCode.POP_MESSAGE: {
        "consumerGroup": STR,
        "topic": STR,
        "queueId": INT,
        "maxMsgNums": INT,
        "invisibleTime": INT,
        "pollTime": INT,
        "bornTime": INT,
        "initMode": INT,
        "expType": STR,
        "exp": STR,
        "order": BOOL,
        "attemptId": STR,
    },
    RequestCode.ACK_MESSAGE: {
        "consumerGroup": STR,
        "topic": STR,
        "queueId": INT,
        "extraInfo": STR,
        "offset": INT,
    },
    RequestCode.CHANGE_MESSAGE_INVISIBLETIME: {
        "consumerGroup": STR,
        "topic": STR,
        "queueId": INT,
        "extraInfo": STR,
        "offset": INT,
        "invisibleTime": INT,
    },
}

# Header fields of the answers our client reads (the *ResponseHeader classes), by the request they answer.
RESPONSE_SCHEMAS: Final[dict[int, dict[str, str]]] = {
    RequestCode.SEND_MESSAGE: {"msgId": STR, "queueId": INT, "queueOffset": INT, "transactionId": STR},
    RequestCode.PULL_MESSAGE: {
        "suggestWhichBrokerId": INT,
        "nextBeginOffset": INT,
        "minOffset": INT,
        "maxOffset": INT,
    },
    RequestCode.QUERY_CONSUMER_OFFSET: {"offset": INT},
    RequestCode.GET_MAX_OFFSET: {"offset": INT},
    RequestCode.GET_MIN_OFFSET: {"offset": INT},
    RequestCode.SEARCH_OFFSET_BY_TIMESTAMP: {"offset": INT},
    RequestCode.POP_MESSAGE: {
        "popTime": INT,
        "invisibleTime": INT,
        "reviveQid": INT,
        "restNum": INT,
        "startOffsetInfo": STR,
        "msgOffsetInfo": STR,
        "orderCountInfo": STR,
    },
    RequestCode.CHANGE_MESSAGE_INVISIBLETIME: {"extraInfo": STR, "invisibleTime": INT, "popTime": INT},
}

# SendMessageRequestHeaderV2's one-letter names.
SEND_V2_NAMES: Final = {
    "a": "producerGroup",
    "b": "topic",
    "c": "defaultTopic",
    "d": "defaultTopicQueueNums",
    "e": "queueId",
    "f": "sysFlag",
    "g": "bornTimestamp",
    "h": "flag",
    "i": "properties",
    "j": "reconsumeTimes",
    "k": "unitMode",
    "l": "maxReconsumeTimes",
    "m": "batch",
    "n": "brokerName",
}

NAMES_SEND_V2: Final = {long: short for short, long in SEND_V2_NAMES.items()}

# SendMessageRequestHeader's fields that RocketMQ's broker requires (@CFNotNull) and our requests may leave
# out, with what DefaultMQProducerImpl.sendKernelImpl writes there.
_SEND_DEFAULTS: Final = {
    "defaultTopic": "TBW102",
    "defaultTopicQueueNums": 4,
    "sysFlag": 0,
    "flag": 0,
    "reconsumeTimes": 0,
    "unitMode": False,
    "batch": False,
}

# CreateTopicRequestHeader's required fields (@CFNotNull) beyond the queue counts and permission, as
# MQAdminImpl/DefaultMQAdminExt fill them.
_CREATE_TOPIC_DEFAULTS: Final = {"defaultTopic": "TBW102", "topicFilterType": "SINGLE_TAG", "order": False}

# PullSysFlag bits.
PULL_COMMIT_OFFSET: Final = 0x1
PULL_SUSPEND: Final = 0x2
PULL_SUBSCRIPTION: Final = 0x4

# Enum ordinals as the C++ client writes them in HEART_BEAT.
_CONSUME_TYPES = ("CONSUME_ACTIVELY", "CONSUME_PASSIVELY")
_MESSAGE_MODELS = ("BROADCASTING", "CLUSTERING")
_CONSUME_FROM = {
    0: "CONSUME_FROM_LAST_OFFSET",
    1: "CONSUME_FROM_LAST_OFFSET",  # CONSUME_FROM_LAST_OFFSET_AND_FROM_MIN_WHEN_BOOT_FIRST (deprecated)
    2: "CONSUME_FROM_LAST_OFFSET",  # CONSUME_FROM_MIN_OFFSET (deprecated; clients treat it as LAST)
    3: "CONSUME_FROM_LAST_OFFSET",  # CONSUME_FROM_MAX_OFFSET (deprecated; clients treat it as LAST)
    4: "CONSUME_FROM_FIRST_OFFSET",
    5: "CONSUME_FROM_TIMESTAMP",
}
_DEPRECATED_CONSUME_FROM = {
    "CONSUME_FROM_LAST_OFFSET_AND_FROM_MIN_WHEN_BOOT_FIRST": "CONSUME_FROM_LAST_OFFSET",
    "CONSUME_FROM_MIN_OFFSET": "CONSUME_FROM_LAST_OFFSET",
    "CONSUME_FROM_MAX_OFFSET": "CONSUME_FROM_LAST_OFFSET",
}

_INT_RE = re.compile(r"-?\d+")
# A number string longer than this is no Java long (19 digits and a sign); it stays a string and the
# handler answers INVALID_PARAMETER, instead of Python parsing thousands of digits (or refusing to).
_MAX_INT_CHARS = 24
# Bodies inflate at most to this (a producer's compressed SEND); beyond it the body is cut just past the
# limit, so the size check answers MESSAGE_ILLEGAL instead of the broker inflating a bomb.
MAX_INFLATED_BODY: Final = 16 * 1024 * 1024
# fastjson writes maps with number keys unquoted ({0:"addr"}); quote them before a retry.
_BARE_KEY_RE = re.compile(r"([{,]\s*)(-?\d+)(\s*:)")


@dataclass(slots=True)
class TranslateContext:
    """What the translation of one connection needs to know about the server it runs in."""

    store_host: StoreHost = field(default_factory=lambda: StoreHost(b"\x7f\x00\x00\x01", 0))
    # Maps a broker address in a route to the address real clients must use (the native port).
    rewrite_broker_addr: Callable[[str], str] = lambda addr: addr
    # Client side: the language our requests announce, and where SEND_MESSAGE's UNIQ_KEYs come from.
    language: str = LANGUAGE
    uniq_ids: Callable[[], str] | None = None


# -- values ------------------------------------------------------------------------------------------------


def convert_value(value: Any, kind: str) -> Any:
    """A native ext value as ``kind``; unconvertible values come back unchanged (the handler reports them)."""
    if kind == INT:
        if isinstance(value, bool):
            return value
        if isinstance(value, int):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, str) and len(value) <= _MAX_INT_CHARS and _INT_RE.fullmatch(value.strip()):
            return int(value.strip())
        return value
    if kind == BOOL:
        if isinstance(value, bool):
            return value
        if isinstance(value, str):
            low = value.strip().lower()
            if low in ("true", "1"):
                return True
            if low in ("false", "0"):
                return False
        if isinstance(value, int):
            return value != 0
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return str(value)
    return value


def typed_ext(ext: Mapping[str, Any], schema: Mapping[str, str] | None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, value in ext.items():
        if name in RPC_HOOK_FIELDS:
            continue
        kind = schema.get(name) if schema else None
        if kind is None:
            out[name] = value
            continue
        # Clients write absent numbers and flags as empty strings (the C++ client does).
        if isinstance(value, str) and value == "" and kind != STR:
            continue
        out[name] = convert_value(value, kind)
    return out


def ext_to_native(ext: Mapping[str, Any]) -> dict[str, str]:
    out: dict[str, str] = {}
    for name, value in ext.items():
        if value is None:
            continue
        if isinstance(value, bool):
            out[name] = "true" if value else "false"
        elif isinstance(value, (str, int, float)):
            out[name] = str(value)
        else:
            out[name] = json.dumps(value, default=_json_default)
    return out


# -- JSON bodies -------------------------------------------------------------------------------------------


def parse_json_body(body: bytes | None) -> Any:
    """A JSON body as Python values; None when there is no body or it is not JSON."""
    if not body:
        return None
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        return None
    try:
        return json.loads(text)
    except ValueError:
        pass
    try:
        return json.loads(_BARE_KEY_RE.sub(r'\1"\2"\3', text))
    except ValueError:
        return None


def _json_default(value: Any) -> Any:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return base64.b64encode(bytes(value)).decode("ascii")  # fastjson writes byte[] as base64
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def json_body(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=_json_default).encode("utf-8")


def _enum_name(value: Any, names: Mapping[int, str] | tuple[str, ...]) -> Any:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and len(value) <= _MAX_INT_CHARS and _INT_RE.fullmatch(value):
        value = int(value)
    if isinstance(value, int):
        if isinstance(names, tuple):
            return names[value] if 0 <= value < len(names) else value
        return names.get(value, value)
    return value


def normalize_heartbeat(body: Any) -> Any:
    """HEART_BEAT body: enum ordinals to names, numbers in strings to ints.

    The C++ client writes the enums as ordinals and ``subVersion`` as a string; JS and Java write names."""
    if not isinstance(body, dict):
        return body
    consumers = body.get("consumerDataSet")
    if isinstance(consumers, list):
        for cd in consumers:
            if not isinstance(cd, dict):
                continue
            if "consumeType" in cd:
                cd["consumeType"] = _enum_name(cd["consumeType"], _CONSUME_TYPES)
            if "messageModel" in cd:
                cd["messageModel"] = _enum_name(cd["messageModel"], _MESSAGE_MODELS)
            if "consumeFromWhere" in cd:
                cfw = _enum_name(cd["consumeFromWhere"], _CONSUME_FROM)
                if isinstance(cfw, str):
                    cfw = _DEPRECATED_CONSUME_FROM.get(cfw, cfw)
                cd["consumeFromWhere"] = cfw
            if "unitMode" in cd:
                cd["unitMode"] = convert_value(cd["unitMode"], BOOL)
            subs = cd.get("subscriptionDataSet")
            if isinstance(subs, list):
                for sd in subs:
                    if not isinstance(sd, dict):
                        continue
                    if "subVersion" in sd:
                        sd["subVersion"] = convert_value(sd["subVersion"], INT)
                    if isinstance(sd.get("codeSet"), list):
                        sd["codeSet"] = [convert_value(c, INT) for c in sd["codeSet"]]
    for key in ("consumerDataSet", "producerDataSet"):
        if body.get(key) is None:
            body[key] = []
    return body


def normalize_lock_body(body: Any) -> Any:
    if not isinstance(body, dict):
        return body
    body.setdefault("onlyThisBroker", False)
    body["onlyThisBroker"] = convert_value(body["onlyThisBroker"], BOOL)
    mqs = body.get("mqSet")
    if isinstance(mqs, list):
        for mq in mqs:
            if isinstance(mq, dict) and "queueId" in mq:
                mq["queueId"] = convert_value(mq["queueId"], INT)
    return body


# -- requests from real clients ----------------------------------------------------------------------------


def normalize_batch_ack(body: Any) -> Any:
    """BatchAckMessageRequestBody: each ack's bit set (``b``, java.util.BitSet#toByteArray in base64, as
    BitSetSerializerDeserializer writes it) becomes the list of its set indices."""
    if not isinstance(body, dict) or not isinstance(body.get("acks"), list):
        return body
    acks = []
    for ack in body["acks"]:
        if isinstance(ack, dict) and isinstance(ack.get("b"), str):
            try:
                ack = dict(ack, b=bitset_indices(base64.b64decode(ack["b"], validate=True)))
            except ValueError:
                pass  # left as it is: the handler names the field
        acks.append(ack)
    return dict(body, acks=acks)


def _send_request(ext: dict[str, Any], raw_body: bytes | None) -> tuple[dict[str, Any], Any]:
    props_text = ext.pop("properties", None)
    props = string_to_properties(props_text) if isinstance(props_text, str) else {}
    body = raw_body or b""
    sys_flag = ext.get("sysFlag")
    if isinstance(sys_flag, int) and not isinstance(sys_flag, bool) and sys_flag & COMPRESSED_FLAG:
        try:
            body = inflate_bounded(body, MAX_INFLATED_BODY)
        except zlib.error:
            pass  # stored as sent; the consumer sees what the producer sent
    if props.get(PROPERTY_TAGS):
        ext["tags"] = props[PROPERTY_TAGS]
    if props.get(PROPERTY_KEYS):
        ext["keys"] = props[PROPERTY_KEYS]
    return ext, {"body": body, "properties": props}


def inflate_bounded(data: bytes, limit: int) -> bytes:
    """zlib-inflate ``data`` to at most ``limit + 1`` bytes (one more than allowed tells the caller it
    was too large) without ever holding more."""
    d = zlib.decompressobj()
    out = d.decompress(data, limit + 1)
    if len(out) <= limit and not d.unconsumed_tail:
        out += d.flush()
    return out[: limit + 1]


def _pull_request(ext: dict[str, Any]) -> dict[str, Any]:
    sys_flag = ext.get("sysFlag")
    if isinstance(sys_flag, int) and not isinstance(sys_flag, bool):
        # RocketMQ's broker reads these three only when their bit is set.
        if not sys_flag & PULL_COMMIT_OFFSET:
            ext["commitOffset"] = 0
        if not sys_flag & PULL_SUSPEND:
            ext["suspendTimeoutMillis"] = 0
        if not sys_flag & PULL_SUBSCRIPTION:
            ext.pop("subscription", None)
    return ext


def _send_back_request(ext: dict[str, Any]) -> dict[str, Any]:
    offset = ext.get("offset")
    if isinstance(offset, int) and not isinstance(offset, bool):
        group = ext.get("group")
        candidates = [ext.get("originTopic") or "", retry_topic(group) if isinstance(group, str) else ""]
        found = unpack_physical_offset(offset, candidates)
        if found is not None:
            topic, queue_id, queue_offset = found
            ext["originTopic"] = topic
            ext["queueId"] = queue_id
            ext["offset"] = queue_offset
    return ext


def request_from_native(frame: NativeFrame) -> RemotingCommand:
    """A request (or one-way request) from a real client as the handlers expect it."""
    code = frame.code
    raw_ext = dict(frame.ext)
    if code == RequestCode.SEND_MESSAGE_V2:
        code = int(RequestCode.SEND_MESSAGE)
        raw_ext = {SEND_V2_NAMES.get(k, k): v for k, v in raw_ext.items()}
    ext = typed_ext(raw_ext, REQUEST_SCHEMAS.get(code))
    body: Any
    if code == RequestCode.SEND_MESSAGE:
        ext, body = _send_request(ext, frame.body)
    elif code == RequestCode.PULL_MESSAGE:
        ext, body = _pull_request(ext), None
    elif code == RequestCode.CONSUMER_SEND_MSG_BACK:
        ext, body = _send_back_request(ext), None
    elif code == RequestCode.HEART_BEAT:
        parsed = parse_json_body(frame.body)
        body = normalize_heartbeat(parsed) if parsed is not None else frame.body
    elif code in (RequestCode.LOCK_BATCH_MQ, RequestCode.UNLOCK_BATCH_MQ):
        parsed = parse_json_body(frame.body)
        body = normalize_lock_body(parsed) if parsed is not None else frame.body
    elif code == RequestCode.BATCH_ACK_MESSAGE:
        parsed = parse_json_body(frame.body)
        body = normalize_batch_ack(parsed) if parsed is not None else frame.body
    else:
        parsed = parse_json_body(frame.body)
        body = parsed if parsed is not None else frame.body
    flag = frame.flag & (Flag.RESPONSE | Flag.ONEWAY)
    cmd = RemotingCommand(code, frame.opaque, flag, frame.remark, ext, body)
    cmd.auth = native_signed_content(frame.ext, frame.body)
    return cmd


def message_from_record(rec: MessageRecord) -> dict[str, Any]:
    """A MessageExt record as PROTOCOL.md's message map, without ``brokerName`` (the record has none: the
    client names the queue it pulled, as PullAPIWrapper.processPullResult does). The message id is
    UNIQ_KEY, else the offset message id (MessageClientExt.getMsgId); ``commitLogOffset`` is kept for
    CONSUMER_SEND_MSG_BACK."""
    props = rec.properties
    body = rec.body
    if rec.sys_flag & COMPRESSED_FLAG:
        try:
            body = inflate_bounded(body, MAX_INFLATED_BODY)
        except zlib.error as exc:
            raise RecordError(f"message {rec.topic}:{rec.queue_id}@{rec.queue_offset}: body: {exc}") from None
    msg: dict[str, Any] = {
        "msgId": props.get(PROPERTY_UNIQ_KEY) or offset_msg_id(rec.store_host, rec.physical_offset),
        "topic": rec.topic,
        "queueId": rec.queue_id,
        "queueOffset": rec.queue_offset,
        "body": body,
        "bornTimestamp": rec.born_timestamp,
        "storeTimestamp": rec.store_timestamp,
        "reconsumeTimes": rec.reconsume_times,
        "properties": props,
        "commitLogOffset": rec.physical_offset,
    }
    if props.get(PROPERTY_TAGS):
        msg["tags"] = props[PROPERTY_TAGS]
    if props.get(PROPERTY_KEYS):
        msg["keys"] = props[PROPERTY_KEYS]
    return msg


def response_from_native(
    request_code: int | None, frame: NativeFrame, uniq_key: str | None = None
) -> RemotingCommand:
    """An answer to a request we sent, in the form the request's caller reads: header fields typed by
    RESPONSE_SCHEMAS, JSON bodies as maps, a pull's records as ``{"messages": [...]}``. For SEND_MESSAGE
    the message id is the UNIQ_KEY sent (``uniq_key``) and the broker's own id is ``offsetMsgId``, as
    in RocketMQ's SendResult. A body that cannot be read becomes a SYSTEM_ERROR answer naming why, so
    the caller fails with a clear error and the connection lives on."""
    ext = typed_ext(frame.ext, RESPONSE_SCHEMAS.get(request_code) if request_code is not None else None)
    flag = frame.flag | Flag.RESPONSE
    body: Any
    if (
        request_code in (RequestCode.PULL_MESSAGE, RequestCode.POP_MESSAGE)
        and frame.code == ResponseCode.SUCCESS
    ):
        try:
            body = {"messages": [message_from_record(r) for r in decode_records(frame.body or b"")]}
        except RecordError as exc:
            remark = f"the {code_name(request_code, response=False)} answer cannot be read: {exc}"
            return RemotingCommand(ResponseCode.SYSTEM_ERROR, frame.opaque, flag, remark, ext, None)
    else:
        parsed = parse_json_body(frame.body)
        body = parsed if parsed is not None else frame.body
    if request_code == RequestCode.SEND_MESSAGE and uniq_key is not None:
        if "msgId" in ext:
            ext["offsetMsgId"] = ext["msgId"]
        ext["msgId"] = uniq_key
    return RemotingCommand(frame.code, frame.opaque, flag, frame.remark, ext, body)


# -- answers to real clients -------------------------------------------------------------------------------


def _route_body(body: Any, ctx: TranslateContext) -> Any:
    if not isinstance(body, dict):
        return body
    out = dict(body)
    brokers = []
    for bd in out.get("brokerDatas") or []:
        if not isinstance(bd, dict):
            continue
        bd = dict(bd)
        native = bd.pop("nativeAddrs", None)
        addrs = native if isinstance(native, dict) and native else bd.get("brokerAddrs") or {}
        if not (isinstance(native, dict) and native):
            addrs = {str(k): ctx.rewrite_broker_addr(str(v)) for k, v in addrs.items()}
        bd["brokerAddrs"] = {str(k): str(v) for k, v in addrs.items()}
        brokers.append(bd)
    out["brokerDatas"] = brokers
    queues = []
    for qd in out.get("queueDatas") or []:
        if isinstance(qd, dict):
            qd = dict(qd)
            qd.setdefault("topicSysFlag", 0)
            queues.append(qd)
    out["queueDatas"] = queues
    out.setdefault("filterServerTable", {})
    return out


def _message_record(msg: Mapping[str, Any], ctx: TranslateContext) -> bytes:
    topic = str(msg.get("topic") or "")
    queue_id = int(msg.get("queueId") or 0)
    queue_offset = int(msg.get("queueOffset") or 0)
    body = msg.get("body") or b""
    if isinstance(body, str):
        body = body.encode("utf-8")
    props = {str(k): str(v) for k, v in (msg.get("properties") or {}).items()}
    if msg.get("tags"):
        props[PROPERTY_TAGS] = str(msg["tags"])
    if msg.get("keys"):
        props[PROPERTY_KEYS] = str(msg["keys"])
    msg_id = msg.get("msgId")
    if msg_id and not props.get(PROPERTY_UNIQ_KEY):
        # Clients show UNIQ_KEY as the message id: make it the broker's, as our own clients see it.
        props[PROPERTY_UNIQ_KEY] = str(msg_id)
    physical = pack_physical_offset(topic, queue_id, queue_offset)
    record = MessageRecord(
        topic=topic,
        queue_id=queue_id,
        queue_offset=queue_offset,
        body=bytes(body),
        properties=props,
        born_timestamp=int(msg.get("bornTimestamp") or 0),
        store_timestamp=int(msg.get("storeTimestamp") or 0),
        reconsume_times=int(msg.get("reconsumeTimes") or 0),
        physical_offset=physical if physical is not None else queue_offset,
        born_host=StoreHost(ctx.store_host.ip, 0),
        store_host=ctx.store_host,
    )
    return encode_record(record)


def _pull_body(body: Any, ctx: TranslateContext) -> bytes | None:
    if isinstance(body, dict) and isinstance(body.get("messages"), list):
        return b"".join(_message_record(m, ctx) for m in body["messages"] if isinstance(m, dict))
    if isinstance(body, (bytes, bytearray)):
        return bytes(body)
    return None


def _body_to_native(body: Any) -> bytes | None:
    if body is None:
        return None
    if isinstance(body, (bytes, bytearray, memoryview)):
        return bytes(body)
    return json_body(body)


def response_to_native(request_code: int | None, cmd: RemotingCommand, ctx: TranslateContext) -> NativeFrame:
    """Our answer to a real client's request, in the form that client reads."""
    ext = dict(cmd.ext)
    body: bytes | None
    if request_code == RequestCode.POP_MESSAGE:
        body = _pull_body(cmd.body, ctx) if cmd.code == ResponseCode.SUCCESS else None
    elif request_code == RequestCode.PULL_MESSAGE:
        ext.setdefault("suggestWhichBrokerId", 0)
        for name in ("nextBeginOffset", "minOffset", "maxOffset"):
            ext.setdefault(name, 0)
        body = _pull_body(cmd.body, ctx) if cmd.code == ResponseCode.SUCCESS else None
    elif request_code == RequestCode.GET_ROUTEINFO_BY_TOPIC:
        body = _body_to_native(_route_body(cmd.body, ctx))
    else:
        body = _body_to_native(cmd.body)
    return NativeFrame(
        code=cmd.code,
        opaque=cmd.opaque,
        flag=(cmd.flag | Flag.RESPONSE) & ~Flag.ONEWAY,
        remark=cmd.remark,
        ext=ext_to_native(ext),
        body=body,
    )


def send_uniq_key(cmd: RemotingCommand) -> str | None:
    """The UNIQ_KEY property a SEND_MESSAGE request already carries, if any."""
    props = cmd.body.get("properties") if isinstance(cmd.body, dict) else None
    value = props.get(PROPERTY_UNIQ_KEY) if isinstance(props, dict) else None
    return value if isinstance(value, str) and value else None


def _send_to_native(ext: dict[str, Any], payload: Any, uniq_key: str | None) -> tuple[dict[str, Any], bytes]:
    """SEND_MESSAGE as DefaultMQProducerImpl.sendKernelImpl writes it (then SEND_MESSAGE_V2's names):
    tags and keys travel as properties, the body as the frame's body."""
    payload = payload if isinstance(payload, dict) else {}
    props = {str(k): str(v) for k, v in (payload.get("properties") or {}).items()}
    tags = ext.pop("tags", None)
    keys = ext.pop("keys", None)
    if tags is not None:
        props[PROPERTY_TAGS] = str(tags)
    if keys is not None:
        props[PROPERTY_KEYS] = str(keys)
    if uniq_key is not None:
        props.setdefault(PROPERTY_UNIQ_KEY, uniq_key)
    out = {**_SEND_DEFAULTS, **ext, "properties": properties_to_string(props)}
    body = payload.get("body") or b""
    if isinstance(body, str):
        body = body.encode("utf-8")
    return {NAMES_SEND_V2.get(k, k): v for k, v in out.items()}, bytes(body)


def _send_back_to_native(ext: dict[str, Any]) -> dict[str, Any]:
    """CONSUMER_SEND_MSG_BACK names its message by commit-log offset (ConsumerSendMsgBackRequestHeader has
    no queue id): the offset the pulled record carried, else the one our broker's native port made up."""
    ext = dict(ext)
    queue_id = ext.pop("queueId", None)
    physical = ext.pop("commitLogOffset", None)
    if physical is None and isinstance(queue_id, int) and isinstance(ext.get("offset"), int):
        physical = pack_physical_offset(str(ext.get("originTopic") or ""), queue_id, ext["offset"])
    if physical is not None:
        ext["offset"] = physical
    ext.setdefault("unitMode", False)
    return ext


def request_to_native(
    cmd: RemotingCommand, uniq_key: str | None = None, language: str = LANGUAGE
) -> NativeFrame:
    """A request in the form RocketMQ's Java client sends it: our client's requests to a broker or name
    server (SEND_MESSAGE as SEND_MESSAGE_V2, ``uniq_key`` its UNIQ_KEY when it has none), and the requests
    a server pushes to a real client (NOTIFY_CONSUMER_IDS_CHANGED and the like)."""
    code = cmd.code
    ext = dict(cmd.ext)
    body: bytes | None
    if code == RequestCode.SEND_MESSAGE:
        code = int(RequestCode.SEND_MESSAGE_V2)
        ext, body = _send_to_native(ext, cmd.body, uniq_key)
    elif code == RequestCode.CONSUMER_SEND_MSG_BACK:
        ext, body = _send_back_to_native(ext), None
    elif code == RequestCode.UPDATE_AND_CREATE_TOPIC:
        ext, body = {**_CREATE_TOPIC_DEFAULTS, **ext}, _body_to_native(cmd.body)
    else:
        body = _body_to_native(cmd.body)
    return NativeFrame(
        code=code,
        opaque=cmd.opaque,
        flag=cmd.flag & Flag.ONEWAY,
        remark=cmd.remark,
        ext=ext_to_native(ext),
        body=body,
        language=language,
    )


def encode_native(frame: NativeFrame) -> bytes:
    return encode_frame(frame)
