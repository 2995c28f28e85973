"""Fault relay over real loopback sockets: relay, latency, blackhole, reset, and route rewriting."""

from __future__ import annotations

import asyncio
import struct
import time

import msgpack
import pytest

from rmqlab.chaos.fault_relay import ClientLinks, FaultRelay, RouteRewriter
from rmqlab.protocol.codes import RequestCode, ResponseCode
from rmqlab.protocol.command import RemotingCommand
from rmqlab.protocol.remoting import RemotingClient, RemotingServer, RemotingTimeoutError


async def echo_server() -> tuple[asyncio.Server, str, list[int]]:
    resets: list[int] = []

    async def handle(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        try:
            while data := await r.read(65536):
                w.write(data)
                await w.drain()
        except ConnectionResetError:
            resets.append(1)
        finally:
            w.close()

    srv = await asyncio.start_server(handle, "127.0.0.1", 0)
    return srv, f"127.0.0.1:{srv.sockets[0].getsockname()[1]}", resets


async def roundtrip(addr: str, payload: bytes) -> bytes:
    host, _, port = addr.rpartition(":")
    r, w = await asyncio.open_connection(host, int(port))
    try:
        w.write(payload)
        await w.drain()
        async with asyncio.timeout(5):
            return await r.readexactly(len(payload))
    finally:
        w.close()


async def test_relays_bytes_both_ways() -> None:
    srv, addr, _ = await echo_server()
    async with FaultRelay(addr) as relay:
        payload = bytes(range(256)) * 1000
        assert await roundtrip(relay.address, payload) == payload
        assert relay.accepted == 1 and relay.bytes_up == len(payload) == relay.bytes_down
    srv.close()


async def test_latency_delays_each_direction_and_heal_removes_it() -> None:
    srv, addr, _ = await echo_server()
    async with FaultRelay(addr) as relay:
        relay.set_latency(150)
        t0 = time.monotonic()
        assert await roundtrip(relay.address, b"ping") == b"ping"
        assert time.monotonic() - t0 >= 0.29  # 150 ms up + 150 ms down
        relay.heal()
        assert relay.latency_ms == 0
    srv.close()


async def test_blackhole_holds_traffic_until_healed() -> None:
    srv, addr, _ = await echo_server()
    async with FaultRelay(addr) as relay:
        r, w = await asyncio.open_connection("127.0.0.1", relay.port)
        w.write(b"a")
        await w.drain()
        assert await r.readexactly(1) == b"a"
        relay.blackhole()
        w.write(b"held")
        await w.drain()
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.3):
                await r.readexactly(4)
        relay.heal()
        async with asyncio.timeout(5):
            assert await r.readexactly(4) == b"held"
        w.close()
    srv.close()


async def test_reset_aborts_open_connections_and_refuses_until_healed() -> None:
    srv, addr, upstream_resets = await echo_server()
    async with FaultRelay(addr) as relay:
        r, w = await asyncio.open_connection("127.0.0.1", relay.port)
        w.write(b"x")
        assert await r.readexactly(1) == b"x"
        assert relay.reset(refuse=True) == 1
        with pytest.raises((ConnectionResetError, asyncio.IncompleteReadError)):
            async with asyncio.timeout(5):
                await r.readexactly(1)
        with pytest.raises((ConnectionResetError, asyncio.IncompleteReadError)):
            await roundtrip(relay.address, b"y")
        relay.heal()
        assert await roundtrip(relay.address, b"z") == b"z"
        w.close()
        await asyncio.sleep(0.1)
        assert upstream_resets == [1]
    srv.close()


async def test_unreachable_upstream_resets_the_client() -> None:
    srv, addr, _ = await echo_server()
    srv.close()
    await srv.wait_closed()
    async with FaultRelay(addr) as relay:
        with pytest.raises((ConnectionResetError, asyncio.IncompleteReadError)):
            await roundtrip(relay.address, b"q")


