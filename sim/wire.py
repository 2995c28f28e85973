"""What a frame is on the in-memory network when both ends are simulated: the command object itself.

Through bytes, every frame is packed to msgpack, framed, split and unpacked again, only to give the peer
a fresh ``RemotingCommand``. ``ObjectCodec`` gives it the same command directly, as a copy taken at the
moment of the write with msgpack's round-trip semantics (tuples and lists become lists, int and str
subclasses such as enums become plain ints and strs, bytearrays become bytes, dict order is kept), so
neither side sees the other's later changes and the handlers see what they would have decoded. A
value msgpack cannot carry fails the write as encoding would. What is not checked: the frame-size limit
and Java's 64-bit range of ints (msgpack refuses ints past 64 bits), which the roles never reach.

``Network(wire="bytes")`` keeps every frame going through the real codec; both ways give the same
event logs for a seed (tests/sim/test_sim_wire.py).
"""

from __future__ import annotations

from typing import Any

import msgpack

from rmqlab.protocol.command import PROTOCOL_VERSION, RemotingCommand
from rmqlab.protocol.remoting import Connection, MsgpackCodec

WIRES = ("objects", "bytes")

# Immutable values msgpack gives back as the same type and value: shared, not copied.
_SAME = frozenset({str, int, float, bool, bytes, type(None)})


def _round_trip(value: Any) -> Any:
    """msgpack's own answer, for the rare types the fast paths do not know (enums, bytearrays)."""
    return msgpack.unpackb(msgpack.packb(value, use_bin_type=True), raw=False, strict_map_key=False)


# Long tuples of immutable scalars checked before, by identity, each kept alive here so that its id is
# never another object's: a tuple cannot change, so one check holds for good. A broker answers every
# member of a group with its one tuple of client ids (broker.consumer_manager), a thousand strings
# checked once per member list instead of once per answer.
_CHECKED: dict[int, tuple[Any, ...]] = {}
_CHECKED_MAX = 64
_CHECK_ONCE_FROM = 32  # shorter tuples are checked each time: cheap, and not worth remembering


def wire_copy(value: Any) -> Any:
    """``value`` as the peer would decode it: containers copied, immutable scalars shared."""
    t = type(value)
    if t in _SAME:
        return value
    if t is dict:
        # map() runs in C: a flat map (ext headers, most bodies) costs two scans and one copy
        if _SAME.issuperset(map(type, value.values())) and _SAME.issuperset(map(type, value)):
            return dict(value)
        # nested: the scalars inside are taken as they are, without a call each
        return {
            (k if type(k) is str else wire_copy(k)): (v if type(v) in _SAME else wire_copy(v))
            for k, v in value.items()
        }
    if t is tuple and len(value) >= _CHECK_ONCE_FROM:
        if _CHECKED.get(id(value)) is value:
            return list(value)
        if _SAME.issuperset(map(type, value)):
            if len(_CHECKED) >= _CHECKED_MAX:
                del _CHECKED[next(iter(_CHECKED))]
            _CHECKED[id(value)] = value
            return list(value)
        return [v if type(v) in _SAME else wire_copy(v) for v in value]
    if t is list or t is tuple:
        if _SAME.issuperset(map(type, value)):
            return list(value)
        return [v if type(v) in _SAME else wire_copy(v) for v in value]
    return _round_trip(value)


def copy_command(cmd: RemotingCommand) -> RemotingCommand:
    """The command as ``decode_payload(encode_payload(cmd))`` returns it."""
    code, opaque, flag, remark = cmd.code, cmd.opaque, cmd.flag, cmd.remark
    ext = cmd.ext
    return RemotingCommand(
        code if type(code) is int else int(code),
        opaque if type(opaque) is int else int(opaque),
        flag if type(flag) is int else int(flag),
        remark if remark is None or type(remark) is str else str(remark),
        wire_copy(ext) if ext else {},
        wire_copy(cmd.body),
        cmd.version if type(cmd.version) is int else PROTOCOL_VERSION,
    )


class ObjectCodec:
    """A connection's codec when the peer is simulated too: the frame is the copied command.

    ``end`` is the connection's own end of the in-memory network (``sim.network.SimTransport``): once
    the other end is lost (its process killed, the connection closed) no frame reaches it, so the
    command is handed on uncopied and the network drops it (a broker's NOTIFY to each of a thousand
    members killed together). Such a frame is not checked for values msgpack cannot carry."""

    __slots__ = ("end",)
    buffered = 0  # nothing is ever half-received, so the partial-frame timer never arms

    def __init__(self, end: Any = None) -> None:
        self.end = end

    def feed(self, data: Any) -> list[RemotingCommand]:
        return [data]

    def encode(self, cmd: RemotingCommand) -> Any:
        end = self.end
        if end is not None and end.peer is not None and end.peer.lost:
            return cmd
        return copy_command(cmd)


def speaks_msgpack(proto: Any) -> bool:
    """A connection of the remoting layer with PROTOCOL.md's codec (not RocketMQ's native one)."""
    return isinstance(proto, Connection) and type(proto.codec) is MsgpackCodec


def serves_msgpack(factory: Any) -> bool:
    """Whether a listener's protocol factory (RemotingServer._make_protocol) makes msgpack connections."""
    owner = getattr(factory, "__self__", None)
    return getattr(owner, "codec_factory", None) is MsgpackCodec
