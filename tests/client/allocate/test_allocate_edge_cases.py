"""Odd inputs, Java semantics the strategies depend on, bad arguments and the registry."""

from __future__ import annotations

from typing import Any

import pytest

from rmqlab.protocol.allocate import (
    STRATEGY_NAMES,
    AllocateMachineRoomNearby,
    AllocateMessageQueueAveragely,
    AllocateMessageQueueAveragelyByCircle,
    AllocateMessageQueueByConfig,
    AllocateMessageQueueByMachineRoom,
    AllocateMessageQueueConsistentHash,
    PrefixMachineRoomResolver,
    StaticMachineRoomResolver,
    allocate_all,
    get_strategy,
    java_split,
    md5_hash,
    mq_to_string,
    sort_cid_all,
    sort_mq_all,
)
from rmqlab.protocol.model import MessageQueue


def mqs(n: int, broker: str = "b", topic: str = "T") -> list[MessageQueue]:
    return [MessageQueue(topic, broker, i) for i in range(n)]


class TableHash:
    """A ring hash from a table, to place virtual nodes and queues exactly where a case needs them."""

    def __init__(self, table: dict[str, int]) -> None:
        self.table = table

    def hash(self, key: str) -> int:
        return self.table[key]


# --------------------------------------------------------------------------------------------------------
# Java semantics


@pytest.mark.parametrize(
    ("text", "parts"),
    [
        ("room@broker", ["room", "broker"]),
        ("a@", ["a"]),
        ("a@@", ["a"]),
        ("@", []),
        ("@@", []),
        ("@b", ["", "b"]),
        ("a@@b", ["a", "", "b"]),
        ("a@b@", ["a", "b"]),
        ("", [""]),
        ("plain", ["plain"]),
    ],
)
def test_java_split(text: str, parts: list[str]) -> None:
    assert java_split(text, "@") == parts


def test_sorting_uses_java_string_order() -> None:
    # Java compares UTF-16 code units: a surrogate pair (U+D83D...) sorts before U+FFFF
    assert sort_cid_all(["\uffff", "\U0001f600", "b", "a", "b"]) == ["a", "b", "b", "\U0001f600", "\uffff"]
    unordered = [
        MessageQueue("T", "\uffff", 0),
        MessageQueue("T", "\U0001f600", 1),
        MessageQueue("S", "z", 9),
    ]
    assert [mq.queue_id for mq in sort_mq_all(unordered)] == [9, 1, 0]
    assert sort_mq_all([MessageQueue("T", "b", 10), MessageQueue("T", "b", 2)])[0].queue_id == 2


def test_md5_hash_encodes_like_java() -> None:
    assert md5_hash("\ud800") == md5_hash("?")  # Java's getBytes(UTF_8) replaces an unpaired surrogate
    assert md5_hash("\u00e9") != md5_hash("?")
    assert 0 <= md5_hash("anything") < 2**32


def test_mq_to_string() -> None:
    assert mq_to_string(MessageQueue("TopicTest", "broker-a", 3)) == (
        "MessageQueue [topic=TopicTest, brokerName=broker-a, queueId=3]"
    )


# --------------------------------------------------------------------------------------------------------
# Odd cases


def test_fewer_queues_than_clients_and_missing_client() -> None:
    cids = ["c0", "c1", "c2", "c3"]
    for strategy in (AllocateMessageQueueAveragely(), AllocateMessageQueueAveragelyByCircle()):
        got = [strategy.allocate("g", c, mqs(2), cids) for c in cids]
        assert got == [[mqs(2)[0]], [mqs(2)[1]], [], []]
        assert strategy.allocate("g", "c9", mqs(2), cids) == []


def test_duplicate_client_ids_take_the_first_index() -> None:
    cids = ["a", "a", "b"]
    assert AllocateMessageQueueAveragely().allocate("g", "a", mqs(6), cids) == mqs(6)[0:2]
    assert AllocateMessageQueueAveragely().allocate("g", "b", mqs(6), cids) == mqs(6)[4:6]
    assert AllocateMessageQueueAveragelyByCircle().allocate("g", "a", mqs(6), cids) == [mqs(6)[0], mqs(6)[3]]
    assert list(allocate_all(AllocateMessageQueueAveragely(), "g", mqs(6), cids)) == ["a", "b"]


def test_consistent_hash_with_zero_virtual_nodes_gives_nothing() -> None:
    strategy = AllocateMessageQueueConsistentHash(0)
    assert all(v == [] for v in allocate_all(strategy, "g", mqs(8), ["a", "b"]).values())


