"""RocketMQ's queue allocation strategies, returning exactly what the Java classes return.

Every consumer of a group computes its own share from the same sorted ``mq_all`` and ``cid_all``; if two
implementations differ by one queue, that queue is consumed twice or not at all. The classes below therefore
follow ``org.apache.rocketmq.client.consumer.rebalance`` queue for queue and in the same order, including the
odd cases (fewer queues than consumers, a client missing from ``cid_all`` → empty list, duplicate ids,
consistent-hash collisions where the later ring entry wins, zero virtual nodes).

Where RocketMQ throws IllegalArgumentException (or NullPointerException for a missing argument) these
raise ``ValueError`` with a clear message.

Both roles run them: the client divides a topic's queues itself (RebalanceImpl), and RocketMQ 5's broker
divides them for a client that asks (QUERY_ASSIGNMENT names the strategy on the wire, and the answer must be
the split the client would have made). So they live here, below both, as the route types do.
"""

from __future__ import annotations

import bisect
import hashlib
import operator
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from rmqlab.protocol.model import MQ_ORDER, MessageQueue

__all__ = [
    "ALLOCATION_CACHE",
    "DEFAULT_VIRTUAL_NODE_CNT",
    "STRATEGY_NAMES",
    "AllocateMachineRoomNearby",
    "AllocateMessageQueueAveragely",
    "AllocateMessageQueueAveragelyByCircle",
    "AllocateMessageQueueByConfig",
    "AllocateMessageQueueByMachineRoom",
    "AllocateMessageQueueConsistentHash",
    "AllocateMessageQueueStrategy",
    "AllocationCache",
    "HashFunction",
    "MachineRoomResolver",
    "PrefixMachineRoomResolver",
    "StaticMachineRoomResolver",
    "allocate_all",
    "get_strategy",
    "java_split",
    "java_string_key",
    "md5_hash",
    "mq_sort_key",
    "mq_to_string",
    "sort_cid_all",
    "sort_mq_all",
]

DEFAULT_VIRTUAL_NODE_CNT = 10
_LONG_MIN = -(1 << 63)
_LONG_MAX = (1 << 63) - 1


# ---------------------------------------------------------------------------------------------------------
# Java semantics the strategies depend on


def java_string_key(s: str) -> bytes:
    """Sort key giving Java's ``String.compareTo`` order (UTF-16 code units).

    Python compares code points, which differs from Java for characters outside the BMP; big-endian
    UTF-16 bytes compare exactly like Java's code units (lone surrogates pass through as Java keeps them).
    """
    return s.encode("utf-16-be", "surrogatepass")


_TOPIC = operator.attrgetter("topic")
_BROKER = operator.attrgetter("broker_name")
_QUEUE_ID = operator.attrgetter("queue_id")


def mq_sort_key(mq: MessageQueue) -> tuple[bytes, bytes, int]:
    """``MessageQueue.compareTo``: topic, then broker name (Java string order), then queue id."""
    return (java_string_key(mq.topic), java_string_key(mq.broker_name), mq.queue_id)


def sort_mq_all(mq_all: Iterable[MessageQueue]) -> list[MessageQueue]:
    """``mq_all`` sorted as RebalanceImpl sorts it before allocating."""
    items = list(mq_all)
    _check_mqs(items, "mq_all")
    names = {*map(_TOPIC, items), *map(_BROKER, items)}
    if all(n.isascii() or max(n) <= "\uffff" for n in names):
        # Without characters beyond the BMP, code point order is Java's UTF-16 order: the key can be
        # the fields themselves, compared in C
        return sorted(items, key=MQ_ORDER)
    return sorted(items, key=mq_sort_key)


def sort_cid_all(cid_all: Iterable[str]) -> list[str]:
    """``cid_all`` sorted as RebalanceImpl sorts it (Java string order); duplicates are kept."""
    items = list(cid_all)
    _check_cids(items, "cid_all")
    return sorted(items, key=java_string_key)


def java_split(s: str, sep: str) -> list[str]:
    """Java's ``String.split`` for a literal one-character separator: trailing empty parts are dropped.

    ``"a@"`` → ``["a"]``, ``"@"`` → ``[]``, ``"@b"`` → ``["", "b"]``, and ``""`` → ``[""]`` (no match
    keeps the input).
    """
    if sep not in s:
        return [s]
    parts = s.split(sep)
    while parts and parts[-1] == "":
        parts.pop()
    return parts


