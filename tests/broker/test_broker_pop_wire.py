"""POP over real sockets: pop with receipts, long polling, ack and batch ack, invisible time changes,
revive into the pop retry topic, orderly POP, and the errors of bad requests."""

from __future__ import annotations

import asyncio
import base64
import json
import time
from typing import Any

from kit import wait_until
from kit.native_wire import NativePeer, decode_messages, json_frame

from rmqlab.protocol.codes import RequestCode, ResponseCode
from rmqlab.protocol.pop_receipt import PROPERTY_POP_CK, ExtraInfo


async def pop(
    peer, queue_id: int = -1, *, nums: int = 32, invisible: int = 60_000, poll: int = 0, **extra: Any
):
    ext = {
        "consumerGroup": "g",
        "topic": "T",
        "queueId": queue_id,
        "maxMsgNums": nums,
        "invisibleTime": invisible,
        "pollTime": poll,
        "bornTime": int(time.time() * 1000),
        "initMode": 0,
        **extra,
    }
    return await peer.call(RequestCode.POP_MESSAGE, ext)


def receipts(resp) -> list[ExtraInfo]:
    return [ExtraInfo.parse(m["properties"][PROPERTY_POP_CK]) for m in resp.body["messages"]]


async def ack(peer, r: ExtraInfo, topic: str = "T"):
    ext = {
        "consumerGroup": "g",
        "topic": topic,
        "queueId": r.queue_id,
        "extraInfo": r.build(),
        "offset": r.queue_offset,
    }
    return await peer.call(RequestCode.ACK_MESSAGE, ext)


async def setup(make_broker, make_peer, n: int = 3, **cfg: Any):
    broker = await make_broker(time_scale=0.01, **cfg)
    p = make_peer(broker.address)
    await p.heartbeat("c1")
    for i in range(n):
        await p.send("T", f"m{i}".encode(), queue_id=0)
    return broker, p


async def test_pop_ack_and_revive_of_the_unacked(make_broker, make_peer) -> None:
    broker, p = await setup(make_broker, make_peer)
    resp = await pop(p, 0, invisible=300)
    assert resp.code == ResponseCode.SUCCESS and resp.remark == "FOUND"
    msgs = resp.body["messages"]
    assert [m["queueOffset"] for m in msgs] == [0, 1, 2]
    rs = receipts(resp)
    assert {(r.ck_queue_offset, r.invisible_time, r.retry, r.broker_name, r.queue_id) for r in rs} == {
        (0, 300, "0", "broker-a", 0)
    }
    assert resp.ext["startOffsetInfo"] == "0 0 0" and resp.ext["msgOffsetInfo"] == "0 0 0,1,2"
    assert resp.ext["restNum"] == 0 and resp.ext["popTime"] == rs[0].pop_time
    # in flight: nobody else gets them
    again = await pop(p, 0)
    assert again.code == ResponseCode.POLLING_TIMEOUT and again.remark == "NO_MESSAGE_IN_QUEUE"
    assert (await ack(p, rs[1])).code == ResponseCode.SUCCESS
    assert broker.pop_state.in_flight() == 2
    assert broker.offset_manager.query_offset("g", "T", 0) == 0  # the checkpoint is still open
    # after the invisible time (and the revive delay) the two unacked come back through %RETRY%g_T
    await wait_until(lambda: broker.pop_state.in_flight() == 0, within=5)
    assert broker.offset_manager.query_offset("g", "T", 0) == 3
    revived = broker.log.of("message_revived")
    assert sorted(e["queue_offset"] for e in revived) == [0, 2]
    assert {e["retry_topic"] for e in revived} == {"%RETRY%g_T"}
    back = await pop(p, -1)
    assert back.code == ResponseCode.SUCCESS
    got = back.body["messages"]
    assert sorted(m["body"] for m in got) == [b"m0", b"m2"]
    assert {m["topic"] for m in got} == {"T"} and {m["reconsumeTimes"] for m in got} == {1}
    assert {m["properties"]["ORIGIN_MESSAGE_ID"] for m in got} == {msgs[0]["msgId"], msgs[2]["msgId"]}
    rr = receipts(back)
    assert {r.retry for r in rr} == {"1"}
    # acking a retry message names the retry topic, as the receipt says
    assert (await ack(p, rr[0], topic="%RETRY%g_T")).code == ResponseCode.SUCCESS
    # an ack for a revived receipt is refused with the reason
    late = await ack(p, rs[0])
    assert late.code == ResponseCode.NO_MESSAGE and "revived" in late.remark


