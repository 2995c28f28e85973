"""Topic routes as the name server answers GET_ROUTEINFO_BY_TOPIC, one definition for every role (sans-IO).

``TopicRouteData``, ``BrokerData`` and ``QueueData`` are RocketMQ's route types: the name server builds
its answer from them (``to_wire``), and the client, the broker (server-side assignment) and the proxy
read it back (``from_wire``). ``subscribe_queues`` is RocketMQ's topicRouteData2TopicSubscribeInfo
(readable queues, master or not), ``publish_queues`` the queues of topicRouteData2TopicPublishInfo
(writable queues of brokers with a master).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from rmqlab.protocol.command import field_int, field_list, field_map, field_str
from rmqlab.protocol.model import MessageQueue

PERM_READ = 4
PERM_WRITE = 2
MASTER_ID = 0

Addrs = tuple[tuple[int, str], ...]
"""(broker id, address) pairs sorted by id: a broker name's addresses, hashable and frozen."""


def _addrs_from_wire(raw: dict[Any, Any]) -> Addrs:
    """A ``brokerAddrs`` map: ids that are not integers and addresses that are not strings are left out."""
    addrs: list[tuple[int, str]] = []
    for key, addr in raw.items():
        try:
            bid = int(key)
        except (TypeError, ValueError):
            continue
        if isinstance(addr, str) and addr:
            addrs.append((bid, addr))
    return tuple(sorted(addrs))


def _addrs_to_wire(addrs: Addrs) -> dict[str, str]:
    return {str(bid): addr for bid, addr in addrs}


@dataclass(frozen=True, slots=True)
class BrokerData:
    """A broker name's cluster and addresses by broker id, from a topic route.

    ``native_addrs`` are the brokers' RocketMQ-native ports (``nativeAddrs``, for real clients; absent
    when none is open). They do not take part in equality: our clients never connect to them, so a route
    that differs only there is the same route to them (the native codec reads them from the wire)."""

    cluster: str
    broker_name: str
    broker_addrs: Addrs = ()
    native_addrs: Addrs = field(default=(), compare=False)

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

    def to_wire(self) -> dict[str, Any]:
        wire: dict[str, Any] = {
            "cluster": self.cluster,
            "brokerName": self.broker_name,
            "brokerAddrs": _addrs_to_wire(self.broker_addrs),
        }
        if self.native_addrs:
            wire["nativeAddrs"] = _addrs_to_wire(self.native_addrs)
        return wire

    @classmethod
    def from_wire(cls, body: Any, where: str = "brokerData") -> BrokerData:
        addrs = _addrs_from_wire(field_map(body, "brokerAddrs", where))
        native = body.get("nativeAddrs")  # optional, and skipped when malformed: only real clients use it
        return cls(
            field_str(body, "cluster", where, ""),
            field_str(body, "brokerName", where),
            addrs,
            _addrs_from_wire(native) if isinstance(native, dict) else (),
        )


@dataclass(frozen=True, slots=True)
class QueueData:
    """A broker's read and write queue counts and permissions for one topic."""

    broker_name: str
    read_queue_nums: int
    write_queue_nums: int
    perm: int

    def to_wire(self) -> dict[str, Any]:
        return {
            "brokerName": self.broker_name,
            "readQueueNums": self.read_queue_nums,
            "writeQueueNums": self.write_queue_nums,
            "perm": self.perm,
        }

    @classmethod
    def from_wire(cls, body: Any, where: str = "queueData") -> QueueData:
        return cls(
            field_str(body, "brokerName", where),
            field_int(body, "readQueueNums", where),
            field_int(body, "writeQueueNums", where),
            field_int(body, "perm", where, PERM_READ | PERM_WRITE),
        )


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
class FindBrokerResult:
    """MQClientInstance's FindBrokerResult: an address and whether it is a slave's."""

    broker_addr: str
    slave: bool


def find_broker_in_subscribe(
    addrs: dict[int, str] | None, broker_id: int, only_this_broker: bool
) -> FindBrokerResult | None:
    """MQClientInstance#findBrokerAddressInSubscribe (4.9.8): ``broker_id``'s address; for a slave id that
    is missing, the next id's; then, unless ``only_this_broker``, the first entry of the table (the lowest
    id: Java's HashMap of small Long keys iterates in key order)."""
    if not addrs:
        return None
    addr = addrs.get(broker_id)
    slave = broker_id != MASTER_ID
    if addr is None and slave:
        addr = addrs.get(broker_id + 1)
    if addr is None:
        if only_this_broker:
            return None
        first = min(addrs)
        addr, slave = addrs[first], first != MASTER_ID
    return FindBrokerResult(addr, slave)


@dataclass(frozen=True, slots=True)
class TopicRouteData:
    """GET_ROUTEINFO_BY_TOPIC's answer: the topic's queue data and broker data."""

    broker_datas: tuple[BrokerData, ...]
    queue_datas: tuple[QueueData, ...]

    @classmethod
    def from_wire(cls, body: Any) -> TopicRouteData:
        """The route in a GET_ROUTEINFO_BY_TOPIC body, brokers and queues in broker-name order;
        ``InvalidParameter`` naming the field when a required one is missing or mistyped."""
        brokers = [
            BrokerData.from_wire(bd, f"route.brokerDatas[{i}]")
            for i, bd in enumerate(field_list(body, "brokerDatas", "route"))
        ]
        queues = [
            QueueData.from_wire(qd, f"route.queueDatas[{i}]")
            for i, qd in enumerate(field_list(body, "queueDatas", "route"))
        ]
        return cls(
            tuple(sorted(brokers, key=lambda b: b.broker_name)),
            tuple(sorted(queues, key=lambda q: q.broker_name)),
        )

    def to_wire(self) -> dict[str, Any]:
        return {
            "brokerDatas": [bd.to_wire() for bd in self.broker_datas],
            "queueDatas": [qd.to_wire() for qd in self.queue_datas],
        }

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