def mq_to_string(mq: MessageQueue) -> str:
    """``MessageQueue.toString()``, the key the consistent-hash strategy routes by."""
    return f"MessageQueue [topic={mq.topic}, brokerName={mq.broker_name}, queueId={mq.queue_id}]"


def md5_hash(key: str) -> int:
    """RocketMQ's default ring hash: the first 4 bytes of MD5(UTF-8 key) as an unsigned big-endian int.

    Java encodes an unpaired surrogate as ``?``; ``errors="replace"`` does the same.
    """
    digest = hashlib.md5(key.encode("utf-8", "replace"), usedforsecurity=False).digest()
    return int.from_bytes(digest[:4], "big")


# ---------------------------------------------------------------------------------------------------------
# Interfaces


@runtime_checkable
class AllocateMessageQueueStrategy(Protocol):
    """RocketMQ's AllocateMessageQueueStrategy: ``name`` is ``getName()``."""

    @property
    def name(self) -> str: ...

    def allocate(
        self,
        consumer_group: str,
        current_cid: str,
        mq_all: Sequence[MessageQueue],
        cid_all: Sequence[str],
    ) -> list[MessageQueue] | None: ...  # None: Java's null (CONFIG without a list)


@runtime_checkable
class MachineRoomResolver(Protocol):
    """Tells AllocateMachineRoomNearby which room a broker's queue and a client are deployed in."""

    def broker_deploy_in(self, mq: MessageQueue) -> str: ...

    def consumer_deploy_in(self, client_id: str) -> str: ...


@runtime_checkable
class HashFunction(Protocol):
    """A custom ring hash for AllocateMessageQueueConsistentHash (Java's ``long hash(String)``)."""

    def hash(self, key: str) -> int: ...


# ---------------------------------------------------------------------------------------------------------
# Argument checks


def _check_mqs(mqs: Sequence[Any], what: str) -> None:
    # The common case checked by type in C (a list of thousands is checked once per view of a group);
    # anything else, subclasses included, takes the loop below, which names the first bad element.
    if (
        set(map(type, mqs)) <= {MessageQueue}
        and set(map(type, map(_TOPIC, mqs))) <= {str}
        and set(map(type, map(_BROKER, mqs))) <= {str}
        and set(map(type, map(_QUEUE_ID, mqs))) <= {int}
    ):
        return
    for i, mq in enumerate(mqs):
        if not isinstance(mq, MessageQueue):
            raise ValueError(f"{what}[{i}] is not a MessageQueue: {mq!r}")
        # the dataclass does not check its fields; sorting and hashing need these types
        if not isinstance(mq.topic, str) or not isinstance(mq.broker_name, str):
            raise ValueError(f"{what}[{i}] needs string topic and broker name: {mq!r}")
        if isinstance(mq.queue_id, bool) or not isinstance(mq.queue_id, int):
            raise ValueError(f"{what}[{i}] needs an int queue id: {mq!r}")


def _check_cids(cids: Sequence[Any], what: str) -> None:
    for i, cid in enumerate(cids):
        if not isinstance(cid, str):
            raise ValueError(f"{what}[{i}] is not a client id string: {cid!r}")


def _as_sequence(value: Any, what: str) -> Sequence[Any]:
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise ValueError(f"{what} must be a list, got {type(value).__name__}")
    return value


class _AbstractStrategy:
    """AbstractAllocateMessageQueueStrategy: the common argument check."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"

    @staticmethod
    def _check(current_cid: Any, mq_all: Any, cid_all: Any) -> bool:
        """Raise for bad arguments; False when ``current_cid`` is not in ``cid_all`` (RocketMQ logs a bug)."""
        if current_cid is None or current_cid == "":
            raise ValueError("currentCID is empty")
        if not isinstance(current_cid, str):
            raise ValueError(f"currentCID must be a string, got {type(current_cid).__name__}")
        if mq_all is None or (isinstance(mq_all, Sequence) and len(mq_all) == 0):
            raise ValueError("mqAll is null or mqAll empty")
        _check_mqs(_as_sequence(mq_all, "mqAll"), "mqAll")
        if cid_all is None or (isinstance(cid_all, Sequence) and len(cid_all) == 0):
            raise ValueError("cidAll is null or cidAll empty")
        _check_cids(_as_sequence(cid_all, "cidAll"), "cidAll")
        return current_cid in cid_all


class _SharingStrategy(_AbstractStrategy):
    """A strategy whose share depends only on the client's index among the sorted ids (AVG, AVG_BY_CIRCLE):
    ``share`` answers for an index, so a whole group's allocation can be computed in one pass."""

    def allocate(
        self,
        consumer_group: str,
        current_cid: str,
        mq_all: Sequence[MessageQueue],
        cid_all: Sequence[str],
    ) -> list[MessageQueue]:
        if not self._check(current_cid, mq_all, cid_all):
            return []
        return self.share(list(cid_all).index(current_cid), mq_all, len(cid_all))

    @staticmethod
    def share(index: int, mq_all: Sequence[MessageQueue], c: int) -> list[MessageQueue]:
        """The queues of the client at ``index`` of ``c`` sorted ids, the arguments already checked."""
        raise NotImplementedError


