"""The message store: consume queues of stored messages, behind one interface.

``MemoryMessageStore`` keeps everything in memory (the default). ``broker.sqlite_store`` adds a durable
copy in SQLite and reuses these in-memory queues for reads. Reads (``get_message``, offsets, search) are
synchronous and cheap; writes are coroutines that return once the write is as durable as the store
promises, so a caller can answer its request only then.
"""

from __future__ import annotations

import bisect
import enum
import ipaddress
import itertools
import socket
import struct
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from rmqlab.broker.topic_config import TopicConfig
from rmqlab.protocol.clock import Clock, SystemClock
from rmqlab.protocol.model import tag_matches

# Delayed messages (retries) wait here, one queue per delay level, as in RocketMQ.
SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"
# Offsets of the schedule service are kept with the consumer offsets under this reserved group name.
SCHEDULE_GROUP = "%SCHEDULE%"

PROPERTY_DELAY_TIME_LEVEL = "DELAY"
PROPERTY_REAL_TOPIC = "REAL_TOPIC"
PROPERTY_REAL_QUEUE_ID = "REAL_QID"
PROPERTY_RETRY_TOPIC = "RETRY_TOPIC"
PROPERTY_ORIGIN_MESSAGE_ID = "ORIGIN_MESSAGE_ID"


class StoreError(Exception):
    """The store cannot take writes (answered SERVICE_NOT_AVAILABLE)."""


@dataclass(slots=True)
class MessageDraft:
    """A message as a send carries it, before the store gives it an offset and an id."""

    topic: str
    queue_id: int
    body: bytes
    tags: str | None = None
    keys: str | None = None
    born_timestamp: int = 0
    reconsume_times: int = 0
    properties: dict[str, str] = field(default_factory=dict)


class StoredMessage:
    """A stored message; ``wire`` is its PROTOCOL.md Message form, built once and shared by every pull."""

    __slots__ = (
        "body",
        "born_timestamp",
        "keys",
        "log_end",
        "msg_id",
        "properties",
        "queue_id",
        "queue_offset",
        "reconsume_times",
        "store_timestamp",
        "tags",
        "topic",
        "wire",
    )

    def __init__(
        self,
        msg_id: str,
        topic: str,
        queue_id: int,
        queue_offset: int,
        body: bytes,
        tags: str | None,
        keys: str | None,
        born_timestamp: int,
        store_timestamp: int,
        reconsume_times: int,
        properties: dict[str, str],
        broker_name: str,
    ) -> None:
        self.msg_id = msg_id
        self.topic = topic
        self.queue_id = queue_id
        self.queue_offset = queue_offset
        self.body = body
        self.tags = tags
        self.keys = keys
        self.born_timestamp = born_timestamp
        self.store_timestamp = store_timestamp
        self.reconsume_times = reconsume_times
        self.properties = properties
        self.log_end = -1  # its end in the broker's commit-log order (broker.ha.ReplicationLog), once there
        self.wire: dict[str, Any] = {
            "msgId": msg_id,
            "topic": topic,
            "brokerName": broker_name,
            "queueId": queue_id,
            "queueOffset": queue_offset,
            "body": body,
            "tags": tags,
            "keys": keys,
            "bornTimestamp": born_timestamp,
            "storeTimestamp": store_timestamp,
            "reconsumeTimes": reconsume_times,
            "properties": properties,
        }

    def __repr__(self) -> str:
        return f"<StoredMessage {self.topic}:{self.queue_id}@{self.queue_offset} {self.msg_id}>"


class ConsumeQueue:
    """One queue's messages in offset order; ``min_offset`` is the offset of ``messages[0]``."""

    __slots__ = ("last_store_timestamp", "messages", "min_offset", "next_offset")

    def __init__(self, min_offset: int = 0) -> None:
        self.min_offset = min_offset
        self.messages: list[StoredMessage] = []
        # Offsets handed out so far; ahead of max_offset while durable writes are in flight.
        self.next_offset = min_offset
        self.last_store_timestamp = 0

    @property
    def max_offset(self) -> int:
        return self.min_offset + len(self.messages)

    def get(self, offset: int) -> StoredMessage | None:
        i = offset - self.min_offset
        if 0 <= i < len(self.messages):
            return self.messages[i]
        return None


class GetMessageStatus(enum.Enum):
    """How a pull's read of the store ended (RocketMQ's GetMessageStatus)."""

    FOUND = "FOUND"
    NO_MATCHED_MESSAGE = "NO_MATCHED_MESSAGE"  # messages scanned, none matched the filter
    OFFSET_OVERFLOW_ONE = "OFFSET_OVERFLOW_ONE"  # offset == max: nothing new yet
    OFFSET_MOVED = "OFFSET_MOVED"  # offset outside [min, max]


@dataclass(slots=True)
class GetMessageResult:
    """A pull's read of the store: the messages, its status and the offsets around them."""

    status: GetMessageStatus
    messages: list[StoredMessage]
    next_begin_offset: int
    min_offset: int
    max_offset: int


