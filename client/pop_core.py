"""The RocketMQ 5 client's POP pieces without I/O: server assignments split by mode, PopProcessQueue,
PopRequest, and the decisions of ConsumeMessagePopConcurrentlyService (skip a batch whose invisible time
ran out, how long a failed message stays invisible, when a message past maxReconsumeTimes is dropped).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from rmqlab.protocol.model import Message, MessageQueue
from rmqlab.protocol.pop_receipt import PROPERTY_POP_CK, ExtraInfo

MODE_POP = "POP"
MODE_PULL = "PULL"
MIN_POP_INVISIBLE_TIME = 5_000  # DefaultMQPushConsumerImpl: outside these bounds 60 s is used
MAX_POP_INVISIBLE_TIME = 300_000
DEFAULT_POP_INVISIBLE_TIME = 60_000
# DefaultMQPushConsumerImpl.popDelayLevel, seconds: how long a failed message stays invisible
POP_DELAY_LEVEL_S: tuple[int, ...] = (
    10,
    30,
    60,
    120,
    180,
    240,
    300,
    360,
    420,
    480,
    540,
    600,
    1200,
    1800,
    3600,
    7200,
)
CONSUME_INIT_MODE_MAX = 1  # ConsumeInitMode for CONSUME_FROM_LAST_OFFSET (and timestamp)
CONSUME_INIT_MODE_MIN = 0  # CONSUME_FROM_FIRST_OFFSET


def split_assignments(
    assignments: Iterable[tuple[MessageQueue, str]],
) -> tuple[set[MessageQueue], set[MessageQueue]]:
    """updateMessageQueueAssignment's first step: (PULL queues, POP queues)."""
    pull: set[MessageQueue] = set()
    pop: set[MessageQueue] = set()
    for mq, mode in assignments:
        (pop if mode == MODE_POP else pull).add(mq)
    return pull, pop


def effective_invisible_time(configured: int) -> int:
    """popMessage: a configured invisible time outside [5 s, 300 s] is replaced by 60 s (unscaled ms)."""
    if configured < MIN_POP_INVISIBLE_TIME or configured > MAX_POP_INVISIBLE_TIME:
        return DEFAULT_POP_INVISIBLE_TIME
    return configured


def receipt_of(msg: Message) -> ExtraInfo | None:
    raw = msg.properties.get(PROPERTY_POP_CK)
    if raw is None:
        return None
    try:
        return ExtraInfo.parse(raw)
    except ValueError:
        return None


def is_pop_timeout(msgs: list[Message], now_ms: int) -> bool:
    """ConsumeRequest#isPopTimeout: the first message's invisible time is over, so the broker may already
    have handed the batch to another consumer."""
    if not msgs:
        return False
    r = receipt_of(msgs[0])
    return r is not None and now_ms - r.pop_time >= r.invisible_time


def change_invisible_delay_s(reconsume_times: int, delay_level: int) -> int:
    """changePopInvisibleTime: delay level 0 means "by reconsume times"; past the table, its last entry."""
    level = reconsume_times if delay_level == 0 else delay_level
    if level >= len(POP_DELAY_LEVEL_S):
        return POP_DELAY_LEVEL_S[-1]
    return POP_DELAY_LEVEL_S[max(0, level)]


def past_max_decision(born_ms: int, now_ms: int) -> int | None:
    """checkNeedAckOrDelay for a message past maxReconsumeTimes: None = ack it (dropped: older than twice
    the longest delay), else the delay level to change its invisible time to (one above the largest level
    its age has reached)."""
    age = now_ms - born_ms
    if age > POP_DELAY_LEVEL_S[-1] * 1000 * 2:
        return None
    level = len(POP_DELAY_LEVEL_S) - 1
    while level >= 0:
        if age >= POP_DELAY_LEVEL_S[level] * 1000:
            return level + 1
        level -= 1
    return level  # -1: younger than the first level; RocketMQ then indexes from -1 + 1 = 0 below


class PopProcessQueue:
    """PopProcessQueue: only a count of messages popped and not yet acked, and when the queue last popped."""

    __slots__ = ("dropped", "last_pop_timestamp", "wait_ack_count")

    def __init__(self, now_ms: int) -> None:
        self.last_pop_timestamp = now_ms
        self.wait_ack_count = 0
        self.dropped = False

    def inc_found_msg(self, n: int) -> None:
        self.wait_ack_count += n

    def ack(self) -> int:
        before = self.wait_ack_count
        self.wait_ack_count -= 1
        return before

    def dec_found_msg(self, n: int) -> None:
        self.wait_ack_count += n  # RocketMQ passes a negative count

    def is_pull_expired(self, now_ms: int, max_idle_ms: int) -> bool:
        return now_ms - self.last_pop_timestamp > max_idle_ms


@dataclass(slots=True, eq=False)
class PopRequest:
    """One POP queue of the group (a queue id of -1 pops every queue of its broker)."""

    topic: str
    consumer_group: str
    message_queue: MessageQueue
    pop_process_queue: PopProcessQueue
    init_mode: int