class AllocateMessageQueueAveragely(_SharingStrategy):
    """AVG: contiguous blocks; the first ``len(mq_all) % len(cid_all)`` clients get one extra queue."""

    name = "AVG"

    @staticmethod
    def share(index: int, mq_all: Sequence[MessageQueue], c: int) -> list[MessageQueue]:
        """The queues of the client at ``index`` of ``c`` sorted ids, the arguments already checked."""
        n = len(mq_all)
        mod = n % c
        bigger = mod > 0 and index < mod
        if n <= c:  # noqa: SIM108 - kept in RocketMQ's shape
            average = 1
        else:
            average = n // c + 1 if bigger else n // c
        start = index * average if bigger else index * average + mod
        count = min(average, n - start)
        return [mq_all[start + i] for i in range(count)]


class AllocateMessageQueueAveragelyByCircle(_SharingStrategy):
    """AVG_BY_CIRCLE: round robin, client ``i`` gets queues ``i, i + n, i + 2n, ...``."""

    name = "AVG_BY_CIRCLE"

    @staticmethod
    def share(index: int, mq_all: Sequence[MessageQueue], c: int) -> list[MessageQueue]:
        """The queues of the client at ``index`` of ``c`` sorted ids, the arguments already checked."""
        return [mq_all[i] for i in range(index, len(mq_all), c)]


class AllocateMessageQueueByConfig(_AbstractStrategy):
    """CONFIG: every client gets the configured list, whatever the group (RocketMQ does no check here).

    Without a list (Java's ``new AllocateMessageQueueByConfig()`` before ``setMessageQueueList``) every
    client gets None, Java's null, which RebalanceImpl reads as "nothing allocated".
    """

    name = "CONFIG"

    def __init__(self, message_queue_list: Sequence[MessageQueue] | None = None) -> None:
        self.message_queue_list: tuple[MessageQueue, ...] | None = None
        if message_queue_list is not None:
            items = list(_as_sequence(message_queue_list, "message_queue_list"))
            _check_mqs(items, "message_queue_list")
            self.message_queue_list = tuple(items)

    def __repr__(self) -> str:
        if self.message_queue_list is None:
            return "AllocateMessageQueueByConfig(None)"
        return f"AllocateMessageQueueByConfig({[mq.short for mq in self.message_queue_list]!r})"

    def allocate(
        self,
        consumer_group: str,
        current_cid: str,
        mq_all: Sequence[MessageQueue],
        cid_all: Sequence[str],
    ) -> list[MessageQueue] | None:
        return None if self.message_queue_list is None else list(self.message_queue_list)


class AllocateMessageQueueByMachineRoom(_AbstractStrategy):
    """MACHINE_ROOM: only brokers named ``room@broker`` whose room is in ``consumer_idcs`` are shared out.

    The broker name is split like Java's ``split("@")`` (trailing empty parts dropped) and must give exactly
    two parts, so ``"room@broker@"`` counts and ``"room@"`` or ``"a@b@c"`` do not. Each client gets a block of
    ``len(selected) // len(cid_all)`` queues, and the first ``len(selected) % len(cid_all)`` clients one more
    from the tail.
    """

    name = "MACHINE_ROOM"

    def __init__(self, consumer_idcs: Iterable[str] | None = None) -> None:
        self.consumer_idcs: frozenset[str] | None = None
        if consumer_idcs is None:
            return  # Java's unset consumeridcs: fine until a broker name needs the room set
        if isinstance(consumer_idcs, (str, bytes)) or not isinstance(consumer_idcs, Iterable):
            raise ValueError("consumer_idcs must be a collection of room names, not a single string")
        idcs = list(consumer_idcs)
        for room in idcs:
            if not isinstance(room, str):
                raise ValueError(f"consumer_idcs holds a non-string room {room!r}")
        self.consumer_idcs = frozenset(idcs)

    def __repr__(self) -> str:
        rooms = None if self.consumer_idcs is None else sorted(self.consumer_idcs)
        return f"AllocateMessageQueueByMachineRoom({rooms!r})"

    def allocate(
        self,
        consumer_group: str,
        current_cid: str,
        mq_all: Sequence[MessageQueue],
        cid_all: Sequence[str],
    ) -> list[MessageQueue]:
        if not self._check(current_cid, mq_all, cid_all):
            return []
        index = list(cid_all).index(current_cid)
        selected = []
        for mq in mq_all:
            parts = java_split(mq.broker_name, "@")
            if len(parts) != 2:
                continue
            if self.consumer_idcs is None:
                # Java: consumeridcs.contains(...) on a null set, a NullPointerException
                raise ValueError(f"consumeridcs is null (needed for broker {mq.broker_name!r})")
            if parts[0] in self.consumer_idcs:
                selected.append(mq)
        c = len(cid_all)
        block, rem = divmod(len(selected), c)
        start = block * index
        result = selected[start : start + block]
        if rem > index:
            result.append(selected[index + block * c])
        return result


