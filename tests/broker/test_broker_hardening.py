"""No single request may break the broker: bounded numbers, a store writer that survives a bad write,
an answer for every request, listening only once ready, bounded requests, partial frames and peers that
do not read. Each test is a request a hostile or broken client sent."""

from __future__ import annotations

import asyncio
import socket
import struct
import time

import pytest
from kit import wait_until
from kit.broker import Peer

from rmqlab.broker.controller import BrokerController
from rmqlab.broker.faults import MAX_FAULTS
from rmqlab.broker.processor.common import MAX_GROUPS_PER_HEARTBEAT, MAX_QUEUES_PER_LOCK
from rmqlab.broker.server_config import BrokerConfig
from rmqlab.broker.sqlite_store import SqliteMessageStore
from rmqlab.broker.store import MessageDraft, StoreError
from rmqlab.protocol.codes import RequestCode, ResponseCode
from rmqlab.protocol.command import FrameDecoder, RemotingCommand, encode_frame
from rmqlab.protocol.model import MessageQueue
from rmqlab.protocol.remoting import RemotingClient, RemotingServer

LONG_MAX = 2**63 - 1


async def _durable(make_broker, tmp_path) -> BrokerController:
    return await make_broker(time_scale=0.01, store_dir=str(tmp_path / "store"))


@pytest.mark.parametrize(
    ("code", "ext", "field"),
    [
        (RequestCode.UPDATE_CONSUMER_OFFSET, {"commitOffset": 2**63}, "commitOffset"),
        (RequestCode.UPDATE_CONSUMER_OFFSET, {"queueId": 2**63}, "queueId"),
        (RequestCode.UPDATE_CONSUMER_OFFSET, {"queueId": 2**31}, "queueId"),
        (RequestCode.SEND_MESSAGE, {"bornTimestamp": 2**64 - 1}, "bornTimestamp"),
        (RequestCode.SEND_MESSAGE, {"queueId": 2**63}, "queueId"),
        (RequestCode.SEND_MESSAGE, {"reconsumeTimes": 2**40}, "reconsumeTimes"),
    ],
)
async def test_out_of_range_numbers_are_refused_and_the_durable_store_keeps_working(
    make_broker, make_peer, tmp_path, code, ext, field
):
    b = await _durable(make_broker, tmp_path)
    p: Peer = make_peer(b.address)
    base = {"consumerGroup": "g", "topic": "T", "queueId": 0, "commitOffset": 1}
    if code == RequestCode.SEND_MESSAGE:
        resp = await p.send("T", **ext)
    else:
        resp = await p.call(code, base | ext)
    assert resp.code == ResponseCode.INVALID_PARAMETER, (resp.code, resp.remark)
    assert field in (resp.remark or "")
    # Nothing is poisoned: sends, commits and a new group's heartbeat (a retry topic) all work.
    assert (await p.send("T")).code == ResponseCode.SUCCESS
    await p.ok(RequestCode.UPDATE_CONSUMER_OFFSET, base | {"commitOffset": LONG_MAX})
    await p.heartbeat("c1", group="fresh")
    resp = await p.call(RequestCode.QUERY_CONSUMER_OFFSET, {"consumerGroup": "g", "topic": "T", "queueId": 0})
    assert resp.ext["offset"] == LONG_MAX
    assert [line for line in b.log.lines if line[0] == "error"] == []


async def test_the_store_writer_survives_a_write_the_database_refuses(tmp_path):
    store = SqliteMessageStore(str(tmp_path))
    await store.open()
    try:
        bad = store.persist_offset("g", "\ud800", 0, 1)  # a lone surrogate cannot be stored as UTF-8
        good = store.persist_offset("g", "T", 0, 7)
        with pytest.raises(StoreError, match="rejected"):
            await store.wait_durable(bad)
        await store.wait_durable(good)
        msg = await store.put_message(MessageDraft("T", 0, b"after", None, None, 1, 0, {}))
        assert msg.queue_offset == 0 and store.failed is None and store.rejected_writes == 1
    finally:
        await store.close()
    reopened = SqliteMessageStore(str(tmp_path))
    await reopened.open()
    try:
        assert reopened.loaded_offsets == [("g", "T", 0, 7)]
        assert reopened.message_count() == 1
    finally:
        await reopened.close()


