"""RocketMQ's own unit tests for the allocation strategies, and the fact sheet's golden vectors, as data."""

from __future__ import annotations

import itertools
import random

import pytest

from rmqlab.protocol.allocate import (
    AllocateMachineRoomNearby,
    AllocateMessageQueueAveragely,
    AllocateMessageQueueAveragelyByCircle,
    AllocateMessageQueueByConfig,
    AllocateMessageQueueByMachineRoom,
    AllocateMessageQueueConsistentHash,
    AllocateMessageQueueStrategy,
    PrefixMachineRoomResolver,
    allocate_all,
    get_strategy,
    java_split,
    md5_hash,
)
from rmqlab.protocol.model import MessageQueue


def cids(prefix: str, n: int) -> list[str]:
    return [f"{prefix}{i}" for i in range(n)]


def queues(topic: str, broker: str, n: int) -> list[MessageQueue]:
    return [MessageQueue(topic, broker, i) for i in range(n)]


def ids(result: list[MessageQueue]) -> list[int]:
    return [mq.queue_id for mq in result]


def per_client(
    strategy: AllocateMessageQueueStrategy, mq_all: list[MessageQueue], cid_all: list[str]
) -> dict[str, list[MessageQueue]]:
    """Each client's share, called exactly as the Java tests do (inputs not re-sorted)."""
    return {cid: strategy.allocate("testConsumerGroup", cid, mq_all, cid_all) for cid in cid_all}


# --------------------------------------------------------------------------------------------------------
# AllocateMessageQueueAveragelyTest, ...ByCircleTest, ...ByConfigTest, ...ByMachineRoomTest


def test_averagely_sizes() -> None:
    mq_all, cid_all = queues("topic", "brokerName", 10), cids("CID_PREFIX", 4)
    got = per_client(AllocateMessageQueueAveragely(), mq_all, cid_all)
    assert [len(v) for v in got.values()] == [3, 3, 2, 2]


def test_averagely_by_circle() -> None:
    mq_all, cid_all = queues("topic", "brokerName", 10), cids("CID_PREFIX", 4)
    strategy = AllocateMessageQueueAveragelyByCircle()
    assert strategy.allocate("", "CID_PREFIX", mq_all, cid_all) == []  # not in cid_all
    got = {cid: ids(v) for cid, v in per_client(strategy, mq_all, cid_all).items()}
    assert got == {
        "CID_PREFIX0": [0, 4, 8],
        "CID_PREFIX1": [1, 5, 9],
        "CID_PREFIX2": [2, 6],
        "CID_PREFIX3": [3, 7],
    }


def test_by_config() -> None:
    mq_all, cid_all = queues("topic", "brokerName", 4), cids("CID_PREFIX", 2)
    strategy = AllocateMessageQueueByConfig(mq_all)
    got = {cid: ids(v) for cid, v in per_client(strategy, mq_all, cid_all).items()}
    assert got == {"CID_PREFIX0": [0, 1, 2, 3], "CID_PREFIX1": [0, 1, 2, 3]}
    # RocketMQ does no check here: a client outside the group gets the list too
    assert ids(strategy.allocate("", "stranger", [], [])) == [0, 1, 2, 3]


def machine_room_queues() -> list[MessageQueue]:
    return [MessageQueue("topic", "room1@broker-a" if i < 5 else "room2@broker-b", i) for i in range(10)]


def test_by_machine_room() -> None:
    cid_all = cids("CID_PREFIX", 2)
    strategy = AllocateMessageQueueByMachineRoom({"room1"})
    with pytest.raises(ValueError, match=r"^mqAll is null or mqAll empty$"):
        strategy.allocate("", cid_all[0], [], cid_all)
    got = {cid: ids(v) for cid, v in per_client(strategy, machine_room_queues(), cid_all).items()}
    assert got == {"CID_PREFIX0": [0, 1, 4], "CID_PREFIX1": [2, 3]}


# --------------------------------------------------------------------------------------------------------
# AllocateMachineRoomNearByTest (resolver: Java's split("-")[0]; inner AVG; inputs in creation order)


class SplitDashResolver:
    def broker_deploy_in(self, mq: MessageQueue) -> str:
        return java_split(mq.broker_name, "-")[0]

    def consumer_deploy_in(self, client_id: str) -> str:
        return java_split(client_id, "-")[0]


RESOLVER = SplitDashResolver()
NEARBY = AllocateMachineRoomNearby(AllocateMessageQueueAveragely(), RESOLVER)


def idc_queues(idc: str, n: int) -> list[MessageQueue]:
    return queues("topic_test", f"{idc}-brokerName", n)