class AllocateMachineRoomNearby(_AbstractStrategy):
    """MACHINE_ROOM_NEARBY-<inner>: a room's queues go to the clients of that room; the queues of rooms
    without any client are shared by all clients, one inner allocation per room.

    Rooms are visited in Java string order (RocketMQ's TreeMap). The resolver must answer a non-empty
    string for every queue and client; anything else is a ``ValueError``.
    """

    def __init__(self, strategy: AllocateMessageQueueStrategy, resolver: MachineRoomResolver) -> None:
        if strategy is None:
            raise ValueError("allocateMessageQueueStrategy is null")
        if resolver is None:
            raise ValueError("machineRoomResolver is null")
        if not callable(getattr(strategy, "allocate", None)) or not isinstance(
            getattr(strategy, "name", None), str
        ):
            raise ValueError(f"inner strategy {strategy!r} has no allocate() and name")
        if not callable(getattr(resolver, "broker_deploy_in", None)) or not callable(
            getattr(resolver, "consumer_deploy_in", None)
        ):
            raise ValueError(f"resolver {resolver!r} needs broker_deploy_in(mq) and consumer_deploy_in(cid)")
        self.strategy = strategy
        self.resolver = resolver

    @property
    def name(self) -> str:
        return f"MACHINE_ROOM_NEARBY-{self.strategy.name}"

    def __repr__(self) -> str:
        return f"AllocateMachineRoomNearby({self.strategy!r}, {self.resolver!r})"

    @staticmethod
    def _room(value: Any, what: str) -> str:
        if not isinstance(value, str) or value == "":
            shown = "empty" if value == "" else ("null" if value is None else f"not a string ({value!r})")
            raise ValueError(f"Machine room is {shown} for {what}")
        return value

    def allocate(
        self,
        consumer_group: str,
        current_cid: str,
        mq_all: Sequence[MessageQueue],
        cid_all: Sequence[str],
    ) -> list[MessageQueue]:
        if not self._check(current_cid, mq_all, cid_all):
            return []
        mr2mq: dict[str, list[MessageQueue]] = {}
        for mq in mq_all:
            room = self._room(self.resolver.broker_deploy_in(mq), f"mq {mq_to_string(mq)}")
            mr2mq.setdefault(room, []).append(mq)
        mr2c: dict[str, list[str]] = {}
        for cid in cid_all:
            room = self._room(self.resolver.consumer_deploy_in(cid), f"consumer id {cid}")
            mr2c.setdefault(room, []).append(cid)

        result: list[MessageQueue] = []
        my_room = self._room(self.resolver.consumer_deploy_in(current_cid), f"consumer id {current_cid}")
        mine = mr2mq.pop(my_room, None)
        if mine:
            # RocketMQ passes the room's client list as is; a resolver answering differently for the same id
            # leaves it missing (Java then gets null and the inner check rejects it).
            result.extend(self.strategy.allocate(consumer_group, current_cid, mine, mr2c.get(my_room, [])))
        for room in sorted(mr2mq, key=java_string_key):
            if room not in mr2c:  # no client in that room: every client shares its queues
                result.extend(self.strategy.allocate(consumer_group, current_cid, mr2mq[room], cid_all))
        return result