class MessageIdFactory:
    """Message ids in RocketMQ's 32-hex-character form, unique across restarts.

    16 bytes: the broker's IPv4 address (4), its port (2), the store's start epoch in ms (6) and a
    sequence number (4). A durable store makes sure its epoch is later than any earlier run's.
    """

    def __init__(self, host: str, port: int, epoch_ms: int) -> None:
        self._ip = _ip_bytes(host)
        self._port = port & 0xFFFF
        self._set_epoch(epoch_ms)

    def _set_epoch(self, epoch_ms: int) -> None:
        self.epoch_ms = epoch_ms
        self._prefix = (self._ip + struct.pack(">H", self._port) + epoch_ms.to_bytes(6, "big")).hex().upper()
        self._seq = itertools.count()

    def next_id(self) -> str:
        n = next(self._seq)
        if n > 0xFFFFFFFF:
            self._set_epoch(self.epoch_ms + 1)
            n = next(self._seq)
        return f"{self._prefix}{n:08X}"


def _ip_bytes(host: str) -> bytes:
    try:
        addr = ipaddress.ip_address(host)
        if isinstance(addr, ipaddress.IPv4Address) and not addr.is_unspecified:
            return addr.packed
    except ValueError:
        pass
    try:
        return socket.inet_aton(socket.gethostbyname(host)) if host not in ("", "0.0.0.0") else b"\0" * 4
    except OSError:
        return struct.pack(">I", zlib.crc32(host.encode()))


ArrivalListener = Callable[[StoredMessage], None]