def prepare_mq(idc_count: int, queue_size: int) -> list[MessageQueue]:
    return [mq for i in range(1, idc_count + 1) for mq in idc_queues(f"IDC{i}", queue_size)]


def prepare_consumers(idc_count: int, size: int) -> list[str]:
    return [f"IDC{i}-CID-{j}" for i in range(1, idc_count + 1) for j in range(size)]


def allocated_everything_once(
    cid_all: list[str], mq_all: list[MessageQueue], res_all: list[MessageQueue]
) -> bool:
    if not cid_all:
        return not res_all
    return set(res_all) == set(mq_all) and len(res_all) == len(mq_all)


def check_idc_size_equals(idc_size: int, queue_size: int, consumer_size: int) -> None:
    cid_all, mq_all = prepare_consumers(idc_size, consumer_size), prepare_mq(idc_size, queue_size)
    res_all: list[MessageQueue] = []
    for cid in cid_all:
        res = NEARBY.allocate("Test-C-G", cid, mq_all, cid_all)
        assert all(RESOLVER.broker_deploy_in(mq) == RESOLVER.consumer_deploy_in(cid) for mq in res)
        res_all += res
    assert allocated_everything_once(cid_all, mq_all, res_all)


def check_consumer_idc_is_more(broker_idcs: int, more: int, queue_size: int, consumer_size: int) -> None:
    cid_all, mq_all = (
        prepare_consumers(broker_idcs + more, consumer_size),
        prepare_mq(broker_idcs, queue_size),
    )
    with_consumer = {RESOLVER.broker_deploy_in(mq) for mq in mq_all}
    res_all: list[MessageQueue] = []
    for cid in cid_all:
        res = NEARBY.allocate("Test-C-G", cid, mq_all, cid_all)
        for mq in res:
            if RESOLVER.broker_deploy_in(mq) in with_consumer:  # healthy room: only its own clients
                assert RESOLVER.broker_deploy_in(mq) == RESOLVER.consumer_deploy_in(cid)
        res_all += res
    assert allocated_everything_once(cid_all, mq_all, res_all)


def check_consumer_idc_is_less(broker_idcs: int, less: int, queue_size: int, consumer_size: int) -> None:
    cid_all, mq_all = (
        prepare_consumers(broker_idcs - less, consumer_size),
        prepare_mq(broker_idcs, queue_size),
    )
    healthy = {RESOLVER.consumer_deploy_in(cid) for cid in cid_all}
    res_all: list[MessageQueue] = []
    by_idc: dict[str, list[MessageQueue]] = {}
    for cid in cid_all:
        res = NEARBY.allocate("Test-C-G", cid, mq_all, cid_all)
        by_idc.setdefault(RESOLVER.consumer_deploy_in(cid), []).extend(res)
        res_all += res
    for idc in healthy:
        assert set(idc_queues(idc, queue_size)) <= set(by_idc[idc])
    assert allocated_everything_once(cid_all, mq_all, res_all)


@pytest.mark.parametrize("consumers", [10, 20, 30, 0])
def test_nearby_idc_size_equals(consumers: int) -> None:
    check_idc_size_equals(5, 20, consumers)


@pytest.mark.parametrize("consumers", [10, 5, 20, 0])
def test_nearby_consumer_idc_is_more(consumers: int) -> None:
    check_consumer_idc_is_more(5, 1, 10, consumers)


@pytest.mark.parametrize("consumers", [10, 5, 20, 0])
def test_nearby_consumer_idc_is_less(consumers: int) -> None:
    check_consumer_idc_is_less(5, 2, 10, consumers)


@pytest.mark.parametrize("seed", range(10))
def test_nearby_random_case(seed: int) -> None:
    rnd = random.Random(seed)
    consumer_size, queue_size = rnd.randint(1, 200), rnd.randint(1, 100)
    broker_idcs, consumer_idcs = rnd.randint(1, 10), rnd.randint(1, 10)
    if broker_idcs == consumer_idcs:
        check_idc_size_equals(broker_idcs, queue_size, consumer_size)
    elif broker_idcs > consumer_idcs:
        check_consumer_idc_is_less(broker_idcs, broker_idcs - consumer_idcs, queue_size, consumer_size)
    else:
        check_consumer_idc_is_more(broker_idcs, consumer_idcs - broker_idcs, queue_size, consumer_size)


# --------------------------------------------------------------------------------------------------------
# AllocateMessageQueueConsitentHashTest


def test_consistent_hash_current_cid_not_exists() -> None:
    got = AllocateMessageQueueConsistentHash().allocate(
        "", str(2**31 - 1), queues("topic_test", "brokerName", 6), cids("CID-", 2)
    )
    assert got == []


