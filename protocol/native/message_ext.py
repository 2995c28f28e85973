"""RocketMQ's stored-message layout (MessageExt), as a pull response body carries it (sans-IO).

Each record: TOTALSIZE, MAGICCODE (0xDAA320A7 for v1), BODYCRC, QUEUEID, FLAG, QUEUEOFFSET, PHYSICALOFFSET,
SYSFLAG, BORNTIMESTAMP, BORNHOST (ipv4 + port), STORETIMESTAMP, STOREHOST, RECONSUMETIMES,
PREPAREDTRANSACTIONOFFSET, BODY (int32 length), TOPIC (1-byte length; v2 uses 2 bytes), PROPERTIES (int16
length; ``name\\x01value\\x02`` pairs). A pull body is such records back to back. The offset message id is
the store host (ip, port) and the commit-log offset in hex.

We have no commit log, so the physical offset is made up: an 8-bit hash of the topic, the queue id (8 bits)
and the queue offset (36 bits) packed into 52 bits, below 2**53 because JavaScript clients read it as a
double. It stays the same for a message across pulls, and CONSUMER_SEND_MSG_BACK (which names a message by
this offset) can be traced back to its queue.
"""

from __future__ import annotations

import ipaddress
import struct
import zlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Final

MAGIC_V1: Final = 0xDAA320A7
MAGIC_V2: Final = 0xDAA320AB
NAME_VALUE_SEPARATOR: Final = "\x01"
PROPERTY_SEPARATOR: Final = "\x02"
MAX_PROPERTIES_BYTES: Final = 32767

PROPERTY_TAGS: Final = "TAGS"
PROPERTY_KEYS: Final = "KEYS"
PROPERTY_UNIQ_KEY: Final = "UNIQ_KEY"

COMPRESSED_FLAG: Final = 0x1

_HEAD = struct.Struct(">iIiiiqqiq4siq4siiq")  # up to PREPAREDTRANSACTIONOFFSET
_TOPIC_HASH_BITS: Final = 8
_QID_BITS: Final = 8
_QOFFSET_BITS: Final = 36


@dataclass(frozen=True, slots=True)
class StoreHost:
    """An IPv4 address and port, as the record and the offset message id carry them."""

    ip: bytes
    port: int

    @classmethod
    def parse(cls, addr: str) -> StoreHost:
        host, _, port = addr.rpartition(":")
        try:
            ip = ipaddress.IPv4Address(host.strip("[]")).packed
        except ValueError:
            ip = ipaddress.IPv4Address("127.0.0.1").packed
        return cls(ip, int(port) if port.isdigit() else 0)

    def __str__(self) -> str:
        return f"{ipaddress.IPv4Address(self.ip)}:{self.port}"


def properties_to_string(props: Mapping[str, str]) -> str:
    return "".join(f"{k}{NAME_VALUE_SEPARATOR}{v}{PROPERTY_SEPARATOR}" for k, v in props.items())


def string_to_properties(text: str) -> dict[str, str]:
    """RocketMQ's property string to a map; pieces without a separator are skipped, as the clients do."""
    props: dict[str, str] = {}
    for item in text.split(PROPERTY_SEPARATOR):
        name, sep, value = item.partition(NAME_VALUE_SEPARATOR)
        if sep and name:
            props[name] = value
    return props


def body_crc(body: bytes) -> int:
    """Java's UtilAll.crc32: CRC-32 masked to a non-negative int."""
    return zlib.crc32(body) & 0x7FFFFFFF


def topic_hash(topic: str) -> int:
    return zlib.crc32(topic.encode("utf-8")) & ((1 << _TOPIC_HASH_BITS) - 1)


def pack_physical_offset(topic: str, queue_id: int, queue_offset: int) -> int | None:
    """The made-up commit-log offset of a message; None when the queue id or offset does not fit."""
    if not (0 <= queue_id < (1 << _QID_BITS) and 0 <= queue_offset < (1 << _QOFFSET_BITS)):
        return None
    return (topic_hash(topic) << (_QID_BITS + _QOFFSET_BITS)) | (queue_id << _QOFFSET_BITS) | queue_offset


def unpack_physical_offset(offset: int, candidate_topics: Iterable[str]) -> tuple[str, int, int] | None:
    """(topic, queue id, queue offset) of a packed offset whose topic hash is one of the candidates."""
    if offset < 0 or offset >= (1 << (_TOPIC_HASH_BITS + _QID_BITS + _QOFFSET_BITS)):
        return None
    hashed = offset >> (_QID_BITS + _QOFFSET_BITS)
    queue_id = (offset >> _QOFFSET_BITS) & ((1 << _QID_BITS) - 1)
    queue_offset = offset & ((1 << _QOFFSET_BITS) - 1)
    for topic in candidate_topics:
        if topic and topic_hash(topic) == hashed:
            return topic, queue_id, queue_offset
    return None


def offset_msg_id(store: StoreHost, physical_offset: int) -> str:
    """RocketMQ's offset message id: store ip, port and commit-log offset, upper-case hex."""
    return (store.ip + struct.pack(">iq", store.port, physical_offset)).hex().upper()


@dataclass(slots=True)
class MessageRecord:
    """The fields of one MessageExt record."""

    topic: str
    queue_id: int
    queue_offset: int
    body: bytes
    properties: dict[str, str]
    born_timestamp: int = 0
    store_timestamp: int = 0
    reconsume_times: int = 0
    physical_offset: int = 0
    flag: int = 0
    sys_flag: int = 0
    born_host: StoreHost = StoreHost(b"\x7f\x00\x00\x01", 0)
    store_host: StoreHost = StoreHost(b"\x7f\x00\x00\x01", 0)
    prepared_transaction_offset: int = 0