class MemoryMessageStore:
    """Everything in memory; writes are visible and 'durable' at once."""

    durable = False

    def __init__(
        self,
        broker_name: str = "broker-a",
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        clock: Clock | None = None,
    ) -> None:
        self.broker_name = broker_name
        self.clock: Clock = clock or SystemClock()
        self.queues: dict[tuple[str, int], ConsumeQueue] = {}
        self._listeners: list[ArrivalListener] = []
        self._host = host
        self._port = port
        self.msg_ids = MessageIdFactory(host, port, self.clock.now_ms())
        self.committed_seq = 0
        # What a durable store found on disk; empty here.
        self.loaded_topics: list[TopicConfig] = []
        self.loaded_offsets: list[tuple[str, str, int, int]] = []

    # -- life cycle ---------------------------------------------------------------------------------
    async def open(self) -> None:
        pass

    async def close(self) -> None:
        pass

    def add_arrival_listener(self, listener: ArrivalListener) -> None:
        self._listeners.append(listener)

    # -- reads ----------------------------------------------------------------------------------------
    def consume_queue(self, topic: str, queue_id: int) -> ConsumeQueue | None:
        return self.queues.get((topic, queue_id))

    def get_max_offset(self, topic: str, queue_id: int) -> int:
        cq = self.queues.get((topic, queue_id))
        return cq.max_offset if cq is not None else 0

    def get_min_offset(self, topic: str, queue_id: int) -> int:
        cq = self.queues.get((topic, queue_id))
        return cq.min_offset if cq is not None else 0

    def lookup(self, topic: str, queue_id: int, offset: int) -> StoredMessage | None:
        cq = self.queues.get((topic, queue_id))
        return cq.get(offset) if cq is not None else None

    def search_offset_by_timestamp(self, topic: str, queue_id: int, timestamp: int) -> int:
        """The first offset whose store time is >= timestamp; the max offset when there is none."""
        cq = self.queues.get((topic, queue_id))
        if cq is None:
            return 0
        i = bisect.bisect_left(cq.messages, timestamp, key=_store_ts)
        return cq.min_offset + i

    def get_message(
        self,
        topic: str,
        queue_id: int,
        offset: int,
        max_count: int,
        max_bytes: int,
        tags_set: list[str] | set[str] | None = None,
        max_scan: int = 16_000,
    ) -> GetMessageResult:
        cq = self.queues.get((topic, queue_id))
        if cq is None:
            lo = hi = 0
        else:
            lo, hi = cq.min_offset, cq.max_offset
        if offset < lo or offset > hi:
            return GetMessageResult(GetMessageStatus.OFFSET_MOVED, [], min(max(offset, lo), hi), lo, hi)
        if offset == hi or cq is None:
            return GetMessageResult(GetMessageStatus.OFFSET_OVERFLOW_ONE, [], offset, lo, hi)
        msgs = cq.messages
        start = offset - lo
        end = min(len(msgs), start + max(max_scan, max_count))
        found: list[StoredMessage] = []
        total = 0
        i = start
        while i < end:
            m = msgs[i]
            if not tags_set or tag_matches(tags_set, m.tags):
                size = len(m.body)
                if found and total + size > max_bytes:
                    break
                found.append(m)
                total += size
                if len(found) >= max_count:
                    i += 1
                    break
            i += 1
        status = GetMessageStatus.FOUND if found else GetMessageStatus.NO_MATCHED_MESSAGE
        return GetMessageResult(status, found, lo + i, lo, hi)

    def message_count(self) -> int:
        return sum(len(cq.messages) for cq in self.queues.values())

    # -- writes ---------------------------------------------------------------------------------------
    def _reserve(self, draft: MessageDraft) -> StoredMessage:
        key = (draft.topic, draft.queue_id)
        cq = self.queues.get(key)
        if cq is None:
            cq = self.queues[key] = ConsumeQueue()
        offset = cq.next_offset
        cq.next_offset += 1
        # Store times never go backwards within a queue, so SEARCH_OFFSET_BY_TIMESTAMP can bisect.
        ts = max(self.clock.now_ms(), cq.last_store_timestamp)
        cq.last_store_timestamp = ts
        return StoredMessage(
            self.msg_ids.next_id(),
            draft.topic,
            draft.queue_id,
            offset,
            draft.body,
            draft.tags,
            draft.keys,
            draft.born_timestamp,
            ts,
            draft.reconsume_times,
            draft.properties,
            self.broker_name,
        )

    def _publish(self, msg: StoredMessage) -> None:
        cq = self.queues[(msg.topic, msg.queue_id)]
        if msg.queue_offset != cq.max_offset:
            raise StoreError(f"consume queue {msg.topic}:{msg.queue_id} out of order at {msg.queue_offset}")
        cq.messages.append(msg)
        for listener in self._listeners:
            listener(msg)

    async def put_message(self, draft: MessageDraft) -> StoredMessage:
        msg = self._reserve(draft)
        await self._commit(msg)
        return msg

    async def _commit(self, msg: StoredMessage) -> None:
        """Make a reserved message durable as this store promises, then visible."""
        self._publish(msg)

    async def put_replica(self, msg: StoredMessage, keep: Callable[[int, int], bool | None]) -> bool | None:
        """Store a message copied from the master as it is there (id, queue offset, store time). ``keep``
        (broker.ha.ReplicaApplier.keep) decides from the queue's next offset: True stored, False already
        held, None a gap (not stored)."""
        key = (msg.topic, msg.queue_id)
        cq = self.queues.get(key)
        if cq is None:
            cq = self.queues[key] = ConsumeQueue()
        verdict = keep(cq.next_offset, msg.queue_offset)
        if verdict:
            cq.next_offset += 1
            cq.last_store_timestamp = max(cq.last_store_timestamp, msg.store_timestamp)
            await self._commit(msg)
        return verdict

    def persist_offset(self, group: str, topic: str, queue_id: int, offset: int) -> int:
        """Record a committed offset durably; returns a sequence number for ``wait_durable``."""
        return 0

    def persist_topic(self, tc: TopicConfig) -> int:
        return 0

    def persist_topic_removal(self, topic: str) -> int:
        return 0

    async def wait_durable(self, seq: int) -> None:
        pass

    def is_rejected(self, seq: int) -> bool:
        """Whether the durable write ``seq`` was refused (the store carried on without it)."""
        return False

    async def truncate(self, topic: str, queue_id: int, min_offset: int) -> None:
        """Drop messages below ``min_offset`` (RocketMQ's expired commit-log files)."""
        self._truncate_memory(topic, queue_id, min_offset)

    async def truncate_tail(self, topic: str, queue_id: int, end_offset: int) -> list[StoredMessage]:
        """Drop the messages at ``end_offset`` and after: a slave's log cut back to where its new master's
        epoch began (RocketMQ 5's AutoSwitchHAClient truncates its commit log so). Returns them."""
        return self._truncate_tail_memory(topic, queue_id, end_offset)

    def _truncate_tail_memory(self, topic: str, queue_id: int, end_offset: int) -> list[StoredMessage]:
        cq = self.queues.get((topic, queue_id))
        if cq is None or end_offset >= cq.max_offset:
            return []
        if cq.next_offset != cq.max_offset:
            raise StoreError("cannot truncate a queue with writes in flight")
        cut = max(end_offset, cq.min_offset) - cq.min_offset
        removed = cq.messages[cut:]
        del cq.messages[cut:]
        cq.next_offset = cq.max_offset
        return removed

    def _truncate_memory(self, topic: str, queue_id: int, min_offset: int) -> None:
        cq = self.queues.get((topic, queue_id))
        if cq is None:
            cq = self.queues[(topic, queue_id)] = ConsumeQueue()
        if cq.next_offset != cq.max_offset:
            raise StoreError("cannot truncate a queue with writes in flight")
        if min_offset <= cq.min_offset:
            return
        if min_offset >= cq.max_offset:
            cq.min_offset = cq.next_offset = cq.max_offset
            cq.messages.clear()
            return
        del cq.messages[: min_offset - cq.min_offset]
        cq.min_offset = min_offset

    def topics(self) -> Iterable[str]:
        return {t for (t, _) in self.queues}


def _store_ts(m: StoredMessage) -> int:
    return m.store_timestamp
