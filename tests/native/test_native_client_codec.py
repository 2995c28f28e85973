"""The client's side of the native codec without sockets: our typed requests through the client codec and
the server codec (the broker's translation) arrive as the handlers read them, and the answers come back
as our client reads them; malformed and unknown answers give clear errors."""

from __future__ import annotations

import json
import struct
import zlib
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kit.native_wire import split_frames

from rmqlab.protocol.codes import Flag, RequestCode, ResponseCode
from rmqlab.protocol.command import RemotingCommand
from rmqlab.protocol.model import ConsumerData, HeartbeatData, MessageQueue, SubscriptionData
from rmqlab.protocol.native import (
    NativeCodec,
    native_client_codec_factory,
    native_codec_factory,
    port_rewriter,
)
from rmqlab.protocol.native.frame import NativeFrame, encode_frame
from rmqlab.protocol.native.message_ext import (
    COMPRESSED_FLAG,
    MessageRecord,
    RecordError,
    StoreHost,
    UniqIdGenerator,
    decode_records,
    encode_record,
    offset_msg_id,
    pack_physical_offset,
)
from rmqlab.protocol.route import TopicRouteData

STORE = "10.1.2.3:10911"
GET_CONSUMER_RUNNING_INFO = 307  # RequestCode.GET_CONSUMER_RUNNING_INFO, which our client does not serve


def pair() -> tuple[NativeCodec, NativeCodec]:
    uniq = UniqIdGenerator("10.0.0.7", 4242, 7, lambda: 1000.0)
    client = native_client_codec_factory(uniq)(1 << 20)
    server = native_codec_factory(1 << 20, store_host=STORE, rewrite_broker_addr=port_rewriter(7000, 7001))
    return client, server


def to_server(
    client: NativeCodec, server: NativeCodec, cmd: RemotingCommand, opaque: int = 5
) -> RemotingCommand:
    cmd.opaque = opaque
    [got] = server.feed(client.encode(cmd))
    return got


def answer(
    client: NativeCodec, server: NativeCodec, req: RemotingCommand, resp: RemotingCommand
) -> RemotingCommand:
    resp.opaque = req.opaque
    resp.flag |= Flag.RESPONSE
    [got] = client.feed(server.encode(resp))
    assert got.is_response and got.opaque == req.opaque
    return got


# -- requests: what the broker's translation reads is what our client meant --------------------------


@pytest.mark.parametrize(
    ("code", "ext"),
    [
        (RequestCode.QUERY_CONSUMER_OFFSET, {"consumerGroup": "g", "topic": "T", "queueId": 3}),
        (RequestCode.GET_MAX_OFFSET, {"topic": "T", "queueId": 1}),
        (
            RequestCode.SEARCH_OFFSET_BY_TIMESTAMP,
            {"topic": "T", "queueId": 1, "timestamp": 1_700_000_000_000},
        ),
        (RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": "g"}),
        (RequestCode.UNREGISTER_CLIENT, {"clientID": "1.2.3.4@x", "consumerGroup": "g"}),
        (RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "T"}),
        (
            RequestCode.PULL_MESSAGE,
            {
                "consumerGroup": "g",
                "topic": "T",
                "queueId": 2,
                "queueOffset": 40,
                "maxMsgNums": 32,
                "sysFlag": 0x1 | 0x2 | 0x4,
                "commitOffset": 38,
                "suspendTimeoutMillis": 15000,
                "subVersion": 9,
                "expressionType": "TAG",
                "subscription": "TagA || TagB",
            },
        ),
    ],
)
def test_header_requests_round_trip(code: int, ext: dict[str, Any]) -> None:
    client, server = pair()
    got = to_server(client, server, RemotingCommand.request(code, ext))
    assert (got.code, got.opaque, got.ext, got.body) == (code, 5, ext, None)


def test_update_offset_travels_one_way_and_heartbeat_and_lock_bodies_arrive_as_maps() -> None:
    client, server = pair()
    ext = {"consumerGroup": "g", "topic": "T", "queueId": 0, "commitOffset": 17}
    got = to_server(
        client, server, RemotingCommand.request(RequestCode.UPDATE_CONSUMER_OFFSET, ext, oneway=True)
    )
    assert got.is_oneway and got.ext == ext
    hb = HeartbeatData(
        "1.2.3.4@p#1",
        consumer_data_set=[ConsumerData("g", subscription_data_set=[SubscriptionData.build("T", "A", 3)])],
    )
    got = to_server(client, server, RemotingCommand.request(RequestCode.HEART_BEAT, body=hb.to_wire()))
    assert HeartbeatData.from_wire(got.body) == hb
    lock = {
        "consumerGroup": "g",
        "clientId": "c",
        "onlyThisBroker": False,
        "mqSet": [MessageQueue("T", "broker-a", 1).to_wire()],
    }
    got = to_server(client, server, RemotingCommand.request(RequestCode.LOCK_BATCH_MQ, body=lock))
    assert got.body == lock


