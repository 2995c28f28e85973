"""The native codec without sockets: frames, per-code translation both ways, MessageExt records."""

from __future__ import annotations

import json
import struct
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kit.native_wire import binary_frame, decode_messages, json_frame, split_frames

from rmqlab.protocol.codes import Flag, RequestCode, ResponseCode
from rmqlab.protocol.command import FrameError, InvalidParameter, RemotingCommand
from rmqlab.protocol.model import HeartbeatData, MessageQueue
from rmqlab.protocol.native import NativeCodec, native_codec_factory, port_rewriter
from rmqlab.protocol.native.message_ext import pack_physical_offset


def codec() -> NativeCodec:
    return native_codec_factory(
        1 << 20, store_host="10.1.2.3:10911", rewrite_broker_addr=port_rewriter(7000, 7001)
    )


def one(c: NativeCodec, frame: bytes) -> RemotingCommand:
    cmds = c.feed(frame)
    assert len(cmds) == 1
    return cmds[0]


def reply(c: NativeCodec, cmd: RemotingCommand, resp: RemotingCommand):
    resp.opaque = cmd.opaque
    resp.flag |= Flag.RESPONSE
    frames, rest = split_frames(c.encode(resp))
    assert len(frames) == 1 and rest == b""
    return frames[0]


# -- frames ------------------------------------------------------------------------------------------------


def test_json_frame_fed_byte_by_byte_and_back_to_back():
    c = codec()
    data = json_frame(RequestCode.GET_MAX_OFFSET, 7, {"topic": "T", "queueId": 3}) + json_frame(
        RequestCode.GET_MIN_OFFSET, 8, {"topic": "T", "queueId": "2"}
    )
    got: list[RemotingCommand] = []
    for i in range(len(data)):
        got += c.feed(data[i : i + 1])
    assert [(x.code, x.opaque, x.ext) for x in got] == [
        (RequestCode.GET_MAX_OFFSET, 7, {"topic": "T", "queueId": 3}),
        (RequestCode.GET_MIN_OFFSET, 8, {"topic": "T", "queueId": 2}),
    ]


def test_binary_rocketmq_header_is_read():
    c = codec()
    cmd = one(c, binary_frame(RequestCode.QUERY_CONSUMER_OFFSET, 5, {"consumerGroup": "g", "queueId": "1"}))
    assert cmd.code == RequestCode.QUERY_CONSUMER_OFFSET
    assert cmd.opaque == 5
    assert cmd.ext == {"consumerGroup": "g", "queueId": 1}


@pytest.mark.parametrize(
    "data",
    [
        struct.pack(">I", 2) + b"ab",  # total shorter than the header-length field
        struct.pack(">I", 1 << 30),  # over the frame limit
        struct.pack(">II", 8, 100) + b"{}{}",  # header longer than the frame
        struct.pack(">II", 6, 2) + b"[]",  # header not an object
        struct.pack(">II", 7, 3) + b"{x}",  # header not JSON
        struct.pack(">II", 6, (2 << 24) | 2) + b"{}",  # unknown serialize type
        struct.pack(">II", 6, 2) + b"{}",  # no code
        struct.pack(">II", 17, 13) + b'{"code":"ab"}',  # code not a number
    ],
)
def test_bad_frames_raise_frame_error(data: bytes):
    with pytest.raises(FrameError):
        codec().feed(data)


# -- requests ----------------------------------------------------------------------------------------------


def test_rpc_hook_fields_dropped_and_types_follow_the_schema():
    c = codec()
    cmd = one(
        c,
        json_frame(
            RequestCode.QUERY_CONSUMER_OFFSET,
            1,
            {"consumerGroup": "g", "topic": "T", "queueId": "3", "setZeroIfNotFound": "false"},
        ),
    )
    assert cmd.ext == {"consumerGroup": "g", "topic": "T", "queueId": 3, "setZeroIfNotFound": False}


def test_unconvertible_value_reaches_the_handler_as_a_named_error():
    c = codec()
    cmd = one(c, json_frame(RequestCode.GET_MAX_OFFSET, 1, {"topic": "T", "queueId": "three"}))
    with pytest.raises(InvalidParameter, match="queueId"):
        cmd.ext_int("queueId")


