"""The native port over real loopback sockets, with stub handlers: the same handlers and connection
callbacks serve both ports, one-way rules, pushes to native clients, bad frames."""

from __future__ import annotations

import json
import struct

import pytest
from kit.native_wire import NativePeer, json_frame

from rmqlab.protocol.codes import RequestCode, ResponseCode
from rmqlab.protocol.command import RemotingCommand
from rmqlab.protocol.native import start_native_port
from rmqlab.protocol.remoting import Connection, RemotingClient, RemotingServer


@pytest.fixture
async def ports():
    primary = RemotingServer("127.0.0.1", 0)
    seen: list[tuple[str, RemotingCommand]] = []
    opened: list[Connection] = []

    async def offset(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        seen.append(("offset", cmd))
        return cmd.response(ext={"offset": cmd.ext_int("queueId") * 100})

    async def update(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        seen.append(("update", cmd))
        cmd.ext_int("commitOffset")
        return cmd.response()

    async def route(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        addr = f"127.0.0.1:{primary.port}"
        body = {
            "brokerDatas": [{"cluster": "c", "brokerName": "broker-a", "brokerAddrs": {"0": addr}}],
            "queueDatas": [{"brokerName": "broker-a", "readQueueNums": 4, "writeQueueNums": 4, "perm": 6}],
        }
        return cmd.response(body=body)

    primary.register(RequestCode.GET_MAX_OFFSET, offset)
    primary.register(RequestCode.UPDATE_CONSUMER_OFFSET, update)
    primary.register(RequestCode.GET_ROUTEINFO_BY_TOPIC, route)
    primary.on_connection_opened(opened.append)
    await primary.start()
    native = await start_native_port(primary, "127.0.0.1", 0)
    try:
        yield primary, native, seen, opened
    finally:
        await native.close()
        await primary.close()


async def test_same_handlers_serve_both_ports(ports):
    primary, native, seen, opened = ports
    peer = await NativePeer.connect(native.port)
    await peer.send(json_frame(RequestCode.GET_MAX_OFFSET, 41, {"topic": "T", "queueId": "3"}))
    r = await peer.recv()
    assert (r.code, r.opaque, r.flag, r.ext) == (0, 41, 1, {"offset": "300"})
    client = RemotingClient()
    try:
        req = RemotingCommand.request(RequestCode.GET_MAX_OFFSET, {"topic": "T", "queueId": 2})
        resp = await client.invoke(primary.address, req, 3)
        assert resp.ext == {"offset": 200}
    finally:
        await client.close()
    assert [kind for kind, _ in seen] == ["offset", "offset"]
    assert len(opened) == 2 and any(c in native.connections for c in opened)
    await peer.close()


async def test_oneway_only_with_flag_bit_two(ports):
    _, native, seen, _ = ports
    peer = await NativePeer.connect(native.port)
    ext = {"consumerGroup": "g", "topic": "T", "queueId": 1, "commitOffset": "9"}
    await peer.send(json_frame(RequestCode.UPDATE_CONSUMER_OFFSET, 1, ext, flag=2))
    await peer.send(json_frame(RequestCode.UPDATE_CONSUMER_OFFSET, 2, ext, flag=0))
    r = await peer.recv()
    assert (r.opaque, r.code) == (2, 0)  # only the request without the one-way bit is answered
    with pytest.raises(TimeoutError):
        await peer.recv(wait_s=0.3)
    assert [c.ext["commitOffset"] for _, c in seen] == [9, 9]
    await peer.close()


async def test_route_names_the_native_port(ports):
    _, native, _, _ = ports
    peer = await NativePeer.connect(native.port)
    await peer.send(json_frame(RequestCode.GET_ROUTEINFO_BY_TOPIC, 5, {"topic": "T"}))
    r = await peer.recv()
    assert json.loads(r.body)["brokerDatas"][0]["brokerAddrs"] == {"0": f"127.0.0.1:{native.port}"}
    await peer.close()


async def test_unknown_code_and_bad_field_are_answered(ports):
    _, native, _, _ = ports
    peer = await NativePeer.connect(native.port)
    await peer.send(json_frame(4242, 1, {}))
    r = await peer.recv()
    assert r.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED
    await peer.send(json_frame(RequestCode.GET_MAX_OFFSET, 2, {"topic": "T", "queueId": "x"}))
    r = await peer.recv()
    assert r.code == ResponseCode.INVALID_PARAMETER and "queueId" in r.remark
    await peer.close()


async def test_push_to_a_native_client(ports):
    _, native, _, opened = ports
    peer = await NativePeer.connect(native.port)
    await peer.send(json_frame(RequestCode.GET_MAX_OFFSET, 1, {"topic": "T", "queueId": 0}))
    await peer.recv()
    (conn,) = [c for c in opened if c in native.connections]
    notify = RemotingCommand.request(
        RequestCode.NOTIFY_CONSUMER_IDS_CHANGED, {"consumerGroup": "g"}, oneway=True
    )
    await conn.invoke_oneway(notify)
    r = await peer.recv()
    assert (r.code, r.flag, r.ext) == (RequestCode.NOTIFY_CONSUMER_IDS_CHANGED, 2, {"consumerGroup": "g"})
    await peer.close()


async def test_bad_frame_closes_only_that_connection(ports):
    _, native, _, _ = ports
    good = await NativePeer.connect(native.port)
    bad = await NativePeer.connect(native.port)
    await bad.send(struct.pack(">II", 7, 3) + b"{x}")
    assert await bad.closed()
    await good.send(json_frame(RequestCode.GET_MAX_OFFSET, 3, {"topic": "T", "queueId": 1}))
    assert (await good.recv()).ext == {"offset": "100"}
    await good.close()
