"""Remoting over real loopback sockets: dispatch, errors, pushes, concurrency, close callbacks."""

from __future__ import annotations

import asyncio
import struct

import msgpack
import pytest

from rmqlab.protocol.codes import RequestCode, ResponseCode
from rmqlab.protocol.command import CommandError, FrameDecoder, RemotingCommand, encode_frame
from rmqlab.protocol.remoting import (
    Connection,
    RemotingClient,
    RemotingConnectionError,
    RemotingServer,
    RemotingTimeoutError,
)


async def echo(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
    return cmd.response(body={"echo": cmd.body, "n": cmd.ext_int("n", default=0)})


@pytest.fixture
async def server():
    srv = RemotingServer(max_frame_bytes=1 << 16)
    srv.register(RequestCode.HEART_BEAT, echo)
    await srv.start()
    yield srv
    await srv.close()


@pytest.fixture
async def client():
    c = RemotingClient(connect_timeout_s=1.0)
    yield c
    await c.close()


async def raw_request(addr: str, data: bytes, *, read: bool = True) -> list[RemotingCommand] | None:
    host, port = addr.rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(data)
    await writer.drain()
    out: list[RemotingCommand] | None = None
    if read:
        dec = FrameDecoder()
        out = []
        async with asyncio.timeout(2):
            while not out:
                chunk = await reader.read(65536)
                if not chunk:
                    break
                out += dec.feed(chunk)
    writer.close()
    return out


async def test_request_response_and_errors(server: RemotingServer, client: RemotingClient) -> None:
    r = await client.invoke(server.address, RemotingCommand.request(34, {"n": 3}, [1, b"x"]), 2)
    assert r.code == ResponseCode.SUCCESS and r.body == {"echo": [1, b"x"], "n": 3}
    r = await client.invoke(server.address, RemotingCommand.request(34, {"n": "3"}), 2)
    assert r.code == ResponseCode.INVALID_PARAMETER and "n" in (r.remark or "")
    r = await client.invoke(server.address, RemotingCommand.request(7777), 2)
    assert r.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED


async def test_handler_exceptions_become_responses(server: RemotingServer, client: RemotingClient) -> None:
    async def boom(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        raise RuntimeError("kaput")

    async def refuse(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        raise CommandError(ResponseCode.TOPIC_NOT_EXIST, "topic X not exist")

    server.register(1, boom)
    server.register(2, refuse)
    r = await client.invoke(server.address, RemotingCommand.request(1), 2)
    assert r.code == ResponseCode.SYSTEM_ERROR and "kaput" in (r.remark or "")
    r = await client.invoke(server.address, RemotingCommand.request(2), 2)
    assert (r.code, r.remark) == (ResponseCode.TOPIC_NOT_EXIST, "topic X not exist")


async def test_slow_request_does_not_hold_up_the_next(server: RemotingServer, client: RemotingClient) -> None:
    release = asyncio.Event()

    async def slow(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        await release.wait()
        return cmd.response()

    server.register(5, slow)
    slow_call = asyncio.ensure_future(client.invoke(server.address, RemotingCommand.request(5), 5))
    await asyncio.sleep(0.05)
    fast = await client.invoke(server.address, RemotingCommand.request(34), 2)
    assert fast.code == 0 and not slow_call.done()
    release.set()
    assert (await slow_call).code == 0


async def test_inflight_bound_pushes_back() -> None:
    srv = RemotingServer(max_inflight=2)
    running = 0
    peak = 0
    gate = asyncio.Event()

    async def slow(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await gate.wait()
        running -= 1
        return cmd.response()

    srv.register(5, slow)
    await srv.start()
    cli = RemotingClient()
    try:
        calls = [
            asyncio.ensure_future(cli.invoke(srv.address, RemotingCommand.request(5), 5)) for _ in range(6)
        ]
        await asyncio.sleep(0.2)
        assert peak == 2
        gate.set()
        assert [c.code for c in await asyncio.gather(*calls)] == [0] * 6
    finally:
        await cli.close()
        await srv.close()


async def test_oneway_gets_no_response(server: RemotingServer) -> None:
    got: list[int] = []

    async def record(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        got.append(cmd.ext_int("n"))
        return cmd.response()

    server.register(15, record)
    oneway = RemotingCommand.request(15, {"n": 1}, oneway=True)
    oneway.opaque = 1
    unknown_oneway = RemotingCommand.request(999, oneway=True)
    unknown_oneway.opaque = 2
    probe = RemotingCommand.request(34, {"n": 9})
    probe.opaque = 3
    out = await raw_request(
        server.address, encode_frame(oneway) + encode_frame(unknown_oneway) + encode_frame(probe)
    )
    assert out is not None and [c.opaque for c in out] == [3]
    assert got == [1]


async def test_bad_frame_closes_only_that_connection(server: RemotingServer, client: RemotingClient) -> None:
    assert (await client.invoke(server.address, RemotingCommand.request(34), 2)).code == 0
    for bad in (struct.pack(">I", 0), struct.pack(">I", (1 << 16) + 1), b"\x00\x00\x00\x02\x92\x01"):
        out = await raw_request(server.address, bad)
        assert out == []  # closed without an answer
    payload = msgpack.packb({"code": 34})
    assert await raw_request(server.address, struct.pack(">I", len(payload)) + payload) == []
    assert (await client.invoke(server.address, RemotingCommand.request(34, {"n": 1}), 2)).body["n"] == 1


async def test_server_pushes_to_client_and_close_callbacks(server: RemotingServer) -> None:
    opened: list[Connection] = []
    closed_server: list[Connection] = []
    closed_client: list[str] = []
    notified: list[str] = []
    server.on_connection_opened(opened.append)
    server.on_connection_closed(closed_server.append)
    cli = RemotingClient()
    cli.on_connection_closed(closed_client.append)

    async def on_notify(conn: Connection, cmd: RemotingCommand) -> None:
        notified.append(cmd.ext_str("consumerGroup"))
        return None

    cli.register(RequestCode.NOTIFY_CONSUMER_IDS_CHANGED, on_notify)
    await cli.invoke(server.address, RemotingCommand.request(34), 2)
    assert len(opened) == 1
    (conn,) = opened
    await conn.invoke_oneway(RemotingCommand.request(40, {"consumerGroup": "g1"}))
    for _ in range(50):
        if notified:
            break
        await asyncio.sleep(0.01)
    assert notified == ["g1"]
    # server closes -> the client sees it, and the next call reconnects
    conn.close()
    await conn.wait_closed()
    for _ in range(50):
        if closed_client:
            break
        await asyncio.sleep(0.01)
    assert closed_client == [server.address] and closed_server == [conn]
    assert (await cli.invoke(server.address, RemotingCommand.request(34), 2)).code == 0
    assert len(opened) == 2
    await cli.close()
    for _ in range(50):
        if len(closed_server) == 2:
            break
        await asyncio.sleep(0.01)
    assert len(closed_server) == 2


async def test_timeout_and_connect_errors(server: RemotingServer, client: RemotingClient) -> None:
    async def never(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        await asyncio.sleep(10)
        return cmd.response()

    server.register(6, never)
    with pytest.raises(RemotingTimeoutError):
        await client.invoke(server.address, RemotingCommand.request(6), 0.1)
    # the next call connects again
    assert (await client.invoke(server.address, RemotingCommand.request(34), 2)).code == 0
    srv2 = RemotingServer()
    await srv2.start()
    addr = srv2.address
    await srv2.close()
    with pytest.raises(RemotingConnectionError):
        await client.invoke(addr, RemotingCommand.request(34), 1)
    with pytest.raises(RemotingConnectionError):
        await client.invoke("no-port", RemotingCommand.request(34), 1)


async def test_sync_timeout_closes_the_connection_as_invoke_sync_does(server: RemotingServer) -> None:
    """NettyRemotingClient#invokeSync closes the channel on a timeout (clientCloseSocketIfTimeout): the
    server sees the close, and a request pending on that connection fails at once."""

    async def never(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        await asyncio.sleep(10)
        return cmd.response()

    server.register(6, never)
    closed = asyncio.Event()
    server.on_connection_closed(lambda _conn: closed.set())
    client = RemotingClient()
    try:
        held = asyncio.create_task(client.invoke_async(server.address, RemotingCommand.request(6), 5))
        await asyncio.sleep(0.05)
        first = await client.connection(server.address)
        with pytest.raises(RemotingTimeoutError):
            await client.invoke(server.address, RemotingCommand.request(6), 0.1)
        with pytest.raises(RemotingConnectionError):
            async with asyncio.timeout(2):
                await held
        async with asyncio.timeout(2):
            await closed.wait()
        assert (await client.invoke(server.address, RemotingCommand.request(34), 2)).code == 0
        assert await client.connection(server.address) is not first
    finally:
        await client.close()


async def test_timeouts_that_keep_the_connection(server: RemotingServer) -> None:
    """An asynchronous call's timeout, and a synchronous one with close_socket_if_timeout off, leave
    the connection open."""

    async def never(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        await asyncio.sleep(10)
        return cmd.response()

    server.register(6, never)
    for close_on_timeout, call in ((True, "invoke_async"), (False, "invoke")):
        client = RemotingClient(close_socket_if_timeout=close_on_timeout)
        try:
            first = await client.connection(server.address)
            with pytest.raises(RemotingTimeoutError):
                await getattr(client, call)(server.address, RemotingCommand.request(6), 0.1)
            assert (await client.invoke(server.address, RemotingCommand.request(34), 2)).code == 0
            assert await client.connection(server.address) is first
        finally:
            await client.close()


async def test_pending_request_fails_when_connection_drops(
    server: RemotingServer, client: RemotingClient
) -> None:
    async def drop(conn: Connection, cmd: RemotingCommand) -> None:
        conn.close()
        return None

    server.register(8, drop)
    with pytest.raises(RemotingConnectionError):
        await client.invoke(server.address, RemotingCommand.request(8), 2)


async def test_invoke_times_out_when_the_peer_stops_reading() -> None:
    """A peer that accepts but never reads (a SIGSTOPped broker): the write buffer fills and the call
    must still end at its timeout instead of blocking on the drain."""
    accepted: list[asyncio.StreamWriter] = []

    async def on_client(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(writer)  # never read

    srv = await asyncio.start_server(on_client, "127.0.0.1", 0)
    port = srv.sockets[0].getsockname()[1]
    cli = RemotingClient()
    try:
        big = RemotingCommand.request(RequestCode.SEND_MESSAGE, body={"body": b"x" * (1 << 20)})
        with pytest.raises(RemotingTimeoutError):
            async with asyncio.timeout(10):
                for _ in range(64):
                    await cli.invoke_oneway(f"127.0.0.1:{port}", big, timeout_s=0.2)
        with pytest.raises(RemotingTimeoutError):
            await cli.invoke(f"127.0.0.1:{port}", big, 0.2)
    finally:
        await cli.close()
        for w in accepted:
            w.close()
        srv.close()


async def test_a_failing_codec_closes_only_its_connection() -> None:
    class Broken:
        def feed(self, data: bytes) -> list[RemotingCommand]:
            raise TypeError("codec bug")

        def encode(self, cmd: RemotingCommand) -> bytes:
            return encode_frame(cmd)

    srv = RemotingServer(codec_factory=lambda _max: Broken())
    closed: list[Connection] = []
    srv.on_connection_closed(closed.append)
    await srv.start()
    try:
        assert await raw_request(srv.address, b"\x00\x00\x00\x01\x80") == []
        for _ in range(50):
            if closed:
                break
            await asyncio.sleep(0.01)
        assert len(closed) == 1
    finally:
        await srv.close()


# -- synchronous handlers: a plain function runs from a callback, not on a task -----------------------


async def test_a_sync_handler_is_answered_and_its_errors_as_a_coroutine_handlers_are(
    server: RemotingServer, client: RemotingClient
) -> None:
    tasks: list[asyncio.Task[object] | None] = []

    def answer(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        tasks.append(asyncio.current_task())
        return cmd.response(body={"n": cmd.ext_int("n")})  # ext_int raises InvalidParameter on "x"

    def boom(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        raise RuntimeError("kaput")

    def refuse(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        raise CommandError(ResponseCode.TOPIC_NOT_EXIST, "topic X not exist")

    def later(conn: Connection, cmd: RemotingCommand) -> object:
        async def wait() -> RemotingCommand:  # has to wait this once: finished on a task
            await asyncio.sleep(0.01)
            if cmd.ext_int("n") < 0:
                raise ValueError("negative")
            return cmd.response(ext={"late": 1})

        return wait()

    for code, handler in ((1, answer), (2, boom), (3, refuse), (4, later)):
        server.register(code, handler)
    r = await client.invoke(server.address, RemotingCommand.request(1, {"n": 3}), 2)
    assert r.code == ResponseCode.SUCCESS and r.body == {"n": 3}
    assert tasks == [None]  # no task was made for it
    r = await client.invoke(server.address, RemotingCommand.request(1, {"n": "x"}), 2)
    assert r.code == ResponseCode.INVALID_PARAMETER and "n" in (r.remark or "")
    r = await client.invoke(server.address, RemotingCommand.request(2), 2)
    assert r.code == ResponseCode.SYSTEM_ERROR and r.remark == "RuntimeError: kaput"
    r = await client.invoke(server.address, RemotingCommand.request(3), 2)
    assert r.code == ResponseCode.TOPIC_NOT_EXIST and r.remark == "topic X not exist"
    r = await client.invoke(server.address, RemotingCommand.request(4, {"n": 1}), 2)
    assert r.code == ResponseCode.SUCCESS and r.ext_int("late") == 1
    r = await client.invoke(server.address, RemotingCommand.request(4, {"n": -1}), 2)
    assert r.code == ResponseCode.SYSTEM_ERROR and r.remark == "ValueError: negative"


async def test_sync_and_coroutine_handlers_run_in_the_order_requests_came(server: RemotingServer) -> None:
    """A sync request takes the place in the ready queue a task's first step would: a coroutine request
    that came first runs first, and one-way sync requests are not answered."""
    order: list[str] = []

    def sync_one(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        order.append(f"sync{cmd.ext_int('n')}")
        return cmd.response()

    async def coro_one(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        order.append(f"coro{cmd.ext_int('n')}")
        return cmd.response()

    server.register(15, sync_one)
    server.register(16, coro_one)
    frames = b""
    for op, (code, n) in enumerate(((16, 1), (15, 2), (16, 3), (15, 4)), 1):
        cmd = RemotingCommand.request(code, {"n": n}, oneway=True)
        cmd.opaque = op
        frames += encode_frame(cmd)
    probe = RemotingCommand.request(34, {"n": 9})
    probe.opaque = 9
    out = await raw_request(server.address, frames + encode_frame(probe))
    assert out is not None and [c.opaque for c in out] == [9]
    assert order == ["coro1", "sync2", "coro3", "sync4"]