def test_empty_string_for_a_number_counts_as_absent():
    cmd = one(codec(), json_frame(RequestCode.UPDATE_CONSUMER_OFFSET, 1, {"queueId": 1, "commitOffset": ""}))
    assert "commitOffset" not in cmd.ext


@pytest.mark.parametrize(
    ("sys_flag", "commit", "suspend", "has_sub"),
    [(0b111, 42, 15000, True), (0b110, 0, 15000, True), (0b001, 42, 0, False), (0, 0, 0, False)],
)
def test_pull_sys_flag_decides_commit_suspend_and_subscription(sys_flag, commit, suspend, has_sub):
    # C++ 2.1.0 sends queueId/maxMsgNums/sysFlag as numbers and the rest as strings.
    ext = {
        "consumerGroup": "g",
        "topic": "T",
        "queueId": 2,
        "queueOffset": "10",
        "maxMsgNums": 32,
        "sysFlag": sys_flag,
        "commitOffset": "42",
        "subVersion": "1700000000000",
        "suspendTimeoutMillis": "15000",
        "subscription": "*",
    }
    cmd = one(codec(), json_frame(RequestCode.PULL_MESSAGE, 9, ext))
    assert cmd.ext["commitOffset"] == commit
    assert cmd.ext["suspendTimeoutMillis"] == suspend
    assert ("subscription" in cmd.ext) is has_sub
    assert cmd.ext["queueOffset"] == 10 and cmd.ext["subVersion"] == 1700000000000


def test_send_message_v2_short_names_become_send_message():
    props = "TAGS\x01tagA\x02KEYS\x01k1 k2\x02UNIQ_KEY\x01ABCDEF\x02WAIT\x01true\x02"
    ext = {"a": "pg", "b": "T", "c": "TBW102", "d": 4, "e": 1, "f": 0, "g": "1700000000123", "h": 0}
    ext |= {"i": props, "j": "0", "k": "false", "m": "false"}
    cmd = one(codec(), json_frame(RequestCode.SEND_MESSAGE_V2, 3, ext, body=b"hello"))
    assert cmd.code == RequestCode.SEND_MESSAGE
    assert cmd.ext["producerGroup"] == "pg" and cmd.ext["topic"] == "T"
    assert cmd.ext["queueId"] == 1 and cmd.ext["bornTimestamp"] == 1700000000123
    assert cmd.ext["tags"] == "tagA" and cmd.ext["keys"] == "k1 k2"
    assert cmd.ext["unitMode"] is False
    assert cmd.body == {
        "body": b"hello",
        "properties": {"TAGS": "tagA", "KEYS": "k1 k2", "UNIQ_KEY": "ABCDEF", "WAIT": "true"},
    }


def test_compressed_send_body_is_inflated():
    ext = {"a": "pg", "b": "T", "e": 0, "f": 1, "g": "1", "i": ""}
    cmd = one(codec(), json_frame(RequestCode.SEND_MESSAGE_V2, 3, ext, body=zlib.compress(b"x" * 5000)))
    assert cmd.body["body"] == b"x" * 5000


def test_cpp_heartbeat_enums_as_ordinals():
    hb = {
        "clientID": "10.0.0.1@123",
        "consumerDataSet": [
            {
                "groupName": "g",
                "consumeFromWhere": 4,
                "consumeType": 1,
                "messageModel": 1,
                "subscriptionDataSet": [{"subString": "*", "subVersion": "1700000000000", "topic": "T"}],
            }
        ],
    }
    cmd = one(codec(), json_frame(RequestCode.HEART_BEAT, 1, {}, body=json.dumps(hb).encode()))
    assert cmd.ext == {}
    data = HeartbeatData.from_wire(cmd.body)
    cd = data.consumer_data_set[0]
    assert (cd.consume_type, cd.message_model, cd.consume_from_where) == (
        "CONSUME_PASSIVELY",
        "CLUSTERING",
        "CONSUME_FROM_FIRST_OFFSET",
    )
    assert cd.subscription_data_set[0].sub_version == 1700000000000
    assert data.producer_data_set == []


