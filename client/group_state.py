"""GroupState: the rebalance tables of one consumer group in one client, and every rule that changes them.

No I/O, no event loop, no clock: time comes in as ``now_ms`` (monotonic) or ``wall_ms`` (epoch), and the
methods answer what to do. A rebalance round asks once per topic, ``plan_rebalance`` (or
``plan_assignment`` for queues the broker assigned), and gets a ``RebalancePlan``: the allocation, the
queues to drop, the queues to add with where each starts, and those to lock first;
``client.rebalance.RebalanceImpl`` carries it out, making the broker calls it asks for and writing the
events. The rules, each enforced by a method below (RocketMQ's RebalanceImpl and
RebalancePushImpl / RebalanceLitePullImpl are the reference):

1. ``subscription_inner`` (topic -> SubscriptionData) changes on subscribe / unsubscribe, when a
   CLUSTERING group copies its retry topic in at start, and when a topic's queues changed (the
   ``sub_version`` becomes the wall time, telling the broker this client's view moved on).
2. ``topic_subscribe_info_table`` (topic -> every readable queue of the topic) is replaced per topic, only
   when the new route's set differs from the old one.
3. ``process_queue_table`` (queue -> ProcessQueue) holds the queues this client serves. A queue leaves
   when it is no longer allocated, when its pulls stalled past pullMaxIdleTime (push consumers only),
   when its topic is no longer subscribed, or at shutdown; it is marked dropped before it leaves, and an
   orderly queue whose release failed stays (dropped) until a later round releases it. A queue enters
   when allocated and not held, after the broker lock (orderly) and a start offset >= 0; it enters marked
   locked (4.9.5+).
4. The per-queue flow-control thresholds are the topic-level ones split over every entry of the table,
   recomputed after a round that changed it.
5. ``ProcessQueue.locked`` follows the broker's last lock answer; a granted lock renews
   ``last_lock_timestamp``.
6. A round runs only while the consumer is ``running`` and not ``paused`` (suspend()); a lite-pull
   consumer given its queues by assign() (``assigned``) has no round to run and counts as balanced.

Only this module writes to the three tables; everyone else reads them through read-only views.
"""

from __future__ import annotations

import enum
import functools
import hashlib
from collections import defaultdict
from collections.abc import Iterable, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from types import MappingProxyType

from rmqlab.client.client_config import ConsumerConfig
from rmqlab.client.process_queue import ProcessQueue
from rmqlab.client.pull_core import FlowControl, flow_control_check
from rmqlab.protocol.allocate import ALLOCATION_CACHE, AllocateMessageQueueStrategy, sort_mq_all
from rmqlab.protocol.model import (
    MQ_ORDER,
    ConsumeFromWhere,
    ConsumeType,
    MessageModel,
    MessageQueue,
    SubscriptionData,
    is_retry_topic,
    retry_topic,
)


class DropReason(enum.StrEnum):
    """Why a queue left the process-queue table (the ``reason`` of ``mq_removed``)."""

    REALLOCATED = "reallocated"
    PULL_EXPIRED = "pull_expired"
    NOT_MY_TOPIC = "not_my_topic"
    OFFSET_MOVED = "offset_moved"
    SHUTDOWN = "shutdown"
    UNASSIGNED = "unassigned"  # lite pull: assign() with another set


# shorts of the last few frozensets by identity (kept alive here, so an id is not reused): equal routes
# share one frozenset (TopicRouteData.subscribe_queues), and every consumer of a 4,000-queue topic wrote
# the same sorted list into its topic_route event, sorting it again each time.
_SHORTS: dict[int, tuple[frozenset[MessageQueue], list[str]]] = {}
_SHORTS_MAX = 16