def test_consistent_hash_collision_later_entry_wins_and_duplicate_ids_continue_numbering() -> None:
    # a-1 and b-0 collide at 20: b (added later) takes it; a then owns one entry, so the repeated "a"
    # adds replicas a-1 (taking 20 back) and a-2.
    table = {"a-0": 10, "a-1": 20, "b-0": 20, "b-1": 30, "a-2": 40}
    strategy = AllocateMessageQueueConsistentHash(2, TableHash(table))
    assert strategy.ring(["a", "b"]) == {10: "a", 20: "b", 30: "b"}
    assert strategy.ring(["a", "b", "a"]) == {10: "a", 20: "a", 30: "b", 40: "a"}


def test_consistent_hash_tail_is_inclusive_and_wraps() -> None:
    queues = mqs(4)
    table = {"a-0": 10, "b-0": 20}
    # queue 0 hashes exactly onto a's entry, 1 between, 2 exactly onto b's, 3 past the end (wraps to a)
    table |= {mq_to_string(mq): h for mq, h in zip(queues, [10, 15, 20, 25], strict=True)}
    strategy = AllocateMessageQueueConsistentHash(1, TableHash(table))
    assert strategy.allocate("g", "a", queues, ["a", "b"]) == [queues[0], queues[3]]
    assert strategy.allocate("g", "b", queues, ["a", "b"]) == [queues[1], queues[2]]


def test_consistent_hash_accepts_a_plain_callable_and_negative_keys() -> None:
    strategy = AllocateMessageQueueConsistentHash(3, lambda key: -md5_hash(key))
    shares = allocate_all(strategy, "g", mqs(10), ["a", "b", "c"])
    assert sorted(mq for share in shares.values() for mq in share) == mqs(10)


def test_machine_room_odd_broker_names() -> None:
    names = ["room1@x", "room1@", "room1@@", "room1@x@", "room1@x@y", "@x", "room1"]
    queues = [MessageQueue("T", name, i) for i, name in enumerate(names)]
    got = AllocateMessageQueueByMachineRoom({"room1", ""}).allocate("g", "c", queues, ["c"])
    assert [mq.broker_name for mq in got] == ["room1@x", "room1@x@", "@x"]


def test_machine_room_nearby_visits_orphan_rooms_in_java_order() -> None:
    resolver = StaticMachineRoomResolver(
        {"b1": "\uffff", "b2": "\U0001f600", "b3": "home"}, {"c0": "home", "c1": "home"}
    )
    queues = [MessageQueue("T", b, 0) for b in ("b1", "b2", "b3")]
    strategy = AllocateMachineRoomNearby(AllocateMessageQueueAveragely(), resolver)
    # c0: its own room's queue, then the surrogate-pair room before U+FFFF
    assert [mq.broker_name for mq in strategy.allocate("g", "c0", queues, ["c0", "c1"])] == ["b3", "b2", "b1"]
    assert strategy.allocate("g", "c1", queues, ["c0", "c1"]) == []


def test_config_returns_a_copy() -> None:
    strategy = AllocateMessageQueueByConfig(mqs(2))
    got = strategy.allocate("g", "c", mqs(5), ["c"])
    got.clear()
    assert strategy.allocate("g", "c", mqs(5), ["c"]) == mqs(2)


@pytest.mark.parametrize(
    ("name", "room"),
    [("room1@broker-a", "room1"), ("IDC1-brokerName", "IDC1"), ("IDC1-CID-0", "IDC1"), ("plain", "plain")],
)
def test_prefix_resolver(name: str, room: str) -> None:
    assert PrefixMachineRoomResolver.room_of(name) == room


# --------------------------------------------------------------------------------------------------------
# Bad arguments give ValueError with a clear message


@pytest.mark.parametrize(
    ("current", "mq_all", "cid_all", "message"),
    [
        ("", mqs(1), ["a"], "currentCID is empty"),
        (None, mqs(1), ["a"], "currentCID is empty"),
        ("a", [], ["a"], "mqAll is null or mqAll empty"),
        ("a", None, ["a"], "mqAll is null or mqAll empty"),
        ("a", mqs(1), [], "cidAll is null or cidAll empty"),
        ("a", mqs(1), None, "cidAll is null or cidAll empty"),
        (7, mqs(1), ["a"], "currentCID must be a string"),
        ("a", set(mqs(1)), ["a"], "mqAll must be a list"),
        ("a", "T", ["a"], "mqAll must be a list"),
        ("a", [("T", "b", 0)], ["a"], "not a MessageQueue"),
        ("a", [MessageQueue("T", "b", "0")], ["a"], "needs an int queue id"),  # type: ignore[arg-type]
        ("a", [MessageQueue("T", None, 0)], ["a"], "needs string topic and broker name"),  # type: ignore[arg-type]
        ("a", mqs(1), "a", "cidAll must be a list"),
        ("a", mqs(1), ["a", None], "not a client id string"),
    ],
)
def test_common_check(current: Any, mq_all: Any, cid_all: Any, message: str) -> None:
    for strategy in (
        AllocateMessageQueueAveragely(),
        AllocateMessageQueueAveragelyByCircle(),
        AllocateMessageQueueConsistentHash(),
        AllocateMessageQueueByMachineRoom({"r"}),
        AllocateMachineRoomNearby(AllocateMessageQueueAveragely(), PrefixMachineRoomResolver()),
    ):
        with pytest.raises(ValueError, match=message):
            strategy.allocate("g", current, mq_all, cid_all)


