"""Delayed delivery of retried messages (RocketMQ's ScheduleMessageService), sans-IO.

A message sent back for a retry is stored in ``SCHEDULE_TOPIC_XXXX``, queue ``level - 1``, with its real
topic and queue in properties. Each level's queue is FIFO with one delay, so due times never decrease
along it: delivery walks each queue from its delivery offset and stops at the first message not yet due.
"""

from __future__ import annotations

from collections.abc import Sequence

from rmqlab.broker.store import (
    PROPERTY_DELAY_TIME_LEVEL,
    PROPERTY_REAL_QUEUE_ID,
    PROPERTY_REAL_TOPIC,
    SCHEDULE_TOPIC,
    MemoryMessageStore,
    MessageDraft,
    StoredMessage,
)


class ScheduleMessageService:
    """Delivers delayed messages (retries) when their delay level's time has come."""

    def __init__(self, delay_levels_ms: Sequence[int]) -> None:
        if not delay_levels_ms:
            raise ValueError("at least one delay level is needed")
        self.delay_levels_ms = tuple(delay_levels_ms)
        self.offset_table: dict[int, int] = {}  # level -> next offset to deliver

    @property
    def max_level(self) -> int:
        return len(self.delay_levels_ms)

    def clamp_level(self, level: int) -> int:
        return min(max(level, 1), self.max_level)

    def delay_ms(self, level: int) -> int:
        return self.delay_levels_ms[self.clamp_level(level) - 1]

    def schedule_draft(
        self,
        level: int,
        real_topic: str,
        real_queue_id: int,
        body: bytes,
        *,
        tags: str | None,
        keys: str | None,
        born_timestamp: int,
        reconsume_times: int,
        properties: dict[str, str],
    ) -> MessageDraft:
        level = self.clamp_level(level)
        props = dict(properties)
        props[PROPERTY_REAL_TOPIC] = real_topic
        props[PROPERTY_REAL_QUEUE_ID] = str(real_queue_id)
        props[PROPERTY_DELAY_TIME_LEVEL] = str(level)
        return MessageDraft(
            SCHEDULE_TOPIC, level - 1, body, tags, keys, born_timestamp, reconsume_times, props
        )

    def due(
        self, store: MemoryMessageStore, now_ms: int, limit: int = 1024
    ) -> list[tuple[int, StoredMessage]]:
        """Messages due for delivery at ``now_ms`` (wall clock), oldest first within each level."""
        out: list[tuple[int, StoredMessage]] = []
        for level in range(1, self.max_level + 1):
            cq = store.consume_queue(SCHEDULE_TOPIC, level - 1)
            if cq is None:
                continue
            delay = self.delay_levels_ms[level - 1]
            offset = max(self.offset_table.get(level, 0), cq.min_offset)
            while offset < cq.max_offset and len(out) < limit:
                msg = cq.get(offset)
                if msg is None or msg.store_timestamp + delay > now_ms:
                    break
                out.append((level, msg))
                offset += 1
        return out

    def next_due_ms(self, store: MemoryMessageStore) -> int | None:
        """Wall-clock time at which the next scheduled message falls due, or None when none waits."""
        best: int | None = None
        for level in range(1, self.max_level + 1):
            cq = store.consume_queue(SCHEDULE_TOPIC, level - 1)
            if cq is None:
                continue
            msg = cq.get(max(self.offset_table.get(level, 0), cq.min_offset))
            if msg is not None:
                t = msg.store_timestamp + self.delay_levels_ms[level - 1]
                best = t if best is None else min(best, t)
        return best

    def mark_delivered(self, level: int, msg: StoredMessage) -> int:
        """Advance the level's delivery offset past ``msg``; returns the new offset to persist."""
        nxt = msg.queue_offset + 1
        if nxt > self.offset_table.get(level, 0):
            self.offset_table[level] = nxt
        return self.offset_table[level]

    def pending(self, store: MemoryMessageStore) -> int:
        n = 0
        for level in range(1, self.max_level + 1):
            cq = store.consume_queue(SCHEDULE_TOPIC, level - 1)
            if cq is not None:
                n += max(0, cq.max_offset - max(self.offset_table.get(level, 0), cq.min_offset))
        return n

    @staticmethod
    def real_draft(msg: StoredMessage) -> MessageDraft:
        """The message to deliver to its real topic once due."""
        props = dict(msg.properties)
        topic = props.pop(PROPERTY_REAL_TOPIC, None)
        qid = props.pop(PROPERTY_REAL_QUEUE_ID, None)
        props.pop(PROPERTY_DELAY_TIME_LEVEL, None)
        if topic is None or qid is None or not qid.lstrip("-").isdigit():
            raise ValueError(f"scheduled message {msg.msg_id} lacks its real topic or queue")
        return MessageDraft(
            topic, int(qid), msg.body, msg.tags, msg.keys, msg.born_timestamp, msg.reconsume_times, props
        )