@pytest.mark.parametrize(
    ("current", "mq_all", "cid_all", "message"),
    [
        ("", queues("topic_test", "brokerName", 6), cids("CID-", 2), "currentCID is empty"),
        ("0", None, cids("CID-", 2), "mqAll is null or mqAll empty"),
        ("0", queues("topic_test", "brokerName", 6), None, "cidAll is null or cidAll empty"),
    ],
)
def test_consistent_hash_illegal_arguments(current, mq_all, cid_all, message) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match=rf"^{message}$"):
        AllocateMessageQueueConsistentHash().allocate("", current, mq_all, cid_all)


def owners(
    strategy: AllocateMessageQueueStrategy, mq_all: list[MessageQueue], cid_all: list[str]
) -> tuple[dict[MessageQueue, str], list[MessageQueue]]:
    owner: dict[MessageQueue, str] = {}
    res_all: list[MessageQueue] = []
    for cid in cid_all:
        res = strategy.allocate("testConsumerGroup", cid, mq_all, cid_all)
        res_all += res
        owner.update(dict.fromkeys(res, cid))
    return owner, res_all


def check_consistent_hash(queue_size: int, consumer_size: int) -> None:
    strategy = AllocateMessageQueueConsistentHash(3)
    mq_all, cid_all = queues("topic_test", "brokerName", queue_size), cids("CID-", consumer_size)

    before, res_all = owners(strategy, mq_all, cid_all)
    assert set(res_all) == set(mq_all) and len(res_all) == len(mq_all)

    removed, after_remove = cid_all[0], cid_all[1:]
    after, res_all = owners(strategy, mq_all, after_remove)
    if after_remove:
        assert set(res_all) == set(mq_all)
    else:
        assert res_all == []
    for mq, cid in before.items():
        if cid != removed:
            assert after[mq] == cid

    new_cid = "CID-NEW"
    with_new, res_all = owners(strategy, mq_all, [*after_remove, new_cid])
    assert set(res_all) == set(mq_all)
    for mq, cid in with_new.items():
        if cid != new_cid:
            assert after.get(mq) == cid, mq


@pytest.mark.parametrize(("queue_size", "consumer_size"), [(20, 10), (10, 20)])
def test_consistent_hash_allocate(queue_size: int, consumer_size: int) -> None:
    check_consistent_hash(queue_size, consumer_size)


@pytest.mark.parametrize("seed", range(10))
def test_consistent_hash_random_case(seed: int) -> None:
    rnd = random.Random(seed)
    check_consistent_hash(rnd.randint(1, 20), rnd.randint(1, 20))


# --------------------------------------------------------------------------------------------------------
# Golden vectors produced by running RocketMQ's classes (fact sheet 5.9)


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("", 3558706393),
        ("CID-0-0", 1900518137),
        ("CID-0-1", 2611424514),
        ("CID-1-0", 1110034835),
        ("192.168.1.10@1234#5678-0", 4293978574),
        ("MessageQueue [topic=topic_test, brokerName=brokerName, queueId=0]", 2171879703),
        ("MessageQueue [topic=TopicTest, brokerName=broker-a, queueId=3]", 3652785994),
    ],
)
def test_md5_hash(key: str, value: int) -> None:
    assert md5_hash(key) == value


def by_ids(result: dict[str, list[MessageQueue]]) -> dict[str, list[int]]:
    return {cid: ids(v) for cid, v in result.items()}


CASE_A = (queues("topic_test", "brokerName", 10), cids("CID-", 4))


@pytest.mark.parametrize(
    ("strategy", "expected"),
    [
        (
            AllocateMessageQueueAveragely(),
            {"CID-0": [0, 1, 2], "CID-1": [3, 4, 5], "CID-2": [6, 7], "CID-3": [8, 9]},
        ),
        (
            AllocateMessageQueueAveragelyByCircle(),
            {"CID-0": [0, 4, 8], "CID-1": [1, 5, 9], "CID-2": [2, 6], "CID-3": [3, 7]},
        ),
        (
            AllocateMessageQueueConsistentHash(),
            {"CID-0": [1], "CID-1": [], "CID-2": [0, 3, 4, 5, 8], "CID-3": [2, 6, 7, 9]},
        ),
        (
            AllocateMessageQueueConsistentHash(3),
            {"CID-0": [3, 5, 8], "CID-1": [2], "CID-2": [4], "CID-3": [0, 1, 6, 7, 9]},
        ),
    ],
    ids=["AVG", "AVG_BY_CIRCLE", "CH10", "CH3"],
)
def test_golden_case_a(strategy: AllocateMessageQueueStrategy, expected: dict[str, list[int]]) -> None:
    assert by_ids(allocate_all(strategy, "g", *CASE_A)) == expected