def test_a_send_carries_its_tags_keys_and_a_uniq_key_which_becomes_the_message_id() -> None:
    client, server = pair()
    ext = {"producerGroup": "P", "topic": "T", "queueId": 2, "bornTimestamp": 5, "tags": "TagA", "keys": "k1"}
    req = RemotingCommand.request(RequestCode.SEND_MESSAGE, ext, {"body": b"hello", "properties": {"a": "b"}})
    got = to_server(client, server, req)
    assert got.code == RequestCode.SEND_MESSAGE  # sent as SEND_MESSAGE_V2, read back by the broker's side
    assert {k: got.ext[k] for k in ext} == ext
    uniq = got.body["properties"].pop("UNIQ_KEY")
    assert len(uniq) == 32 and uniq.startswith("0A000007")  # the client's ip first, as RocketMQ's
    assert got.body == {"body": b"hello", "properties": {"a": "b", "TAGS": "TagA", "KEYS": "k1"}}
    resp = got.response(ext={"msgId": "BROKERID", "queueId": 2, "queueOffset": 9})
    back = answer(client, server, got, resp)
    assert back.ext == {"msgId": uniq, "offsetMsgId": "BROKERID", "queueId": 2, "queueOffset": 9}
    # a message that has a UNIQ_KEY keeps it (a retry sent by the client itself)
    req = RemotingCommand.request(
        RequestCode.SEND_MESSAGE, ext, {"body": b"x", "properties": {"UNIQ_KEY": "U1"}}
    )
    got = to_server(client, server, req, opaque=6)
    assert got.body["properties"]["UNIQ_KEY"] == "U1"
    assert answer(client, server, got, got.response(ext={"msgId": "B"})).ext["msgId"] == "U1"


def test_send_back_names_the_message_by_its_commit_log_offset() -> None:
    client, server = pair()
    ext = {"group": "g", "originTopic": "T", "queueId": 3, "offset": 12, "originMsgId": "M", "delayLevel": 0}
    ext["maxReconsumeTimes"] = 16
    # pulled from our broker's native port: the offset it made up, which its side turns back into the queue's
    got = to_server(client, server, RemotingCommand.request(RequestCode.CONSUMER_SEND_MSG_BACK, ext))
    assert (got.ext["originTopic"], got.ext["queueId"], got.ext["offset"]) == ("T", 3, 12)
    # pulled from Apache's broker: the record's own commit-log offset
    client, _ = pair()
    frame = _sent_frame(
        client,
        RemotingCommand.request(RequestCode.CONSUMER_SEND_MSG_BACK, {**ext, "commitLogOffset": 987654}),
    )
    assert frame["extFields"]["offset"] == "987654" and "queueId" not in frame["extFields"]
    assert frame["extFields"]["unitMode"] == "false"


def _sent_frame(client: NativeCodec, cmd: RemotingCommand) -> dict[str, Any]:
    cmd.opaque = 9
    data = client.encode(cmd)
    (hlen,) = struct.unpack_from(">I", data, 4)
    return json.loads(data[8 : 8 + (hlen & 0xFFFFFF)])


def test_requests_are_written_as_the_java_client_writes_them() -> None:
    client, _ = pair()
    ext = {"producerGroup": "P", "topic": "T", "queueId": 0, "bornTimestamp": 1}
    header = _sent_frame(client, RemotingCommand.request(RequestCode.SEND_MESSAGE, ext, {"body": b"b"}))
    assert header["code"] == RequestCode.SEND_MESSAGE_V2 and header["language"] == "PYTHON"
    fields = header["extFields"]
    # SendMessageRequestHeaderV2's letters, every value a string, the @CFNotNull ones present
    assert {k: fields[k] for k in "abcdefgh"} == {
        "a": "P",
        "b": "T",
        "c": "TBW102",
        "d": "4",
        "e": "0",
        "f": "0",
        "g": "1",
        "h": "0",
    }
    header = _sent_frame(
        client, RemotingCommand.request(RequestCode.UPDATE_CONSUMER_OFFSET, {"queueId": 1}, oneway=True)
    )
    assert header["flag"] == 2 and header["extFields"] == {"queueId": "1"}


