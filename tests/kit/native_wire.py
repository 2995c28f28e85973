"""Test-side RocketMQ wire functions, written from the Java layouts and independent of protocol.native:
they build frames as real clients do and decode what the emulator answers, so a shared bug cannot hide."""

from __future__ import annotations

import asyncio
import json
import socket
import struct
from dataclasses import dataclass, field
from typing import Any


def json_frame(
    code: int,
    opaque: int,
    ext: dict[str, Any] | None = None,
    body: bytes = b"",
    flag: int = 0,
    language: str = "CPP",
    remark: str | None = None,
) -> bytes:
    header: dict[str, Any] = {"code": code, "language": language, "version": 0}
    header |= {"opaque": opaque, "flag": flag}
    if remark is not None:
        header["remark"] = remark
    # The C++ client always sends the RPC hook's fields, empty when no credentials are set.
    header["extFields"] = {"AccessKey": "", "Signature": "", "OnsChannel": "", **(ext or {})}
    hdr = json.dumps(header).encode()
    return struct.pack(">II", 4 + len(hdr) + len(body), len(hdr)) + hdr + body


def binary_frame(code: int, opaque: int, ext: dict[str, str], body: bytes = b"", flag: int = 0) -> bytes:
    """RocketMQSerializable's header form (serialize type 1)."""
    ext_bytes = b""
    for k, v in ext.items():
        kb, vb = k.encode(), v.encode()
        ext_bytes += struct.pack(">h", len(kb)) + kb + struct.pack(">i", len(vb)) + vb
    hdr = struct.pack(">hbhii", code, 0, 399, opaque, flag) + struct.pack(">i", 0)
    hdr += struct.pack(">i", len(ext_bytes)) + ext_bytes
    return struct.pack(">II", 4 + len(hdr) + len(body), (1 << 24) | len(hdr)) + hdr + body


@dataclass
class Reply:
    code: int
    opaque: int
    flag: int
    remark: str | None
    ext: dict[str, Any]
    body: bytes
    header: dict[str, Any] = field(default_factory=dict)

    def json(self) -> Any:
        return json.loads(self.body.decode())


def split_frames(data: bytes) -> tuple[list[Reply], bytes]:
    out = []
    while len(data) >= 4:
        (total,) = struct.unpack_from(">I", data, 0)
        if len(data) < 4 + total:
            break
        (info,) = struct.unpack_from(">I", data, 4)
        assert info >> 24 == 0, "answers must use the JSON header (the C++ client reads no other)"
        hlen = info & 0xFFFFFF
        header = json.loads(data[8 : 8 + hlen])
        body = data[8 + hlen : 4 + total]
        out.append(
            Reply(
                header["code"],
                header["opaque"],
                header["flag"],
                header.get("remark"),
                header.get("extFields", {}),
                body,
                header,
            )
        )
        data = data[4 + total :]
    return out, data


class BlockingPeer:
    """A plain socket speaking native frames, as a real client does (used from a thread or directly)."""

    def __init__(self, addr: tuple[str, int], timeout: float = 5.0) -> None:
        self.sock = socket.create_connection(addr, timeout=timeout)
        self.buf = b""

    def send(self, frame: bytes) -> None:
        self.sock.sendall(frame)

    def recv_one(self) -> Reply:
        while True:
            frames, rest = split_frames(self.buf)
            if frames:
                self.buf = rest + b"".join(_reframe(f) for f in frames[1:])
                return frames[0]
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("closed")
            self.buf += chunk

    def close(self) -> None:
        self.sock.close()


def _reframe(r: Reply) -> bytes:
    hdr = json.dumps(r.header).encode()
    return struct.pack(">II", 4 + len(hdr) + len(r.body), len(hdr)) + hdr + r.body


@dataclass
class DecodedMessage:
    topic: str
    queue_id: int
    queue_offset: int
    physical_offset: int
    sys_flag: int
    body: bytes
    body_crc: int
    properties: dict[str, str]
    born_timestamp: int
    store_timestamp: int
    store_host: str
    reconsume_times: int
    magic: int
    offset_msg_id: str


def decode_messages(data: bytes) -> list[DecodedMessage]:
    """MessageDecoder.decode, field by field (v1 and v2 topic lengths, IPv4 hosts)."""
    out = []
    pos = 0
    while pos < len(data):
        start = pos
        total, magic, crc, qid, _flag, qoff, phys, sysflag, born = struct.unpack_from(">iIiiiqqiq", data, pos)
        pos += 4 + 4 + 4 + 4 + 4 + 8 + 8 + 4 + 8
        pos += 8  # born host ip + port
        (store_ts,) = struct.unpack_from(">q", data, pos)
        pos += 8
        store_ip = data[pos : pos + 4]
        (store_port,) = struct.unpack_from(">i", data, pos + 4)
        pos += 8
        reconsume, _prepared = struct.unpack_from(">iq", data, pos)
        pos += 12
        (blen,) = struct.unpack_from(">i", data, pos)
        pos += 4
        body = data[pos : pos + blen]
        pos += blen
        if magic == 0xDAA320A7:
            tlen = data[pos]
            pos += 1
        else:
            (tlen,) = struct.unpack_from(">h", data, pos)
            pos += 2
        topic = data[pos : pos + tlen].decode()
        pos += tlen
        (plen,) = struct.unpack_from(">h", data, pos)
        pos += 2
        props_text = data[pos : pos + plen].decode()
        pos += plen
        assert pos - start == total, f"TOTALSIZE {total} but the record took {pos - start} bytes"
        props = {}
        for item in props_text.split("\x02"):
            if "\x01" in item:
                k, v = item.split("\x01", 1)
                props[k] = v
        msg_id = (store_ip + struct.pack(">iq", store_port, phys)).hex().upper()
        out.append(
            DecodedMessage(
                topic,
                qid,
                qoff,
                phys,
                sysflag,
                body,
                crc,
                props,
                born,
                store_ts,
                f"{socket.inet_ntoa(store_ip)}:{store_port}",
                reconsume,
                magic,
                msg_id,
            )
        )
    return out


class NativePeer:
    """A raw native-protocol connection to the emulator's native port, over asyncio streams."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer, self.buf = reader, writer, b""

    @classmethod
    async def connect(cls, port: int) -> NativePeer:
        return cls(*await asyncio.open_connection("127.0.0.1", port))

    async def send(self, frame: bytes) -> None:
        self.writer.write(frame)
        await self.writer.drain()

    async def recv(self, wait_s: float = 3.0):
        async with asyncio.timeout(wait_s):
            while True:
                frames, _ = split_frames(self.buf)
                if frames:
                    # re-split later frames on the next call
                    first_len = 4 + struct.unpack_from(">I", self.buf, 0)[0]
                    self.buf = self.buf[first_len:]
                    return frames[0]
                chunk = await self.reader.read(65536)
                if not chunk:
                    raise ConnectionError("closed by the server")
                self.buf += chunk

    async def closed(self, wait_s: float = 3.0) -> bool:
        async with asyncio.timeout(wait_s):
            while True:
                if not await self.reader.read(65536):
                    return True

    async def close(self) -> None:
        self.writer.close()
        await self.writer.wait_closed()