@pytest.mark.parametrize("name", ["AVG", "AVG_BY_CIRCLE"])
def test_golden_case_b_fewer_queues_than_consumers(name: str) -> None:
    got = allocate_all(get_strategy(name), "g", queues("topic_test", "brokerName", 3), cids("CID-", 5))
    assert by_ids(got) == {"CID-0": [0], "CID-1": [1], "CID-2": [2], "CID-3": [], "CID-4": []}


# given out of order on purpose: allocate_all sorts both lists as RebalanceImpl does
CASE_C_CIDS = ["192.168.1.11@5678#22222", "10.0.0.5@DEFAULT", "192.168.1.10@1234#11111"]
CASE_C_MQS = [
    MessageQueue("TopicTest", b, q) for b, q in itertools.product(["broker-b", "broker-a"], range(4))
]


@pytest.mark.parametrize(
    ("strategy", "expected"),
    [
        (AllocateMessageQueueAveragely(), [["a0", "a1", "a2"], ["a3", "b0", "b1"], ["b2", "b3"]]),
        (AllocateMessageQueueAveragelyByCircle(), [["a0", "a3", "b2"], ["a1", "b0", "b3"], ["a2", "b1"]]),
        (AllocateMessageQueueConsistentHash(), [["a1", "b0", "b3"], ["a0", "a2", "a3"], ["b1", "b2"]]),
    ],
    ids=["AVG", "AVG_BY_CIRCLE", "CH10"],
)
def test_golden_case_c(strategy: AllocateMessageQueueStrategy, expected: list[list[str]]) -> None:
    got = allocate_all(strategy, "g", CASE_C_MQS, CASE_C_CIDS)
    assert list(got) == ["10.0.0.5@DEFAULT", "192.168.1.10@1234#11111", "192.168.1.11@5678#22222"]
    short = [[f"{mq.broker_name[-1]}{mq.queue_id}" for mq in v] for v in got.values()]
    assert short == expected


def test_golden_case_d_and_removal() -> None:
    mq_all = queues("T", "b", 16)
    assert by_ids(allocate_all(AllocateMessageQueueAveragely(), "g", mq_all, ["c0", "c1", "c2"])) == {
        "c0": [0, 1, 2, 3, 4, 5],
        "c1": [6, 7, 8, 9, 10],
        "c2": [11, 12, 13, 14, 15],
    }
    assert by_ids(allocate_all(AllocateMessageQueueAveragelyByCircle(), "g", mq_all, ["c0", "c1", "c2"])) == {
        "c0": [0, 3, 6, 9, 12, 15],
        "c1": [1, 4, 7, 10, 13],
        "c2": [2, 5, 8, 11, 14],
    }
    ch = AllocateMessageQueueConsistentHash()
    assert by_ids(allocate_all(ch, "g", mq_all, ["c0", "c1", "c2"])) == {
        "c0": [3, 4, 6, 10, 15],
        "c1": [1, 2, 5, 9, 11],
        "c2": [0, 7, 8, 12, 13, 14],
    }
    assert by_ids(allocate_all(ch, "g", mq_all, ["c0", "c1"])) == {
        "c0": [3, 4, 6, 10, 15],
        "c1": [0, 1, 2, 5, 7, 8, 9, 11, 12, 13, 14],
    }


def test_golden_case_e_machine_room() -> None:
    got = allocate_all(
        AllocateMessageQueueByMachineRoom({"room1"}), "g", machine_room_queues(), cids("CID_PREFIX", 2)
    )
    assert by_ids(got) == {"CID_PREFIX0": [0, 1, 4], "CID_PREFIX1": [2, 3]}


def test_golden_case_f_machine_room_nearby() -> None:
    mq_all = [mq for idc in ("IDC1", "IDC2", "IDC3") for mq in idc_queues(idc, 4)]
    strategy = AllocateMachineRoomNearby(AllocateMessageQueueAveragely(), PrefixMachineRoomResolver())
    got = allocate_all(strategy, "g", mq_all, ["IDC1-CID-0", "IDC1-CID-1", "IDC2-CID-0"])
    assert {cid: [mq.short for mq in v] for cid, v in got.items()} == {
        "IDC1-CID-0": ["IDC1-brokerName:0", "IDC1-brokerName:1", "IDC3-brokerName:0", "IDC3-brokerName:1"],
        "IDC1-CID-1": ["IDC1-brokerName:2", "IDC1-brokerName:3", "IDC3-brokerName:2"],
        "IDC2-CID-0": [f"IDC2-brokerName:{i}" for i in range(4)] + ["IDC3-brokerName:3"],
    }