async def test_long_polling_pop_is_answered_when_a_message_arrives(make_broker, make_peer) -> None:
    broker, p = await setup(make_broker, make_peer, n=1)
    sender = make_peer(broker.address)
    assert (await pop(p, -1)).code == ResponseCode.SUCCESS  # takes the one message there is
    held = asyncio.create_task(pop(p, -1, poll=600_000))
    await wait_until(lambda: len(broker.pop_polling) == 1)
    await sender.send("T", b"late", queue_id=2)
    async with asyncio.timeout(30):  # answered by the arrival, long before the 10-minute poll time
        resp = await held
    assert resp.code == ResponseCode.SUCCESS and resp.body["messages"][0]["body"] == b"late"
    # nothing arrives: answered POLLING_TIMEOUT once the poll time is over
    resp = await pop(p, -1, poll=100)
    assert resp.code == ResponseCode.POLLING_TIMEOUT


async def test_change_invisible_time_gives_a_new_receipt(make_broker, make_peer) -> None:
    broker, p = await setup(make_broker, make_peer, n=1)
    r = receipts(await pop(p, 0, invisible=60_000))[0]
    ext = {
        "consumerGroup": "g",
        "topic": "T",
        "queueId": 0,
        "extraInfo": r.build(),
        "offset": r.queue_offset,
        "invisibleTime": 200,
    }
    resp = await p.call(RequestCode.CHANGE_MESSAGE_INVISIBLETIME, ext)
    assert resp.code == ResponseCode.SUCCESS, resp.remark
    new = ExtraInfo.parse(resp.ext["extraInfo"])
    assert (new.invisible_time, new.pop_time) == (200, resp.ext["popTime"]) and new.pop_time >= r.pop_time
    assert (await ack(p, r)).code == ResponseCode.NO_MESSAGE  # the old receipt is gone
    again = await p.call(RequestCode.CHANGE_MESSAGE_INVISIBLETIME, ext)
    assert again.code == ResponseCode.NO_MESSAGE
    assert broker.log.of("invisible_time_changed", queue_offset=0)
    # 200 ms later (not 60 s) it is revived
    await wait_until(lambda: broker.log.of("message_revived"), within=5)


async def test_batch_ack(make_broker, make_peer) -> None:
    broker, p = await setup(make_broker, make_peer)
    rs = receipts(await pop(p, 0))
    r = rs[0]
    ack_body = {
        "c": "g",
        "t": "T",
        "r": "0",
        "so": r.ck_queue_offset,
        "q": 0,
        "rq": r.revive_qid,
        "pt": r.pop_time,
        "it": r.invisible_time,
        "b": [0, 2],
    }
    resp = await p.call(RequestCode.BATCH_ACK_MESSAGE, body={"brokerName": "broker-a", "acks": [ack_body]})
    assert resp.code == ResponseCode.SUCCESS
    assert broker.pop_state.in_flight() == 1
    assert (await ack(p, rs[1])).code == ResponseCode.SUCCESS
    assert broker.offset_manager.query_offset("g", "T", 0) == 3
    resp = await p.call(RequestCode.BATCH_ACK_MESSAGE, body={"acks": []})
    assert resp.code == ResponseCode.NO_MESSAGE
    resp = await p.call(RequestCode.BATCH_ACK_MESSAGE, body={"acks": [dict(ack_body, b="x")]})
    assert resp.code == ResponseCode.INVALID_PARAMETER and "acks[0].b" in resp.remark


