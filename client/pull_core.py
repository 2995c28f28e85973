"""The pull-side decisions of DefaultMQPushConsumerImpl as pure functions: the flow-control branches
of pullMessage, and the mapping of pull response codes to RocketMQ's PullStatus and retry delays. The
rebalance decisions live in ``client.group_state``; ``client.push_consumer`` performs the pulls.
"""

from __future__ import annotations

import enum

from rmqlab.client.process_queue import ProcessQueue
from rmqlab.protocol.codes import ResponseCode

# -- pullMessage flow control ------------------------------------------------------------------------


class FlowControl(enum.Enum):
    """Which cache limit held a pull back."""

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
    """RocketMQ's PullStatus, from the broker's response code."""

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