class BadResolver:
    def __init__(self, broker_room: Any, consumer_room: Any) -> None:
        self.broker_room, self.consumer_room = broker_room, consumer_room

    def broker_deploy_in(self, mq: MessageQueue) -> Any:
        return self.broker_room

    def consumer_deploy_in(self, client_id: str) -> Any:
        return self.consumer_room


@pytest.mark.parametrize(
    ("broker_room", "consumer_room", "message"),
    [
        (None, "r", "Machine room is null for mq MessageQueue"),
        ("", "r", "Machine room is empty for mq MessageQueue"),
        (3, "r", "Machine room is not a string"),
        ("r", None, "Machine room is null for consumer id a"),
        ("r", "", "Machine room is empty for consumer id a"),
    ],
)
def test_nearby_bad_rooms(broker_room: Any, consumer_room: Any, message: str) -> None:
    strategy = AllocateMachineRoomNearby(
        AllocateMessageQueueAveragely(), BadResolver(broker_room, consumer_room)
    )
    with pytest.raises(ValueError, match=message):
        strategy.allocate("g", "a", mqs(2), ["a"])


def test_nearby_default_resolver_rejects_names_without_a_room() -> None:
    strategy = get_strategy("MACHINE_ROOM_NEARBY")
    with pytest.raises(ValueError, match="Machine room is empty for mq"):
        strategy.allocate("g", "r-a", [MessageQueue("T", "-broker", 0)], ["r-a"])
    with pytest.raises(ValueError, match="Machine room is empty for consumer id @x"):
        strategy.allocate("g", "r-a", mqs(1, "r-b"), ["r-a", "@x"])


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: AllocateMessageQueueConsistentHash(-1), "illegal virtualNodeCnt :-1"),
        (lambda: AllocateMessageQueueConsistentHash(True), "must be an int"),
        (lambda: AllocateMessageQueueConsistentHash(2.5), "must be an int"),
        (lambda: AllocateMessageQueueConsistentHash(3, "md5"), "has no hash"),
        (lambda: AllocateMessageQueueByConfig([1]), "not a MessageQueue"),
        (lambda: AllocateMessageQueueByMachineRoom("room1"), "not a single string"),
        (lambda: AllocateMessageQueueByMachineRoom([1]), "non-string room"),
        (
            lambda: AllocateMachineRoomNearby(None, PrefixMachineRoomResolver()),
            "allocateMessageQueueStrategy",
        ),
        (lambda: AllocateMachineRoomNearby(AllocateMessageQueueAveragely(), None), "machineRoomResolver"),
        (lambda: AllocateMachineRoomNearby(AllocateMessageQueueAveragely(), object()), "broker_deploy_in"),
        (lambda: AllocateMachineRoomNearby(object(), PrefixMachineRoomResolver()), "no allocate"),
    ],
)
def test_bad_constructor_arguments(make: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make()


def test_config_without_a_list_gives_every_client_null() -> None:
    """AllocateMessageQueueByConfig before setMessageQueueList returns null; the rebalance then takes
    nothing."""
    for strategy in (AllocateMessageQueueByConfig(), get_strategy("CONFIG")):
        assert strategy.allocate("g", "a", mqs(4), ["a", "b"]) is None
    assert allocate_all(get_strategy("CONFIG"), "g", mqs(2), ["b", "a"]) == {"a": None, "b": None}


def test_machine_room_without_rooms_as_java_answers_it() -> None:
    """consumeridcs unset: an empty list while no broker name splits into exactly two parts around '@';
    Java's NullPointerException (a ValueError here) once one does."""
    for strategy in (AllocateMessageQueueByMachineRoom(), get_strategy("MACHINE_ROOM")):
        assert strategy.allocate("g", "a", mqs(3, "broker-a") + mqs(2, "a@b@c"), ["a", "b"]) == []
        assert strategy.allocate("g", "a", mqs(2, "room@"), ["a"]) == []
        with pytest.raises(ValueError, match="consumeridcs is null"):
            strategy.allocate("g", "a", mqs(2, "broker-a") + mqs(1, "room1@broker-b"), ["a"])
        assert strategy.allocate("g", "x", mqs(1, "room1@broker-b"), ["a"]) == []  # not a member first


@pytest.mark.parametrize("bad", ["x", 1.5, 2**63, True])
def test_hash_function_must_return_a_long(bad: Any) -> None:
    strategy = AllocateMessageQueueConsistentHash(1, lambda key: bad)
    with pytest.raises(ValueError, match="expected a signed 64-bit int"):
        strategy.allocate("g", "a", mqs(1), ["a"])


def test_allocate_all_rejects_empty_inputs() -> None:
    with pytest.raises(ValueError, match="mqAll is null or mqAll empty"):
        allocate_all(AllocateMessageQueueAveragely(), "g", [], ["a"])
    with pytest.raises(ValueError, match="cidAll is null or cidAll empty"):
        allocate_all(AllocateMessageQueueAveragely(), "g", mqs(1), [])
    with pytest.raises(ValueError, match="not a MessageQueue"):
        allocate_all(AllocateMessageQueueAveragely(), "g", ["T"], ["a"])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="needs an int queue id"):
        allocate_all(AllocateMessageQueueAveragely(), "g", [MessageQueue("T", "b", 1.5)], ["a"])  # type: ignore[arg-type]
    both = [MessageQueue("T", "b", 0), MessageQueue("T", "b", True)]
    with pytest.raises(ValueError, match=r"mq_all\[1\] needs an int queue id"):  # bool is an int to Python
        allocate_all(AllocateMessageQueueAveragely(), "g", both, ["a"])