async def test_an_answer_that_cannot_be_encoded_is_answered_with_system_error():
    server = RemotingServer("127.0.0.1", 0)

    async def huge(conn, cmd: RemotingCommand) -> RemotingCommand:
        return cmd.response(ext={"offset": 2**64})  # msgpack has no room for it

    server.register(77, huge)
    await server.start()
    client = RemotingClient()
    try:
        resp = await client.invoke(server.address, RemotingCommand.request(77), 5.0)
        assert resp.code == ResponseCode.SYSTEM_ERROR and "could not be encoded" in (resp.remark or "")
        # the connection is still good
        resp = await client.invoke(server.address, RemotingCommand.request(78), 5.0)
        assert resp.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED
    finally:
        await client.close()
        await server.close()


async def test_no_request_meets_a_broker_that_is_still_starting(tmp_path):
    # Many messages make the store's open take a while; requests sent as soon as the port exists must
    # be refused at connect (and retried) or answered by a ready broker, never REQUEST_CODE_NOT_SUPPORTED.
    store = SqliteMessageStore(str(tmp_path))
    await store.open()
    for i in range(3000):
        await store.put_message(MessageDraft("T", 0, b"x" * 100, None, None, i, 0, {}))
    await store.close()
    b = BrokerController(BrokerConfig(port=0, time_scale=0.01, store_dir=str(tmp_path)))
    starting = asyncio.create_task(b.start())
    answers: list[int] = []
    try:
        await wait_until(lambda: b.server.port != 0, step=0.0005)
        frame = encode_frame(
            RemotingCommand.request(RequestCode.GET_MAX_OFFSET, {"topic": "T", "queueId": 0})
        )
        while not starting.done() or not answers:
            try:
                reader, writer = await asyncio.open_connection("127.0.0.1", b.server.port)
            except OSError:
                await asyncio.sleep(0.001)
                continue
            writer.write(frame)
            (n,) = struct.unpack(">I", await reader.readexactly(4))
            (resp,) = FrameDecoder().feed(struct.pack(">I", n) + await reader.readexactly(n))
            answers.append(resp.code)
            writer.close()
        await starting
    finally:
        await b.shutdown()
    assert set(answers) == {ResponseCode.SUCCESS}


async def test_too_many_items_in_one_request_are_refused(broker, make_peer):
    p: Peer = make_peer(broker.address)
    groups = [{"groupName": f"g{i}", "subscriptionDataSet": []} for i in range(MAX_GROUPS_PER_HEARTBEAT + 1)]
    resp = await p.call(RequestCode.HEART_BEAT, body={"clientID": "c", "consumerDataSet": groups})
    assert resp.code == ResponseCode.INVALID_PARAMETER and "consumerDataSet" in (resp.remark or "")
    assert len(broker.topic_manager.table) < 10  # no retry topic was made for any of them
    mqs = [{"topic": "T", "brokerName": "b", "queueId": i} for i in range(MAX_QUEUES_PER_LOCK + 1)]
    body = {"consumerGroup": "g", "clientId": "c", "mqSet": mqs}
    resp = await p.call(RequestCode.LOCK_BATCH_MQ, body=body)
    assert resp.code == ResponseCode.INVALID_PARAMETER and "mqSet" in (resp.remark or "")


async def test_a_long_lock_request_lets_other_requests_through(make_broker):
    # At the usual 0.01 scale the idle close is 1.2 s, which a 16384-queue lock can outlast on a
    # loaded machine; the broker would then close the connection before answering.
    broker = await make_broker(time_scale=1.0)
    mqs = [MessageQueue("T", "b", i).to_wire() for i in range(MAX_QUEUES_PER_LOCK)]
    lock = RemotingCommand.request(
        RequestCode.LOCK_BATCH_MQ, body={"consumerGroup": "g", "clientId": "c", "mqSet": mqs}
    )
    ping = RemotingCommand.request(RequestCode.GET_MAX_OFFSET, {"topic": "T", "queueId": 0})
    hb = RemotingCommand.request(
        RequestCode.HEART_BEAT, body={"clientID": "c", "consumerDataSet": [], "producerDataSet": []}
    )
    hb.opaque, lock.opaque, ping.opaque = 3, 1, 2
    reader, writer = await asyncio.open_connection(*broker.address.rsplit(":", 1))
    writer.write(encode_frame(hb))
    dec = FrameDecoder()
    assert [c.code for c in dec.feed(await reader.read(1 << 20))] == [ResponseCode.SUCCESS]
    writer.write(encode_frame(lock) + encode_frame(ping))  # one read: both requests start together
    answers: list[RemotingCommand] = []
    async with asyncio.timeout(60):
        while len(answers) < 2:
            data = await reader.read(1 << 20)
            assert data, f"the broker closed the connection after {len(answers)} answer(s)"
            answers += dec.feed(data)
    writer.close()
    assert [c.opaque for c in answers] == [2, 1]  # the ping did not wait for 16384 queues to be locked
    assert all(c.code == ResponseCode.SUCCESS for c in answers)


