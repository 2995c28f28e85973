"""The frame codec and model types against PROTOCOL.md, without sockets."""

from __future__ import annotations

import struct

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from rmqlab.protocol.codes import RequestCode, ResponseCode
from rmqlab.protocol.command import (
    CommandError,
    FrameDecoder,
    FrameError,
    InvalidParameter,
    RemotingCommand,
    encode_frame,
    field_bool,
    field_int,
    field_int32,
    field_list,
    field_map,
    field_str,
)
from rmqlab.protocol.model import (
    ConsumerData,
    ConsumeType,
    HeartbeatData,
    Message,
    MessageModel,
    MessageQueue,
    SubscriptionData,
    WireError,
    java_string_hash,
)


def frame(obj: object) -> bytes:
    payload = msgpack.packb(obj, use_bin_type=True)
    return struct.pack(">I", len(payload)) + payload


def test_codes_have_rocketmq_values() -> None:
    expected_requests = {
        "SEND_MESSAGE": 10, "PULL_MESSAGE": 11, "QUERY_CONSUMER_OFFSET": 14, "UPDATE_CONSUMER_OFFSET": 15,
        "UPDATE_AND_CREATE_TOPIC": 17, "SEARCH_OFFSET_BY_TIMESTAMP": 29, "GET_MAX_OFFSET": 30,
        "GET_MIN_OFFSET": 31, "HEART_BEAT": 34, "UNREGISTER_CLIENT": 35, "CONSUMER_SEND_MSG_BACK": 36,
        "GET_CONSUMER_LIST_BY_GROUP": 38, "NOTIFY_CONSUMER_IDS_CHANGED": 40, "LOCK_BATCH_MQ": 41,
        "UNLOCK_BATCH_MQ": 42, "REGISTER_BROKER": 103, "UNREGISTER_BROKER": 104,
        "GET_ROUTEINFO_BY_TOPIC": 105, "GET_CONSUMER_CONNECTION_LIST": 203,
    }  # fmt: skip
    for name, value in expected_requests.items():
        assert RequestCode[name] == value
    expected_responses = {
        "SUCCESS": 0, "SYSTEM_ERROR": 1, "SYSTEM_BUSY": 2, "REQUEST_CODE_NOT_SUPPORTED": 3,
        "MESSAGE_ILLEGAL": 13, "SERVICE_NOT_AVAILABLE": 14, "NO_PERMISSION": 16, "TOPIC_NOT_EXIST": 17,
        "PULL_NOT_FOUND": 19, "PULL_RETRY_IMMEDIATELY": 20, "PULL_OFFSET_MOVED": 21, "QUERY_NOT_FOUND": 22,
        "SUBSCRIPTION_NOT_EXIST": 24, "SUBSCRIPTION_NOT_LATEST": 25, "SUBSCRIPTION_GROUP_NOT_EXIST": 26,
        "INVALID_PARAMETER": 29, "CONSUMER_NOT_ONLINE": 206,
    }  # fmt: skip
    for name, value in expected_responses.items():
        assert ResponseCode[name] == value


def test_round_trip_and_flags() -> None:
    req = RemotingCommand.request(RequestCode.HEART_BEAT, {"a": 1, "b": "x"}, {"k": b"\x00\x01"})
    req.opaque = 7
    (decoded,) = FrameDecoder().feed(encode_frame(req))
    assert decoded == req
    assert not decoded.is_response and not decoded.is_oneway
    resp = decoded.response(ResponseCode.SYSTEM_ERROR, "nope")
    assert resp.opaque == 7 and resp.is_response and resp.remark == "nope"
    oneway = RemotingCommand.request(RequestCode.UPDATE_CONSUMER_OFFSET, oneway=True)
    assert oneway.is_oneway
    assert isinstance(FrameDecoder().feed(encode_frame(req))[0].body["k"], bytes)


def test_optional_keys_default_and_unknown_keys_ignored() -> None:
    (cmd,) = FrameDecoder().feed(frame({"code": 34, "opaque": 3, "whatever": [1, 2]}))
    assert cmd.flag == 0 and cmd.version == 1 and cmd.ext == {} and cmd.body is None and cmd.remark is None


@pytest.mark.parametrize(
    "data",
    [
        struct.pack(">I", 0),
        struct.pack(">I", 1024 + 1),
        frame([1, 2, 3]),
        frame({"opaque": 1}),
        frame({"code": "34", "opaque": 1}),
        frame({"code": 34}),
        frame({"code": 34, "opaque": True}),
        frame({"code": 34, "opaque": 1, "ext": [1]}),
        struct.pack(">I", 3) + b"\xc1\xc1\xc1",
    ],
    ids=["zero", "too-big", "array", "no-code", "str-code", "no-opaque", "bool-opaque", "ext-list", "junk"],
)
def test_invalid_frames_raise(data: bytes) -> None:
    with pytest.raises(FrameError):
        FrameDecoder(max_frame_bytes=1024).feed(data)