def test_js_heartbeat_names_and_deprecated_consume_from():
    hb = {
        "clientID": "c@1",
        "consumerDataSet": [
            {
                "groupName": "g",
                "consumeType": "CONSUME_PASSIVELY",
                "messageModel": "CLUSTERING",
                "consumeFromWhere": "CONSUME_FROM_MAX_OFFSET",
                "subscriptionDataSet": [
                    {"topic": "T", "subString": "a || b", "tagsSet": ["a", "b"], "codeSet": [97, 98]}
                ],
                "unitMode": False,
            }
        ],
        "producerDataSet": [{"groupName": "CLIENT_INNER_PRODUCER"}],
    }
    frame = json_frame(RequestCode.HEART_BEAT, 1, {}, body=json.dumps(hb).encode(), language="JAVA")
    cmd = one(codec(), frame)
    data = HeartbeatData.from_wire(cmd.body)
    assert data.consumer_data_set[0].consume_from_where == "CONSUME_FROM_LAST_OFFSET"
    assert data.consumer_data_set[0].subscription_data_set[0].tags_set == ["a", "b"]


def test_fastjson_bare_number_keys_are_accepted():
    body = b'{"consumerGroup":"g","clientId":"c","x":{0:"y"},'
    body += b'"mqSet":[{"topic":"T","brokerName":"b","queueId":1}]}'
    cmd = one(codec(), json_frame(RequestCode.LOCK_BATCH_MQ, 1, {}, body=body))
    assert cmd.body["onlyThisBroker"] is False
    assert MessageQueue.from_wire(cmd.body["mqSet"][0]) == MessageQueue("T", "b", 1)


def test_body_that_is_not_json_is_passed_on_as_bytes():
    cmd = one(codec(), json_frame(RequestCode.HEART_BEAT, 1, {}, body=b"\xff\x00garbage"))
    assert cmd.body == b"\xff\x00garbage"


# -- answers -----------------------------------------------------------------------------------------------


def test_pull_answer_is_messageext_records_with_string_header():
    c = codec()
    cmd = one(c, json_frame(RequestCode.PULL_MESSAGE, 11, {"topic": "T", "queueId": 2, "sysFlag": 2}))
    msgs = [
        {
            "msgId": "7F00000100002A9F0000000000000001",
            "topic": "T",
            "brokerName": "broker-a",
            "queueId": 2,
            "queueOffset": 5 + i,
            "body": f"body-{i}".encode(),
            "tags": "tagA",
            "keys": "key-1",
            "bornTimestamp": 1_700_000_000_000 + i,
            "storeTimestamp": 1_700_000_000_500 + i,
            "reconsumeTimes": i,
            "properties": {"p": "v"},
        }
        for i in range(3)
    ]
    ext = {"nextBeginOffset": 8, "minOffset": 0, "maxOffset": 8}
    r = reply(c, cmd, cmd.response(ResponseCode.SUCCESS, ext=ext, body={"messages": msgs}))
    assert (r.code, r.opaque, r.flag & 1) == (0, 11, 1)
    assert r.ext == {"nextBeginOffset": "8", "minOffset": "0", "maxOffset": "8", "suggestWhichBrokerId": "0"}
    got = decode_messages(r.body)
    assert [m.queue_offset for m in got] == [5, 6, 7]
    first = got[0]
    assert first.magic == 0xDAA320A7 and first.topic == "T" and first.queue_id == 2
    assert first.body == b"body-0" and first.body_crc == zlib.crc32(b"body-0") & 0x7FFFFFFF
    assert first.properties == {
        "p": "v",
        "TAGS": "tagA",
        "KEYS": "key-1",
        "UNIQ_KEY": "7F00000100002A9F0000000000000001",
    }
    assert first.born_timestamp == 1_700_000_000_000 and first.store_timestamp == 1_700_000_000_500
    assert got[2].reconsume_times == 2
    assert first.store_host == "10.1.2.3:10911"
    assert len(first.offset_msg_id) == 32 and first.offset_msg_id.startswith("0A010203")
    assert len({m.physical_offset for m in got}) == 3
    # JavaScript clients read the offset as a double: it must be exact there.
    assert all(m.physical_offset < 2**53 for m in got)


