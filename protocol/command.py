"""The command codec (sans-IO): length-prefixed msgpack frames per PROTOCOL.md, and typed field access.

Nothing here touches a socket: ``FrameDecoder`` is fed bytes and returns commands, ``encode_frame``
returns bytes. The remoting layer moves them.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final, Generic, TypeVar

import msgpack

from rmqlab.protocol.codes import Flag, ResponseCode
from rmqlab.protocol.model import JAVA_INT_MAX, JAVA_INT_MIN, JAVA_LONG_MAX, JAVA_LONG_MIN, WireError

DEFAULT_MAX_FRAME_BYTES: Final = 16 * 1024 * 1024
PROTOCOL_VERSION: Final = 1
OPAQUE_MAX: Final = 2**31 - 1

_LEN = struct.Struct(">I")
# the flag bits as plain ints: IntFlag arithmetic runs in Python, on every frame
_RESPONSE: Final = int(Flag.RESPONSE)
_ONEWAY: Final = int(Flag.ONEWAY)
T = TypeVar("T")


class _Required:
    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED: Final = _Required()


class FrameError(Exception):
    """The peer sent a frame or payload that is not a valid command: the connection must be closed."""


class InvalidParameter(WireError):
    """A request field is missing or has the wrong type; answered with INVALID_PARAMETER."""


class CommandError(Exception):
    """Raised by a request handler to answer with ``code`` and ``remark``."""

    def __init__(self, code: int, remark: str) -> None:
        super().__init__(remark)
        self.code = int(code)
        self.remark = remark


def _typed(mapping: Any, name: str, where: str, default: Any, check: Any, typename: str) -> Any:
    label = f"{where}.{name}" if where else name
    if not isinstance(mapping, dict):
        raise InvalidParameter(where or name, "expected a map")
    value = mapping.get(name)
    if value is None:
        if default is REQUIRED:
            raise InvalidParameter(label, "missing")
        return default
    if not check(value):
        raise InvalidParameter(label, f"expected {typename}, got {type(value).__name__}")
    return value


def _field_int(mapping: Any, name: str, where: str, default: Any) -> Any:
    value = _typed(
        mapping, name, where, default, lambda v: isinstance(v, int) and not isinstance(v, bool), "int"
    )
    if value is not default and not JAVA_LONG_MIN <= value <= JAVA_LONG_MAX:
        raise InvalidParameter(f"{where}.{name}" if where else name, f"{value} is outside a 64-bit long")
    return value


# The typed accessors run for every field of every frame. Each first tries the common case (a plain
# dict holding a value of exactly the wanted type, in range) inline; anything else (missing, None, a
# bool for an int, an int subclass, a value out of range, not a map) goes the full way, which answers
# with the same INVALID_PARAMETER as always.


def field_int(mapping: Any, name: str, where: str = "", default: Any = REQUIRED) -> Any:
    """An int field within Java's ``long`` (every RocketMQ number is a long or narrower)."""
    if mapping.__class__ is dict:
        value = mapping.get(name)
        if value.__class__ is int and JAVA_LONG_MIN <= value <= JAVA_LONG_MAX:
            return value
    return _field_int(mapping, name, where, default)


def field_int32(mapping: Any, name: str, where: str = "", default: Any = REQUIRED) -> Any:
    """An int field that is a Java ``int`` in RocketMQ (queue ids, counts, reconsume times)."""
    if mapping.__class__ is dict:
        value = mapping.get(name)
        if value.__class__ is int and JAVA_INT_MIN <= value <= JAVA_INT_MAX:
            return value
    value = _field_int(mapping, name, where, default)
    if value is not default and not JAVA_INT_MIN <= value <= JAVA_INT_MAX:
        raise InvalidParameter(f"{where}.{name}" if where else name, f"{value} is outside a 32-bit int")
    return value


def field_str(mapping: Any, name: str, where: str = "", default: Any = REQUIRED) -> Any:
    if mapping.__class__ is dict:
        value = mapping.get(name)
        if value.__class__ is str:
            return value
    return _typed(mapping, name, where, default, lambda v: isinstance(v, str), "str")