async def test_orderly_pop_keeps_the_queue_until_acked(make_broker, make_peer) -> None:
    broker, p = await setup(make_broker, make_peer)
    first = await pop(p, 0, nums=2, invisible=300, order=True, attemptId="a1")
    rs = receipts(first)
    assert [r.queue_offset for r in rs] == [0, 1] and {r.revive_qid for r in rs} == {999}
    assert first.ext["orderCountInfo"] == "0 0 0"
    blocked = await pop(p, 0, nums=2, order=True, attemptId="a2")
    assert blocked.code == ResponseCode.POLLING_TIMEOUT  # the queue waits for the first pop
    # its invisible time runs out: the same messages again, counted as a second consumption
    await asyncio.sleep(0.35)
    second = await pop(p, 0, nums=2, invisible=300, order=True, attemptId="a3")
    assert [m["queueOffset"] for m in second.body["messages"]] == [0, 1]
    assert [m["reconsumeTimes"] for m in second.body["messages"]] == [1, 1]
    for r in receipts(second):
        assert (await ack(p, r)).code == ResponseCode.SUCCESS
    assert broker.offset_manager.query_offset("g", "T", 0) == 2
    third = await pop(p, 0, nums=2, order=True, attemptId="a4")
    assert [m["queueOffset"] for m in third.body["messages"]] == [2]


async def test_bad_pops_and_acks_get_clear_errors(make_broker, make_peer) -> None:
    broker, p = await setup(make_broker, make_peer, n=1)
    stranger = make_peer(broker.address)
    resp = await pop(stranger, 0, consumerGroup="nobody")
    assert resp.code == ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST and "nobody" in resp.remark
    await stranger.heartbeat("c2", group="other", topics=["U"])
    resp = await stranger.call(
        RequestCode.POP_MESSAGE,
        {
            "consumerGroup": "other",
            "topic": "T",
            "queueId": 0,
            "maxMsgNums": 1,
            "invisibleTime": 1000,
            "pollTime": 0,
            "bornTime": int(time.time() * 1000),
            "initMode": 0,
        },
    )
    assert resp.code == ResponseCode.SUBSCRIPTION_NOT_EXIST
    resp = await pop(p, 0, nums=33)
    assert resp.code == ResponseCode.INVALID_PARAMETER and "greater than 32" in resp.remark
    resp = await pop(p, 7)
    assert resp.code == ResponseCode.INVALID_PARAMETER and "queueId" in resp.remark
    resp = await pop(p, 0, bornTime=int(time.time() * 1000) - 10_000)
    assert resp.code == ResponseCode.POLLING_TIMEOUT and "timeout too much" in resp.remark
    r = receipts(await pop(p, 0))[0]
    bad = {"consumerGroup": "g", "topic": "T", "queueId": 0, "extraInfo": "1 2", "offset": 0}
    resp = await p.call(RequestCode.ACK_MESSAGE, bad)
    assert resp.code == ResponseCode.INVALID_PARAMETER and "extraInfo" in resp.remark
    resp = await p.call(RequestCode.ACK_MESSAGE, dict(bad, extraInfo=r.build(), offset=99))
    assert resp.code == ResponseCode.NO_MESSAGE and "offset is illegal" in resp.remark
    resp = await p.call(RequestCode.ACK_MESSAGE, dict(bad, extraInfo=r.build(), topic="Nope"))
    assert resp.code == ResponseCode.TOPIC_NOT_EXIST
    never = ExtraInfo(0, 1, 1, 0, "0", "broker-a", 0, 0)
    resp = await p.call(RequestCode.ACK_MESSAGE, dict(bad, extraInfo=never.build()))
    assert resp.code == ResponseCode.NO_MESSAGE and "never popped" in resp.remark