async def test_a_half_sent_frame_is_dropped_after_the_partial_frame_timeout(make_broker):
    b = await make_broker(time_scale=0.01, partial_frame_timeout_ms=200)
    reader, writer = await asyncio.open_connection(*b.address.rsplit(":", 1))
    writer.write(struct.pack(">I", 1 << 20) + b"\x80" * 1000)  # 1 MiB announced, 1000 bytes sent
    async with asyncio.timeout(5):
        assert await reader.read() == b""  # closed by the broker
    writer.close()
    # a whole frame in several pieces spread over more than the timeout is still fine
    reader, writer = await asyncio.open_connection(*b.address.rsplit(":", 1))
    data = encode_frame(RemotingCommand.request(RequestCode.GET_MAX_OFFSET, {"topic": "T", "queueId": 0}))
    writer.write(data[:3])
    await asyncio.sleep(0.1)
    writer.write(data[3:])
    assert len(await reader.read(1 << 16)) > 4
    writer.close()


async def test_a_peer_that_does_not_read_is_not_read_from(broker, make_peer):
    p: Peer = make_peer(broker.address)
    await p.heartbeat("c", topics=["T"])
    assert (await p.send("T", body=b"x" * 200_000)).code == ResponseCode.SUCCESS
    pull = RemotingCommand.request(
        RequestCode.PULL_MESSAGE,
        {
            "consumerGroup": "g",
            "topic": "T",
            "queueId": 0,
            "queueOffset": 0,
            "maxMsgNums": 32,
            "subVersion": 0,
        },
    )
    host, port = broker.address.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
    sock.setblocking(False)
    sent = 0
    frames = b"".join(encode_frame(pull) for _ in range(100))  # ~100 x 200 KB of answers
    deadline = time.monotonic() + 3
    try:
        while sent < 300 * len(frames) // 100 and time.monotonic() < deadline:
            try:
                sent += sock.send(frames)
            except BlockingIOError:
                await asyncio.sleep(0.01)
        await asyncio.sleep(0.3)
        (conn,) = [
            c for c in broker.connections.values() if c.remote_addr.endswith(f":{sock.getsockname()[1]}")
        ]
        assert conn._transport is not None
        # Answers not taken stay near the write high-water mark instead of 300 x 200 KB.
        assert conn._transport.get_write_buffer_size() < 16 * 1024 * 1024
    finally:
        sock.close()
    await wait_until(lambda: len(broker.connections) == 1)
    assert (await p.send("T")).code == ResponseCode.SUCCESS


@pytest.mark.parametrize(
    "body",
    [
        {"clientID": "c", "consumerDataSet": [5]},
        {"clientID": "c", "consumerDataSet": 5},
        {"clientID": "c", "consumerDataSet": 1.5},
        {"clientID": "c", "consumerDataSet": [{"groupName": "g", "subscriptionDataSet": [7]}]},
        {"clientID": "c", "producerDataSet": ["x"]},
    ],
)
async def test_wrong_types_inside_a_body_are_invalid_parameter(broker, make_peer, body):
    p: Peer = make_peer(broker.address)
    resp = await p.call(RequestCode.HEART_BEAT, body=body)
    assert resp.code == ResponseCode.INVALID_PARAMETER, (resp.code, resp.remark)
    assert [line for line in broker.log.lines if line[0] == "error"] == []