def field_bool(mapping: Any, name: str, where: str = "", default: Any = REQUIRED) -> Any:
    if mapping.__class__ is dict:
        value = mapping.get(name)
        if value.__class__ is bool:
            return value
    return _typed(mapping, name, where, default, lambda v: isinstance(v, bool), "bool")


def field_list(mapping: Any, name: str, where: str = "", default: Any = REQUIRED) -> Any:
    if mapping.__class__ is dict:
        value = mapping.get(name)
        if value.__class__ is list:
            return value
    return _typed(mapping, name, where, default, lambda v: isinstance(v, list), "array")


def field_map(mapping: Any, name: str, where: str = "", default: Any = REQUIRED) -> Any:
    if mapping.__class__ is dict:
        value = mapping.get(name)
        if value.__class__ is dict:
            return value
    return _typed(mapping, name, where, default, lambda v: isinstance(v, dict), "map")


@dataclass(slots=True)
class RemotingCommand:
    """One request or response frame: code, opaque, flag, remark, header fields and body."""

    code: int
    opaque: int = 0
    flag: int = 0
    remark: str | None = None
    ext: dict[str, Any] = field(default_factory=dict)
    body: Any = None
    version: int = PROTOCOL_VERSION
    # A native request's ACL material (protocol.acl.SignedContent): its key, signature and signed bytes
    # as sent, which the translation to typed fields would lose. None for msgpack commands.
    auth: Any = None

    @property
    def is_response(self) -> bool:
        return bool(self.flag & _RESPONSE)

    @property
    def is_oneway(self) -> bool:
        return bool(self.flag & _ONEWAY) and not self.flag & _RESPONSE

    @classmethod
    def request(
        cls, code: int, ext: dict[str, Any] | None = None, body: Any = None, *, oneway: bool = False
    ) -> RemotingCommand:
        return cls(int(code), 0, _ONEWAY if oneway else 0, None, dict(ext or {}), body)

    def response(
        self,
        code: int = ResponseCode.SUCCESS,
        remark: str | None = None,
        ext: dict[str, Any] | None = None,
        body: Any = None,
    ) -> RemotingCommand:
        return RemotingCommand(int(code), self.opaque, _RESPONSE, remark, dict(ext or {}), body)

    # Typed access to header fields; a wrong type is INVALID_PARAMETER naming the field. The common case
    # is tried inline, as in the field_* functions, which answer everything else.
    def ext_int(self, name: str, default: Any = REQUIRED) -> Any:
        value = self.ext.get(name) if self.ext.__class__ is dict else None
        if value.__class__ is int and JAVA_LONG_MIN <= value <= JAVA_LONG_MAX:
            return value
        if value is None and default is not REQUIRED and self.ext.__class__ is dict:
            return default
        return field_int(self.ext, name, "", default)

    def ext_int32(self, name: str, default: Any = REQUIRED) -> Any:
        value = self.ext.get(name) if self.ext.__class__ is dict else None
        if value.__class__ is int and JAVA_INT_MIN <= value <= JAVA_INT_MAX:
            return value
        if value is None and default is not REQUIRED and self.ext.__class__ is dict:
            return default
        return field_int32(self.ext, name, "", default)

    def ext_str(self, name: str, default: Any = REQUIRED) -> Any:
        value = self.ext.get(name) if self.ext.__class__ is dict else None
        if value.__class__ is str:
            return value
        if value is None and default is not REQUIRED and self.ext.__class__ is dict:
            return default
        return field_str(self.ext, name, "", default)

    def ext_bool(self, name: str, default: Any = REQUIRED) -> Any:
        value = self.ext.get(name) if self.ext.__class__ is dict else None
        if value.__class__ is bool:
            return value
        if value is None and default is not REQUIRED and self.ext.__class__ is dict:
            return default
        return field_bool(self.ext, name, "", default)

    def body_map(self) -> dict[str, Any]:
        if not isinstance(self.body, dict):
            raise InvalidParameter("body", "expected a map" if self.body is not None else "missing")
        return self.body

    def to_payload(self) -> dict[str, Any]:
        payload: dict[str, Any] = {"code": self.code, "opaque": self.opaque, "flag": self.flag}
        if self.version != PROTOCOL_VERSION:
            payload["version"] = self.version
        if self.remark is not None:
            payload["remark"] = self.remark
        if self.ext:
            payload["ext"] = self.ext
        if self.body is not None:
            payload["body"] = self.body
        return payload


