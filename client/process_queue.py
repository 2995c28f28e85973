"""ProcessQueue and PullRequest: the client's cache of pulled, not yet consumed messages of one queue.

Sans-IO: every time-dependent method takes ``now_ms`` (monotonic milliseconds) and the limit it checks,
so the same code serves any clock and time scale. Offsets are kept in a sorted list beside a dict,
RocketMQ's TreeMap: the cache holds at most ~pullThresholdForQueue + one batch entries.
"""

from __future__ import annotations

import asyncio
import bisect
from collections.abc import Iterable
from dataclasses import dataclass, field

from rmqlab.protocol.model import Message, MessageQueue

MIB = 1024 * 1024


class ProcessQueue:
    """Messages of one queue by offset, with RocketMQ's counters, flags and timestamps."""

    def __init__(self, now_ms: int = 0) -> None:
        self._msgs: dict[int, Message] = {}
        self._offsets: list[int] = []  # sorted keys of _msgs
        self._consuming_orderly: dict[int, Message] = {}
        self.msg_count = 0
        self.msg_size = 0  # body bytes
        self.queue_offset_max = 0
        self.dropped = False
        self.locked = False
        self.consuming = False
        self.last_pull_timestamp = now_ms
        self.last_consume_timestamp = now_ms
        self.last_lock_timestamp = now_ms
        self.try_unlock_times = 0
        self.msg_acc_cnt = 0
        # Held while an orderly listener runs; rebalance takes it before unlocking the queue at the broker.
        self.consume_lock = asyncio.Lock()

    # -- state checks --------------------------------------------------------------------------
    def is_pull_expired(self, now_ms: int, pull_max_idle_ms: float) -> bool:
        return now_ms - self.last_pull_timestamp > pull_max_idle_ms

    def is_lock_expired(self, now_ms: int, lock_max_live_ms: float) -> bool:
        return now_ms - self.last_lock_timestamp > lock_max_live_ms

    @property
    def cached_size_mib(self) -> int:
        return self.msg_size // MIB

    def max_span(self) -> int:
        if not self._offsets:
            return 0
        return self._offsets[-1] - self._offsets[0]

    def has_temp_message(self) -> bool:
        return bool(self._msgs)

    def contains(self, offset: int) -> bool:
        return offset in self._msgs

    def first_offset(self) -> int | None:
        return self._offsets[0] if self._offsets else None

    def last_offset(self) -> int | None:
        return self._offsets[-1] if self._offsets else None

    def offsets(self) -> list[int]:
        return list(self._offsets)

    @property
    def consuming_orderly_count(self) -> int:
        return len(self._consuming_orderly)

    # -- mutation ------------------------------------------------------------------------------
    def _insert(self, msg: Message) -> bool:
        off = msg.queue_offset
        new = off not in self._msgs
        self._msgs[off] = msg
        if new:
            bisect.insort(self._offsets, off)
        return new

    def _remove(self, off: int) -> Message | None:
        msg = self._msgs.pop(off, None)
        if msg is not None:
            i = bisect.bisect_left(self._offsets, off)
            del self._offsets[i]
        return msg

    def put_messages(self, msgs: Iterable[Message]) -> bool:
        """Cache pulled messages; True when the caller should dispatch a consume request (orderly)."""
        msgs = list(msgs)
        valid = 0
        for msg in msgs:
            if self._insert(msg):
                valid += 1
                self.queue_offset_max = msg.queue_offset
                self.msg_size += len(msg.body)
        self.msg_count += valid
        dispatch = False
        if self._msgs and not self.consuming:
            dispatch = True
            self.consuming = True
        if msgs:
            last = msgs[-1]
            max_prop = last.properties.get("MAX_OFFSET")
            if max_prop is not None and max_prop.lstrip("-").isdigit():
                acc = int(max_prop) - last.queue_offset
                if acc > 0:
                    self.msg_acc_cnt = acc
        return dispatch

    def remove_messages(self, msgs: Iterable[Message], now_ms: int) -> int:
        """Drop consumed messages; returns the offset safe to commit (the smallest still cached, or
        ``queue_offset_max + 1`` when none is left), or -1 when the cache was already empty."""
        self.last_consume_timestamp = now_ms
        if not self._msgs:
            return -1
        result = self.queue_offset_max + 1
        removed = 0
        for msg in msgs:
            prev = self._remove(msg.queue_offset)
            if prev is not None:
                removed += 1
                self.msg_size -= len(msg.body)
        self.msg_count -= removed
        if self.msg_count == 0:
            self.msg_size = 0
        if self._offsets:
            result = self._offsets[0]
        return result

    # -- orderly -------------------------------------------------------------------------------
    def take_messages(self, batch_size: int, now_ms: int) -> list[Message]:
        self.last_consume_timestamp = now_ms
        out: list[Message] = []
        while self._offsets and len(out) < batch_size:
            off = self._offsets[0]
            msg = self._remove(off)
            assert msg is not None
            out.append(msg)
            self._consuming_orderly[off] = msg
        if not out:
            self.consuming = False
        return out

    def commit(self) -> int:
        """Forget the messages taken for orderly consumption; returns the next offset to consume, or -1."""
        if not self._consuming_orderly:
            return -1
        last = max(self._consuming_orderly)
        self.msg_count -= len(self._consuming_orderly)
        if self.msg_count == 0:
            self.msg_size = 0
        else:
            self.msg_size -= sum(len(m.body) for m in self._consuming_orderly.values())
        self._consuming_orderly.clear()
        return last + 1

    def rollback(self) -> None:
        for msg in self._consuming_orderly.values():
            self._insert(msg)
        self._consuming_orderly.clear()

    def make_message_to_consume_again(self, msgs: Iterable[Message]) -> None:
        for msg in msgs:
            self._consuming_orderly.pop(msg.queue_offset, None)
            self._insert(msg)

    def clear(self) -> None:
        self._msgs.clear()
        self._offsets.clear()
        self._consuming_orderly.clear()
        self.msg_count = 0
        self.msg_size = 0
        self.queue_offset_max = 0

    def __repr__(self) -> str:
        return (
            f"ProcessQueue(count={self.msg_count}, size={self.msg_size}, span={self.max_span()}, "
            f"dropped={self.dropped}, locked={self.locked})"
        )


@dataclass(slots=True, eq=False)
class PullRequest:
    """The one in-flight pull of a ProcessQueue; it is re-queued after every response."""

    consumer_group: str
    message_queue: MessageQueue
    process_queue: ProcessQueue
    next_offset: int
    previously_locked: bool = False
    attempts: int = field(default=0)