def test_pull_answer_keeps_a_producers_uniq_key():
    c = codec()
    cmd = one(c, json_frame(RequestCode.PULL_MESSAGE, 1, {"topic": "T", "queueId": 0}))
    msg = {"msgId": "BROKERID", "topic": "T", "queueId": 0, "queueOffset": 0, "body": b"x"}
    msg["properties"] = {"UNIQ_KEY": "PRODUCERID"}
    r = reply(c, cmd, cmd.response(ext={"nextBeginOffset": 1}, body={"messages": [msg]}))
    assert decode_messages(r.body)[0].properties["UNIQ_KEY"] == "PRODUCERID"


def test_pull_not_found_has_no_body_and_all_offsets():
    c = codec()
    cmd = one(c, json_frame(RequestCode.PULL_MESSAGE, 4, {"topic": "T", "queueId": 0}))
    r = reply(c, cmd, cmd.response(ResponseCode.PULL_NOT_FOUND, ext={"nextBeginOffset": 3}))
    assert r.code == ResponseCode.PULL_NOT_FOUND and r.body == b""
    assert r.ext == {"nextBeginOffset": "3", "minOffset": "0", "maxOffset": "0", "suggestWhichBrokerId": "0"}


def test_long_topic_uses_the_v2_layout():
    c = codec()
    topic = "T" * 200
    cmd = one(c, json_frame(RequestCode.PULL_MESSAGE, 4, {"topic": topic, "queueId": 0}))
    msg = {"msgId": "m", "topic": topic, "queueId": 0, "queueOffset": 0, "body": b"x"}
    got = decode_messages(reply(c, cmd, cmd.response(body={"messages": [msg]})).body)
    assert got[0].magic == 0xDAA320AB and got[0].topic == topic


def test_route_answer_points_at_the_native_port():
    c = codec()
    cmd = one(c, json_frame(RequestCode.GET_ROUTEINFO_BY_TOPIC, 2, {"topic": "T"}))
    route = {
        "brokerDatas": [{"cluster": "c", "brokerName": "broker-a", "brokerAddrs": {"0": "10.1.2.3:7000"}}],
        "queueDatas": [{"brokerName": "broker-a", "readQueueNums": 4, "writeQueueNums": 4, "perm": 6}],
    }
    r = reply(c, cmd, cmd.response(body=route))
    got = r.json()
    assert got["brokerDatas"][0]["brokerAddrs"] == {"0": "10.1.2.3:7001"}
    assert got["queueDatas"][0]["readQueueNums"] == 4 and got["queueDatas"][0]["topicSysFlag"] == 0


def test_advertised_ports_are_rewritten_too():
    rewrite = port_rewriter(7000, 7001, 7100)
    assert [rewrite(a) for a in ("h:7000", "h:7100", "h:7200")] == ["h:7001", "h:7001", "h:7200"]


def test_route_answer_prefers_registered_native_addresses():
    c = codec()
    cmd = one(c, json_frame(RequestCode.GET_ROUTEINFO_BY_TOPIC, 2, {"topic": "T"}))
    bd = {"brokerName": "b", "brokerAddrs": {"0": "h:1"}, "nativeAddrs": {"0": "h:2"}}
    got = reply(c, cmd, cmd.response(body={"brokerDatas": [bd], "queueDatas": []})).json()
    assert got["brokerDatas"][0] == {"brokerName": "b", "brokerAddrs": {"0": "h:2"}}


def test_json_bodies_and_errors_go_back_as_sent():
    c = codec()
    cmd = one(c, json_frame(RequestCode.GET_CONSUMER_LIST_BY_GROUP, 3, {"consumerGroup": "g"}))
    r = reply(c, cmd, cmd.response(body={"consumerIdList": ["a@1", "b@2"]}))
    assert r.json() == {"consumerIdList": ["a@1", "b@2"]}
    cmd = one(c, json_frame(RequestCode.GET_CONSUMER_LIST_BY_GROUP, 4, {"consumerGroup": "h"}))
    r = reply(c, cmd, cmd.response(ResponseCode.SYSTEM_ERROR, "no consumer for this group, h"))
    assert (r.code, r.remark, r.ext, r.body) == (1, "no consumer for this group, h", {}, b"")


