"""Remoting over asyncio: a server that dispatches requests by code and can push requests to its
clients, and a client with one reconnecting connection per address.

Both ends use the same ``Connection`` (an asyncio Protocol): it decodes frames, resolves responses by
``opaque``, and runs incoming requests concurrently, at most ``max_inflight`` per connection (reading
pauses beyond that, which pushes back on the peer instead of queueing without bound).
"""

from __future__ import annotations

import asyncio
import collections
import inspect
import itertools
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, cast

from rmqlab.protocol.acl_signing import SessionCredentials, sign_ext
from rmqlab.protocol.codes import Flag, ResponseCode, code_name
from rmqlab.protocol.command import (
    DEFAULT_MAX_FRAME_BYTES,
    OPAQUE_MAX,
    CommandError,
    FrameDecoder,
    FrameError,
    RemotingCommand,
    encode_frame,
)
from rmqlab.protocol.model import WireError

_log = logging.getLogger("rmqlab.protocol.remoting")
_RESPONSE = int(Flag.RESPONSE)  # plain ints: IntFlag arithmetic runs in Python, on every frame
_ONEWAY = int(Flag.ONEWAY)

Handler = Callable[["Connection", RemotingCommand], Awaitable[RemotingCommand | None]]
# A handler that never waits: a plain function returning the answer (or None). It runs as one callback
# where a coroutine handler would run as a Task's first step, at the same place in the loop's ready queue.
# It may instead return an awaitable when this one request has to wait after all (a broker fault with a
# latency); that is then finished on a Task.
SyncHandler = Callable[
    ["Connection", RemotingCommand], "RemotingCommand | Awaitable[RemotingCommand | None] | None"
]


class Codec(Protocol):
    """Turns bytes into commands and back for one connection (stateful: it may remember requests).

    The default is the msgpack framing of PROTOCOL.md; RocketMQ's own remoting format plugs in here
    so the same handlers serve both.
    """

    def feed(self, data: bytes) -> list[RemotingCommand]: ...

    def encode(self, cmd: RemotingCommand) -> bytes: ...