class AllocateMessageQueueConsistentHash(_AbstractStrategy):
    """CONSISTENT_HASH: a ring of ``virtual_node_cnt`` virtual nodes per client, rebuilt at every call.

    Virtual node keys are ``f"{cid}-{replica}"``; a repeated client id continues the replica numbering after
    the entries it already owns on the ring. Clients are added in ``cid_all`` order and a hash collision
    replaces the earlier entry. A queue goes to the first ring entry whose hash is ``>=`` the hash of its
    ``toString()`` (wrapping to the lowest); with 0 virtual nodes nobody gets anything.
    """

    name = "CONSISTENT_HASH"

    def __init__(
        self,
        virtual_node_cnt: int = DEFAULT_VIRTUAL_NODE_CNT,
        hash_function: HashFunction | Callable[[str], int] | None = None,
    ) -> None:
        if isinstance(virtual_node_cnt, bool) or not isinstance(virtual_node_cnt, int):
            raise ValueError(f"virtual_node_cnt must be an int, got {virtual_node_cnt!r}")
        if virtual_node_cnt < 0:
            raise ValueError(f"illegal virtualNodeCnt :{virtual_node_cnt}")
        if hash_function is None:
            self._hash: Callable[[str], int] = md5_hash
        elif callable(getattr(hash_function, "hash", None)):
            self._hash = hash_function.hash  # type: ignore[union-attr]
        elif callable(hash_function):
            self._hash = hash_function
        else:
            raise ValueError(f"hash_function {hash_function!r} has no hash(key) method")
        self.virtual_node_cnt = virtual_node_cnt
        self.hash_function = hash_function

    def __repr__(self) -> str:
        extra = "" if self.hash_function is None else f", {self.hash_function!r}"
        return f"AllocateMessageQueueConsistentHash({self.virtual_node_cnt}{extra})"

    def _hash_of(self, key: str) -> int:
        h = self._hash(key)
        # Java's HashFunction returns a long; anything else cannot be placed on the ring.
        if isinstance(h, bool) or not isinstance(h, int) or not _LONG_MIN <= h <= _LONG_MAX:
            raise ValueError(f"hash function returned {h!r} for {key!r}; expected a signed 64-bit int")
        return h

    def ring(self, cid_all: Sequence[str]) -> dict[int, str]:
        """The ring as ``{hash: client id}`` after adding ``cid_all`` in order (ConsistentHashRouter)."""
        ring: dict[int, str] = {}
        owned: dict[str, int] = {}
        for cid in cid_all:
            existing = owned.get(cid, 0)
            for i in range(self.virtual_node_cnt):
                h = self._hash_of(f"{cid}-{i + existing}")
                previous = ring.get(h)
                if previous is not None:
                    owned[previous] -= 1
                ring[h] = cid
                owned[cid] = owned.get(cid, 0) + 1
        return ring

    def allocate(
        self,
        consumer_group: str,
        current_cid: str,
        mq_all: Sequence[MessageQueue],
        cid_all: Sequence[str],
    ) -> list[MessageQueue]:
        if not self._check(current_cid, mq_all, cid_all):
            return []
        return [
            mq for mq, owner in zip(mq_all, self.route(mq_all, cid_all), strict=True) if owner == current_cid
        ]

    def route(self, mq_all: Sequence[MessageQueue], cid_all: Sequence[str]) -> list[str | None]:
        """The owner of each queue (None for all when the ring is empty); the same for every client."""
        ring = self.ring(cid_all)
        if not ring:
            return [None] * len(mq_all)
        keys = sorted(ring)
        owners: list[str | None] = []
        for mq in mq_all:
            pos = bisect.bisect_left(keys, self._hash_of(mq_to_string(mq)))  # tailMap is inclusive
            owners.append(ring[keys[pos] if pos < len(keys) else keys[0]])
        return owners


# ---------------------------------------------------------------------------------------------------------
# Machine room resolvers


class PrefixMachineRoomResolver:
    """Default resolver: the room is the text before the first ``'@'`` or ``'-'``, whichever comes first.

    ``"room1@broker-a"`` → ``room1``, ``"IDC1-brokerName"`` → ``IDC1``, ``"IDC1-CID-0"`` → ``IDC1``; a name
    with neither character is its own room. A name starting with one of them resolves to ``""``, which the
    strategy rejects with ``ValueError``. Note that a RocketMQ client id ``ip@instance`` resolves to its ip.
    """

    separators = ("@", "-")

    @classmethod
    def room_of(cls, name: str) -> str:
        cut = len(name)
        for sep in cls.separators:
            pos = name.find(sep)
            if pos >= 0:
                cut = min(cut, pos)
        return name[:cut]

    def broker_deploy_in(self, mq: MessageQueue) -> str:
        return self.room_of(mq.broker_name)

    def consumer_deploy_in(self, client_id: str) -> str:
        return self.room_of(client_id)

    def __repr__(self) -> str:
        return "PrefixMachineRoomResolver()"