def shorts(mqs: Iterable[MessageQueue]) -> list[str]:
    """Queues as ``broker:queue_id`` in MessageQueue order, as events list them."""
    if not mqs:
        return []
    if isinstance(mqs, frozenset):
        seen = _SHORTS.get(id(mqs))
        if seen is not None and seen[0] is mqs:
            return list(seen[1])
        out = [mq.short for mq in sort_mq_all(mqs)]
        while len(_SHORTS) >= _SHORTS_MAX:
            del _SHORTS[next(iter(_SHORTS))]
        _SHORTS[id(mqs)] = (mqs, out)
        return list(out)
    return [mq.short for mq in sort_mq_all(mqs)]


# -- computePullFromWhere ----------------------------------------------------------------------------


class StartKind(enum.Enum):
    """How a new queue's start offset is found."""

    OFFSET = "offset"  # start at ``offset``
    MAX_OFFSET = "max_offset"  # ask the broker for the queue's max offset (GET_MAX_OFFSET)
    SEARCH_OFFSET = "search_offset"  # ask for the first offset stored at/after ``timestamp_ms``
    FAIL = "fail"  # the queue is skipped this round


@dataclass(frozen=True, slots=True)
class StartPlan:
    """Where a newly added queue starts: an offset, or the broker call that finds it."""

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


@dataclass(frozen=True, slots=True)
class StartRule:
    """Where a new queue of ``topic`` starts, decided before the offset store is asked: the committed
    offset when there is one, otherwise what ``consume_from_where`` says (computePullFromWhere)."""

    topic: str
    consume_from_where: ConsumeFromWhere
    consume_timestamp_ms: int
    lite: bool = False  # RebalanceLitePullImpl's variant: -1 instead of an exception

    def given(self, last_offset: int) -> StartPlan:
        """The start once the offset store answered ``last_offset``."""
        plan = plan_pull_from_where_lite if self.lite else plan_pull_from_where
        return plan(self.consume_from_where, last_offset, self.topic, self.consume_timestamp_ms)