@given(st.lists(st.binary(min_size=0, max_size=50), min_size=1, max_size=6), st.data())
def test_decoder_reassembles_any_split(bodies: list[bytes], data: st.DataObject) -> None:
    stream = b""
    sent = []
    for i, b in enumerate(bodies):
        cmd = RemotingCommand.request(RequestCode.SEND_MESSAGE, {"i": i}, {"body": b})
        cmd.opaque = i
        sent.append(cmd)
        stream += encode_frame(cmd)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=8)))
    dec = FrameDecoder()
    got: list[RemotingCommand] = []
    prev = 0
    for c in [*cuts, len(stream)]:
        got += dec.feed(stream[prev:c])
        prev = c
    assert got == sent
    assert dec.buffered == 0


def test_typed_field_access_names_the_field() -> None:
    cmd = RemotingCommand.request(14, {"queueId": "0", "topic": "T", "flag": 1})
    with pytest.raises(InvalidParameter, match="queueId: expected int, got str"):
        cmd.ext_int("queueId")
    with pytest.raises(InvalidParameter, match="consumerGroup: missing"):
        cmd.ext_str("consumerGroup")
    with pytest.raises(InvalidParameter, match="flag: expected bool"):
        cmd.ext_bool("flag")
    assert cmd.ext_int("missing", default=5) == 5
    with pytest.raises(InvalidParameter, match=r"x\.n: expected int, got bool"):
        field_int({"n": True}, "n", "x")
    with pytest.raises(InvalidParameter, match="body"):
        cmd.body_map()
    assert CommandError(17, "no topic").code == 17


@pytest.mark.parametrize(
    ("read", "value", "problem"),
    [
        (field_int, 2**63 - 1, None),
        (field_int, -(2**63), None),
        (field_int, 2**63, "n: 9223372036854775808 is outside a 64-bit long"),
        (field_int, -(2**63) - 1, "outside a 64-bit long"),
        (field_int, True, "n: expected int, got bool"),
        (field_int, 1.0, "n: expected int, got float"),
        (field_int, ResponseCode.SUCCESS, None),  # an int subclass other than bool is an int
        (field_int32, 2**31 - 1, None),
        (field_int32, -(2**31), None),
        (field_int32, 2**31, "n: 2147483648 is outside a 32-bit int"),
        (field_int32, -(2**31) - 1, "outside a 32-bit int"),
        (field_int32, 2**63, "outside a 64-bit long"),
        (field_int32, False, "n: expected int, got bool"),
        (field_str, "", None),
        (field_str, b"x", "n: expected str, got bytes"),
        (field_str, 1, "n: expected str, got int"),
        (field_bool, False, None),
        (field_bool, 0, "n: expected bool, got int"),
        (field_list, [], None),
        (field_list, (1,), "n: expected array, got tuple"),
        (field_map, {}, None),
        (field_map, [], "n: expected map, got list"),
    ],
)
def test_typed_fields_accept_exactly_their_type_and_range(read, value, problem) -> None:
    class Map(dict):  # any map type is read the same way as a plain dict
        pass

    for mapping in ({"n": value}, Map(n=value)):
        if problem is None:
            assert read(mapping, "n") == value
        else:
            with pytest.raises(InvalidParameter, match=problem):
                read(mapping, "n")
    for absent in ({}, {"n": None}):
        assert read(absent, "n", default=7) == 7
        with pytest.raises(InvalidParameter, match=r"w\.n: missing"):
            read(absent, "n", "w")
    with pytest.raises(InvalidParameter, match="w: expected a map"):
        read([("n", value)], "n", "w")


@pytest.mark.parametrize(
    ("read", "ok", "bad", "problem"),
    [
        ("ext_int", -(2**63), 2**63, "9223372036854775808 is outside a 64-bit long"),
        ("ext_int32", 2**31 - 1, 2**31, "2147483648 is outside a 32-bit int"),
        ("ext_int32", 0, True, "expected int, got bool"),
        ("ext_str", "x", 3, "expected str, got int"),
        ("ext_bool", True, 1, "expected bool, got int"),
    ],
)
def test_header_fields_read_like_the_field_functions(read, ok, bad, problem) -> None:
    assert getattr(RemotingCommand.request(11, {"n": ok}), read)("n") == ok
    with pytest.raises(InvalidParameter, match=f"n: {problem}"):
        getattr(RemotingCommand.request(11, {"n": bad}), read)("n")
    assert getattr(RemotingCommand.request(11, {"n": None}), read)("n", None) is None
    with pytest.raises(InvalidParameter, match="n: missing"):
        getattr(RemotingCommand.request(11, {}), read)("n")