# --------------------------------------------------------------------------------------------------------
# Registry


def test_registry_names() -> None:
    assert STRATEGY_NAMES == (
        "AVG",
        "AVG_BY_CIRCLE",
        "CONSISTENT_HASH",
        "CONFIG",
        "MACHINE_ROOM",
        "MACHINE_ROOM_NEARBY",
    )
    options: dict[str, dict[str, Any]] = {
        "CONFIG": {"message_queue_list": mqs(1)},
        "MACHINE_ROOM": {"consumer_idcs": ["r"]},
    }
    for name in STRATEGY_NAMES:
        strategy = get_strategy(name, **options.get(name, {}))
        expected = "MACHINE_ROOM_NEARBY-AVG" if name == "MACHINE_ROOM_NEARBY" else name
        assert strategy.name == expected
        assert get_strategy(name.lower(), **options.get(name, {})).name == expected


def test_registry_options() -> None:
    ch = get_strategy("CONSISTENT_HASH", virtual_node_cnt=3)
    assert isinstance(ch, AllocateMessageQueueConsistentHash) and ch.virtual_node_cnt == 3
    assert get_strategy("CONSISTENT_HASH").virtual_node_cnt == 10  # type: ignore[attr-defined]
    nearby = get_strategy("MACHINE_ROOM_NEARBY", inner="CONSISTENT_HASH", virtual_node_cnt=4)
    assert nearby.name == "MACHINE_ROOM_NEARBY-CONSISTENT_HASH"
    assert nearby.strategy.virtual_node_cnt == 4  # type: ignore[attr-defined]
    assert get_strategy("MACHINE_ROOM_NEARBY-AVG_BY_CIRCLE").name == "MACHINE_ROOM_NEARBY-AVG_BY_CIRCLE"
    inner = AllocateMessageQueueAveragelyByCircle()
    assert get_strategy("MACHINE_ROOM_NEARBY", inner=inner).strategy is inner  # type: ignore[attr-defined]
    resolver = StaticMachineRoomResolver({}, {})
    assert get_strategy("MACHINE_ROOM_NEARBY", resolver=resolver).resolver is resolver  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("name", "options", "message"),
    [
        ("STICKY", {}, "unknown allocation strategy 'STICKY'; known: AVG, AVG_BY_CIRCLE"),
        ("", {}, "unknown allocation strategy"),
        (None, {}, "strategy name must be a string"),
        ("AVG", {"virtual_node_cnt": 3}, "AVG takes no options"),
        ("CONSISTENT_HASH", {"vnodes": 3}, "does not take vnodes"),
        ("MACHINE_ROOM_NEARBY", {"inner": "NOPE"}, "unknown allocation strategy 'NOPE'"),
        ("MACHINE_ROOM_NEARBY", {"inner": "MACHINE_ROOM_NEARBY"}, "cannot wrap itself"),
        ("MACHINE_ROOM_NEARBY-AVG", {"inner": "AVG"}, "already names the inner strategy"),
        ("MACHINE_ROOM_NEARBY", {"inner": "AVG", "virtual_node_cnt": 2}, "AVG takes no options"),
    ],
)
def test_registry_errors(name: Any, options: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        get_strategy(name, **options)