class StaticMachineRoomResolver:
    """A resolver from explicit maps: broker name → room and client id → room (``""`` when unknown)."""

    def __init__(self, broker_rooms: Mapping[str, str], consumer_rooms: Mapping[str, str]) -> None:
        self.broker_rooms = dict(broker_rooms)
        self.consumer_rooms = dict(consumer_rooms)

    def broker_deploy_in(self, mq: MessageQueue) -> str:
        return self.broker_rooms.get(mq.broker_name, "")

    def consumer_deploy_in(self, client_id: str) -> str:
        return self.consumer_rooms.get(client_id, "")

    def __repr__(self) -> str:
        return f"StaticMachineRoomResolver({self.broker_rooms!r}, {self.consumer_rooms!r})"


# ---------------------------------------------------------------------------------------------------------
# Registry

STRATEGY_NAMES: tuple[str, ...] = (
    "AVG",
    "AVG_BY_CIRCLE",
    "CONSISTENT_HASH",
    "CONFIG",
    "MACHINE_ROOM",
    "MACHINE_ROOM_NEARBY",
)

_NEARBY = "MACHINE_ROOM_NEARBY"


def _no_options(name: str, options: Mapping[str, Any]) -> None:
    if options:
        raise ValueError(f"strategy {name} takes no options, got {', '.join(sorted(options))}")


def _pop_options(name: str, options: dict[str, Any], allowed: tuple[str, ...]) -> dict[str, Any]:
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise ValueError(
            f"strategy {name} does not take {', '.join(unknown)} (options: {', '.join(allowed) or 'none'})"
        )
    return options


def get_strategy(name: str, **options: Any) -> AllocateMessageQueueStrategy:
    """A strategy by its RocketMQ name (case-insensitive).

    Options: ``CONSISTENT_HASH``: ``virtual_node_cnt`` (default 10), ``hash_function``;
    ``CONFIG``: ``message_queue_list``; ``MACHINE_ROOM``: ``consumer_idcs`` (without them these answer as
    Java's unconfigured classes do);
    ``MACHINE_ROOM_NEARBY``: ``inner`` (a name or a strategy, default ``"AVG"``;
    ``"MACHINE_ROOM_NEARBY-<inner>"`` names it too), ``resolver`` (default
    :class:`PrefixMachineRoomResolver`); any other option goes to the inner strategy.
    """
    if not isinstance(name, str):
        raise ValueError(f"strategy name must be a string, got {name!r}")
    key = name.strip().upper()
    if key.startswith(_NEARBY + "-"):
        if "inner" in options:
            raise ValueError(f"{name!r} already names the inner strategy; do not pass inner= as well")
        options = {**options, "inner": key[len(_NEARBY) + 1 :]}
        key = _NEARBY
    if key == "AVG":
        _no_options(key, options)
        return AllocateMessageQueueAveragely()
    if key == "AVG_BY_CIRCLE":
        _no_options(key, options)
        return AllocateMessageQueueAveragelyByCircle()
    if key == "CONSISTENT_HASH":
        opts = _pop_options(key, options, ("virtual_node_cnt", "hash_function"))
        return AllocateMessageQueueConsistentHash(
            opts.get("virtual_node_cnt", DEFAULT_VIRTUAL_NODE_CNT), opts.get("hash_function")
        )
    if key == "CONFIG":
        opts = _pop_options(key, options, ("message_queue_list",))
        return AllocateMessageQueueByConfig(opts.get("message_queue_list"))
    if key == "MACHINE_ROOM":
        opts = _pop_options(key, options, ("consumer_idcs",))
        return AllocateMessageQueueByMachineRoom(opts.get("consumer_idcs"))
    if key == _NEARBY:
        rest = dict(options)
        inner = rest.pop("inner", "AVG")
        resolver = rest.pop("resolver", None) or PrefixMachineRoomResolver()
        if isinstance(inner, str):
            if inner.strip().upper().startswith(_NEARBY):
                raise ValueError("MACHINE_ROOM_NEARBY cannot wrap itself")
            inner_strategy = get_strategy(inner, **rest)
        else:
            _no_options(f"{_NEARBY} with a strategy instance", rest)
            inner_strategy = inner
        return AllocateMachineRoomNearby(inner_strategy, resolver)
    raise ValueError(f"unknown allocation strategy {name!r}; known: {', '.join(STRATEGY_NAMES)}")