async def test_pop_ack_and_assignment_on_the_native_port(make_broker, make_peer) -> None:
    """RocketMQ's own remoting format: string headers, JSON bodies, MessageExt records in a pop answer."""
    broker, _ = await setup(make_broker, make_peer)
    await broker.start_native_port(0)
    n = await NativePeer.connect(broker.native_server.port)
    try:
        mode = {"topic": "T", "consumerGroup": "g", "mode": "POP", "popShareQueueNum": 0}
        unknown = json.dumps(mode | {"mode": "PUSH"}).encode()
        await n.send(json_frame(RequestCode.SET_MESSAGE_REQUEST_MODE, 9, {}, unknown))
        refused = await n.recv()
        assert refused.code == ResponseCode.INVALID_PARAMETER
        assert "unknown request mode 'PUSH': PULL or POP" in (refused.remark or "")
        await n.send(json_frame(RequestCode.SET_MESSAGE_REQUEST_MODE, 1, {}, json.dumps(mode).encode()))
        assert (await n.recv()).code == ResponseCode.SUCCESS
        query = {"topic": "T", "consumerGroup": "g", "clientId": "c1", "strategyName": "AVG"}
        await n.send(
            json_frame(
                RequestCode.QUERY_ASSIGNMENT,
                2,
                {},
                json.dumps(query | {"messageModel": "CLUSTERING"}).encode(),
            )
        )
        got = (await n.recv()).json()["messageQueueAssignments"]
        assert got == [
            {
                "messageQueue": {"topic": "T", "brokerName": "broker-a", "queueId": -1},
                "mode": "POP",
                "attachments": {},
            }
        ]
        ext = {
            "consumerGroup": "g",
            "topic": "T",
            "queueId": "0",
            "maxMsgNums": "2",
            "invisibleTime": "60000",
            "pollTime": "0",
            "bornTime": str(int(time.time() * 1000)),
            "initMode": "0",
        }
        await n.send(json_frame(RequestCode.POP_MESSAGE, 3, ext))
        r = await n.recv()
        assert r.code == ResponseCode.SUCCESS and r.ext["msgOffsetInfo"] == "0 0 0,1"
        msgs = decode_messages(r.body)
        assert [m.body for m in msgs] == [b"m0", b"m1"]
        receipt = ExtraInfo.parse(msgs[0].properties[PROPERTY_POP_CK])
        ack_ext = {
            "consumerGroup": "g",
            "topic": "T",
            "queueId": "0",
            "extraInfo": receipt.build(),
            "offset": "0",
        }
        await n.send(json_frame(RequestCode.ACK_MESSAGE, 4, ack_ext))
        assert (await n.recv()).code == ResponseCode.SUCCESS
        # BATCH_ACK's bit set travels as java.util.BitSet#toByteArray in base64: bit 1 = offset start + 1
        batch = {
            "acks": [
                {
                    "c": "g",
                    "t": "T",
                    "r": "0",
                    "so": 0,
                    "q": 0,
                    "rq": receipt.revive_qid,
                    "pt": receipt.pop_time,
                    "it": 60000,
                    "b": base64.b64encode(bytes([0b10])).decode(),
                }
            ]
        }
        await n.send(json_frame(RequestCode.BATCH_ACK_MESSAGE, 5, {}, json.dumps(batch).encode()))
        assert (await n.recv()).code == ResponseCode.SUCCESS
        assert broker.pop_state.in_flight() == 0 and broker.offset_manager.query_offset("g", "T", 0) == 2
    finally:
        await n.close()


async def test_a_max_start_pops_a_new_queue_from_its_first_message_unless_switched_off(
    make_broker, make_peer
) -> None:
    """initPopOffsetByCheckMsgInMem (5.1.4, ISSUE #7117): a group's first POP of a queue that still holds
    its first message starts at 0 with ConsumeInitMode.MAX; before, at the queue's last message."""
    for check_in_mem, offsets in ((True, [0, 1, 2]), (False, [2])):
        _broker, p = await setup(make_broker, make_peer, init_pop_offset_by_check_msg_in_mem=check_in_mem)
        resp = await pop(p, 0, initMode=1)
        assert resp.code == ResponseCode.SUCCESS
        assert [r.queue_offset for r in receipts(resp)] == offsets, check_in_mem
