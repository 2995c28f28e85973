"""Fault relay: a TCP relay between a client and a broker that can add latency, black-hole or reset.

The lab gives a client that network nemeses may target its own set of relays (``ClientLinks``): one
per broker, and one in front of the name server that rewrites broker addresses in route answers so
that the client reaches every broker through its relay. Faults then hit one client's links only,
which is what "a network fault between a client and a broker" means.

- latency: every chunk is held for ``ms`` (+ uniform jitter) before it is written on, in order;
- blackhole: nothing moves in either direction (nor is read: TCP back-pressure builds as it would on
  a dead link); when healed, what was held flows again, like retransmissions after a partition;
- reset: every open connection is aborted with a TCP RST on both sides; with ``refuse`` new
  connections are reset as soon as they are accepted, until healed.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import socket
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgpack

_LEN = struct.Struct(">I")
_CHUNK = 64 * 1024
_MAX_FRAME = 16 * 1024 * 1024


def _rst(writer: asyncio.StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


class RouteRewriter:
    """Rewrites broker addresses in route answers (``body.brokerDatas[].brokerAddrs``) of a frame stream.

    Sans-IO: ``feed`` takes bytes as they arrive and returns the bytes to pass on. Frames are
    PROTOCOL.md's (4-byte big-endian length, msgpack map). Anything it cannot parse is passed on
    unchanged from then on, so the relay never corrupts a stream it does not understand.
    """

    def __init__(
        self, addr_map: Callable[[str], str | None], max_frame_bytes: int = 16 * 1024 * 1024
    ) -> None:
        self.addr_map = addr_map
        self.max_frame_bytes = max_frame_bytes
        self._buf = bytearray()
        self._raw = False
        self.rewritten = 0

    def feed(self, data: bytes) -> bytes:
        if self._raw:
            return data
        self._buf += data
        out = bytearray()
        while len(self._buf) >= 4:
            (length,) = _LEN.unpack_from(self._buf)
            if length == 0 or length > self.max_frame_bytes:
                return self._give_up(out)
            if len(self._buf) < 4 + length:
                break
            payload = bytes(self._buf[4 : 4 + length])
            del self._buf[: 4 + length]
            out += self._frame(payload)
        return bytes(out)

    def _give_up(self, out: bytearray) -> bytes:
        self._raw = True
        out += self._buf
        self._buf.clear()
        return bytes(out)

    def _frame(self, payload: bytes) -> bytes:
        try:
            obj = msgpack.unpackb(payload, raw=False, strict_map_key=False)
        except Exception:  # not ours to judge: pass the frame on as it came
            return _LEN.pack(len(payload)) + payload
        body = obj.get("body") if isinstance(obj, dict) else None
        changed = False
        if isinstance(body, dict) and isinstance(body.get("brokerDatas"), list):
            for bd in body["brokerDatas"]:
                addrs = bd.get("brokerAddrs") if isinstance(bd, dict) else None
                if not isinstance(addrs, dict):
                    continue
                for k, v in list(addrs.items()):
                    new = self.addr_map(v) if isinstance(v, str) else None
                    if new is not None and new != v:
                        addrs[k] = new
                        changed = True
        if not changed:
            return _LEN.pack(len(payload)) + payload
        self.rewritten += 1
        packed = msgpack.packb(obj, use_bin_type=True)
        return _LEN.pack(len(packed)) + packed


@dataclass(eq=False)
class _Conn:
    client: asyncio.StreamWriter
    upstream: asyncio.StreamWriter | None = None
    tasks: tuple[asyncio.Task[None], ...] = ()


class FaultRelay:
    """One listening socket relaying to one upstream address, with faults switchable at run time."""

    def __init__(
        self,
        upstream: str,
        *,
        name: str = "",
        host: str = "127.0.0.1",
        port: int = 0,
        rewriter_factory: Callable[[], RouteRewriter] | None = None,
        seed: int = 0,
    ) -> None:
        self.upstream = upstream
        self.name = name or upstream
        self.host = host
        self._port = port
        self._rewriter_factory = rewriter_factory
        self._server: asyncio.Server | None = None
        self._conns: set[_Conn] = set()
        self._open = asyncio.Event()
        self._open.set()
        self.latency_ms = 0.0
        self.jitter_ms = 0.0
        self.refusing = False
        self._rng = random.Random(seed)
        self.accepted = 0
        self.resets = 0
        self.bytes_up = 0
        self.bytes_down = 0

    # -- control ---------------------------------------------------------------------------------

    @property
    def blackholed(self) -> bool:
        return not self._open.is_set()

    def set_latency(self, ms: float, jitter_ms: float = 0.0) -> None:
        if ms < 0 or jitter_ms < 0:
            raise ValueError("latency and jitter must be >= 0")
        self.latency_ms, self.jitter_ms = float(ms), float(jitter_ms)

    def blackhole(self, on: bool = True) -> None:
        if on:
            self._open.clear()
        else:
            self._open.set()

    def reset(self, refuse: bool = False) -> int:
        """Abort every open connection with RST; returns how many. ``refuse`` keeps doing it to new ones."""
        self.refusing = refuse
        n = 0
        for c in list(self._conns):
            self._abort(c)
            n += 1
        self.resets += n
        return n

    def heal(self) -> None:
        self.set_latency(0)
        self.blackhole(False)
        self.refusing = False

    def state(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "listen": self.address,
            "upstream": self.upstream,
            "latency_ms": self.latency_ms,
            "jitter_ms": self.jitter_ms,
            "blackhole": self.blackholed,
            "refusing": self.refusing,
            "connections": len(self._conns),
            "accepted": self.accepted,
            "resets": self.resets,
        }

    # -- lifecycle -------------------------------------------------------------------------------

    async def start(self) -> FaultRelay:
        self._server = await asyncio.start_server(self._accept, self.host, self._port)
        self._port = self._server.sockets[0].getsockname()[1]
        return self

    @property
    def port(self) -> int:
        return self._port

    @property
    def address(self) -> str:
        return f"{self.host}:{self._port}"

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        self._open.set()
        conns = list(self._conns)
        for c in conns:
            self._abort(c)
        tasks = [t for c in conns for t in c.tasks]
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        if self._server is not None:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(2):
                    await self._server.wait_closed()

    async def __aenter__(self) -> FaultRelay:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- relaying --------------------------------------------------------------------------------

    def _abort(self, c: _Conn) -> None:
        _rst(c.client)
        if c.upstream is not None:
            _rst(c.upstream)
        for t in c.tasks:
            t.cancel()
        self._conns.discard(c)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        if self.refusing:
            self.resets += 1
            _rst(writer)
            return
        conn = _Conn(writer)
        self._conns.add(conn)
        try:
            await self._open.wait()  # a black-holed link does not get through to the upstream either
            host, _, port = self.upstream.rpartition(":")
            try:
                up_reader, up_writer = await asyncio.open_connection(host, int(port))
            except OSError:
                _rst(writer)  # the upstream refused: the client sees its connection reset
                return
            conn.upstream = up_writer
            if conn not in self._conns:  # reset while connecting
                _rst(up_writer)
                return
            rewriter = self._rewriter_factory() if self._rewriter_factory else None
            up = asyncio.create_task(self._pipe(reader, up_writer, None, "up"))
            down = asyncio.create_task(self._pipe(up_reader, writer, rewriter, "down"))
            conn.tasks = (up, down)
            done, _ = await asyncio.wait(conn.tasks, return_when=asyncio.FIRST_COMPLETED)
            # One side ended (EOF or error): close both, as a relay must.
            for t in conn.tasks:
                if t not in done:
                    t.cancel()
            await asyncio.gather(*conn.tasks, return_exceptions=True)
        except asyncio.CancelledError:
            pass
        finally:
            self._conns.discard(conn)
            for w in (writer, conn.upstream):
                if w is not None and not w.transport.is_closing():
                    w.close()

    async def _pipe(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        rewriter: RouteRewriter | None,
        direction: str,
    ) -> None:
        loop = asyncio.get_running_loop()
        held: asyncio.Queue[tuple[float, bytes] | None] = asyncio.Queue()

        async def deliver() -> None:
            while True:
                item = await held.get()
                if item is None:
                    with contextlib.suppress(OSError, RuntimeError):
                        writer.write_eof()
                    return
                due, data = item
                delay = due - loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)
                await self._open.wait()
                writer.write(data)
                await writer.drain()

        sender = asyncio.create_task(deliver())
        try:
            while True:
                await self._open.wait()
                read = asyncio.create_task(reader.read(_CHUNK))
                done, _ = await asyncio.wait((read, sender), return_when=asyncio.FIRST_COMPLETED)
                if sender in done:  # the writing side failed: stop reading
                    read.cancel()
                    sender.result()
                    return
                data = read.result()
                if not data:
                    held.put_nowait(None)
                    await sender
                    return
                if direction == "up":
                    self.bytes_up += len(data)
                else:
                    self.bytes_down += len(data)
                if rewriter is not None:
                    data = rewriter.feed(data)
                    if not data:
                        continue
                delay = self.latency_ms
                if self.jitter_ms:
                    delay += self._rng.uniform(0, self.jitter_ms)
                held.put_nowait((loop.time() + delay / 1000.0, data))
        except (ConnectionError, OSError):
            return
        finally:
            if not sender.done():
                sender.cancel()
            with contextlib.suppress(BaseException):
                await sender


def _port_of(addr: str) -> str:
    return addr.rpartition(":")[2]


class ClientLinks:
    """A client's relayed view of the cluster: a rewriting name-server relay plus one relay per broker."""

    def __init__(
        self, node: str, namesrv: str, brokers: dict[str, str], seed: int = 0, host: str = "127.0.0.1"
    ) -> None:
        self.node = node
        self.namesrv_upstream = namesrv
        self.broker_upstreams = dict(brokers)  # broker name -> real address
        self.brokers: dict[str, FaultRelay] = {
            name: FaultRelay(addr, name=f"{node}->{name}", seed=seed, host=host)
            for name, addr in brokers.items()
        }
        self.namesrv = FaultRelay(
            namesrv,
            name=f"{node}->namesrv",
            rewriter_factory=lambda: RouteRewriter(self.map_addr),
            host=host,
        )

    def map_addr(self, addr: str) -> str | None:
        # Match on the port as well: a broker may register its address under another local interface.
        for name, real in self.broker_upstreams.items():
            if addr == real or (_port_of(addr) == _port_of(real) and _is_local(addr)):
                return self.brokers[name].address
        return None

    async def start(self) -> ClientLinks:
        for p in self.brokers.values():
            await p.start()
        await self.namesrv.start()
        return self

    @property
    def namesrv_address(self) -> str:
        return self.namesrv.address

    def select(self, broker: str = "all") -> list[FaultRelay]:
        if broker == "all":
            return list(self.brokers.values())
        if broker == "namesrv":
            return [self.namesrv]
        try:
            return [self.brokers[broker]]
        except KeyError:
            raise ValueError(f"{self.node} has no link to {broker!r}") from None

    def apply(self, action: str, broker: str = "all", **params: Any) -> list[str]:
        """Apply latency/blackhole/reset/heal to the selected links; returns their names."""
        links = self.select(broker)
        for p in links:
            if action == "latency":
                p.set_latency(float(params.get("ms", 0)), float(params.get("jitter_ms", 0)))
            elif action == "blackhole":
                p.blackhole(True)
            elif action == "reset":
                p.reset(refuse=bool(params.get("refuse", False)))
            elif action == "heal":
                p.heal()
            else:
                raise ValueError(f"unknown network action {action!r}")
        return [p.name for p in links]

    def heal_all(self) -> None:
        for p in (*self.brokers.values(), self.namesrv):
            p.heal()

    async def close(self) -> None:
        for p in (self.namesrv, *self.brokers.values()):
            await p.close()

    def state(self) -> dict[str, Any]:
        return {"namesrv": self.namesrv.state(), "brokers": {n: p.state() for n, p in self.brokers.items()}}


def _is_local(addr: str) -> bool:
    host = addr.rpartition(":")[0]
    if host.startswith("127.") or host in ("localhost", "0.0.0.0", "::1"):
        return True
    try:
        from rmqlab.protocol.client_id import local_ip

        return host == local_ip()
    except ImportError:  # pragma: no cover
        return False