# -- answers: what our client reads is what the broker meant -----------------------------------------


def test_a_pull_answer_brings_the_messages_back_as_message_maps() -> None:
    client, server = pair()
    ext = {"consumerGroup": "g", "topic": "T", "queueId": 1, "queueOffset": 0, "maxMsgNums": 32, "sysFlag": 0}
    ext |= {"commitOffset": 0, "suspendTimeoutMillis": 0, "subVersion": 0}
    got = to_server(client, server, RemotingCommand.request(RequestCode.PULL_MESSAGE, ext))
    msgs = [
        {
            "msgId": f"ID{i}",
            "topic": "T",
            "brokerName": "broker-a",
            "queueId": 1,
            "queueOffset": i,
            "body": b"m%d" % i,
            "tags": "TagA",
            "keys": None if i else "k0",
            "bornTimestamp": 100 + i,
            "storeTimestamp": 200 + i,
            "reconsumeTimes": i,
            "properties": {"p": "v"},
        }
        for i in range(3)
    ]
    resp = got.response(ext={"nextBeginOffset": 3, "minOffset": 0, "maxOffset": 3, "suggestWhichBrokerId": 0})
    resp.body = {"messages": msgs}
    back = answer(client, server, got, resp)
    assert back.ext == {"nextBeginOffset": 3, "minOffset": 0, "maxOffset": 3, "suggestWhichBrokerId": 0}
    out = back.body["messages"]
    assert [m["msgId"] for m in out] == ["ID0", "ID1", "ID2"]  # UNIQ_KEY, which our broker's side sets
    for m, o in zip(msgs, out, strict=True):
        for key in (
            "topic",
            "queueId",
            "queueOffset",
            "body",
            "bornTimestamp",
            "storeTimestamp",
            "reconsumeTimes",
        ):
            assert o[key] == m[key], key
        assert o["tags"] == "TagA" and o.get("keys") == m["keys"]
        assert o["properties"]["p"] == "v" and "brokerName" not in o  # the client names the queue's broker
        assert o["commitLogOffset"] == pack_physical_offset("T", 1, m["queueOffset"])


def test_a_record_without_uniq_key_is_named_by_its_offset_message_id_and_compressed_bodies_inflate() -> None:
    client, _ = pair()
    store = StoreHost.parse("192.168.0.9:10911")
    raw = b"payload" * 40
    rec = MessageRecord(
        "T", 2, 5, zlib.compress(raw), {"TAGS": "x"}, physical_offset=4096, sys_flag=COMPRESSED_FLAG
    )
    rec.store_host = store
    back = _pull_answer(client, encode_record(rec))
    [m] = back.body["messages"]
    assert m["msgId"] == offset_msg_id(store, 4096) and m["body"] == raw and m["tags"] == "x"


def _pull_answer(client: NativeCodec, body: bytes, code: int = ResponseCode.SUCCESS) -> RemotingCommand:
    req = RemotingCommand.request(RequestCode.PULL_MESSAGE, {"topic": "T"})
    req.opaque = 11
    client.encode(req)
    ext = {"nextBeginOffset": "6", "minOffset": "0", "maxOffset": "6", "suggestWhichBrokerId": "0"}
    [back] = client.feed(encode_frame(NativeFrame(code, 11, 1, None, ext, body)))
    return back


def test_a_broken_pull_body_is_a_system_error_naming_the_byte_and_the_connection_lives_on() -> None:
    client, _ = pair()
    good = encode_record(MessageRecord("T", 0, 0, b"x", {}))
    back = _pull_answer(client, good + good[:30])
    assert back.code == ResponseCode.SYSTEM_ERROR
    assert back.remark == (
        "the PULL_MESSAGE answer cannot be read: "
        f"record at byte {len(good)}: 30 bytes left, a record head takes 84"
    )
    bad_magic = good[:4] + b"\x00\x00\x00\x01" + good[8:]
    assert "is not a MessageExt's" in _pull_answer(client, bad_magic).remark
    # not found: no body read, the code as it came
    assert _pull_answer(client, b"", ResponseCode.PULL_NOT_FOUND).code == ResponseCode.PULL_NOT_FOUND