def per_queue_threshold(topic_threshold: int, queue_count: int, current: int) -> int:
    """pullThreshold(Size)ForQueue after a rebalance: the topic-level limit split over every
    ProcessQueue of the consumer (all topics, dropped ones still in the table included)."""
    if queue_count == 0 or topic_threshold == -1:
        return current
    return max(1, topic_threshold // queue_count)


# -- a round's plan (updateProcessQueueTableInRebalance) ---------------------------------------------


@dataclass(frozen=True, slots=True)
class QueueDrop:
    """A queue leaving the process-queue table, and why."""

    mq: MessageQueue
    reason: DropReason


@dataclass(frozen=True, slots=True)
class QueueAdd:
    """A queue entering the process-queue table, and where its first pull starts."""

    mq: MessageQueue
    start: StartRule


@dataclass(frozen=True, slots=True)
class RebalancePlan:
    """What one rebalance round does to one topic of the group, in RocketMQ's order: the drops first, each
    released before it leaves (an orderly queue only once its consume lock and broker lock are let go),
    then the adds, each locked at the broker first when it is in ``lock``, then given its start.

    ``add`` also lists a queue being dropped while still allocated (its pulls stalled): it comes back
    with a new ProcessQueue once released. An add whose queue is still in the table when the drops are
    done (a release that failed) is skipped, as is one whose start offset cannot be found.
    """

    topic: str
    cid_all: list[str]  # the members the allocation saw, sorted (broadcasting: this client; assigned: none)
    allocated: AbstractSet[MessageQueue]  # this client's queues of the topic
    drop: tuple[QueueDrop, ...] = ()  # in MessageQueue order
    add: tuple[QueueAdd, ...] = ()  # in MessageQueue order
    lock: frozenset[MessageQueue] = frozenset()  # the adds to lock at the broker before adding (orderly)


def plan_process_queue_table(
    topic: str,
    allocated: AbstractSet[MessageQueue],
    held: Mapping[MessageQueue, ProcessQueue],
    *,
    now_ms: int,
    pull_max_idle_ms: float | None,
    lock: bool,
    start: StartRule,
) -> tuple[tuple[QueueDrop, ...], tuple[QueueAdd, ...], frozenset[MessageQueue]]:
    """updateProcessQueueTableInRebalance's decisions for ``topic``, given this client's queues
    (``allocated``) and the process-queue table (``held``): (drops, adds, queues to lock).

    A held queue of the topic is dropped when it is no longer allocated, or, with ``pull_max_idle_ms``
    (push consumers), when its last pull is more than that long ago. An allocated queue is added when it is
    not held, or when it is being dropped for its stalled pulls. With ``lock`` every add is locked first."""
    drop: list[QueueDrop] = []
    for mq in sorted((mq for mq in held if mq.topic == topic), key=MQ_ORDER):
        if mq not in allocated:
            drop.append(QueueDrop(mq, DropReason.REALLOCATED))
        elif pull_max_idle_ms is not None and held[mq].is_pull_expired(now_ms, pull_max_idle_ms):
            drop.append(QueueDrop(mq, DropReason.PULL_EXPIRED))
    again = {d.mq for d in drop if d.reason is DropReason.PULL_EXPIRED}
    new = sorted((mq for mq in allocated if mq not in held or mq in again), key=MQ_ORDER)
    return tuple(drop), tuple(QueueAdd(mq, start) for mq in new), frozenset(new) if lock else frozenset()


class AllocationFailed(Exception):
    """The allocation strategy raised ``cause`` (the round is then unbalanced and changes nothing)."""

    def __init__(self, cause: Exception) -> None:
        super().__init__(repr(cause))
        self.cause = cause


# -- the state object --------------------------------------------------------------------------------


class GroupState:
    """The subscription, route and process-queue tables of one consumer group, with its rebalance rules."""

    def __init__(
        self,
        group: str,
        client_id: str,
        config: ConsumerConfig,
        strategy: AllocateMessageQueueStrategy,
        consume_type: ConsumeType,
    ) -> None:
        self.group = group
        self.client_id = client_id
        self.config = config
        self.strategy = strategy
        self.consume_type = consume_type
        self.consume_orderly = False
        self.running = False  # rule 6: the consumer's service state, suspend() and assign()
        self.paused = False
        self.assigned = False
        self.pull_threshold_for_queue = config.pull_threshold_for_queue
        self.pull_threshold_size_for_queue = config.pull_threshold_size_for_queue
        self._subscriptions: dict[str, SubscriptionData] = {}
        self._topic_queues: dict[str, frozenset[MessageQueue]] = {}
        self._process_queues: dict[MessageQueue, ProcessQueue] = {}
        self.subscription_inner: Mapping[str, SubscriptionData] = MappingProxyType(self._subscriptions)
        self.topic_subscribe_info_table: Mapping[str, frozenset[MessageQueue]] = MappingProxyType(
            self._topic_queues
        )
        self.process_queue_table: Mapping[MessageQueue, ProcessQueue] = MappingProxyType(self._process_queues)

    @property
    def message_model(self) -> MessageModel:
        return self.config.message_model

    # -- rule 1: subscriptions --------------------------------------------------------------------------
    def subscribe(self, topic: str, expression: str, wall_ms: int) -> SubscriptionData:
        sub = SubscriptionData.build(topic, expression, wall_ms)
        self._subscriptions[topic] = sub
        return sub

    def unsubscribe(self, topic: str) -> None:
        self._subscriptions.pop(topic, None)

    def copy_subscription(self, wall_ms: int) -> None:
        """copySubscription: a CLUSTERING group always subscribes its retry topic."""
        if self.message_model is MessageModel.CLUSTERING:
            rt = retry_topic(self.group)
            if rt not in self._subscriptions:
                self._subscriptions[rt] = SubscriptionData.build(rt, "*", wall_ms)

    def subscriptions(self) -> list[SubscriptionData]:
        """Copies of the subscriptions in topic order, for the heartbeat."""
        return [
            SubscriptionData(
                s.topic, s.sub_string, list(s.tags_set), list(s.code_set), s.sub_version, s.expression_type
            )
            for _, s in sorted(self._subscriptions.items())
        ]

    # -- rule 2: routes ---------------------------------------------------------------------------------
    def update_topic_subscribe_info(
        self, topic: str, mqs: set[MessageQueue] | frozenset[MessageQueue]
    ) -> bool:
        """Take a topic's readable queues from a new route; True when they changed."""
        old = self._topic_queues.get(topic)
        if old is mqs or old == mqs:  # identity first: routes' queue sets are shared (subscribe_queues)
            return False
        self._topic_queues[topic] = frozenset(mqs)  # replaced, never changed in place
        return True

    def is_subscribe_topic_need_update(self, topic: str) -> bool:
        return topic in self._subscriptions and topic not in self._topic_queues

    # -- rule 3: which queues ---------------------------------------------------------------------------
    def allocate(self, topic: str, cid_all: Iterable[str]) -> tuple[list[str], set[MessageQueue]]:
        """(sorted cid_all, this client's queues of ``topic``) as the strategy divides them; the strategy's
        exceptions propagate (the round is then unbalanced)."""
        _mq_all, cids, mine = ALLOCATION_CACHE.allocate(
            self.strategy, self.group, self.client_id, self._topic_queues.get(topic, ()), cid_all
        )
        return cids, set(mine)

    def need_lock(self, is_order: bool) -> bool:
        """Whether a new queue must be locked at the broker before it is added."""
        if self.message_model is MessageModel.BROADCASTING:
            return is_order and self.config.lock_in_broadcasting
        return is_order

    def plan_rebalance(
        self, topic: str, cid_all: Iterable[str] | None, is_order: bool, now_ms: int
    ) -> RebalancePlan:
        """A round of the client's own rebalance for ``topic`` (rebalanceByTopic's decisions): CLUSTERING
        allocates the topic's queues over ``cid_all`` (``AllocationFailed`` when the strategy raises),
        BROADCASTING takes every one of them. The topic's queues must be known."""
        if self.message_model is MessageModel.BROADCASTING:
            return self._plan(topic, [self.client_id], self._topic_queues[topic], is_order, now_ms)
        assert cid_all is not None
        try:
            cids, allocated = self.allocate(topic, cid_all)
        except Exception as exc:
            raise AllocationFailed(exc) from exc
        return self._plan(topic, cids, allocated, is_order, now_ms)

    def plan_assignment(
        self, topic: str, allocated: AbstractSet[MessageQueue], is_order: bool, now_ms: int
    ) -> RebalancePlan:
        """A round for queues the broker assigned (RocketMQ 5's updateMessageQueueAssignment, PULL ones)."""
        return self._plan(topic, [], allocated, is_order, now_ms)

    def _plan(
        self,
        topic: str,
        cids: list[str],
        allocated: AbstractSet[MessageQueue],
        is_order: bool,
        now_ms: int,
    ) -> RebalancePlan:
        cfg = self.config
        drop, add, lock = plan_process_queue_table(
            topic,
            allocated,
            self._process_queues,
            now_ms=now_ms,
            pull_max_idle_ms=(
                cfg.ms(cfg.pull_max_idle_time) if self.consume_type is ConsumeType.CONSUME_PASSIVELY else None
            ),
            lock=self.need_lock(is_order),
            start=self.start_rule(topic),
        )
        return RebalancePlan(topic, cids, allocated, drop, add, lock)

    def mark_dropped(self, mq: MessageQueue) -> ProcessQueue | None:
        pq = self._process_queues.get(mq)
        if pq is not None:
            pq.dropped = True
        return pq

    def remove_process_queue(self, mq: MessageQueue, pq: ProcessQueue | None = None) -> ProcessQueue | None:
        """Take ``mq`` out of the table (only if it still holds ``pq`` when given), marked dropped."""
        current = self._process_queues.get(mq)
        if current is None or (pq is not None and current is not pq):
            return None
        del self._process_queues[mq]
        current.dropped = True
        return current

    def new_process_queue(self, now_ms: int) -> ProcessQueue:
        """A ProcessQueue for a queue about to be added, marked locked (RocketMQ >= 4.9.5; before, an
        orderly queue's pulls waited for the next lockAll to mark it: ISSUE #2621)."""
        pq = ProcessQueue(now_ms=now_ms)
        pq.locked = self.config.lock_new_process_queue
        return pq

    def add_process_queue(self, mq: MessageQueue, pq: ProcessQueue, next_offset: int) -> bool:
        """Add ``mq`` once its start offset is known; False when the offset is unusable or the queue was
        added meanwhile."""
        if next_offset < 0 or mq in self._process_queues:
            return False
        self._process_queues[mq] = pq
        return True

    def truncate_message_queue_not_my_topic(self) -> list[MessageQueue]:
        """Remove (dropped) the queues whose topic is no longer subscribed; returns them in order."""
        gone = sorted(mq for mq in self._process_queues if mq.topic not in self._subscriptions)
        for mq in gone:
            self._process_queues.pop(mq).dropped = True
        return gone

    def working_set(self, topic: str) -> set[MessageQueue]:
        """The queues of ``topic`` this client really serves: its non-dropped ProcessQueues."""
        return {mq for mq, pq in self._process_queues.items() if mq.topic == topic and not pq.dropped}

    def owned_queues(self) -> list[MessageQueue]:
        return sorted(mq for mq, pq in self._process_queues.items() if not pq.dropped)

    def destroy(self) -> list[MessageQueue]:
        """Drop every queue (shutdown); returns them in order."""
        gone = sorted(self._process_queues)
        for mq in gone:
            self._process_queues[mq].dropped = True
        self._process_queues.clear()
        return gone

    # -- where a new queue starts ----------------------------------------------------------------------
    def start_rule(self, topic: str) -> StartRule:
        """computePullFromWhere for this group's consumer type and settings, for a new queue of ``topic``."""
        cfg = self.config
        return StartRule(
            topic,
            ConsumeFromWhere(cfg.consume_from_where),
            cfg.consume_timestamp_ms(),
            lite=self.consume_type is ConsumeType.CONSUME_ACTIVELY,
        )

    # -- rule 4: after a change ------------------------------------------------------------------------
    def message_queue_changed(self, topic: str, wall_ms: int) -> None:
        """RebalancePushImpl.messageQueueChanged's state part: a new sub_version and new thresholds."""
        sub = self._subscriptions.get(topic)
        if sub is not None:
            sub.sub_version = wall_ms
        count = len(self._process_queues)
        if count:
            cfg = self.config
            self.pull_threshold_for_queue = per_queue_threshold(
                cfg.pull_threshold_for_topic, count, self.pull_threshold_for_queue
            )
            self.pull_threshold_size_for_queue = per_queue_threshold(
                cfg.pull_threshold_size_for_topic, count, self.pull_threshold_size_for_queue
            )

    def flow_control(self, pq: ProcessQueue) -> FlowControl | None:
        """pullMessage's cache checks against this group's current per-queue thresholds."""
        return flow_control_check(
            pq,
            orderly=self.consume_orderly,
            pull_threshold_for_queue=self.pull_threshold_for_queue,
            pull_threshold_size_for_queue_mib=self.pull_threshold_size_for_queue,
            consume_concurrently_max_span=self.config.consume_concurrently_max_span,
        )

    # -- rule 5: locks ---------------------------------------------------------------------------------
    def set_locked(self, mqs: Iterable[MessageQueue], locked: bool, now_ms: int) -> None:
        """Record a broker's lock answer in the process queues of ``mqs``."""
        for mq in mqs:
            pq = self._process_queues.get(mq)
            if pq is not None:
                pq.locked = locked
                if locked:
                    pq.last_lock_timestamp = now_ms

    def queues_by_broker(self, *, include_dropped: bool = False) -> list[tuple[str, set[MessageQueue]]]:
        """buildProcessQueueTableByBrokerName: the queues per broker name, in name order; dropped ones
        only with ``include_dropped`` (4.9.8 has no filter, 5.0 added it)."""
        by_name: dict[str, set[MessageQueue]] = defaultdict(set)
        for mq, pq in self._process_queues.items():
            if include_dropped or not pq.dropped:
                by_name[mq.broker_name].add(mq)
        return sorted(by_name.items())

    def orderly_release_needs_lock(self) -> bool:
        """Whether dropping ``mq`` goes through the orderly unlock (clustering, orderly listener)."""
        return self.consume_orderly and self.message_model is MessageModel.CLUSTERING

    def may_force_unlock(self, pq: ProcessQueue, now_ms: int) -> bool:
        """5.x tryRemoveOrderMessageQueue: a dropped queue is released without its consume lock once
        unlockDelayTimeMills has passed since its last lock."""
        cfg = self.config
        return pq.dropped and now_ms > pq.last_lock_timestamp + cfg.ms(cfg.unlock_delay_time_mills)


def cid_all_digest(cid_all: Iterable[str]) -> str:
    """EVENTS.md's ``cid_all_digest``: SHA-256 of the distinct ids sorted by code point, one per line."""
    return _digest(cid_all if isinstance(cid_all, frozenset) else frozenset(cid_all))


@functools.lru_cache(maxsize=64)
def _digest(members: frozenset[str]) -> str:
    # Remembered per member set: in a large group every member digests the same set after each change,
    # and sorting a thousand ids costs far more than looking the set up (a frozenset keeps its hash, and
    # the members of one view share one set: see member_set).
    return hashlib.sha256("\n".join(sorted(members)).encode("utf-8")).hexdigest()


# The member sets of the last few member lists, by identity (each list kept alive here, so its id is not
# reused). The allocation cache hands every client of a process the same sorted list for one view, so
# after a membership change a thousand clients of a simulated group would each make the set of the same
# thousand ids. Shorter lists (a broadcasting consumer's own id, a small group) are not remembered.
_MEMBERS: dict[int, tuple[list[str], frozenset[str]]] = {}
_MEMBERS_MAX = 16
_MEMBERS_FROM = 32


def member_set(cid_all: list[str]) -> frozenset[str]:
    """``frozenset(cid_all)``, shared by the clients that see the same member list object. The list must
    not change afterwards (the allocation cache's sorted lists never do)."""
    if len(cid_all) < _MEMBERS_FROM:
        return frozenset(cid_all)
    seen = _MEMBERS.get(id(cid_all))
    if seen is not None and seen[0] is cid_all:
        return seen[1]
    members = frozenset(cid_all)
    while len(_MEMBERS) >= _MEMBERS_MAX:
        del _MEMBERS[next(iter(_MEMBERS))]
    _MEMBERS[id(cid_all)] = (cid_all, members)
    return members


def rebalance_event_fields(
    cid_all: list[str],
    allocated: list[str],
    digest_over: int | None,
    members: frozenset[str] | None = None,
) -> dict[str, object]:
    """The member and allocation fields of a ``rebalance`` event: the member list, or its digest when the
    group has more than ``digest_over`` distinct members. ``members``: ``cid_all``'s set, if made already."""
    if digest_over is not None:
        if members is None:
            members = frozenset(cid_all)
        if len(members) > digest_over:
            return {"cid_all_digest": _digest(members), "allocated": allocated}
    return {"cid_all": list(cid_all), "allocated": allocated}