def frame(obj: dict) -> bytes:
    payload = msgpack.packb(obj, use_bin_type=True)
    return struct.pack(">I", len(payload)) + payload


def unframe(data: bytes) -> list[dict]:
    out = []
    while data:
        (n,) = struct.unpack_from(">I", data)
        out.append(msgpack.unpackb(data[4 : 4 + n], raw=False))
        data = data[4 + n :]
    return out


def test_route_rewriter_handles_split_frames_and_leaves_others_alone() -> None:
    mapping = {"127.0.0.1:10911": "127.0.0.1:5001"}
    rw = RouteRewriter(mapping.get)
    route = {
        "code": 0,
        "opaque": 7,
        "flag": 1,
        "body": {
            "brokerDatas": [{"brokerName": "broker-a", "brokerAddrs": {"0": "127.0.0.1:10911"}}],
            "queueDatas": [],
        },
    }
    other = {"code": 0, "opaque": 8, "flag": 1, "body": {"messages": [{"body": b"\x00\xff"}]}}
    stream = frame(route) + frame(other)
    out = b"".join(rw.feed(stream[i : i + 3]) for i in range(0, len(stream), 3))
    got = unframe(out)
    assert got[0]["body"]["brokerDatas"][0]["brokerAddrs"] == {"0": "127.0.0.1:5001"}
    assert got[0]["opaque"] == 7
    assert got[1] == other and rw.rewritten == 1


def test_route_rewriter_passes_garbage_through() -> None:
    rw = RouteRewriter(lambda a: "x")
    junk = b"\x00\x00\x00\x00garbage"
    assert rw.feed(junk) == junk
    assert rw.feed(b"more") == b"more"


async def test_client_links_route_clients_through_their_own_proxies() -> None:
    broker = RemotingServer()
    seen: list[str] = []

    async def on_heartbeat(conn, cmd: RemotingCommand) -> RemotingCommand:
        seen.append(conn.remote_addr)
        return cmd.response()

    broker.register(RequestCode.HEART_BEAT, on_heartbeat)
    await broker.start()
    namesrv = RemotingServer()

    async def on_route(conn, cmd: RemotingCommand) -> RemotingCommand:
        body = {
            "brokerDatas": [{"cluster": "c", "brokerName": "broker-a", "brokerAddrs": {"0": broker.address}}],
            "queueDatas": [{"brokerName": "broker-a", "readQueueNums": 4, "writeQueueNums": 4, "perm": 6}],
        }
        return cmd.response(body=body)

    namesrv.register(RequestCode.GET_ROUTEINFO_BY_TOPIC, on_route)
    await namesrv.start()
    links = await ClientLinks("consumer-1", namesrv.address, {"broker-a": broker.address}).start()
    client = RemotingClient()
    try:
        resp = await client.invoke(
            links.namesrv_address,
            RemotingCommand.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "T"}),
            5,
        )
        addr = resp.body["brokerDatas"][0]["brokerAddrs"]["0"]
        assert addr == links.brokers["broker-a"].address != broker.address
        hb = RemotingCommand.request(RequestCode.HEART_BEAT, body={"clientID": "c"})
        assert (await client.invoke(addr, hb, 5)).code == ResponseCode.SUCCESS
        assert links.brokers["broker-a"].accepted == 1
        assert links.apply("blackhole", "broker-a") == ["consumer-1->broker-a"]
        with pytest.raises(RemotingTimeoutError):
            await client.invoke(addr, hb, 0.3)
        links.heal_all()
        links.apply("reset")
        await asyncio.sleep(0.05)
        assert (await client.invoke(addr, hb, 5)).code == ResponseCode.SUCCESS  # reconnects
        with pytest.raises(ValueError, match="no link"):
            links.apply("latency", "broker-z", ms=1)
    finally:
        await client.close()
        await links.close()
        await namesrv.close()
        await broker.close()