def allocate_all(
    strategy: AllocateMessageQueueStrategy,
    group: str,
    mq_all: Iterable[MessageQueue],
    cid_all: Iterable[str],
) -> dict[str, list[MessageQueue] | None]:
    """What every client of the group gets, each computed as RebalanceImpl does on that client.

    ``mq_all`` and ``cid_all`` are sorted first (MessageQueue.compareTo and String order). The keys follow the
    sorted ``cid_all``; a repeated id appears once. Raises ``ValueError`` for an empty ``mq_all`` or
    ``cid_all`` for every strategy (RocketMQ's throw there and the round is skipped).
    """
    mqs = sort_mq_all(mq_all)
    cids = sort_cid_all(cid_all)
    # checked here too, so that every strategy (CONFIG does no check) answers alike
    if not mqs:
        raise ValueError("mqAll is null or mqAll empty")
    if not cids:
        raise ValueError("cidAll is null or cidAll empty")
    if type(strategy) is AllocateMessageQueueConsistentHash:
        # the ring does not depend on the calling client: build it once instead of once per client
        strategy._check(cids[0], mqs, cids)
        shares: dict[str, list[MessageQueue]] = {cid: [] for cid in cids}
        for mq, owner in zip(mqs, strategy.route(mqs, cids), strict=True):
            if owner is not None:
                shares[owner].append(mq)
        return shares
    return {cid: strategy.allocate(group, cid, mqs, cids) for cid in dict.fromkeys(cids)}


# ---------------------------------------------------------------------------------------------------------
# Remembering allocations


def _cache_key(strategy: AllocateMessageQueueStrategy) -> tuple[Any, ...] | None:
    """What makes two strategy objects decide alike; None for the ones that carry user objects."""
    kind = type(strategy)
    if kind in (AllocateMessageQueueAveragely, AllocateMessageQueueAveragelyByCircle):
        return (kind.__name__,)
    if kind is AllocateMessageQueueConsistentHash and strategy.hash_function is None:  # type: ignore[attr-defined]
        return (kind.__name__, strategy.virtual_node_cnt)  # type: ignore[attr-defined]
    return None


_RECENT_MEMBERS = 4  # member lists an AllocationCache compares before making a key


class _Members(tuple):  # type: ignore[type-arg]
    """A member list in a cache key: a tuple whose hash is computed once. Every client looks its view up
    each round (twice: the LRU order), and at a thousand members hashing the ids again each time cost
    more than the rest of the lookup. Equal to, and hashed as, the plain tuple of its ids."""

    _hash: int

    def __new__(cls, cid_all: Iterable[str]) -> _Members:
        self = super().__new__(cls, cid_all)
        self._hash = tuple.__hash__(self)
        return self

    def __hash__(self) -> int:
        return self._hash


class _Entry:
    __slots__ = ("by_cid", "cids", "index", "mq_all", "owners")

    def __init__(self, mq_all: list[MessageQueue], cids: list[str]) -> None:
        self.mq_all = mq_all
        self.cids = cids
        self.by_cid: dict[str, list[MessageQueue]] = {}
        self.owners: list[str | None] | None = None
        # Each id's first position in the sorted list (list.index's answer), built by the first client
        # of the group whose call the strategy checked in full: the queue list is the same for the
        # others, so checking every queue again per client would make a round quadratic.
        self.index: dict[str, int] | None = None


