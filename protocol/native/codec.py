"""The per-connection codec that lets real RocketMQ clients talk to the same handlers as our own.

It plugs into ``RemotingServer(codec_factory=...)`` and ``RemotingClient(codec_factory=...)``: ``feed``
turns native frames into typed commands and ``encode`` turns commands back into native frames. It remembers
the request code of every request in flight in both directions (by opaque), because native answers are
shaped by the request they answer (a pull's messages, a route's addresses) and carry no code of their own.
On the client side it also remembers the UNIQ_KEY it gave each SEND_MESSAGE, which becomes the send's
message id as in RocketMQ's SendResult.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import TypeVar

from rmqlab.protocol.codes import RequestCode
from rmqlab.protocol.command import DEFAULT_MAX_FRAME_BYTES, RemotingCommand
from rmqlab.protocol.native.frame import NativeFrameDecoder
from rmqlab.protocol.native.message_ext import StoreHost
from rmqlab.protocol.native.translate import (
    CLIENT_LANGUAGE,
    TranslateContext,
    encode_native,
    request_from_native,
    request_to_native,
    response_from_native,
    response_to_native,
    send_uniq_key,
)

_V = TypeVar("_V")

# Requests that never got an answer (a handler that returned nothing) must not pile up.
MAX_TRACKED_REQUESTS = 65536


class NativeCodec:
    """RocketMQ's remoting format for one connection."""

    __slots__ = ("_decoder", "_incoming", "_outgoing", "context")

    def __init__(
        self, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES, context: TranslateContext | None = None
    ) -> None:
        self._decoder = NativeFrameDecoder(max_frame_bytes)
        self.context = context or TranslateContext()
        # opaque -> request code, for requests from the peer; for requests to it, with the UNIQ_KEY sent
        self._incoming: OrderedDict[int, int] = OrderedDict()
        self._outgoing: OrderedDict[int, tuple[int, str | None]] = OrderedDict()

    def feed(self, data: bytes) -> list[RemotingCommand]:
        out: list[RemotingCommand] = []
        for frame in self._decoder.feed(data):
            if frame.is_response:
                code, uniq_key = self._outgoing.pop(frame.opaque, (None, None))
                out.append(response_from_native(code, frame, uniq_key))
                continue
            cmd = request_from_native(frame)
            if not cmd.is_oneway:
                _remember(self._incoming, cmd.opaque, frame.code)
            out.append(cmd)
        return out

    @property
    def buffered(self) -> int:
        return self._decoder.buffered

    def encode(self, cmd: RemotingCommand) -> bytes:
        if cmd.is_response:
            frame = response_to_native(self._incoming.pop(cmd.opaque, None), cmd, self.context)
        else:
            uniq_key = None
            if cmd.code == RequestCode.SEND_MESSAGE and self.context.uniq_ids is not None:
                uniq_key = send_uniq_key(cmd) or self.context.uniq_ids()
            if not cmd.is_oneway:
                _remember(self._outgoing, cmd.opaque, (cmd.code, uniq_key))
            frame = request_to_native(cmd, uniq_key, self.context.language)
        return encode_native(frame)


def _remember(table: OrderedDict[int, _V], opaque: int, value: _V) -> None:
    table[opaque] = value
    table.move_to_end(opaque)
    while len(table) > MAX_TRACKED_REQUESTS:
        table.popitem(last=False)


def port_rewriter(primary_port: int, native_port: int, *also: int) -> Callable[[str], str]:
    """Rewrites ``host:<primary_port>`` (or any port in ``also``) to ``host:<native_port>``; other
    addresses stay as they are."""
    ports = {str(primary_port), *(str(p) for p in also)}

    def rewrite(addr: str) -> str:
        host, sep, port = addr.rpartition(":")
        if sep and port in ports:
            return f"{host}:{native_port}"
        return addr

    return rewrite


def native_client_codec_factory(uniq_ids: Callable[[], str] | None = None) -> Callable[[int], NativeCodec]:
    """The codec factory of a client speaking RocketMQ's protocol to a broker or name server
    (``RemotingClient(codec_factory=...)``); ``uniq_ids`` makes the UNIQ_KEY of each message sent
    (``message_ext.UniqIdGenerator``), shared by the client's connections (None: a client that sends
    no messages, or sends them with their own UNIQ_KEY)."""

    def factory(max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> NativeCodec:
        return NativeCodec(max_frame_bytes, TranslateContext(language=CLIENT_LANGUAGE, uniq_ids=uniq_ids))

    return factory


def native_codec_factory(
    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
    *,
    store_host: str | None = None,
    rewrite_broker_addr: Callable[[str], str] | None = None,
) -> NativeCodec:
    """A codec for one connection; usable as ``codec_factory`` as it is, or partially applied with
    the address real clients reach this broker at (``store_host``, "ip:port", written into pulled
    messages) and how route addresses of the primary port map to native ones."""
    ctx = TranslateContext()
    if store_host is not None:
        ctx.store_host = StoreHost.parse(store_host)
    if rewrite_broker_addr is not None:
        ctx.rewrite_broker_addr = rewrite_broker_addr
    return NativeCodec(max_frame_bytes, ctx)