def _fit_properties(props: Mapping[str, str]) -> bytes:
    data = properties_to_string(props).encode("utf-8")
    if len(data) <= MAX_PROPERTIES_BYTES:
        return data
    # Over RocketMQ's limit: keep what clients rely on, drop the rest rather than fail the whole pull.
    essential = {k: v for k, v in props.items() if k in (PROPERTY_TAGS, PROPERTY_KEYS, PROPERTY_UNIQ_KEY)}
    data = properties_to_string(essential).encode("utf-8")
    return data[:MAX_PROPERTIES_BYTES]


def encode_record(rec: MessageRecord) -> bytes:
    topic = rec.topic.encode("utf-8")
    props = _fit_properties(rec.properties)
    v2 = len(topic) > 127  # a 1-byte length is read signed by the clients
    magic = MAGIC_V2 if v2 else MAGIC_V1
    topic_field = (struct.pack(">h", len(topic)) if v2 else struct.pack(">b", len(topic))) + topic
    total = _HEAD.size + 4 + len(rec.body) + len(topic_field) + 2 + len(props)
    head = _HEAD.pack(
        total,
        magic,
        body_crc(rec.body),
        rec.queue_id,
        rec.flag,
        rec.queue_offset,
        rec.physical_offset,
        rec.sys_flag,
        rec.born_timestamp,
        rec.born_host.ip,
        rec.born_host.port,
        rec.store_timestamp,
        rec.store_host.ip,
        rec.store_host.port,
        rec.reconsume_times,
        rec.prepared_transaction_offset,
    )
    return b"".join(
        (head, struct.pack(">i", len(rec.body)), rec.body, topic_field, struct.pack(">h", len(props)), props)
    )


class RecordError(ValueError):
    """A pull body that is not a sequence of MessageExt records."""


def _decode_one(data: bytes, pos: int) -> tuple[MessageRecord, int]:
    end = len(data)
    if pos + _HEAD.size > end:
        raise RecordError(f"record at byte {pos}: {end - pos} bytes left, a record head takes {_HEAD.size}")
    (
        total,
        magic,
        _crc,
        queue_id,
        flag,
        queue_offset,
        physical_offset,
        sys_flag,
        born_ts,
        born_ip,
        born_port,
        store_ts,
        store_ip,
        store_port,
        reconsume,
        prepared,
    ) = _HEAD.unpack_from(data, pos)
    if magic not in (MAGIC_V1, MAGIC_V2):
        raise RecordError(f"record at byte {pos}: magic code {magic:#x} is not a MessageExt's")
    if total < _HEAD.size or pos + total > end:
        raise RecordError(f"record at byte {pos}: total size {total} does not fit the {end - pos} bytes left")
    record_end = pos + total
    p = pos + _HEAD.size

    def take(n: int, what: str) -> bytes:
        nonlocal p
        if n < 0 or p + n > record_end:
            raise RecordError(f"record at byte {pos}: {what} of {n} bytes runs past the record")
        out = data[p : p + n]
        p += n
        return out

    (body_len,) = struct.unpack(">i", take(4, "body length"))
    body = take(body_len, "body")
    if magic == MAGIC_V2:
        (topic_len,) = struct.unpack(">h", take(2, "topic length"))
    else:
        (topic_len,) = struct.unpack(">b", take(1, "topic length"))
    topic = take(topic_len, "topic")
    (props_len,) = struct.unpack(">h", take(2, "properties length"))
    props = take(props_len, "properties")
    try:
        topic_text = topic.decode("utf-8")
        props_text = props.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RecordError(f"record at byte {pos}: topic or properties are not UTF-8 ({exc})") from None
    rec = MessageRecord(
        topic=topic_text,
        queue_id=queue_id,
        queue_offset=queue_offset,
        body=body,
        properties=string_to_properties(props_text),
        born_timestamp=born_ts,
        store_timestamp=store_ts,
        reconsume_times=reconsume,
        physical_offset=physical_offset,
        flag=flag,
        sys_flag=sys_flag,
        born_host=StoreHost(born_ip, born_port),
        store_host=StoreHost(store_ip, store_port),
        prepared_transaction_offset=prepared,
    )
    return rec, record_end


def decode_records(data: bytes) -> list[MessageRecord]:
    """A pull body's records (MessageDecoder.decodes); RecordError naming the byte where one is broken.
    Bodies are returned as stored: a compressed body (sysFlag bit 0) is for the caller to inflate."""
    out: list[MessageRecord] = []
    pos = 0
    while pos < len(data):
        rec, pos = _decode_one(data, pos)
        out.append(rec)
    return out


class UniqIdGenerator:
    """Message ids as RocketMQ's MessageClientIDSetter makes them for UNIQ_KEY: 16 bytes in upper-case hex,
    the client's IPv4 address, its pid (16 bits), a per-generator random word, the milliseconds since the
    generator started (32 bits) and a counter (16 bits). ``clock_ms`` is the wall clock in milliseconds."""

    __slots__ = ("_clock_ms", "_counter", "_prefix", "_start_ms")

    def __init__(self, ip: str, pid: int, salt: int, clock_ms: Callable[[], float]) -> None:
        host = StoreHost.parse(f"{ip}:0")
        self._prefix = host.ip + struct.pack(">HI", pid & 0xFFFF, salt & 0xFFFFFFFF)
        self._clock_ms = clock_ms
        self._start_ms = int(clock_ms())
        self._counter = 0

    def __call__(self) -> str:
        self._counter = (self._counter + 1) & 0xFFFF
        elapsed = (int(self._clock_ms()) - self._start_ms) & 0xFFFFFFFF
        return (self._prefix + struct.pack(">IH", elapsed, self._counter)).hex().upper()
