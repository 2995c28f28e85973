"""Client behaviour by RocketMQ release: which ``ConsumerConfig`` switch each release turned, and why.

Every switch here undoes (or makes) one change of Apache RocketMQ's client; its default in
``ConsumerConfig`` is 4.9.8's behaviour. ``settings_for_version("4.9.4")`` gives the switch values of
that release, so an experiment or a catalogue entry can say ``client_version = "4.9.4"`` instead of
naming each behaviour. Pure data and lookups: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


class UnknownVersion(ValueError):
    """A client_version or a switch the table does not know; the message lists those it knows."""


DEFAULT_CLIENT_VERSION = "4.9.8"

# The releases of Apache RocketMQ's Java client the table knows (4.7 to 4.9.x and 5.x as tagged).
CLIENT_VERSIONS = (
    "4.7.0", "4.7.1", "4.8.0",
    "4.9.0", "4.9.1", "4.9.2", "4.9.3", "4.9.4", "4.9.5", "4.9.6", "4.9.7", "4.9.8",
    "5.0.0", "5.1.0", "5.1.1", "5.1.2", "5.1.3", "5.1.4", "5.2.0", "5.3.0", "5.3.1", "5.3.2", "5.3.3",
)  # fmt: skip
# What a consumer with ``rocketmq5 = true`` (or a server assignment) runs when it names no client_version:
# the newest 5.x release the table knows.
ROCKETMQ5_CLIENT_VERSION = CLIENT_VERSIONS[-1]


@dataclass(frozen=True)
class Behaviour:
    """One client change: the ``ConsumerConfig`` field that selects it, the release that brought it, the
    field's value before that release and from it on, and the change in Apache's source."""

    field: str
    since: str
    before: Any
    after: Any
    change: str


BEHAVIOURS: tuple[Behaviour, ...] = (
    Behaviour(
        "instance_name_with_nano_time",
        "4.9.0",
        False,
        True,
        "ClientConfig.changeInstanceNameToPID: the default instance name is pid#nanoTime, not the pid "
        "(ISSUE #667, #2760)",
    ),
    Behaviour(
        "lock_new_process_queue",
        "4.9.5",
        False,
        True,
        "RebalancePushImpl/RebalanceImpl: a new ProcessQueue is created locked (ISSUE #2621; commits "
        "2c6ada6f45 and 7ae6caf741); before, an orderly queue waited for the next lockAll (20 s)",
    ),
    Behaviour(
        "query_offset_error_as_not_found",
        "5.0.0",
        True,
        False,
        "RemoteBrokerOffsetStore.readOffset: only OffsetNotFoundException reads as -1 (commit b6ff649291); "
        "before, any MQBrokerException did, and the queue started from ConsumeFromWhere",
    ),
    Behaviour(
        "pull_request_dispatch_delay",
        "5.0.0",
        0,
        500,
        "RebalancePushImpl.dispatchPullRequest: new PullRequests start 500 ms later",
    ),
    Behaviour(
        "rebalance_later_on_lock_failure",
        "5.0.0",
        False,
        True,
        "RebalanceImpl.updateProcessQueueTableInRebalance: rebalanceLater(500) when an orderly lock failed",
    ),
    Behaviour(
        "lock_all_skips_dropped",
        "5.0.0",
        False,
        True,
        "RebalanceImpl.buildProcessQueueTableByBrokerName: lockAll/unlockAll leave out dropped queues",
    ),
    Behaviour(
        "mark_dropped_before_release",
        "5.0.0",
        False,
        True,
        "RebalanceImpl.updateProcessQueueTableInRebalance: every leaving queue is dropped before any is "
        "released",
    ),
    Behaviour(
        "message_queue_changed_without_route",
        "5.0.0",
        False,
        True,
        "RebalanceImpl.rebalanceByTopic: messageQueueChanged is called for a topic without a route",
    ),
    Behaviour(
        "send_back_only_cached",
        "5.1.0",
        False,
        True,
        "ConsumeMessageConcurrentlyService: failed messages no longer cached are not sent back",
    ),
    Behaviour(
        "rebalance_retry_when_unbalanced",
        "5.2.0",
        False,
        True,
        "RebalanceService: a round that is not balanced runs again after 1 s (ISSUE #7644)",
    ),
    Behaviour(
        "orderly_unlock_5x",
        "5.2.0",
        False,
        True,
        "RebalancePushImpl.tryRemoveOrderMessageQueue: tryLock 500 ms, forced unlock 20 s after the last "
        "lock (ISSUE #7644)",
    ),
    Behaviour(
        "offset_illegal_5x",
        "5.2.0",
        False,
        True,
        "DefaultMQPushConsumerImpl: OFFSET_ILLEGAL fixes the offset at once and wakes the rebalance "
        "(ISSUE #7644)",
    ),
    Behaviour(
        "rebalance_at_start_needs_heartbeat",
        "5.2.0",
        False,
        True,
        "DefaultMQPushConsumerImpl.start: the first rebalance only after a heartbeat went out (ISSUE #7644)",
    ),
    Behaviour(
        "heartbeat_on_connect",
        "5.2.0",
        False,
        True,
        "MQClientInstance: a new broker connection gets a heartbeat, then a rebalance (ISSUE #7296)",
    ),
    Behaviour(
        "query_assignment_fallback",
        "5.3.2",
        True,
        False,
        "RebalanceImpl.doRebalance: a consumer with clientRebalance = false asks the broker for its "
        "assignment whatever the answer; before, tryQueryAssignment fell back to the client's own "
        "allocation for good after three QUERY_ASSIGNMENT timeouts or any other error (ISSUE #8686, "
        "#8957; PR #8958, commit d63373a152)",
    ),
    Behaviour(
        "lock_in_broadcasting",
        "5.3.2",
        True,
        False,
        "RebalanceImpl.rebalanceByTopic: broadcasting orderly consumers no longer lock (ISSUE #8772)",
    ),
)


def _key(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.split("."))


def check_version(version: str) -> str:
    """``version`` if the table knows it; a ConfigError naming the known ones otherwise."""
    if version not in CLIENT_VERSIONS:
        raise UnknownVersion(f"unknown client_version {version!r}; known: {', '.join(CLIENT_VERSIONS)}")
    return version


def settings_for_version(version: str) -> dict[str, Any]:
    """The ``ConsumerConfig`` switch values of the client release ``version``."""
    have = _key(check_version(version))
    return {b.field: b.after if have >= _key(b.since) else b.before for b in BEHAVIOURS}


def behaviour(field: str) -> Behaviour:
    """The table's row for a switch; a ConfigError naming the switches otherwise."""
    for b in BEHAVIOURS:
        if b.field == field:
            return b
    raise UnknownVersion(
        f"unknown behaviour switch {field!r}; known: {', '.join(b.field for b in BEHAVIOURS)}"
    )