@pytest.mark.parametrize("group", ["a b", "x" * 256, "g\n", "%RETRY%\u00e9"])
async def test_a_heartbeat_with_a_group_name_rocketmq_refuses_is_invalid(broker, make_peer, group):
    p: Peer = make_peer(broker.address)
    body = {"clientID": "c", "consumerDataSet": [{"groupName": group, "subscriptionDataSet": []}]}
    resp = await p.call(RequestCode.HEART_BEAT, body=body)
    assert resp.code == ResponseCode.INVALID_PARAMETER and "groupName" in (resp.remark or "")
    assert not [t for t in broker.topic_manager.table if t.startswith("%RETRY%")]


async def test_retry_topics_leave_with_their_group_unless_they_hold_messages(broker, make_peer):
    p: Peer = make_peer(broker.address)
    await p.heartbeat("c1", group="g1")
    await p.heartbeat("c1", group="g2")
    assert {"%RETRY%g1", "%RETRY%g2"} <= set(broker.topic_manager.table)
    await p.ok(RequestCode.UNREGISTER_CLIENT, {"clientID": "c1", "consumerGroup": "g1"})
    assert "%RETRY%g1" not in broker.topic_manager.table
    assert broker.log.of("topic_removed", topic="%RETRY%g1", reason="group_left")
    await broker.store.put_message(MessageDraft("%RETRY%g2", 0, b"retry me", None, None, 1, 1, {}))
    await p.close()  # the channel closes: g2 is gone, but its retry topic holds a message
    await wait_until(lambda: broker.consumer_manager.find("g2") is None)
    assert "%RETRY%g2" in broker.topic_manager.table


@pytest.mark.parametrize(
    "spec",
    [
        {"latencyMs": 2**63 - 1},
        {"latencyMs": 120_001},
        {"count": 2**62},
        {"durationMs": 10**12},
        {"errors": [{"code": 1}] * 101},
        {"errors": [{"code": 2**40}]},
        {"errors": [{"code": 1, "remark": "x" * 2000}]},
    ],
)
async def test_fault_parameters_are_bounded(broker, make_peer, spec):
    p: Peer = make_peer(broker.address)
    body = {"requestCode": RequestCode.HEART_BEAT, "errors": [{"code": 1}]} | spec
    resp = await p.call(RequestCode.ADMIN_FAULT_ADD, body=body)
    assert resp.code == ResponseCode.INVALID_PARAMETER, resp.remark
    assert len(broker.faults) == 0


async def test_the_fault_table_is_bounded(broker, make_peer):
    p: Peer = make_peer(broker.address)
    body = {"requestCode": 999, "errors": [{"code": 1}], "count": 5}
    for _ in range(MAX_FAULTS):
        await p.ok(RequestCode.ADMIN_FAULT_ADD, body=body)
    resp = await p.call(RequestCode.ADMIN_FAULT_ADD, body=body)
    assert resp.code == ResponseCode.INVALID_PARAMETER and "full" in (resp.remark or "")
    await p.ok(RequestCode.ADMIN_FAULT_CLEAR)
    await p.ok(RequestCode.ADMIN_FAULT_ADD, body=body)


async def test_a_steady_stream_of_frames_is_not_cut_off_by_the_partial_frame_timeout(make_broker):
    b = await make_broker(time_scale=0.01, partial_frame_timeout_ms=200)
    reader, writer = await asyncio.open_connection(*b.address.rsplit(":", 1))
    stream = b""
    for opaque in range(1, 41):
        cmd = RemotingCommand.request(RequestCode.GET_MAX_OFFSET, {"topic": "T", "queueId": 0})
        cmd.opaque = opaque
        stream += encode_frame(cmd)
    step = len(stream) // 20 + 3  # every chunk ends inside a frame
    for i in range(0, len(stream), step):
        writer.write(stream[i : i + step])
        await asyncio.sleep(0.04)  # 20 chunks: 0.8 s in all, four times the timeout
    dec = FrameDecoder()
    answers: list[RemotingCommand] = []
    async with asyncio.timeout(5):
        while len(answers) < 40:
            data = await reader.read(1 << 16)
            assert data, "the broker closed a connection that kept sending whole frames"
            answers += dec.feed(data)
    writer.close()
