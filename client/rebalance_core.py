"""The decisions of RebalanceImpl and DefaultMQPushConsumerImpl as pure functions.

What to drop and add in updateProcessQueueTableInRebalance, where a new queue starts
(computePullFromWhere), per-queue flow-control thresholds (messageQueueChanged), the flow-control branches
of pullMessage, and the mapping of pull response codes to RocketMQ's PullStatus and retry delays. The
async shell (client.rebalance, client.pull) performs the I/O these decisions ask for.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from client.process_queue import ProcessQueue
from protocol.codes import ResponseCode
from protocol.model import ConsumeFromWhere, ConsumeType, MessageQueue, is_retry_topic


class DropReason(enum.StrEnum):
    REALLOCATED = "reallocated"
    PULL_EXPIRED = "pull_expired"
    NOT_MY_TOPIC = "not_my_topic"
    OFFSET_MOVED = "offset_moved"
    SHUTDOWN = "shutdown"
    UNASSIGNED = "unassigned"  # lite pull: assign() with another set


def select_queues_to_drop(
    topic: str,
    table: Mapping[MessageQueue, ProcessQueue],
    allocated: set[MessageQueue],
    consume_type: ConsumeType,
    now_ms: int,
    pull_max_idle_ms: float,
) -> list[tuple[MessageQueue, DropReason]]:
    """Step 1 of updateProcessQueueTableInRebalance: queues of ``topic`` no longer allocated, and (push
    consumers only) allocated ones whose pull stalled for longer than pullMaxIdleTime."""
    out: list[tuple[MessageQueue, DropReason]] = []
    for mq in sorted(table):
        if mq.topic != topic:
            continue
        pq = table[mq]
        if mq not in allocated:
            out.append((mq, DropReason.REALLOCATED))
        elif consume_type is ConsumeType.CONSUME_PASSIVELY and pq.is_pull_expired(now_ms, pull_max_idle_ms):
            out.append((mq, DropReason.PULL_EXPIRED))
    return out


def select_queues_to_add(
    allocated: Iterable[MessageQueue], table: Mapping[MessageQueue, ProcessQueue]
) -> list[MessageQueue]:
    """Step 3: allocated queues without a ProcessQueue, in MessageQueue order."""
    return sorted(mq for mq in set(allocated) if mq not in table)


def queues_not_my_topic(
    table: Mapping[MessageQueue, ProcessQueue], topics: Iterable[str]
) -> list[MessageQueue]:
    """truncateMessageQueueNotMyTopic: queues whose topic is no longer subscribed."""
    subscribed = set(topics)
    return sorted(mq for mq in table if mq.topic not in subscribed)


def working_set(table: Mapping[MessageQueue, ProcessQueue], topic: str) -> set[MessageQueue]:
    """The queues of ``topic`` this client really serves: its non-dropped ProcessQueues."""
    return {mq for mq, pq in table.items() if mq.topic == topic and not pq.dropped}


# -- computePullFromWhere ----------------------------------------------------------------------------


class StartKind(enum.Enum):
    OFFSET = "offset"  # start at ``offset``
    MAX_OFFSET = "max_offset"  # ask the broker for the queue's max offset (GET_MAX_OFFSET)
    SEARCH_OFFSET = "search_offset"  # ask for the first offset stored at/after ``timestamp_ms``
    FAIL = "fail"  # the queue is skipped this round


@dataclass(frozen=True, slots=True)
class StartPlan:
    kind: StartKind
    offset: int = -1
    timestamp_ms: int = 0
    reason: str = ""


def plan_pull_from_where(
    consume_from_where: ConsumeFromWhere, last_offset: int, topic: str, consume_timestamp_ms: int
) -> StartPlan:
    """RebalancePushImpl.computePullFromWhereWithException given the store's answer ``last_offset``
    (>= 0 committed, -1 not found, -2/-3 error)."""
    if last_offset >= 0:
        return StartPlan(StartKind.OFFSET, last_offset)
    if last_offset != -1:
        return StartPlan(StartKind.FAIL, reason=f"offset store read failed ({last_offset})")
    retry = is_retry_topic(topic)
    if consume_from_where is ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET:
        return StartPlan(StartKind.OFFSET, 0)
    if consume_from_where is ConsumeFromWhere.CONSUME_FROM_TIMESTAMP:
        if retry:
            return StartPlan(StartKind.MAX_OFFSET)
        return StartPlan(StartKind.SEARCH_OFFSET, timestamp_ms=consume_timestamp_ms)
    # CONSUME_FROM_LAST_OFFSET (and RocketMQ's deprecated variants that behave the same)
    if retry:
        return StartPlan(StartKind.OFFSET, 0)
    return StartPlan(StartKind.MAX_OFFSET)


def plan_pull_from_where_lite(
    consume_from_where: ConsumeFromWhere, last_offset: int, topic: str, consume_timestamp_ms: int
) -> StartPlan:
    """RebalanceLitePullImpl.computePullFromWhere: the same table, but -1 instead of an exception."""
    plan = plan_pull_from_where(consume_from_where, last_offset, topic, consume_timestamp_ms)
    if plan.kind is StartKind.FAIL:
        return StartPlan(StartKind.OFFSET, -1, reason=plan.reason)
    return plan


# -- messageQueueChanged ------------------------------------------------------------------------------


def per_queue_threshold(topic_threshold: int, queue_count: int, current: int) -> int:
    """pullThreshold(Size)ForQueue after a rebalance: the topic-level limit split over every
    ProcessQueue of the consumer (all topics, dropped ones still in the table included)."""
    if queue_count == 0 or topic_threshold == -1:
        return current
    return max(1, topic_threshold // queue_count)


# -- pullMessage flow control ------------------------------------------------------------------------


class FlowControl(enum.Enum):
    CACHE_COUNT = "cache_count"
    CACHE_SIZE = "cache_size"
    MAX_SPAN = "max_span"


def flow_control_check(
    pq: ProcessQueue,
    *,
    orderly: bool,
    pull_threshold_for_queue: int,
    pull_threshold_size_for_queue_mib: int,
    consume_concurrently_max_span: int,
) -> FlowControl | None:
    """Branches 5-7 of DefaultMQPushConsumerImpl.pullMessage; a result means "pull again after 50 ms"."""
    if pq.msg_count > pull_threshold_for_queue:
        return FlowControl.CACHE_COUNT
    if pq.cached_size_mib > pull_threshold_size_for_queue_mib:
        return FlowControl.CACHE_SIZE
    if not orderly and pq.max_span() > consume_concurrently_max_span:
        return FlowControl.MAX_SPAN
    return None


# -- pull results -----------------------------------------------------------------------------------


class PullStatus(enum.Enum):
    FOUND = "FOUND"
    NO_NEW_MSG = "NO_NEW_MSG"
    NO_MATCHED_MSG = "NO_MATCHED_MSG"
    OFFSET_ILLEGAL = "OFFSET_ILLEGAL"


_PULL_STATUS = {
    ResponseCode.SUCCESS: PullStatus.FOUND,
    ResponseCode.PULL_NOT_FOUND: PullStatus.NO_NEW_MSG,
    ResponseCode.PULL_RETRY_IMMEDIATELY: PullStatus.NO_MATCHED_MSG,
    ResponseCode.PULL_OFFSET_MOVED: PullStatus.OFFSET_ILLEGAL,
}


def pull_status(code: int) -> PullStatus | None:
    """MQClientAPIImpl.processPullResponse: None means the broker answered an error (onException)."""
    try:
        return _PULL_STATUS.get(ResponseCode(code))
    except ValueError:
        return None


def pull_exception_delay_ms(code: int | None, *, when_exception: int, when_broker_flow_control: int) -> int:
    """PullCallback.onException: 20 ms after FLOW_CONTROL, the exception delay for everything else
    (SUBSCRIPTION_NOT_EXIST, SUBSCRIPTION_NOT_LATEST, timeouts, SYSTEM_ERROR ...)."""
    if code == ResponseCode.FLOW_CONTROL:
        return when_broker_flow_control
    return when_exception


def response_code_name(code: int | None) -> str:
    if code is None:
        return "NONE"
    try:
        return ResponseCode(code).name
    except ValueError:
        return str(code)