class MsgpackCodec:
    """PROTOCOL.md's framing: 4-byte length + msgpack map."""

    __slots__ = ("_decoder",)

    def __init__(self, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> None:
        self._decoder = FrameDecoder(max_frame_bytes)

    def feed(self, data: bytes) -> list[RemotingCommand]:
        return self._decoder.feed(data)

    def encode(self, cmd: RemotingCommand) -> bytes:
        return encode_frame(cmd)

    @property
    def buffered(self) -> int:
        return self._decoder.buffered


CodecFactory = Callable[[int], Codec]
ConnectionCallback = Callable[["Connection"], None]

_WRITE_HIGH_WATER = 4 * 1024 * 1024
# A frame must arrive whole within this long of its first byte (servers only): a peer cannot park
# megabytes of half-sent frames on the server for ever.
DEFAULT_PARTIAL_FRAME_TIMEOUT_S = 10.0
_conn_ids = itertools.count(1)


class RemotingError(Exception):
    """A request could not be completed at the transport level."""


class RemotingConnectionError(RemotingError):
    """The connection could not be made, or closed before the response came."""


class RemotingTimeoutError(RemotingError, TimeoutError):
    """No response within the timeout."""


class _Dispatcher:
    """Maps request codes to handlers and turns handler outcomes into responses.

    A handler registered as a plain function (not ``async def``) is synchronous: the connection calls it
    from a callback instead of running it on a Task (``Connection._start_request``)."""

    def __init__(self, log: Any = None) -> None:
        self.handlers: dict[int, Handler | SyncHandler] = {}
        self.sync_handlers: dict[int, SyncHandler] = {}
        self.default_handler: Handler | None = None
        self.log = log

    def register(self, code: int, handler: Handler | SyncHandler) -> None:
        code = int(code)
        self.handlers[code] = handler
        if inspect.iscoroutinefunction(handler):
            self.sync_handlers.pop(code, None)
        else:
            self.sync_handlers[code] = handler

    async def handle(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand | None:
        handler = self.handlers.get(cmd.code, self.default_handler)
        try:
            if handler is None:
                resp = cmd.response(
                    ResponseCode.REQUEST_CODE_NOT_SUPPORTED, f"request code {cmd.code} not supported"
                )
            else:
                resp = handler(conn, cmd)
                if resp is not None and not isinstance(resp, RemotingCommand):
                    resp = await resp  # a coroutine handler, or a sync one that has to wait this time
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            resp = self._error_response(cmd, exc)
        return self._answer(cmd, resp)

    def handle_sync(
        self, conn: Connection, cmd: RemotingCommand, handler: SyncHandler
    ) -> RemotingCommand | Awaitable[RemotingCommand | None] | None:
        """``handle`` for a synchronous handler: the response, or the awaitable it returned instead
        (to be finished by ``finish``)."""
        try:
            resp = handler(conn, cmd)
            if resp is not None and not isinstance(resp, RemotingCommand):
                return resp
        except Exception as exc:
            resp = self._error_response(cmd, exc)
        return self._answer(cmd, resp)

    async def finish(
        self, cmd: RemotingCommand, pending: Awaitable[RemotingCommand | None]
    ) -> RemotingCommand | None:
        try:
            resp = await pending
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            resp = self._error_response(cmd, exc)
        return self._answer(cmd, resp)

    def _error_response(self, cmd: RemotingCommand, exc: Exception) -> RemotingCommand:
        if isinstance(exc, WireError):  # includes InvalidParameter
            return cmd.response(ResponseCode.INVALID_PARAMETER, str(exc))
        if isinstance(exc, CommandError):
            return cmd.response(exc.code, exc.remark)
        self._report(f"handler for {code_name(cmd.code, response=False)} failed", exc)
        return cmd.response(ResponseCode.SYSTEM_ERROR, f"{type(exc).__name__}: {exc}")

    @staticmethod
    def _answer(cmd: RemotingCommand, resp: RemotingCommand | None) -> RemotingCommand | None:
        if resp is None:
            return None
        resp.opaque = cmd.opaque
        resp.flag = (resp.flag | _RESPONSE) & ~_ONEWAY
        return resp

    def _report(self, msg: str, exc: BaseException) -> None:
        if self.log is not None:
            self.log.error(msg, error=repr(exc))
        else:
            _log.exception(msg, exc_info=exc)


class Connection(asyncio.Protocol):
    """One TCP connection carrying commands both ways."""

    def __init__(
        self,
        dispatcher: _Dispatcher,
        *,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        max_inflight: int = 256,
        on_open: Callable[[Connection], None] | None = None,
        on_close: Callable[[Connection], None] | None = None,
        log: Any = None,
        codec: Codec | None = None,
        partial_frame_timeout_s: float | None = None,
        server_side: bool = False,
        credentials: SessionCredentials | None = None,
    ) -> None:
        self.id = next(_conn_ids)
        # Requests sent on this connection are signed as RocketMQ's AclClientRPCHook signs them.
        self.credentials = credentials
        self.attrs: dict[str, Any] = {}
        self.remote_addr = ""
        self.local_addr = ""
        self.closed = False
        self._dispatcher = dispatcher
        self.codec: Codec = codec if codec is not None else MsgpackCodec(max_frame_bytes)
        self._max_inflight = max_inflight
        self._inflight = 0
        self._reading_paused = False
        self._backlog: collections.deque[RemotingCommand] = collections.deque()
        self._transport: asyncio.Transport | None = None
        self._pending: dict[int, asyncio.Future[RemotingCommand]] = {}
        self._opaque = itertools.count(1)
        # dicts, not sets: closing and cancelling go in the order things began, not by memory address
        # (a simulated run must give the same bytes whatever else the process allocated)
        self._tasks: dict[asyncio.Task[None], None] = {}
        self._cancels = 0  # cancel_requests so far: a synchronous request scheduled before one is dropped
        self._on_open = on_open
        self._on_close = on_close
        self._drain_waiters: list[asyncio.Future[None]] = []
        self._write_paused = False
        # Server side only: a peer that does not read its answers is not read from either, so the
        # answers it has not taken stay bounded (a client never stops reading, so no deadlock).
        self._pause_reading_on_write = server_side
        self._partial_timeout_s = partial_frame_timeout_s
        self._partial_timer: asyncio.TimerHandle | None = None
        self._log = log
        self._loop = asyncio.get_running_loop()
        self.closed_future: asyncio.Future[None] = self._loop.create_future()
        # the loop's clock at the last read or write: Netty's IdleStateHandler (ALL_IDLE) reads this
        self.last_activity = self._loop.time()

    # -- asyncio.Protocol -------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports do not subclass asyncio.Transport, so no isinstance check here.
        self._transport = cast(asyncio.Transport, transport)
        peer = transport.get_extra_info("peername")
        sock = transport.get_extra_info("sockname")
        self.remote_addr = _fmt_addr(peer)
        self.local_addr = _fmt_addr(sock)
        self._transport.set_write_buffer_limits(high=_WRITE_HIGH_WATER)
        if self._on_open is not None:
            self._on_open(self)

    def data_received(self, data: bytes) -> None:
        self.last_activity = self._loop.time()
        try:
            commands = self.codec.feed(data)
        except FrameError as exc:
            self._warn("closing connection after a bad frame", reason=str(exc))
            self.close()
            return
        except Exception as exc:  # a codec bug must cost this connection only, never the process
            self._warn("closing connection: the codec failed", reason=f"{type(exc).__name__}: {exc}")
            self.close()
            return
        if self._partial_timeout_s is not None and (
            self._partial_timer is not None or getattr(self.codec, "buffered", 0)
        ):  # no frame half-received now or before: nothing to watch (nearly every frame)
            self._watch_partial_frame(bool(commands))
        for cmd in commands:
            if cmd.flag & _RESPONSE:
                fut = self._pending.pop(cmd.opaque, None)
                if fut is not None and not fut.done():
                    fut.set_result(cmd)
                continue
            self._start_request(cmd)

    def command_received(self, cmd: RemotingCommand) -> None:
        """``data_received`` for a transport that hands over whole commands (the simulator's network
        between two msgpack ends, sim.wire): no codec, so no bad or partial frame."""
        self.last_activity = self._loop.time()
        if cmd.flag & _RESPONSE:
            fut = self._pending.pop(cmd.opaque, None)
            if fut is not None and not fut.done():
                fut.set_result(cmd)
        else:
            self._start_request(cmd)

    def _watch_partial_frame(self, progressed: bool) -> None:
        # The clock runs from the first byte of the frame now incomplete: a peer streaming whole frames
        # back to back always has a partial one buffered, and must not be cut off for that.
        if self._partial_timer is not None and (progressed or not getattr(self.codec, "buffered", 0)):
            self._partial_timer.cancel()
            self._partial_timer = None
        if self._partial_timer is None and getattr(self.codec, "buffered", 0):
            assert self._partial_timeout_s is not None
            self._partial_timer = asyncio.get_running_loop().call_later(
                self._partial_timeout_s, self._partial_frame_expired
            )

    def _partial_frame_expired(self) -> None:
        self._partial_timer = None
        if getattr(self.codec, "buffered", 0) and not self.closed:
            self._warn(
                "closing connection: a frame did not arrive whole in time",
                buffered=getattr(self.codec, "buffered", 0),
                timeout_s=self._partial_timeout_s,
            )
            self.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._transport = None
        if self._partial_timer is not None:
            self._partial_timer.cancel()
            self._partial_timer = None
        err = RemotingConnectionError(f"connection to {self.remote_addr} closed")
        for fut in self._pending.values():
            if not fut.done():
                fut.set_exception(err)
        self._pending.clear()
        for w in self._drain_waiters:
            if not w.done():
                w.set_result(None)
        self._drain_waiters.clear()
        if not self.closed_future.done():
            self.closed_future.set_result(None)
        if self._on_close is not None:
            try:
                self._on_close(self)
            except Exception:  # a callback must not break the transport's teardown
                _log.exception("connection-closed callback failed")

    def pause_writing(self) -> None:
        self._write_paused = True
        self._sync_reading()

    def resume_writing(self) -> None:
        self._write_paused = False
        self._sync_reading()
        for w in self._drain_waiters:
            if not w.done():
                w.set_result(None)
        self._drain_waiters.clear()

    # -- requests from the peer -------------------------------------------------------------------
    def _sync_reading(self) -> None:
        """Read from the peer unless requests are backlogged or (server side) it is not reading."""
        pause = bool(self._backlog) or (self._pause_reading_on_write and self._write_paused)
        if self._transport is None or pause == self._reading_paused:
            return
        self._reading_paused = pause
        if pause:
            self._transport.pause_reading()
        else:
            self._transport.resume_reading()

    def _start_request(self, cmd: RemotingCommand) -> None:
        if self._inflight >= self._max_inflight:
            # Over the bound: park the request and stop reading, so the peer's sends back up.
            self._backlog.append(cmd)
            self._sync_reading()
            return
        self._inflight += 1
        handler = self._dispatcher.sync_handlers.get(cmd.code)
        if handler is None:
            self._tasks[self._loop.create_task(self._run_request(cmd))] = None
        else:
            # One callback where a Task's first step would be (Task.__init__ schedules that step with
            # call_soon): the same place in the ready queue, in the same context, so the same order.
            self._loop.call_soon(self._run_sync_request, self._cancels, handler, cmd)

    def _run_sync_request(self, cancels: int, handler: SyncHandler, cmd: RemotingCommand) -> None:
        if cancels != self._cancels:
            return  # cancel_requests came first: dropped, as a task cancelled before its first step
        if self._pause_reading_on_write and self._write_paused:
            # _run_request's wait for the peer to read needs a task; it also counts the request done
            self._tasks[self._loop.create_task(self._run_request(cmd))] = None
            return
        resp = self._dispatcher.handle_sync(self, cmd, handler)
        if resp is not None and not isinstance(resp, RemotingCommand):
            # this request has to wait after all: the rest of it on a task, which ends it
            self._tasks[self._loop.create_task(self._run_request(cmd, resp))] = None
            return
        try:
            if resp is not None and not cmd.is_oneway:
                self.send_response(resp)
        finally:
            self._request_done()

    def _request_done(self) -> None:
        self._inflight -= 1
        if self._backlog and not self.closed:
            self._start_request(self._backlog.popleft())
        if self._reading_paused and not self._backlog:
            self._sync_reading()

    async def _run_request(
        self, cmd: RemotingCommand, pending: Awaitable[RemotingCommand | None] | None = None
    ) -> None:
        """Serve ``cmd``, or with ``pending`` finish what a synchronous handler returned to wait for."""
        try:
            if pending is not None:
                resp = await self._dispatcher.finish(cmd, pending)
            else:
                if self._pause_reading_on_write and self._write_paused:
                    # Do not build answers the peer is not taking (a pull's messages): wait until it reads.
                    await self._drain()
                resp = await self._dispatcher.handle(self, cmd)
            if resp is not None and not cmd.is_oneway:
                self.send_response(resp)
        finally:
            # the task forgets itself here rather than in a done callback: one callback fewer per request
            self._tasks.pop(asyncio.current_task(), None)  # type: ignore[arg-type]
            self._request_done()

    # -- sending ----------------------------------------------------------------------------------
    def _write(self, cmd: RemotingCommand) -> None:
        if self._transport is None or self._transport.is_closing():
            raise RemotingConnectionError(f"connection to {self.remote_addr} is closed")
        if self.credentials is not None and not cmd.is_response:
            sign_ext(cmd.ext, cmd.body, self.credentials)
        self._transport.write(self.codec.encode(cmd))
        self.last_activity = self._loop.time()

    def send_response(self, resp: RemotingCommand) -> bool:
        """Write a response (also one produced outside a handler, e.g. a long-poll answered later).

        A response the codec cannot encode (a stored value the peer's format cannot carry) is replaced
        by a SYSTEM_ERROR answer saying why: the request is answered and the connection lives on."""
        if self._transport is None or self._transport.is_closing():
            return False
        try:
            data = self.codec.encode(resp)
        except Exception as exc:
            reason = f"{type(exc).__name__}: {exc}"
            self._warn("answer could not be encoded", code=resp.code, opaque=resp.opaque, reason=reason)
            fallback = RemotingCommand(
                ResponseCode.SYSTEM_ERROR,
                resp.opaque,
                _RESPONSE,
                f"the answer could not be encoded: {reason}"[:512],
            )
            data = self.codec.encode(fallback)
        self._transport.write(data)
        return True

    async def _drain(self) -> None:
        if self._write_paused and not self.closed:
            w: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._drain_waiters.append(w)
            await w

    def _next_opaque(self) -> int:
        op = next(self._opaque)
        if op > OPAQUE_MAX:
            self._opaque = itertools.count(1)
            op = next(self._opaque)
        return op

    async def invoke(self, cmd: RemotingCommand, timeout_s: float) -> RemotingCommand:
        """Send a request and wait for its response."""
        cmd.opaque = opaque = self._next_opaque()
        cmd.flag = cmd.flag & ~(_ONEWAY | _RESPONSE)
        loop = self._loop
        fut: asyncio.Future[RemotingCommand] = loop.create_future()
        self._pending[opaque] = fut
        # The one timer asyncio.timeout would arm, set the same way, but it fails the response future
        # instead of cancelling the caller: as cheap as a request can wait (RocketMQ's invokeSync waits
        # on its ResponseFuture for the timeout, and a response already in wins).
        if timeout_s > 0:
            timer = loop.call_at(loop.time() + timeout_s, self._expire, fut, cmd, timeout_s)
        else:
            timer = loop.call_soon(self._expire, fut, cmd, timeout_s)
        try:
            self._write(cmd)
            if self._write_paused and not self.closed:
                # Waiting for a full write buffer counts against the timeout: a peer that stopped
                # reading (SIGSTOP) must not block the caller forever.
                await self._drain_until(fut)
            return await fut
        finally:
            timer.cancel()
            self._pending.pop(opaque, None)

    def _expire(self, fut: asyncio.Future[RemotingCommand], cmd: RemotingCommand, timeout_s: float) -> None:
        if not fut.done():
            fut.set_exception(
                RemotingTimeoutError(
                    f"{code_name(cmd.code, response=False)} to {self.remote_addr} "
                    f"timed out after {timeout_s:.3f}s"
                )
            )

    async def _drain_until(self, fut: asyncio.Future[Any]) -> None:
        """Wait until the write buffer drains, or ``fut`` is done (the response came, or time is up)."""
        w: asyncio.Future[None] = self._loop.create_future()
        self._drain_waiters.append(w)
        fut.add_done_callback(lambda _: w.done() or w.set_result(None))
        await w

    async def invoke_oneway(self, cmd: RemotingCommand, timeout_s: float = 3.0) -> None:
        if not self.send_oneway(cmd):
            await self.wait_oneway_written(cmd, timeout_s)

    def send_oneway(self, cmd: RemotingCommand) -> bool:
        """``invoke_oneway`` up to its write, without a coroutine: True when that is all (the usual
        case: no timer to arm), False when the write buffer is full and the caller has to wait for it
        with ``wait_oneway_written``. A closed connection raises as ``invoke_oneway`` does."""
        cmd.opaque = self._next_opaque()
        cmd.flag = (cmd.flag | _ONEWAY) & ~_RESPONSE
        self._write(cmd)
        return not self._write_paused or self.closed

    async def wait_oneway_written(self, cmd: RemotingCommand, timeout_s: float) -> None:
        """The rest of a one-way request whose write found the buffer full: wait for the peer to read,
        at most ``timeout_s``."""
        try:
            async with asyncio.timeout(timeout_s):
                await self._drain()
        except TimeoutError:
            raise RemotingTimeoutError(
                f"one-way {code_name(cmd.code, response=False)} to {self.remote_addr}: "
                f"peer not reading for {timeout_s:.3f}s"
            ) from None

    def close(self) -> None:
        if self._transport is not None and not self._transport.is_closing():
            self._transport.close()

    def abort(self) -> None:
        if self._transport is not None:
            self._transport.abort()

    async def wait_closed(self) -> None:
        await asyncio.shield(self.closed_future)

    def cancel_requests(self) -> None:
        self._cancels += 1
        for t in list(self._tasks):
            t.cancel()

    def _warn(self, msg: str, **kv: Any) -> None:
        if self._log is not None:
            self._log.warning(msg, peer=self.remote_addr, **kv)
        else:
            _log.warning("%s peer=%s %s", msg, self.remote_addr, kv)

    def __repr__(self) -> str:
        return f"<Connection #{self.id} {self.remote_addr}>"


async def _close_connections(conns: list[Connection], grace_s: float = 2.0) -> None:
    """Shut channels down: cancel the requests they are handling, close them all, then abort any that
    has not finished closing within ``grace_s``."""
    for conn in conns:
        conn.cancel_requests()
        conn.close()
    for conn in conns:
        try:
            async with asyncio.timeout(grace_s):
                await conn.wait_closed()
        except TimeoutError:
            conn.abort()


def _fmt_addr(addr: Any) -> str:
    if isinstance(addr, tuple) and len(addr) >= 2:
        host = addr[0]
        return f"[{host}]:{addr[1]}" if ":" in str(host) else f"{host}:{addr[1]}"
    return str(addr or "")


def split_addr(addr: str) -> tuple[str, int]:
    """'host:port' (or '[v6]:port') -> (host, port); ValueError with a clear message otherwise."""
    host, sep, port = addr.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"address {addr!r} is not host:port")
    return host.strip("[]"), int(port)


class RemotingServer:
    """Listens, dispatches requests by code, tracks connections."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        max_inflight: int = 256,
        log: Any = None,
        codec_factory: CodecFactory | None = None,
        partial_frame_timeout_s: float = DEFAULT_PARTIAL_FRAME_TIMEOUT_S,
    ) -> None:
        self.host = host
        self.partial_frame_timeout_s = partial_frame_timeout_s
        self.codec_factory: CodecFactory = codec_factory or MsgpackCodec
        self._port = port
        self.max_frame_bytes = max_frame_bytes
        self.max_inflight = max_inflight
        self._dispatcher = _Dispatcher(log)
        self._server: asyncio.Server | None = None
        self.connections: dict[Connection, None] = {}  # in accept order (see Connection._tasks)
        self._opened: list[ConnectionCallback] = []
        self._closed: list[ConnectionCallback] = []
        self._log = log

    def register(self, code: int, handler: Handler | SyncHandler) -> None:
        """Serve requests of ``code`` with ``handler``: an ``async def``, or a plain function for one
        that never waits (run without a task, see ``_Dispatcher``)."""
        self._dispatcher.register(code, handler)

    def set_default_handler(self, handler: Handler) -> None:
        self._dispatcher.default_handler = handler

    def share_handlers_with(self, other: RemotingServer) -> None:
        """Serve ``other``'s handlers and connection callbacks (a second port with another codec)."""
        self._dispatcher = other._dispatcher
        self._opened = other._opened
        self._closed = other._closed

    def on_connection_opened(self, cb: ConnectionCallback) -> None:
        self._opened.append(cb)

    def on_connection_closed(self, cb: ConnectionCallback) -> None:
        self._closed.append(cb)

    def _conn_opened(self, conn: Connection) -> None:
        self.connections[conn] = None
        for cb in self._opened:
            cb(conn)

    def _conn_closed(self, conn: Connection) -> None:
        self.connections.pop(conn, None)
        for cb in self._closed:
            try:
                cb(conn)
            except Exception:
                _log.exception("connection-closed callback failed")

    def _make_protocol(self) -> Connection:
        return Connection(
            self._dispatcher,
            max_frame_bytes=self.max_frame_bytes,
            max_inflight=self.max_inflight,
            on_open=self._conn_opened,
            on_close=self._conn_closed,
            log=self._log,
            codec=self.codec_factory(self.max_frame_bytes),
            partial_frame_timeout_s=self.partial_frame_timeout_s,
            server_side=True,
        )

    async def start(self, *, serve: bool = True) -> None:
        """Bind the port; with ``serve=False`` connections are not accepted until ``start_serving``
        (the port is known, so the owner can finish setting up before the first request)."""
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            self._make_protocol, self.host, self._port, reuse_address=True, start_serving=serve
        )
        sock = self._server.sockets[0]
        self._port = sock.getsockname()[1]

    async def start_serving(self) -> None:
        if self._server is not None:
            await self._server.start_serving()

    @property
    def port(self) -> int:
        return self._port

    @property
    def address(self) -> str:
        return f"{self.host}:{self._port}"

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        await _close_connections(list(self.connections))
        if self._server is not None:
            try:
                async with asyncio.timeout(2):
                    await self._server.wait_closed()
            except TimeoutError:
                pass
            self._server = None


