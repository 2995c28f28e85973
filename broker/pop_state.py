"""POP's broker state (RocketMQ 5's PopMessageProcessor, PopBufferMergeService, PopReviveService and
ConsumerOrderInfoManager), sans-IO: checkpoints, acks, revive, and orderly POP's per-queue order info.

A concurrent pop takes messages from a queue's pop offset and records a checkpoint (``PopCheckPoint``)
for them: start offset, pop time, invisible time, revive queue and the messages' offsets. An ack marks
one message of a checkpoint; a checkpoint whose messages are all acked is done. One not done when its
revive time (pop time + invisible time) has passed by ``REVIVE_DELAY_MS`` is revived: its unacked
messages go to the pop retry topic with one more reconsume time. The group's consumer offset of a queue
moves to the start of its oldest checkpoint still open (or to the pop offset when none is open), as
PopBufferMergeService commits a checkpoint's offset once it is done or stored, so a broker restart
delivers open messages again instead of losing them.

An orderly pop keeps one ``OrderInfo`` per queue instead: the queue is blocked while a message of the
last pop is neither acked nor past its invisible time; the consumer offset stays at the first unacked
message, so an expired pop returns the same messages again with a higher consumed count.

Times are epoch milliseconds, passed in; nothing here reads a clock.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass, field

# PopAckConstants.ackTimeInterval (1 s) plus the second PopReviveService waits past a checkpoint's
# revive time for acks still on their way before it revives the checkpoint.
REVIVE_DELAY_MS = 2_000
REVIVE_INTERVAL_MS = 1_000  # BrokerConfig.reviveInterval: how often revive runs
REVIVE_QUEUE_NUM = 8  # BrokerConfig.reviveQueueNum
POP_FROM_RETRY_PROBABILITY = 20  # BrokerConfig.popFromRetryProbability, percent
POP_POLLING_SIZE = 1024  # BrokerConfig.popPollingSize: held pops per queue before POLLING_FULL
MAX_POP_BATCH = 32  # a pop asking for more is INVALID_PARAMETER
TIMEOUT_TOO_MUCH_MS = 500  # PopMessageRequestHeader#isTimeoutTooMuch's slack

QueueKey = tuple[str, str, int]  # (group, topic, queue_id)


@dataclass(slots=True)
class PopCheckPoint:
    """One pop's messages of one queue, until each is acked or the checkpoint is revived."""

    group: str
    topic: str  # the topic popped: the topic itself or its pop retry topic
    queue_id: int
    start_offset: int
    pop_time: int
    invisible_time: int
    revive_qid: int
    broker_name: str
    offsets: tuple[int, ...]
    acked: set[int] = field(default_factory=set)

    @property
    def revive_time(self) -> int:
        return self.pop_time + self.invisible_time

    @property
    def key(self) -> tuple[str, str, int, int, int]:
        """What an ack names: group, topic, queue, start offset and pop time (the receipt's fields)."""
        return (self.group, self.topic, self.queue_id, self.start_offset, self.pop_time)

    def unacked(self) -> list[int]:
        return [o for o in self.offsets if o not in self.acked]

    @property
    def done(self) -> bool:
        return len(self.acked) == len(self.offsets)


class AckResult(enum.Enum):
    ACKED = "acked"  # the message was in flight and is now acked
    ALREADY_ACKED = "already_acked"
    NO_CHECKPOINT = "no_checkpoint"  # no open checkpoint: revived already, or never popped so
    NOT_IN_CHECKPOINT = "not_in_checkpoint"  # the checkpoint exists but holds no such offset


@dataclass(slots=True)
class OrderInfo:
    """ConsumerOrderInfoManager.OrderInfo: the last orderly pop of one queue."""

    attempt_id: str | None
    pop_time: int
    invisible_time: int
    offsets: list[int]
    acked: set[int] = field(default_factory=set)
    consumed_count: dict[int, int] = field(default_factory=dict)
    next_visible: dict[int, int] = field(default_factory=dict)

    def next_visible_time(self, offset: int) -> int:
        return self.next_visible.get(offset, self.pop_time + self.invisible_time)

    def need_block(self, attempt_id: str | None, now_ms: int) -> bool:
        """OrderInfo#needBlock: a message of the last pop is neither acked nor visible again."""
        if not self.offsets:
            return False
        if self.attempt_id is not None and self.attempt_id == attempt_id:
            return False
        return any(o not in self.acked and now_ms < self.next_visible_time(o) for o in self.offsets)

    def next_offset(self) -> int:
        """OrderInfo#getNextOffset: the first unacked offset, or one past the last when all are acked."""
        for o in self.offsets:
            if o not in self.acked:
                return o
        return self.offsets[-1] + 1