def test_message_queue_order_str_and_wire() -> None:
    a0 = MessageQueue("T", "broker-a", 0)
    a10 = MessageQueue("T", "broker-a", 10)
    b2 = MessageQueue("T", "broker-b", 2)
    s1 = MessageQueue("S", "broker-z", 99)
    assert sorted([b2, a10, s1, a0]) == [s1, a0, a10, b2]
    assert str(a10) == "MessageQueue [topic=T, brokerName=broker-a, queueId=10]"
    assert MessageQueue.from_wire(a10.to_wire()) == a10
    assert hash(a10) == hash(MessageQueue("T", "broker-a", 10))
    assert a0.short == "broker-a:0"
    with pytest.raises(WireError, match="queueId"):
        MessageQueue.from_wire({"topic": "T", "brokerName": "b", "queueId": "1"})


def test_subscription_and_heartbeat_wire() -> None:
    assert java_string_hash("") == 0
    assert java_string_hash("ab") == 97 * 31 + 98
    assert java_string_hash("TagA") == 2598919  # "TagA".hashCode() in Java
    sub = SubscriptionData.build("T", " tagA || tagB ", 5)
    assert sub.tags_set == ["tagA", "tagB"] and sub.matches("tagA") and not sub.matches("tagC")
    assert SubscriptionData.build("T", "*", 1).matches(None)
    hb = HeartbeatData(
        "1.2.3.4@1#2",
        consumer_data_set=[ConsumerData("g", ConsumeType.CONSUME_PASSIVELY, MessageModel.CLUSTERING,
                                        subscription_data_set=[sub])],
    )  # fmt: skip
    back = HeartbeatData.from_wire(hb.to_wire())
    assert back == hb
    bad = hb.to_wire()
    bad["consumerDataSet"][0]["messageModel"] = "SOMETIMES"
    with pytest.raises(WireError, match=r"consumerDataSet\[0\].messageModel"):
        HeartbeatData.from_wire(bad)


def test_message_wire() -> None:
    m = Message("id", "T", "broker-a", 1, 5, b"x", "tagA", None, 1, 2, 0, {"k": "v"})
    assert Message.from_wire(m.to_wire()) == m
    assert m.queue == MessageQueue("T", "broker-a", 1)


@pytest.mark.parametrize(
    ("field", "value", "error"),
    [
        ("queueId", True, r"message\.queueId: expected int, got bool"),
        ("queueOffset", 2**63, r"message\.queueOffset: 9223372036854775808 is outside a 64-bit long"),
        ("topic", 7, r"message\.topic: expected str, got int"),
        ("msgId", None, r"message\.msgId: missing"),
        ("body", "x", r"message\.body: expected bytes, got str"),
        ("bornTimestamp", False, r"message\.bornTimestamp: expected int, got bool"),
        ("storeTimestamp", -(2**63) - 1, r"message\.storeTimestamp: .* is outside a 64-bit long"),
        ("tags", 3, r"message\.tags: expected str, got int"),
        ("properties", [], r"message\.properties: expected dict, got list"),
    ],
)
def test_wire_fields_of_the_wrong_type_or_range_are_named(field: str, value: object, error: str) -> None:
    """The inline common case of the model's field checks lets nothing through that the full check
    refuses (a bool for an int, a long out of range, another type, a missing required field)."""
    d = Message("id", "T", "broker-a", 1, 5, b"x", "tagA", None, 1, 2, 0, {"k": "v"}).to_wire()
    d[field] = value
    with pytest.raises(WireError, match=error):
        Message.from_wire(d)


def test_wire_fields_absent_or_null_take_their_default_and_subclasses_pass() -> None:
    class Name(str):
        pass

    d = Message("id", "T", "broker-a", 1, 5, b"x", "tagA", None, 1, 2, 0, {}).to_wire()
    d["tags"] = None
    del d["bornTimestamp"]
    d["topic"] = Name("T")
    m = Message.from_wire(d)
    assert (m.tags, m.born_timestamp, m.topic, m.queue_offset) == (None, 0, "T", 5)
    with pytest.raises(WireError, match="message: expected a map"):
        Message.from_wire([d])