class RemotingClient:
    """Client side: one connection per address, made on demand and re-made after it closed.

    ``invoke`` is RocketMQ's invokeSync: when it times out the connection is closed
    (``close_socket_if_timeout``, NettyClientConfig.clientCloseSocketIfTimeout, on by default), so the
    broker sees the channel close; ``invoke_async`` (invokeAsync, the push consumer's pulls) leaves it open.
    """

    def __init__(
        self,
        *,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        max_inflight: int = 256,
        connect_timeout_s: float = 3.0,
        close_socket_if_timeout: bool = True,
        log: Any = None,
        credentials: SessionCredentials | None = None,
        codec_factory: CodecFactory | None = None,
    ) -> None:
        self.credentials = credentials
        # one codec per connection: msgpack (PROTOCOL.md), or RocketMQ's own remoting format
        self.codec_factory: CodecFactory = codec_factory or MsgpackCodec
        self.max_frame_bytes = max_frame_bytes
        self.max_inflight = max_inflight
        self.connect_timeout_s = connect_timeout_s
        self.close_socket_if_timeout = close_socket_if_timeout
        self._dispatcher = _Dispatcher(log)
        self._conns: dict[str, Connection] = {}
        self._connecting: dict[str, asyncio.Future[Connection]] = {}
        self._closed_cbs: list[Callable[[str], None]] = []
        self._opened_cbs: list[Callable[[str], None]] = []
        self._log = log
        self._shut = False

    def register(self, code: int, handler: Handler | SyncHandler) -> None:
        """Serve requests of ``code`` with ``handler``: an ``async def``, or a plain function for one
        that never waits (run without a task, see ``_Dispatcher``)."""
        self._dispatcher.register(code, handler)

    def on_connection_closed(self, cb: Callable[[str], None]) -> None:
        self._closed_cbs.append(cb)

    def on_connection_opened(self, cb: Callable[[str], None]) -> None:
        self._opened_cbs.append(cb)

    def connected(self, addr: str) -> bool:
        conn = self._conns.get(addr)
        return conn is not None and not conn.closed

    async def connection(self, addr: str) -> Connection:
        if self._shut:
            raise RemotingConnectionError("client is closed")
        conn = self._conns.get(addr)
        if conn is not None and not conn.closed:
            return conn
        pending = self._connecting.get(addr)
        if pending is not None:
            return await asyncio.shield(pending)
        fut: asyncio.Future[Connection] = asyncio.get_running_loop().create_future()
        self._connecting[addr] = fut
        try:
            conn = await self._connect(addr)
            fut.set_result(conn)
            return conn
        except BaseException as exc:
            fut.set_exception(exc if isinstance(exc, Exception) else RemotingConnectionError("cancelled"))
            fut.exception()  # mark retrieved: waiters get it through shield
            raise
        finally:
            self._connecting.pop(addr, None)

    async def _connect(self, addr: str) -> Connection:
        try:
            host, port = split_addr(addr)
        except ValueError as exc:
            raise RemotingConnectionError(str(exc)) from None
        loop = asyncio.get_running_loop()

        def on_close(conn: Connection) -> None:
            if self._conns.get(addr) is conn:
                del self._conns[addr]
            for cb in self._closed_cbs:
                try:
                    cb(addr)
                except Exception:
                    _log.exception("connection-closed callback failed")

        def factory() -> Connection:
            return Connection(
                self._dispatcher,
                max_frame_bytes=self.max_frame_bytes,
                max_inflight=self.max_inflight,
                on_close=on_close,
                log=self._log,
                codec=self.codec_factory(self.max_frame_bytes),
                credentials=self.credentials,
            )

        try:
            async with asyncio.timeout(self.connect_timeout_s):
                _, conn = await loop.create_connection(factory, host, port)
        except TimeoutError:
            raise RemotingConnectionError(f"connect to {addr} timed out") from None
        except OSError as exc:
            raise RemotingConnectionError(f"connect to {addr} failed: {exc}") from None
        self._conns[addr] = conn
        for cb in self._opened_cbs:
            try:
                cb(addr)
            except Exception:
                _log.exception("connection-opened callback failed")
        return conn

    def _open(self, addr: str) -> Connection | None:
        """The open connection to ``addr`` if there is one: what ``connection`` returns at once, without
        making a coroutine for it (every request asks)."""
        conn = self._conns.get(addr)
        return conn if conn is not None and not conn.closed and not self._shut else None

    async def invoke(self, addr: str, cmd: RemotingCommand, timeout_s: float) -> RemotingCommand:
        """invokeSync: a timeout closes the connection when ``close_socket_if_timeout`` is on."""
        conn = self._open(addr) or await self.connection(addr)
        try:
            return await conn.invoke(cmd, timeout_s)
        except RemotingTimeoutError:
            if self.close_socket_if_timeout:
                self._close_channel(addr, conn)
            raise

    async def invoke_async(self, addr: str, cmd: RemotingCommand, timeout_s: float) -> RemotingCommand:
        """invokeAsync: a timeout fails only this call; the connection stays open."""
        conn = self._open(addr) or await self.connection(addr)
        return await conn.invoke(cmd, timeout_s)

    def _close_channel(self, addr: str, conn: Connection) -> None:
        # Netty's close drops unsent writes at once; a graceful close would wait for a peer that
        # may not be reading, and the pending calls on this connection would not fail until then.
        if self._conns.get(addr) is conn:
            del self._conns[addr]
        conn.abort()

    async def invoke_oneway(self, addr: str, cmd: RemotingCommand, timeout_s: float = 3.0) -> None:
        conn = self._open(addr) or await self.connection(addr)
        await conn.invoke_oneway(cmd, timeout_s)

    def send_oneway(self, addr: str, cmd: RemotingCommand, timeout_s: float = 3.0) -> Awaitable[None] | None:
        """``invoke_oneway`` without a coroutine when the connection is open and its write buffer has
        room: None once the request is written, otherwise what is left of it to await (connecting, or
        the wait for the buffer). Errors of the write raise here, as they would from the await."""
        conn = self._open(addr)
        if conn is None:
            return self.invoke_oneway(addr, cmd, timeout_s)
        if conn.send_oneway(cmd):
            return None
        return conn.wait_oneway_written(cmd, timeout_s)

    def close_connection(self, addr: str) -> None:
        conn = self._conns.pop(addr, None)
        if conn is not None:
            conn.close()

    async def close(self) -> None:
        self._shut = True
        conns = list(self._conns.values())
        self._conns.clear()
        await _close_connections(conns)