class PopState:
    """Every open checkpoint, the pop offsets and the order infos of one broker."""

    def __init__(self, revive_queue_num: int = REVIVE_QUEUE_NUM) -> None:
        self.revive_queue_num = revive_queue_num
        self.checkpoints: dict[tuple[str, str, int, int, int], PopCheckPoint] = {}
        self.queue_checkpoints: dict[QueueKey, list[PopCheckPoint]] = {}
        self.pop_offsets: dict[QueueKey, int] = {}
        self.order_infos: dict[QueueKey, OrderInfo] = {}
        self._ck_number = 0

    def __len__(self) -> int:
        return len(self.checkpoints)

    # -- concurrent pop ----------------------------------------------------------------------------
    def next_revive_qid(self) -> int:
        """PopMessageProcessor's ckMessageNumber counter modulo reviveQueueNum."""
        qid = self._ck_number % self.revive_queue_num
        self._ck_number += 1
        return qid

    def pop_offset(self, key: QueueKey, committed: int) -> int:
        """getPopOffset: past what is already popped (in flight), never behind the committed offset."""
        buffered = self.pop_offsets.get(key)
        return committed if buffered is None else max(buffered, committed)

    def add_checkpoint(self, ck: PopCheckPoint, next_begin_offset: int) -> None:
        """A pop took ``ck.offsets``; the queue's next pop starts at ``next_begin_offset``."""
        key = (ck.group, ck.topic, ck.queue_id)
        self.pop_offsets[key] = max(self.pop_offsets.get(key, 0), next_begin_offset)
        if ck.offsets:
            self.checkpoints[ck.key] = ck
            self.queue_checkpoints.setdefault(key, []).append(ck)

    def skip(self, key: QueueKey, next_begin_offset: int) -> None:
        """addCkMock: messages scanned and filtered out move the pop offset without a checkpoint."""
        self.pop_offsets[key] = max(self.pop_offsets.get(key, 0), next_begin_offset)

    def commit_offset(self, key: QueueKey) -> int | None:
        """The consumer offset that is safe to commit for a queue: the start of its oldest open
        checkpoint, else its pop offset; None when the queue was never popped."""
        open_cks = self.queue_checkpoints.get(key)
        if open_cks:
            return min(ck.start_offset for ck in open_cks)
        return self.pop_offsets.get(key)

    def find(
        self, group: str, topic: str, queue_id: int, start_offset: int, pop_time: int
    ) -> PopCheckPoint | None:
        return self.checkpoints.get((group, topic, queue_id, start_offset, pop_time))

    def ack(
        self, group: str, topic: str, queue_id: int, start_offset: int, pop_time: int, offset: int
    ) -> tuple[AckResult, PopCheckPoint | None]:
        """Mark one message of a checkpoint acked; a checkpoint whose messages are all acked closes."""
        ck = self.find(group, topic, queue_id, start_offset, pop_time)
        if ck is None:
            return AckResult.NO_CHECKPOINT, None
        if offset not in ck.offsets:
            return AckResult.NOT_IN_CHECKPOINT, ck
        if offset in ck.acked:
            return AckResult.ALREADY_ACKED, ck
        ck.acked.add(offset)
        if ck.done:
            self._close(ck)
        return AckResult.ACKED, ck

    def due(self, now_ms: int, delay_ms: int = REVIVE_DELAY_MS) -> list[PopCheckPoint]:
        """Open checkpoints whose revive time has passed by ``delay_ms``, earliest first."""
        due = [ck for ck in self.checkpoints.values() if ck.revive_time + delay_ms <= now_ms]
        due.sort(key=lambda ck: (ck.revive_time, ck.key))
        return due

    def revived(self, ck: PopCheckPoint) -> None:
        """Its unacked messages are in the retry topic now: the checkpoint closes."""
        self._close(ck)

    def _close(self, ck: PopCheckPoint) -> None:
        self.checkpoints.pop(ck.key, None)
        key = (ck.group, ck.topic, ck.queue_id)
        cks = self.queue_checkpoints.get(key)
        if cks is not None:
            cks[:] = [c for c in cks if c is not ck]
            if not cks:
                del self.queue_checkpoints[key]

    def in_flight(self, group: str | None = None) -> int:
        """Messages popped and neither acked nor revived."""
        return sum(
            len(ck.offsets) - len(ck.acked) for ck in self.checkpoints.values() if group in (None, ck.group)
        )

    # -- orderly pop ----------------------------------------------------------------------------
    def check_block(self, key: QueueKey, attempt_id: str | None, now_ms: int) -> bool:
        info = self.order_infos.get(key)
        return info is not None and info.need_block(attempt_id, now_ms)

    def update_order(
        self,
        key: QueueKey,
        attempt_id: str | None,
        pop_time: int,
        invisible_time: int,
        offsets: Iterable[int],
    ) -> dict[int, int]:
        """ConsumerOrderInfoManager#update: the new pop replaces the old one; an offset popped again by
        another attempt counts one more consumption. Returns the consumed count of every offset."""
        offsets = list(offsets)
        old = self.order_infos.get(key)
        info = OrderInfo(attempt_id, pop_time, invisible_time, offsets)
        if old is not None:
            for o in offsets:
                if o in old.offsets:
                    prev = old.consumed_count.get(o, 0)
                    same_attempt = old.attempt_id is not None and old.attempt_id == attempt_id
                    info.consumed_count[o] = prev if same_attempt else prev + 1
        self.order_infos[key] = info
        return {o: info.consumed_count.get(o, 0) for o in offsets}

    def ack_order(self, key: QueueKey, offset: int, pop_time: int) -> int:
        """ConsumerOrderInfoManager#commitAndNext: the offset to commit after acking ``offset``; -1 when
        the offset is not in the queue's last pop, -2 when the pop time is not that pop's."""
        info = self.order_infos.get(key)
        if info is None:
            return offset + 1
        if not info.offsets:
            return -1
        if pop_time != info.pop_time:
            return -2
        if offset not in info.offsets:
            return -1
        info.acked.add(offset)
        return info.next_offset()

    def change_order_invisible_time(self, key: QueueKey, offset: int, next_visible_ms: int) -> bool:
        """updateNextVisibleTime: an orderly message stays invisible until ``next_visible_ms``."""
        info = self.order_infos.get(key)
        if info is None or offset not in info.offsets:
            return False
        info.next_visible[offset] = next_visible_ms
        return True