class AllocationCache:
    """Allocations remembered by (strategy, mq_all, cid_all), so a round whose route and members did not
    change sorts nothing and allocates nothing again, and clients of one process with the same view share
    the work (the consistent-hash ring is built once, not once per client). The answers are the strategy's
    own: a miss calls it exactly as RebalanceImpl would.
    """

    def __init__(self, max_entries: int = 32, max_views: int = 4096) -> None:
        self.max_entries = max_entries
        self._entries: dict[tuple[Any, ...], _Entry] = {}
        self.hits = 0
        self.misses = 0
        # Finding an entry compares queue sets, and MessageQueue's equality runs in Python: thousands of
        # calls per lookup at 4,000 queues. Each client keeps its queue set (a frozenset, replaced on a
        # route change) between rounds, so the set object seen before maps to one shared equal set
        # (kept alive here, so its id is not reused) and the entry is then found by identity.
        self.max_views = max_views
        self._views: dict[int, tuple[frozenset[MessageQueue], frozenset[MessageQueue]]] = {}
        self._shared: dict[frozenset[MessageQueue], frozenset[MessageQueue]] = {}
        # The sorted list of each shared queue set: a group whose members change (a rolling start, a
        # kill) makes a new entry per member list, and sorting 4,000 queues again for each was most of
        # a miss. Keyed by the shared set, whose identity makes the lookup cheap.
        self._sorted: dict[frozenset[MessageQueue], list[MessageQueue]] = {}
        # The member lists of the last lookups, each as a private copy and as its key, newest first: the
        # clients of a process ask with equal lists (each its own answer from a broker, every broker
        # with its own order), and comparing a list with a copy (the same id strings, in a simulation)
        # costs less than making and hashing a tuple of it.
        self._recent_members: list[tuple[list[str], _Members]] = []
        # the entries by (strategy, queue set, sorted member list): see allocate
        self._views_by_members: dict[tuple[Any, ...], _Entry] = {}

    def _members(self, cid_all: Iterable[str]) -> _Members:
        for copy, members in self._recent_members:
            if cid_all in (copy, members):
                return members
        members = _Members(cid_all)
        self._recent_members.insert(0, (list(members), members))
        del self._recent_members[_RECENT_MEMBERS:]
        return members

    def _queue_set(self, mq_set: Iterable[MessageQueue]) -> frozenset[MessageQueue]:
        if not isinstance(mq_set, frozenset):
            return frozenset(mq_set)
        seen = self._views.get(id(mq_set))
        if seen is not None and seen[0] is mq_set:
            return seen[1]
        if len(self._shared) >= self.max_views:
            self._shared.clear()
        shared = self._shared.setdefault(mq_set, mq_set)
        while len(self._views) >= self.max_views:
            del self._views[next(iter(self._views))]
        self._views[id(mq_set)] = (mq_set, shared)
        return shared

    def allocate(
        self,
        strategy: AllocateMessageQueueStrategy,
        consumer_group: str,
        current_cid: str,
        mq_set: Iterable[MessageQueue],
        cid_all: Iterable[str],
    ) -> tuple[list[MessageQueue], list[str], list[MessageQueue]]:
        """(sorted mq_all, sorted cid_all, this client's queues)."""
        skey = _cache_key(strategy)
        if skey is None:
            mq_all, cids = sort_mq_all(mq_set), sort_cid_all(cid_all)
            return mq_all, cids, list(strategy.allocate(consumer_group, current_cid, mq_all, cids) or [])
        cid_tuple = self._members(cid_all)
        key = (skey, self._queue_set(mq_set), cid_tuple)
        entry = self._entries.pop(key, None)
        if entry is None:
            cids = sort_cid_all(cid_tuple)
            # The same members in another order (each broker lists them in its own) are the same view:
            # a strategy sees only the sorted list. Sharing the entry also gives every client of the view
            # one sorted list object, which the rebalance events recognise by identity.
            view = (skey, key[1], _Members(cids))
            entry = self._views_by_members.get(view)
            if entry is None:
                mq_all = self._sorted.get(key[1])
                if mq_all is None:
                    mq_all = sort_mq_all(key[1])
                    while len(self._sorted) >= self.max_entries:
                        del self._sorted[next(iter(self._sorted))]
                    self._sorted[key[1]] = mq_all
                entry = _Entry(mq_all, cids)
                while len(self._views_by_members) >= self.max_entries:
                    del self._views_by_members[next(iter(self._views_by_members))]
                self._views_by_members[view] = entry
            while len(self._entries) >= self.max_entries:
                del self._entries[next(iter(self._entries))]
        self._entries[key] = entry  # most recently used last
        got = entry.by_cid.get(current_cid)
        if got is not None:
            self.hits += 1
            return entry.mq_all, entry.cids, got
        self.misses += 1
        if isinstance(strategy, AllocateMessageQueueConsistentHash):
            if not strategy._check(current_cid, entry.mq_all, entry.cids):
                got = []
            else:
                if entry.owners is None:
                    entry.owners = strategy.route(entry.mq_all, entry.cids)
                got = [mq for mq, o in zip(entry.mq_all, entry.owners, strict=True) if o == current_cid]
        elif entry.index is not None and isinstance(current_cid, str) and current_cid:
            # AVG and AVG_BY_CIRCLE (the only other cached kinds): what allocate() does after its check
            i = entry.index.get(current_cid)
            got = [] if i is None else strategy.share(i, entry.mq_all, len(entry.cids))  # type: ignore[attr-defined]
        else:
            got = list(strategy.allocate(consumer_group, current_cid, entry.mq_all, entry.cids) or [])
            entry.index = {}
            for i, cid in enumerate(entry.cids):
                entry.index.setdefault(cid, i)
        entry.by_cid[current_cid] = got
        return entry.mq_all, entry.cids, got


ALLOCATION_CACHE = AllocationCache()
