"""RocketMQ's remoting frame (sans-IO): the bytes real RocketMQ clients send and expect.

A frame is ``int32 total`` (bytes after this field), ``int32 header-info`` whose high byte is the serialize
type (0 JSON, 1 ROCKETMQ binary) and whose low three bytes are the header length, the header, then the body.
JSON headers carry ``code``, ``language``, ``version``, ``opaque``, ``flag``, ``remark`` and ``extFields``
(values are strings on the wire for Java, numbers or booleans too for other clients). Answers are always
written with a JSON header: every client reads it, and the C++ client reads nothing else.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from typing import Any, Final

from rmqlab.protocol.command import FrameError, LengthPrefixedDecoder

SERIALIZE_JSON: Final = 0
SERIALIZE_ROCKETMQ: Final = 1

# What we announce as our language; clients only log it.
LANGUAGE: Final = "JAVA"
# RocketMQ's version code of 4.9.x, what clients expect from a broker of that line.
VERSION: Final = 399

_INT = struct.Struct(">i")
_UINT = struct.Struct(">I")
_ROCKETMQ_FIXED = struct.Struct(">hbhii")  # code, language, version, opaque, flag

# LanguageCode ordinals, for headers in the ROCKETMQ binary form.
_LANGUAGES = (
    *("JAVA", "CPP", "DOTNET", "PYTHON", "DELPHI", "ERLANG", "RUBY"),
    *("OTHER", "HTTP", "GO", "PHP", "OMS", "RUST", "NODE_JS"),
)

ExtValue = str | int | float | bool


@dataclass(slots=True)
class NativeFrame:
    """One decoded native command, before any translation to the project's typed commands."""

    code: int
    opaque: int
    flag: int = 0
    remark: str | None = None
    ext: dict[str, ExtValue] = field(default_factory=dict)
    body: bytes | None = None
    language: str = LANGUAGE
    version: int = VERSION
    serialize_type: int = SERIALIZE_JSON

    @property
    def is_response(self) -> bool:
        return bool(self.flag & 1)


def _as_int(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, str) and value.lstrip("-").isdigit():
            return int(value)
        raise FrameError(f"native header field {name!r} is not an int: {value!r}")
    return value


def _decode_json_header(data: bytes) -> NativeFrame:
    try:
        obj = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise FrameError(f"native header is not JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise FrameError(f"native header is a JSON {type(obj).__name__}, not an object")
    if "code" not in obj:
        raise FrameError("native header has no 'code'")
    code = _as_int(obj["code"], "code")
    opaque = _as_int(obj.get("opaque", 0), "opaque")
    flag = _as_int(obj.get("flag", 0) if obj.get("flag") is not None else 0, "flag")
    version = obj.get("version", 0)
    version = version if isinstance(version, int) and not isinstance(version, bool) else 0
    remark = obj.get("remark")
    if remark is not None and not isinstance(remark, str):
        remark = str(remark)
    language = obj.get("language", "OTHER")
    language = language if isinstance(language, str) else str(language)
    raw_ext = obj.get("extFields") or {}
    if not isinstance(raw_ext, dict):
        raise FrameError("native header 'extFields' is not an object")
    ext: dict[str, ExtValue] = {}
    for key, value in raw_ext.items():
        if value is None:
            continue
        if not isinstance(value, (str, int, float, bool)):
            value = json.dumps(value)
        ext[str(key)] = value
    return NativeFrame(code, opaque, flag, remark or None, ext, None, language, version, SERIALIZE_JSON)


def _read_str(buf: memoryview, pos: int, short: bool, end: int) -> tuple[str | None, int]:
    width = 2 if short else 4
    if pos + width > end:
        raise FrameError("native binary header truncated")
    n = int.from_bytes(buf[pos : pos + width], "big", signed=True)
    pos += width
    if n < 0 or pos + n > end:
        raise FrameError(f"native binary header string length {n} out of range")
    if n == 0:
        return None, pos
    try:
        return bytes(buf[pos : pos + n]).decode("utf-8"), pos + n
    except UnicodeDecodeError:
        raise FrameError("native binary header string is not UTF-8") from None


def _decode_rocketmq_header(data: bytes) -> NativeFrame:
    buf = memoryview(data)
    end = len(data)
    if end < _ROCKETMQ_FIXED.size:
        raise FrameError("native binary header truncated")
    code, lang, version, opaque, flag = _ROCKETMQ_FIXED.unpack_from(data, 0)
    remark, pos = _read_str(buf, _ROCKETMQ_FIXED.size, False, end)
    if pos + 4 > end:
        raise FrameError("native binary header truncated")
    (ext_len,) = _INT.unpack_from(data, pos)
    pos += 4
    if ext_len < 0 or pos + ext_len > end:
        raise FrameError(f"native binary header extFields length {ext_len} out of range")
    ext: dict[str, ExtValue] = {}
    ext_end = pos + ext_len
    while pos < ext_end:
        key, pos = _read_str(buf, pos, True, ext_end)
        value, pos = _read_str(buf, pos, False, ext_end)
        if key is not None and value is not None:
            ext[key] = value
    language = _LANGUAGES[lang] if 0 <= lang < len(_LANGUAGES) else "OTHER"
    return NativeFrame(code, opaque, flag, remark, ext, None, language, version, SERIALIZE_ROCKETMQ)


def decode_frame_payload(payload: bytes) -> NativeFrame:
    """Decode what follows the total-length field; FrameError when it is not a valid command."""
    if len(payload) < 4:
        raise FrameError(f"native frame of {len(payload)} bytes has no header length")
    (info,) = _UINT.unpack_from(payload, 0)
    serialize_type = info >> 24
    header_len = info & 0xFFFFFF
    if header_len > len(payload) - 4:
        raise FrameError(f"native header length {header_len} exceeds the frame ({len(payload) - 4} bytes)")
    header = payload[4 : 4 + header_len]
    if serialize_type == SERIALIZE_JSON:
        frame = _decode_json_header(header)
    elif serialize_type == SERIALIZE_ROCKETMQ:
        frame = _decode_rocketmq_header(header)
    else:
        raise FrameError(f"unknown native serialize type {serialize_type}")
    body = payload[4 + header_len :]
    frame.body = bytes(body) if body else None
    return frame


def _ext_to_str(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def encode_frame(frame: NativeFrame) -> bytes:
    """A frame with a JSON header; extFields values become strings, as Java brokers send them."""
    header = {
        "code": frame.code,
        "language": frame.language,
        "version": frame.version,
        "opaque": frame.opaque,
        "flag": frame.flag,
        "remark": frame.remark,
        "extFields": {k: _ext_to_str(v) for k, v in frame.ext.items() if v is not None},
        "serializeTypeCurrentRPC": "JSON",
    }
    header_bytes = json.dumps(header, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    if len(header_bytes) > 0xFFFFFF:
        raise ValueError(f"native header of {len(header_bytes)} bytes is too long")
    body = frame.body or b""
    return b"".join(
        (
            _UINT.pack(4 + len(header_bytes) + len(body)),
            _UINT.pack((SERIALIZE_JSON << 24) | len(header_bytes)),
            header_bytes,
            body,
        )
    )


class NativeFrameDecoder(LengthPrefixedDecoder["NativeFrame"]):
    """Incremental splitter: ``feed`` bytes, get complete native frames (the header length alone
    takes 4 bytes, so a shorter frame is broken)."""

    __slots__ = ()

    def __init__(self, max_frame_bytes: int) -> None:
        super().__init__(max_frame_bytes, decode_frame_payload, min_length=4, label="native frame")
