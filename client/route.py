"""Topic routes from the name server and the queue views derived from them (sans-IO).

``subscribe_queues`` is RocketMQ's topicRouteData2TopicSubscribeInfo (readable queues, master or not);
``TopicPublishInfo`` is topicRouteData2TopicPublishInfo (writable queues of brokers with a master) with the
producer's round-robin index.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from rmqlab.protocol.command import field_int, field_list, field_map, field_str
from rmqlab.protocol.model import MessageQueue

PERM_READ = 4
PERM_WRITE = 2
MASTER_ID = 0


@dataclass(frozen=True, slots=True)
class BrokerData:
    """A broker name's addresses by broker id, from a topic route."""

    cluster: str
    broker_name: str
    broker_addrs: tuple[tuple[int, str], ...]  # (brokerId, addr), sorted by id

    def master_addr(self) -> str | None:
        for bid, addr in self.broker_addrs:
            if bid == MASTER_ID:
                return addr
        return None

    def select_addr(self) -> str | None:
        """BrokerData.selectBrokerAddr: the master, else any address (the first, deterministically)."""
        master = self.master_addr()
        if master is not None:
            return master
        return self.broker_addrs[0][1] if self.broker_addrs else None


# subscribe_queues' answers by (topic, readable (broker, count) pairs); bounded, as routes are few
_SUBSCRIBE_QUEUES: dict[tuple[str, tuple[tuple[str, int], ...]], frozenset[MessageQueue]] = {}
_SUBSCRIBE_QUEUES_MAX = 4096
# publish_queues' answers by (topic, writable (broker, count) pairs of brokers with a master)
_PUBLISH_QUEUES: dict[tuple[str, tuple[tuple[str, int], ...]], tuple[MessageQueue, ...]] = {}


_Queues = TypeVar("_Queues", frozenset[MessageQueue], tuple[MessageQueue, ...])


def _shared_queues(
    cache: dict[tuple[str, tuple[tuple[str, int], ...]], _Queues],
    key: tuple[str, tuple[tuple[str, int], ...]],
    make: Callable[[Iterable[MessageQueue]], _Queues],
) -> _Queues:
    """One collection of a topic's queues per (topic, (broker, count) pairs), shared by equal routes."""
    out = cache.get(key)
    if out is None:
        if len(cache) >= _SUBSCRIBE_QUEUES_MAX:
            cache.clear()
        topic, counts = key
        out = cache[key] = make(MessageQueue(topic, name, i) for name, n in counts for i in range(n))
    return out


@dataclass(frozen=True, slots=True)
class QueueData:
    """A broker's read and write queue counts and permissions for one topic."""

    broker_name: str
    read_queue_nums: int
    write_queue_nums: int
    perm: int


@dataclass(frozen=True, slots=True)
class TopicRouteData:
    """GET_ROUTEINFO_BY_TOPIC's answer: the topic's queue data and broker data."""

    broker_datas: tuple[BrokerData, ...]
    queue_datas: tuple[QueueData, ...]

    @classmethod
    def from_wire(cls, body: Any) -> TopicRouteData:
        brokers: list[BrokerData] = []
        for i, bd in enumerate(field_list(body, "brokerDatas", "route")):
            where = f"route.brokerDatas[{i}]"
            addrs_raw = field_map(bd, "brokerAddrs", where)
            addrs: list[tuple[int, str]] = []
            for key, addr in addrs_raw.items():
                try:
                    bid = int(key)
                except (TypeError, ValueError):
                    continue
                if isinstance(addr, str) and addr:
                    addrs.append((bid, addr))
            brokers.append(
                BrokerData(
                    field_str(bd, "cluster", where, ""),
                    field_str(bd, "brokerName", where),
                    tuple(sorted(addrs)),
                )
            )
        queues: list[QueueData] = []
        for i, qd in enumerate(field_list(body, "queueDatas", "route")):
            where = f"route.queueDatas[{i}]"
            queues.append(
                QueueData(
                    field_str(qd, "brokerName", where),
                    field_int(qd, "readQueueNums", where),
                    field_int(qd, "writeQueueNums", where),
                    field_int(qd, "perm", where, PERM_READ | PERM_WRITE),
                )
            )
        return cls(
            tuple(sorted(brokers, key=lambda b: b.broker_name)),
            tuple(sorted(queues, key=lambda q: q.broker_name)),
        )

    def broker(self, broker_name: str) -> BrokerData | None:
        for bd in self.broker_datas:
            if bd.broker_name == broker_name:
                return bd
        return None

    def subscribe_queues(self, topic: str) -> frozenset[MessageQueue]:
        """The readable queues (topicRouteData2TopicSubscribeInfo). Every consumer asks on every route
        poll, and the answer only changes with the route: equal routes share one frozenset, so the
        consumer's "did it change" check is an identity test instead of thousands of queue compares."""
        key = (
            topic,
            tuple((qd.broker_name, qd.read_queue_nums) for qd in self.queue_datas if qd.perm & PERM_READ),
        )
        return _shared_queues(_SUBSCRIBE_QUEUES, key, frozenset)

    def publish_queues(self, topic: str) -> tuple[MessageQueue, ...]:
        """The writable queues of brokers with a master (topicRouteData2TopicPublishInfo). Every
        producer of a client gets them on a route change, the consumers' inner producers included
        (a thousand consumers of a 4,000-queue topic built four million queues at start): equal
        routes share one tuple."""
        key = (
            topic,
            tuple(
                (qd.broker_name, qd.write_queue_nums)
                for qd in self.queue_datas
                if qd.perm & PERM_WRITE
                and (bd := self.broker(qd.broker_name)) is not None
                and bd.master_addr() is not None
            ),
        )
        return _shared_queues(_PUBLISH_QUEUES, key, tuple)


@dataclass(slots=True)
class TopicPublishInfo:
    """The producer's view of a topic: writable queues and the round-robin position."""

    topic: str
    message_queues: Sequence[MessageQueue]  # shared with equal routes' publish_queues: never changed
    route: TopicRouteData | None = None
    send_which_queue: int = field(default=0)

    def ok(self) -> bool:
        return bool(self.message_queues)

    def next_index(self) -> int:
        self.send_which_queue = (self.send_which_queue + 1) & 0x7FFFFFFF
        return self.send_which_queue

    def select_one(self, last_broker_name: str | None = None) -> MessageQueue:
        """TopicPublishInfo.selectOneMessageQueue(lastBrokerName): round robin, avoiding the broker of the
        previous failed attempt when another one exists."""
        n = len(self.message_queues)
        if last_broker_name is not None:
            for _ in range(n):
                mq = self.message_queues[self.next_index() % n]
                if mq.broker_name != last_broker_name:
                    return mq
        return self.message_queues[self.next_index() % n]