def test_an_answer_to_no_request_we_remember_keeps_its_strings() -> None:
    client, _ = pair()
    [back] = client.feed(encode_frame(NativeFrame(0, 77, 1, None, {"offset": "5"}, b'{"a":1}')))
    assert back.ext == {"offset": "5"} and back.body == {"a": 1}  # no schema: a typed read names the field


def test_route_consumer_list_and_lock_answers() -> None:
    client, server = pair()
    got = to_server(
        client, server, RemotingCommand.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "T"})
    )
    route = {
        "brokerDatas": [{"cluster": "c", "brokerName": "broker-a", "brokerAddrs": {"0": "127.0.0.1:7000"}}],
        "queueDatas": [{"brokerName": "broker-a", "readQueueNums": 4, "writeQueueNums": 4, "perm": 6}],
    }
    back = answer(client, server, got, got.response(body=route))
    parsed = TopicRouteData.from_wire(back.body)
    assert parsed.broker_datas[0].master_addr() == "127.0.0.1:7001"  # the native port
    # fastjson's number keys, unquoted, as Apache's name server writes them
    req = RemotingCommand.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "T"})
    req.opaque = 12
    client.encode(req)
    body = b'{"brokerDatas":[{"brokerAddrs":{0:"10.0.0.1:10911"},"brokerName":"b","cluster":"c"}],'
    body += b'"queueDatas":[]}'
    [back] = client.feed(encode_frame(NativeFrame(0, 12, 1, None, {}, body)))
    assert TopicRouteData.from_wire(back.body).broker_datas[0].master_addr() == "10.0.0.1:10911"
    got = to_server(
        client,
        server,
        RemotingCommand.request(RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": "g"}),
        13,
    )
    back = answer(client, server, got, got.response(body={"consumerIdList": ["a", "b"]}))
    assert back.body == {"consumerIdList": ["a", "b"]}
    mq = MessageQueue("T", "broker-a", 1).to_wire()
    got = to_server(
        client, server, RemotingCommand.request(RequestCode.LOCK_BATCH_MQ, body={"mqSet": [mq]}), 14
    )
    assert answer(client, server, got, got.response(body={"lockOKMQSet": [mq]})).body == {"lockOKMQSet": [mq]}


def test_the_broker_notification_reaches_the_client_as_a_one_way_request() -> None:
    client, server = pair()
    push = RemotingCommand.request(
        RequestCode.NOTIFY_CONSUMER_IDS_CHANGED, {"consumerGroup": "g"}, oneway=True
    )
    push.opaque = 3
    data = server.encode(push)
    [got] = client.feed(data)
    assert (got.code, got.ext, got.is_oneway) == (
        RequestCode.NOTIFY_CONSUMER_IDS_CHANGED,
        {"consumerGroup": "g"},
        True,
    )
    # a request the client does not serve is answered in native form too
    ask = RemotingCommand.request(GET_CONSUMER_RUNNING_INFO, {"consumerGroup": "g"})
    ask.opaque = 4
    [got] = client.feed(server.encode(ask))
    reply = got.response(ResponseCode.REQUEST_CODE_NOT_SUPPORTED, "not supported")
    [frame], _ = split_frames(client.encode(reply))
    assert (frame.code, frame.opaque, frame.flag) == (ResponseCode.REQUEST_CODE_NOT_SUPPORTED, 4, 1)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.text(min_size=1, max_size=200).filter(lambda t: "\x01" not in t and "\x02" not in t),
            st.integers(0, 255),
            st.integers(0, 2**40),
            st.binary(max_size=300),
            st.dictionaries(
                st.text("abcdefgh", min_size=1, max_size=5), st.text("xyz0123", max_size=8), max_size=4
            ),
        ),
        max_size=4,
    )
)
def test_records_decode_to_what_was_encoded(items: list[tuple[str, int, int, bytes, dict[str, str]]]) -> None:
    recs = [MessageRecord(t, q, o, b, p, physical_offset=o * 3) for t, q, o, b, p in items]
    got = decode_records(b"".join(encode_record(r) for r in recs))
    assert got == recs


def test_a_truncated_record_names_what_runs_past() -> None:
    data = encode_record(MessageRecord("T", 0, 0, b"body", {"a": "b"}))
    with pytest.raises(RecordError, match="properties of 4 bytes runs past the record"):
        decode_records(data[:-2] and struct.pack(">i", len(data) - 2) + data[4:-2])
