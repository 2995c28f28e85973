"""The in-memory network under the remoting layer: asyncio transports between virtual processes.

Each direction of each pair of nodes is a link with its own seeded random stream; a frame takes a
latency drawn from the network's distribution plus any nemesis latency, and frames on one link arrive in
the order they were written (TCP). Rules per link model the chaos lab's network faults: extra latency,
a blackhole (frames wait, as TCP retransmits, and flow on heal), loss (each try of a frame lost with a
chance, sent again after TCP's retransmission timeouts), dropped frames, and resets. Two msgpack ends hand
each other command objects (``sim.wire``) unless the network is made with ``wire="bytes"``. A killed
process's connections close as the kernel closes them: the peer sees the end of the stream after the
frames already in flight.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rmqlab.protocol.command import RemotingCommand
from rmqlab.sim.dist import Distribution
from rmqlab.sim.loop import CURRENT, VirtualLoop, VirtualProcess
from rmqlab.sim.wire import WIRES, ObjectCodec, serves_msgpack, speaks_msgpack

_EPS = 1e-7  # keeps frames of one link strictly ordered in the timer heap
# Linux's retransmission timeouts: TCP_RTO_MIN for data (a LAN's smoothed RTT is far below it),
# TCP_TIMEOUT_INIT for a SYN, each doubled per loss in a row up to TCP_RTO_MAX
RTO_MIN_S = 0.2
SYN_RTO_S = 1.0
RTO_MAX_S = 120.0


def retransmit_delay(rng: random.Random, loss: float, first_rto_s: float) -> float:
    """How long TCP takes to get one segment across when each try is lost with chance ``loss``."""
    delay, rto = 0.0, first_rto_s
    while rng.random() < loss:
        delay += rto
        rto = min(2 * rto, RTO_MAX_S)
    return delay


@dataclass
class LinkRule:
    """What a nemesis did to the frames from one node to another."""

    latency_ms: float = 0.0
    jitter_ms: float = 0.0
    blackhole: bool = False
    drop: bool = False
    loss: float = 0.0  # chance that a packet is lost (iptables' statistic match); TCP sends it again
    waiting: list[Callable[[], None]] = field(default_factory=list)

    @property
    def cut(self) -> bool:
        """Nothing gets through: frames wait for the heal (TCP retransmits; its ~15 min give-up is
        longer than any experiment's fault)."""
        return self.blackhole or self.loss >= 1.0

    @property
    def idle(self) -> bool:
        return not (self.latency_ms or self.jitter_ms or self.blackhole or self.drop or self.loss)


class _Link:
    __slots__ = ("fifo", "last", "rng")

    def __init__(self, rng: random.Random) -> None:
        self.last = 0.0
        self.rng = rng
        self.fifo: collections.deque[Any] = collections.deque()  # its frames in flight (VirtualLoop)


class SimTransport(asyncio.Transport):
    """One end of an in-memory TCP connection, owned by one virtual process."""

    def __init__(
        self, net: Network, proc: VirtualProcess, local: tuple[str, int], remote: tuple[str, int]
    ) -> None:
        super().__init__()
        self.id = next(net.transport_ids)
        self._net = net
        self.proc = proc
        self._local = local
        self._remote = remote
        self.peer: SimTransport | None = None
        self.link: _Link | None = None  # this end to the peer's: fixed, as both ends' nodes are
        self.protocol: asyncio.Protocol | None = None
        self._receive: Callable[[Any], None] | None = None  # set with the protocol (attach)
        self._closing = False
        self.lost = False
        self._reading_paused = False
        self._inbox: list[bytes] = []

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        if name == "peername":
            return self._remote
        if name == "sockname":
            return self._local
        return default

    def write(self, data: Any) -> None:
        if self._closing or self.peer is None:
            return
        # bytes are copied as the kernel copies them; a command (ObjectCodec) is already a copy
        self._net.send(self, data if type(data) is RemotingCommand else bytes(data))

    def writelines(self, list_of_data: Any) -> None:
        self.write(b"".join(list_of_data))

    def close(self) -> None:
        if not self._closing:
            self._closing = True
            self._net.close(self)

    def abort(self) -> None:
        self.close()

    def is_closing(self) -> bool:
        return self._closing

    def pause_reading(self) -> None:
        self._reading_paused = True

    def resume_reading(self) -> None:
        self._reading_paused = False
        inbox, self._inbox = self._inbox, []
        for data in inbox:
            self._deliver(data)

    def is_reading(self) -> bool:
        return not self._reading_paused

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass  # bandwidth-free: a write never backs up

    def get_write_buffer_size(self) -> int:
        return 0

    def can_write_eof(self) -> bool:
        return False

    def attach(self, protocol: Any, objects: bool) -> None:
        """This end's protocol; with ``objects`` each frame is a command (sim.wire), handed to the
        connection whole (``Connection.command_received``), not through its codec."""
        self.protocol = protocol
        self._receive = protocol.command_received if objects else protocol.data_received

    # -- called by the network, in this end's process ---------------------------------------------
    def deliver(self, data: bytes) -> None:
        if self.lost:
            return
        receive = self._receive
        if self._reading_paused or receive is None:
            self._inbox.append(data)
            return
        receive(data)

    def _deliver(self, data: bytes) -> None:
        if not self.lost and self._receive is not None:
            self._receive(data)

    def lose(self, exc: Exception | None) -> None:
        if self.lost:
            return
        self.lost = True
        self._closing = True
        self._net.forget(self)
        if self.protocol is not None:
            self.protocol.connection_lost(exc)


class _SimSocket:
    def __init__(self, addr: tuple[str, int]) -> None:
        self._addr = addr

    def getsockname(self) -> tuple[str, int]:
        return self._addr


class SimServer:
    """What ``loop.create_server`` returns: stops accepting on close."""

    def __init__(self, net: Network, addr: tuple[str, int], serving: bool = True) -> None:
        self._net = net
        self.addr = addr
        self.sockets = [_SimSocket(addr)]
        self.serving = serving  # bound but not yet listening refuses connections, as a real socket does

    async def start_serving(self) -> None:
        self.serving = True

    def close(self) -> None:
        listener = self._net.listeners.get(self.addr)
        if listener is not None and listener[2] is self:
            del self._net.listeners[self.addr]

    def is_serving(self) -> bool:
        return self.serving and self._net.listeners.get(self.addr, (None, None, None))[2] is self

    async def wait_closed(self) -> None:
        return None


class Network:
    """Hosts (one IP per node), listeners and links, all in virtual time."""

    def __init__(self, loop: VirtualLoop, seed: int, latency: Distribution, wire: str = "objects") -> None:
        if wire not in WIRES:
            raise ValueError(f"wire must be one of {', '.join(WIRES)}, got {wire!r}")
        self.loop = loop
        # "objects": two msgpack connections hand each other commands (sim.wire); "bytes": real frames
        self.wire = wire
        self.seed = seed
        self.latency = latency
        self._sample = latency.sampler()
        self.listeners: dict[tuple[str, int], tuple[VirtualProcess, Callable[[], Any], SimServer]] = {}
        self.transports: dict[int, SimTransport] = {}
        # each process's open ends, in the order they opened: a kill closes them without a pass over
        # every end of the run (a teardown kills a thousand processes)
        self._ends: dict[VirtualProcess, dict[int, SimTransport]] = {}
        self.transport_ids = itertools.count(1)
        self.rules: dict[tuple[str, str], LinkRule] = {}
        self._links: dict[tuple[str, str], _Link] = {}
        self._ips: dict[str, str] = {}
        self._nodes_by_ip: dict[str, str] = {}
        self._ports: dict[str, itertools.count[int]] = {}
        self.frames = 0
        loop.network = self

    # -- addresses ---------------------------------------------------------------------------------
    def ip_of(self, node: str) -> str:
        """A stable address per node name (a restarted process keeps its host)."""
        ip = self._ips.get(node)
        if ip is None:
            n = len(self._ips) + 1
            ip = f"10.{n // 65536 % 256}.{n // 256 % 256}.{n % 256}"
            self._ips[node] = ip
            self._nodes_by_ip[ip] = node
        return ip

    def assign_ip(self, node: str, ip: str) -> None:
        """Give a node a fixed address (the lab's own driver runs on the brokers' host: loopback)."""
        self._ips[node] = ip
        self._nodes_by_ip[ip] = node

    def node_of(self, ip: str) -> str:
        return self._nodes_by_ip.get(ip, ip)

    def _ephemeral(self, ip: str, first: int) -> int:
        counter = self._ports.get(ip)
        if counter is None:
            counter = self._ports[ip] = itertools.count(first)
        return next(counter)

    def _link(self, src: str, dst: str) -> _Link:
        link = self._links.get((src, dst))
        if link is None:
            link = self._links[(src, dst)] = _Link(random.Random(f"{self.seed}:link:{src}>{dst}"))
        return link

    def rule(self, src: str, dst: str) -> LinkRule:
        r = self.rules.get((src, dst))
        if r is None:
            r = self.rules[(src, dst)] = LinkRule()
        return r

    # -- listening and connecting ------------------------------------------------------------------
    def listen(self, factory: Callable[[], Any], host: str, port: int, serving: bool = True) -> SimServer:
        proc = CURRENT.get()
        if proc is None:
            raise OSError("listen outside a virtual process")
        if port == 0:
            port = self._ephemeral(host + "/listen", 10_000)
        addr = (host, port)
        if addr in self.listeners and self.listeners[addr][0].alive:
            raise OSError(98, f"address {host}:{port} already in use")
        server = SimServer(self, addr, serving)
        self.listeners[addr] = (proc, factory, server)
        return server

    async def connect(
        self, factory: Callable[[], Any], host: str, port: int
    ) -> tuple[asyncio.Transport, asyncio.BaseProtocol]:
        proc = CURRENT.get()
        if proc is None:
            raise OSError("connect outside a virtual process")
        src = proc.node
        dst = self.node_of(host)
        # SYN and SYN-ACK: a blackholed link never completes the handshake (the caller's timeout ends it).
        for key in ((src, dst), (dst, src)):
            r = self.rules.get(key)
            if r is not None and r.cut:
                healed: asyncio.Future[None] = self.loop.create_future()
                r.waiting.append(lambda f=healed: f.done() or f.set_result(None))
                await healed
        await asyncio.sleep(self._delay(src, dst, SYN_RTO_S) + self._delay(dst, src, SYN_RTO_S))
        entry = self.listeners.get((host, port))
        if entry is None or not entry[0].alive or not entry[2].serving:
            raise ConnectionRefusedError(111, f"connect to {host}:{port}: connection refused")
        sproc, sfactory, _server = entry
        objects = self.wire == "objects" and serves_msgpack(sfactory)
        local = (self.ip_of(src), self._ephemeral(self.ip_of(src), 40_000))
        client = SimTransport(self, proc, local, (host, port))
        server = SimTransport(self, sproc, (host, port), local)
        client.peer, server.peer = server, client
        client.link, server.link = self._link(src, dst), self._link(dst, src)
        self.transports[client.id] = client
        self.transports[server.id] = server
        self._ends.setdefault(proc, {})[client.id] = client
        self._ends.setdefault(sproc, {})[server.id] = server

        def accept() -> None:
            if server.lost:
                return
            proto = sfactory()
            if objects:
                proto.codec = ObjectCodec(server)
            server.attach(proto, objects)
            proto.connection_made(server)
            if server._inbox and not server._reading_paused:
                server.resume_reading()

        # The kernel completes the handshake; the server process accepts when it next runs.
        self.loop.call_soon(accept, context=sproc.context)
        proto = factory()
        if objects and speaks_msgpack(proto):
            proto.codec = ObjectCodec(client)
        elif objects:
            # a client that does not speak msgpack gets bytes; so must the server's end
            objects = False
        client.attach(proto, objects)
        proto.connection_made(client)
        return client, proto

    # -- frames --------------------------------------------------------------------------------------
    def _delay(self, src: str, dst: str, first_rto_s: float = RTO_MIN_S) -> float:
        link = self._link(src, dst)
        ms = self._sample(link.rng)
        r = self.rules.get((src, dst))
        if r is None:
            return max(0.0, ms) / 1000.0
        if r.latency_ms or r.jitter_ms:
            ms += r.latency_ms + (link.rng.uniform(-r.jitter_ms, r.jitter_ms) if r.jitter_ms else 0.0)
        # A lost frame is not lost to the peer: TCP retransmits it, and the frames behind it on the
        # link wait (they arrive in order), as they do behind a dropped packet. A frame counts as one
        # segment, whatever its size.
        lost = retransmit_delay(link.rng, r.loss, first_rto_s) if r.loss else 0.0
        return max(0.0, ms) / 1000.0 + lost

    def _schedule(self, sender: SimTransport, fn: Callable[..., None], arg: Any, *, frame: bool) -> None:
        peer = sender.peer
        if peer is None:
            return
        src, dst = sender.proc.node, peer.proc.node
        r = self.rules.get((src, dst))
        if r is not None and r.drop and frame:
            return
        if r is not None and r.cut:
            r.waiting.append(lambda: self._schedule(sender, fn, arg, frame=frame))
            return
        link = self._link(src, dst)
        when = max(link.last + _EPS, self.loop.time() + self._delay(src, dst))
        link.last = when
        if not peer.lost:  # (a lost end takes nothing: see send)
            self.loop.deliver_at(when, fn, arg, peer.proc, link.fifo)

    def send(self, sender: SimTransport, data: bytes) -> None:
        self.frames += 1
        peer = sender.peer
        if peer is None:
            return
        link = sender.link
        if self.rules or link is None:
            self._schedule(sender, peer.deliver, data, frame=True)
            return
        # No nemesis on any link: _schedule's steps for a plain frame, with the link known
        loop = self.loop
        when = loop._now + max(0.0, self._sample(link.rng)) / 1000.0
        if when < link.last + _EPS:
            when = link.last + _EPS
        link.last = when
        if peer.lost:
            # The peer's process is gone (or its end closed): the frame would reach nothing, so it is
            # not scheduled; its latency was still drawn, so the link's later frames keep their times.
            # A broker's NOTIFY to members killed together (a teardown) is a million of these.
            return
        loop.deliver_at(when, peer.deliver, data, peer.proc, link.fifo)

    def close(self, t: SimTransport) -> None:
        """An orderly close: the peer reads to the end of what was sent, then sees the stream end."""
        peer = t.peer
        if peer is not None:
            self._schedule(t, peer.lose, None, frame=False)
        self.loop.call_soon(t.lose, None, context=t.proc.context)

    def forget(self, t: SimTransport) -> None:
        self.transports.pop(t.id, None)
        ends = self._ends.get(t.proc)
        if ends is not None:
            ends.pop(t.id, None)
            if not ends:
                del self._ends[t.proc]

    # -- what happens to processes and links -------------------------------------------------------
    def process_died(self, proc: VirtualProcess) -> None:
        """SIGKILL: the kernel closes the process's sockets and stops its listeners."""
        for addr, (p, _f, _s) in list(self.listeners.items()):
            if p is proc:
                del self.listeners[addr]
        for t in list(self._ends.get(proc, {}).values()):
            t.lost = True
            t._closing = True
            self.forget(t)
            if t.peer is not None and not t.peer.lost:
                self._schedule(t, t.peer.lose, None, frame=False)

    def reset(self, a: str, b: str) -> int:
        """Connection resets between nodes a and b: both ends see ECONNRESET at once."""
        n = 0
        for t in list(self.transports.values()):
            peer = t.peer
            if peer is None or t.proc.node != a or peer.proc.node != b:
                continue
            for end in (t, peer):
                self.loop.call_soon(
                    end.lose, ConnectionResetError(104, "connection reset by peer"), context=end.proc.context
                )
            n += 1
        return n

    def heal(self, a: str, b: str) -> None:
        for key in ((a, b), (b, a)):
            r = self.rules.pop(key, None)
            if r is not None:
                for resend in r.waiting:
                    resend()