def test_send_answer_ext_as_strings():
    c = codec()
    cmd = one(c, json_frame(RequestCode.SEND_MESSAGE_V2, 3, {"b": "T", "e": 0}, body=b"x"))
    r = reply(c, cmd, cmd.response(ext={"msgId": "ID", "queueId": 0, "queueOffset": 17}))
    assert r.ext == {"msgId": "ID", "queueId": "0", "queueOffset": "17"}


def test_oneway_requests_are_not_tracked():
    c = codec()
    cmd = one(c, json_frame(RequestCode.UPDATE_CONSUMER_OFFSET, 6, {"queueId": 0}, flag=2))
    assert cmd.is_oneway
    assert c._incoming == {}


def test_pushed_notify_is_a_native_oneway_request():
    c = codec()
    notify = RemotingCommand.request(
        RequestCode.NOTIFY_CONSUMER_IDS_CHANGED, {"consumerGroup": "g"}, oneway=True
    )
    notify.opaque = 99
    frames, _ = split_frames(c.encode(notify))
    assert (frames[0].code, frames[0].opaque, frames[0].flag) == (40, 99, 2)
    assert frames[0].ext == {"consumerGroup": "g"}


def test_peer_answer_to_our_request_is_matched_by_opaque():
    c = codec()
    req = RemotingCommand.request(307, {"consumerGroup": "g", "jstackEnable": False})
    req.opaque = 12
    frames, _ = split_frames(c.encode(req))
    assert frames[0].ext == {"consumerGroup": "g", "jstackEnable": "false"}
    (resp,) = c.feed(json_frame(0, 12, {}, body=b'{"properties":{}}', flag=1))
    assert resp.is_response and resp.opaque == 12 and resp.body == {"properties": {}}


def test_send_back_names_the_message_by_its_queue():
    c = codec()
    phys = pack_physical_offset("%RETRY%g", 1, 77)
    ext = {"group": "g", "offset": str(phys), "delayLevel": 0, "originMsgId": "X", "originTopic": "T"}
    cmd = one(c, json_frame(RequestCode.CONSUMER_SEND_MSG_BACK, 1, ext))
    assert (cmd.ext["originTopic"], cmd.ext["queueId"], cmd.ext["offset"]) == ("%RETRY%g", 1, 77)
    phys = pack_physical_offset("T", 3, 5)
    cmd = one(c, json_frame(RequestCode.CONSUMER_SEND_MSG_BACK, 2, {**ext, "offset": str(phys)}))
    assert (cmd.ext["originTopic"], cmd.ext["queueId"], cmd.ext["offset"]) == ("T", 3, 5)


@settings(max_examples=60, deadline=None)
@given(
    topic=st.text(st.characters(min_codepoint=33, max_codepoint=126), min_size=1, max_size=60),
    queue_id=st.integers(0, 255),
    offsets=st.lists(st.integers(0, 2**36 - 1), min_size=1, max_size=5),
    body=st.binary(max_size=300),
    props=st.dictionaries(
        st.text(st.characters(min_codepoint=48, max_codepoint=122), min_size=1, max_size=8),
        st.text(st.characters(min_codepoint=32, max_codepoint=0x2FF), max_size=20),
        max_size=4,
    ),
)
def test_records_decode_as_encoded(topic, queue_id, offsets, body, props):
    c = codec()
    cmd = one(c, json_frame(RequestCode.PULL_MESSAGE, 1, {"topic": topic, "queueId": queue_id}))
    msgs = [
        {"msgId": f"id{o}", "topic": topic, "queueId": queue_id, "queueOffset": o, "body": body}
        | {"properties": props}
        for o in offsets
    ]
    got = decode_messages(reply(c, cmd, cmd.response(body={"messages": msgs})).body)
    assert [(m.topic, m.queue_id, m.queue_offset, m.body) for m in got] == [
        (topic, queue_id, o, body) for o in offsets
    ]
    for m, o in zip(got, offsets, strict=True):
        assert m.properties == {**props, "UNIQ_KEY": f"id{o}"}
