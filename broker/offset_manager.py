"""Committed consumer offsets (RocketMQ's ConsumerOffsetManager), sans-IO.

Commits overwrite unconditionally (RocketMQ has no increase-only rule on the broker); a missing
offset reads as -1.
"""

from __future__ import annotations


class ConsumerOffsetManager:
    """Committed consume offsets by group, topic and queue."""

    def __init__(self) -> None:
        # (topic, group) -> queue id -> offset, like RocketMQ's "topic@group" keyed table.
        self.offset_table: dict[tuple[str, str], dict[int, int]] = {}

    def commit_offset(self, group: str, topic: str, queue_id: int, offset: int) -> int:
        """Store the offset; returns the previous one (-1 when none)."""
        queues = self.offset_table.setdefault((topic, group), {})
        prev = queues.get(queue_id, -1)
        queues[queue_id] = offset
        return prev

    def query_offset(self, group: str, topic: str, queue_id: int) -> int:
        queues = self.offset_table.get((topic, group))
        if queues is None:
            return -1
        return queues.get(queue_id, -1)

    def entries(self) -> list[tuple[str, str, int, int]]:
        """(group, topic, queue_id, offset) for every stored offset."""
        return [
            (group, topic, qid, off)
            for (topic, group), queues in self.offset_table.items()
            for qid, off in queues.items()
        ]

    def groups(self) -> set[str]:
        return {group for (_, group) in self.offset_table}


def resolve_query_offset(
    committed: int,
    min_offset: int,
    set_zero_if_not_found: bool,
    *,
    max_offset: int = 0,
    rocketmq5: bool = False,
) -> int | None:
    """QUERY_CONSUMER_OFFSET's answer: an offset, or None for QUERY_NOT_FOUND (PROTOCOL.md).

    Without a committed offset, a queue whose min offset is still 0 answers 0 (RocketMQ 4.9 treats the
    whole in-memory store as "hot"), unless the request says setZeroIfNotFound=false. RocketMQ 5
    (checkInMemByConsumeOffset) also wants the message at offset 0 to exist: a fresh, empty queue is
    QUERY_NOT_FOUND there.
    """
    if committed >= 0:
        return committed
    if set_zero_if_not_found and min_offset <= 0 and (max_offset > 0 or not rocketmq5):
        return 0
    return None
