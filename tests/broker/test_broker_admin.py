"""Fault injection, what-if policies, status and bad input over real sockets."""

from __future__ import annotations

import asyncio
import struct
import time

import msgpack
from kit import wait_until

from rmqlab.protocol.codes import RequestCode, ResponseCode
from rmqlab.protocol.command import FrameDecoder


async def add_fault(p, **body):
    resp = await p.ok(RequestCode.ADMIN_FAULT_ADD, body=body)
    return resp.ext["faultId"]


async def test_error_sequence_then_normal(broker, make_peer):
    p = make_peer(broker.address)
    await p.heartbeat("C")
    fid = await add_fault(
        p,
        requestCode=RequestCode.GET_CONSUMER_LIST_BY_GROUP,
        errors=[{"code": 2, "remark": "busy"}, {"code": 1, "remark": "boom"}],
    )
    codes = []
    for _ in range(3):
        r = await p.call(RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": "g"})
        codes.append((r.code, r.remark))
    assert codes[:2] == [(2, "busy"), (1, "boom")] and codes[2][0] == ResponseCode.SUCCESS
    (inj,) = broker.log.of("fault_injected")
    assert inj["fault_id"] == fid and inj["request_code"] == 38
    assert broker.log.of("fault_cleared", fault_id=fid)[0]["reason"] == "exhausted"


async def test_fault_for_one_client_and_duration(broker, make_peer):
    a, b = make_peer(broker.address), make_peer(broker.address)
    await a.heartbeat("A")
    await b.heartbeat("B")
    await add_fault(a, requestCode=RequestCode.HEART_BEAT, clientId="B", errors=[{"code": 2}], durationMs=300)
    await a.heartbeat("A")
    for _ in range(3):
        r = await b.call(RequestCode.HEART_BEAT, body={"clientID": "B", "consumerDataSet": []})
        assert r.code == 2
    await asyncio.sleep(0.35)
    await b.heartbeat("B")
    listed = await a.ok(RequestCode.ADMIN_FAULT_LIST)
    assert listed.body["faults"] == []


async def test_latency_drop_and_clear(broker, make_peer):
    p = make_peer(broker.address)
    await p.heartbeat("C")
    fid = await add_fault(p, requestCode=RequestCode.QUERY_CONSUMER_OFFSET, latencyMs=200)
    q = {"consumerGroup": "g", "topic": "T", "queueId": 0}
    t0 = time.monotonic()
    await p.ok(RequestCode.QUERY_CONSUMER_OFFSET, q)
    assert time.monotonic() - t0 >= 0.18  # the injected latency was applied (timer granularity ~1 ms)
    drop = await add_fault(p, requestCode=RequestCode.UPDATE_CONSUMER_OFFSET, drop=True, count=1)
    listed = await p.ok(RequestCode.ADMIN_FAULT_LIST)
    assert {f["faultId"] for f in listed.body["faults"]} == {fid, drop}
    try:
        await p.call(RequestCode.UPDATE_CONSUMER_OFFSET, {**q, "commitOffset": 5}, timeout_s=0.3)
        raise AssertionError("a dropped response must not arrive")
    except TimeoutError:
        pass
    assert broker.offset_manager.query_offset("g", "T", 0) == 5  # processed, only the answer was lost
    resp = await p.ok(RequestCode.ADMIN_FAULT_CLEAR, {"faultId": fid})
    assert resp.ext["cleared"] == 1
    await p.ok(RequestCode.ADMIN_FAULT_CLEAR)
    assert (await p.ok(RequestCode.ADMIN_FAULT_LIST)).body["faults"] == []
    resp = await p.call(RequestCode.ADMIN_FAULT_ADD, body={"requestCode": 34})
    assert resp.code == ResponseCode.INVALID_PARAMETER


async def test_error_fault_on_oneway_commit_loses_it(broker, make_peer):
    p = make_peer(broker.address)
    await add_fault(
        p, requestCode=RequestCode.UPDATE_CONSUMER_OFFSET, group="g", errors=[{"code": 1}], count=1
    )
    q = {"consumerGroup": "g", "topic": "T", "queueId": 0}
    await p.oneway(RequestCode.UPDATE_CONSUMER_OFFSET, {**q, "commitOffset": 3})
    await p.oneway(RequestCode.UPDATE_CONSUMER_OFFSET, {**q, "commitOffset": 4, "consumerGroup": "h"})
    await p.oneway(RequestCode.UPDATE_CONSUMER_OFFSET, {**q, "commitOffset": 9})
    await wait_until(lambda: broker.offset_manager.query_offset("g", "T", 0) == 9)
    assert [e["offset"] for e in broker.log.of("offset_committed", group="g")] == [9]


async def test_policy_set_and_status(broker, make_peer):
    p = make_peer(broker.address)
    resp = await p.ok(RequestCode.ADMIN_POLICY_SET, {"notifyOnChannelExpired": True})
    assert resp.ext == {"notifyOnChannelExpired": True, "releaseLocksOnChannelClose": False}
    assert broker.notify_on_channel_expired
    await p.ok(RequestCode.ADMIN_POLICY_SET, {"releaseLocksOnChannelClose": True})
    assert broker.release_locks_on_close
    assert len(broker.log.of("policy_changed")) == 2
    resp = await p.call(RequestCode.ADMIN_POLICY_SET, {"notifyOnChannelExpired": "yes"})
    assert resp.code == ResponseCode.INVALID_PARAMETER
    await p.heartbeat("C")
    await p.send("T")
    st = (await p.ok(RequestCode.ADMIN_BROKER_STATUS)).body
    assert st["messages"] == 1 and st["groups"] == 1 and st["connections"] == 1
    # T, %RETRY%g and TBW102 (the auto-create key topic)
    assert st["topics"] == 3 and st["brokerName"] == "broker-a" and st["durable"] is False


async def test_unknown_code_bad_field_and_oneway_error(broker, make_peer):
    p = make_peer(broker.address)
    resp = await p.call(777, {"x": 1})
    assert resp.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED
    resp = await p.call(RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": 5})
    assert resp.code == ResponseCode.INVALID_PARAMETER and "consumerGroup" in resp.remark
    resp = await p.call(RequestCode.HEART_BEAT, body={"clientID": "x", "consumerDataSet": [{"groupName": 1}]})
    assert resp.code == ResponseCode.INVALID_PARAMETER and "consumerDataSet[0].groupName" in resp.remark
    resp = await p.call(RequestCode.HEART_BEAT, body=[1, 2])
    assert resp.code == ResponseCode.INVALID_PARAMETER and "body" in resp.remark
    await p.oneway(RequestCode.GET_CONSUMER_LIST_BY_GROUP, {})  # bad one-way: no answer at all
    await p.oneway(999)
    resp = await p.call(RequestCode.GET_MAX_OFFSET, {"topic": "T", "queueId": -1})
    assert resp.code == ResponseCode.INVALID_PARAMETER


async def test_broken_frame_closes_only_that_connection(broker, make_peer):
    good = make_peer(broker.address)
    await good.heartbeat("C")
    host, port = broker.address.rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(struct.pack(">I", 0))  # length 0 is a broken frame
    await writer.drain()
    async with asyncio.timeout(2):
        assert await reader.read() == b""  # closed by the broker, nothing answered
    writer.close()
    reader, writer = await asyncio.open_connection(host, int(port))
    payload = msgpack.packb([1, 2, 3])  # valid msgpack, not a command
    writer.write(struct.pack(">I", len(payload)) + payload)
    async with asyncio.timeout(2):
        assert await reader.read() == b""
    writer.close()
    # a valid command on a raw socket still works
    reader, writer = await asyncio.open_connection(host, int(port))
    payload = msgpack.packb({"code": 38, "opaque": 5, "flag": 0, "ext": {"consumerGroup": "g"}})
    writer.write(struct.pack(">I", len(payload)) + payload)
    dec = FrameDecoder()
    out = []
    async with asyncio.timeout(2):
        while not out:
            out += dec.feed(await reader.read(65536))
    assert out[0].opaque == 5 and out[0].body == {"consumerIdList": ["C"]}
    writer.close()
    assert (await good.call(RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": "g"})).code == 0