_EXT_VALUE_TYPES = (str, int, float, bool, type(None))


def decode_payload(payload: bytes) -> RemotingCommand:
    """Decode one frame's payload; raises FrameError when it is not a valid command (PROTOCOL.md)."""
    try:
        obj = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    except Exception as exc:  # msgpack raises several unrelated types for garbage
        raise FrameError(f"payload is not msgpack: {exc.__class__.__name__}: {exc}") from None
    if not isinstance(obj, dict):
        raise FrameError(f"payload is a {type(obj).__name__}, not a map")
    code = obj.get("code")
    opaque = obj.get("opaque")
    if not isinstance(code, int) or isinstance(code, bool):
        raise FrameError("command has no int 'code'")
    if not isinstance(opaque, int) or isinstance(opaque, bool):
        raise FrameError("command has no int 'opaque'")
    ext = obj.get("ext", {})
    if ext is None:
        ext = {}
    if not isinstance(ext, dict):
        raise FrameError("'ext' is not a map")
    flag = obj.get("flag", 0)
    if not isinstance(flag, int) or isinstance(flag, bool):
        flag = 0
    version = obj.get("version", PROTOCOL_VERSION)
    if not isinstance(version, int) or isinstance(version, bool):
        version = PROTOCOL_VERSION
    remark = obj.get("remark")
    if remark is not None and not isinstance(remark, str):
        remark = str(remark)
    # ext keys must be strings; values of other types are kept and rejected by typed access later.
    clean_ext = {str(k): v for k, v in ext.items()}
    return RemotingCommand(code, opaque, flag, remark, clean_ext, obj.get("body"), version)


def encode_payload(cmd: RemotingCommand) -> bytes:
    return msgpack.packb(cmd.to_payload(), use_bin_type=True)


def encode_frame(cmd: RemotingCommand) -> bytes:
    payload = encode_payload(cmd)
    return _LEN.pack(len(payload)) + payload


class LengthPrefixedDecoder(Generic[T]):
    """Incremental splitter of ``uint32 length + payload`` frames; ``decode`` turns a payload into a
    value. Both wire formats (msgpack and RocketMQ's own) share this framing."""

    __slots__ = ("_buf", "_decode", "_label", "_min", "max_frame_bytes")

    def __init__(
        self, max_frame_bytes: int, decode: Callable[[bytes], T], *, min_length: int = 1, label: str = "frame"
    ) -> None:
        self.max_frame_bytes = max_frame_bytes
        self._decode = decode
        self._min = min_length
        self._label = label
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[T]:
        if not self._buf and len(data) > 4:
            # the common case, one whole frame per read: decoded without the copies through the buffer
            (length,) = _LEN.unpack_from(data, 0)
            if length == len(data) - 4 and self._min <= length <= self.max_frame_bytes:
                return [self._decode(bytes(data[4:]))]
        self._buf += data
        out: list[T] = []
        buf = self._buf
        pos = 0
        n = len(buf)
        while n - pos >= 4:
            (length,) = _LEN.unpack_from(buf, pos)
            if length < self._min or length > self.max_frame_bytes:
                raise FrameError(f"{self._label} length {length} outside {self._min}..{self.max_frame_bytes}")
            if n - pos - 4 < length:
                break
            out.append(self._decode(bytes(buf[pos + 4 : pos + 4 + length])))
            pos += 4 + length
        if pos:
            del buf[:pos]
        return out

    @property
    def buffered(self) -> int:
        return len(self._buf)


class FrameDecoder(LengthPrefixedDecoder[RemotingCommand]):
    """Incremental decoder of PROTOCOL.md frames: ``feed`` bytes, get complete commands."""

    __slots__ = ()

    def __init__(self, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> None:
        super().__init__(max_frame_bytes, decode_payload)
