"""Properties every client of a group relies on: together the shares cover each queue exactly once."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from rmqlab.protocol.allocate import (
    AllocateMachineRoomNearby,
    AllocateMessageQueueAveragely,
    AllocateMessageQueueAveragelyByCircle,
    AllocateMessageQueueByMachineRoom,
    AllocateMessageQueueConsistentHash,
    AllocateMessageQueueStrategy,
    PrefixMachineRoomResolver,
    allocate_all,
    java_split,
    md5_hash,
    sort_cid_all,
    sort_mq_all,
)
from rmqlab.protocol.model import MessageQueue

names = st.text(alphabet="ab-@#.1\u00e9\U0001f600\uffff", min_size=0, max_size=6)
mq_lists = st.lists(
    st.builds(
        MessageQueue,
        st.sampled_from(["TopicTest", "t\U0001f600", "%RETRY%g"]),
        st.sampled_from(["broker-a", "broker-b", "room1@broker-c", "\ue000"]),
        st.integers(0, 40),
    ),
    min_size=1,
    max_size=40,
    unique=True,
)
cid_lists = st.lists(names.filter(bool), min_size=1, max_size=20, unique=True)
vnodes = st.integers(1, 20)


def balanced_strategies(v: int) -> list[AllocateMessageQueueStrategy]:
    return [
        AllocateMessageQueueAveragely(),
        AllocateMessageQueueAveragelyByCircle(),
        AllocateMessageQueueConsistentHash(v),
        # a coarse hash: many ring collisions, negative keys
        AllocateMessageQueueConsistentHash(v, lambda key: md5_hash(key) % 13 - 6),
    ]


def assert_exact_cover(shares: dict[str, list[MessageQueue]], mq_all: list[MessageQueue]) -> None:
    flat = [mq for share in shares.values() for mq in share]
    assert len(flat) == len(set(flat)), "a queue was given to two clients"
    assert set(flat) == set(mq_all), "a queue was given to nobody"


@settings(max_examples=150, deadline=None)
@given(mq_all=mq_lists, cid_all=cid_lists, v=vnodes)
def test_disjoint_and_covering(mq_all: list[MessageQueue], cid_all: list[str], v: int) -> None:
    for strategy in balanced_strategies(v):
        shares = allocate_all(strategy, "g", mq_all, cid_all)
        assert list(shares) == sort_cid_all(cid_all)
        assert_exact_cover(shares, mq_all)
        ordered = sort_mq_all(mq_all)
        for share in shares.values():  # each share keeps mq_all's order
            assert share == sorted(share, key=ordered.index)


@settings(max_examples=150, deadline=None)
@given(mq_all=mq_lists, cid_all=cid_lists)
def test_avg_sizes_differ_by_at_most_one_and_blocks_are_contiguous(
    mq_all: list[MessageQueue], cid_all: list[str]
) -> None:
    shares = allocate_all(AllocateMessageQueueAveragely(), "g", mq_all, cid_all)
    sizes = [len(s) for s in shares.values()]
    assert max(sizes) - min(sizes) <= 1
    assert sizes == sorted(sizes, reverse=True)  # the earlier clients get the bigger blocks
    assert [mq for s in shares.values() for mq in s] == sort_mq_all(mq_all)


@settings(max_examples=100, deadline=None)
@given(mq_all=mq_lists, cid_all=cid_lists)
def test_avg_by_circle_sizes_differ_by_at_most_one(mq_all: list[MessageQueue], cid_all: list[str]) -> None:
    sizes = [
        len(s) for s in allocate_all(AllocateMessageQueueAveragelyByCircle(), "g", mq_all, cid_all).values()
    ]
    assert max(sizes) - min(sizes) <= 1


@settings(max_examples=100, deadline=None)
@given(mq_all=mq_lists, cid_all=cid_lists, v=vnodes, outsider=names)
def test_client_outside_the_group_gets_nothing(
    mq_all: list[MessageQueue], cid_all: list[str], v: int, outsider: str
) -> None:
    if not outsider or outsider in cid_all:
        return
    for strategy in [*balanced_strategies(v), AllocateMessageQueueByMachineRoom({"room1"})]:
        assert strategy.allocate("g", outsider, sort_mq_all(mq_all), sort_cid_all(cid_all)) == []


@settings(max_examples=100, deadline=None)
@given(mq_all=mq_lists, cid_all=cid_lists, seed=st.integers(0, 2**32))
def test_allocate_all_does_not_depend_on_input_order(
    mq_all: list[MessageQueue], cid_all: list[str], seed: int
) -> None:
    rnd = random.Random(seed)
    shuffled_mqs, shuffled_cids = mq_all[:], cid_all[:]
    rnd.shuffle(shuffled_mqs)
    rnd.shuffle(shuffled_cids)
    for strategy in balanced_strategies(5):
        assert allocate_all(strategy, "g", mq_all, cid_all) == allocate_all(
            strategy, "g", shuffled_mqs, shuffled_cids
        )


@settings(max_examples=100, deadline=None)
@given(mq_all=mq_lists, cid_all=cid_lists.filter(lambda c: len(c) >= 2), v=vnodes, data=st.data())
def test_consistent_hash_moves_only_the_leavers_queues(
    mq_all: list[MessageQueue], cid_all: list[str], v: int, data: st.DataObject
) -> None:
    strategy = AllocateMessageQueueConsistentHash(v)
    leaver = data.draw(st.sampled_from(cid_all))
    before = allocate_all(strategy, "g", mq_all, cid_all)
    after = allocate_all(strategy, "g", mq_all, [c for c in cid_all if c != leaver])
    for cid, share in after.items():
        assert set(before[cid]) <= set(share)


@settings(max_examples=100, deadline=None)
@given(
    rooms=st.lists(st.sampled_from(["r1", "r2", "r3", "r4"]), min_size=1, max_size=4, unique=True),
    client_rooms=st.lists(st.sampled_from(["r1", "r2", "r3", "r5"]), min_size=1, max_size=12),
    per_room=st.integers(1, 8),
)
def test_machine_room_nearby_covers_once_and_keeps_rooms(
    rooms: list[str], client_rooms: list[str], per_room: int
) -> None:
    mq_all = [MessageQueue("T", f"{room}-broker", q) for room in rooms for q in range(per_room)]
    cid_all = [f"{room}-c{i}" for i, room in enumerate(client_rooms)]
    strategy = AllocateMachineRoomNearby(AllocateMessageQueueAveragely(), PrefixMachineRoomResolver())
    shares = allocate_all(strategy, "g", mq_all, cid_all)
    assert_exact_cover(shares, mq_all)
    for cid, share in shares.items():
        for mq in share:
            broker_room = mq.broker_name.split("-")[0]
            assert broker_room == cid.split("-")[0] or broker_room not in client_rooms


@settings(max_examples=100, deadline=None)
@given(mq_all=mq_lists, cid_all=cid_lists)
def test_machine_room_shares_exactly_the_selected_rooms(
    mq_all: list[MessageQueue], cid_all: list[str]
) -> None:
    shares = allocate_all(AllocateMessageQueueByMachineRoom({"room1"}), "g", mq_all, cid_all)
    selected = [mq for mq in mq_all if java_split(mq.broker_name, "@") == ["room1", "broker-c"]]
    assert_exact_cover(shares, selected)


@settings(max_examples=100, deadline=None)
@given(
    mq_all=mq_lists,
    cid_all=st.lists(st.sampled_from(["a", "b", "c", "d", "a-1"]), min_size=1, max_size=8),
    v=st.integers(0, 6),
    coarse=st.booleans(),
)
def test_consistent_hash_allocate_all_matches_each_client(
    mq_all: list[MessageQueue], cid_all: list[str], v: int, coarse: bool
) -> None:
    """allocate_all builds the ring once; each client building its own must agree (duplicates included)."""
    strategy = AllocateMessageQueueConsistentHash(v, (lambda key: md5_hash(key) % 7) if coarse else None)
    mqs, cids = sort_mq_all(mq_all), sort_cid_all(cid_all)
    expected = {cid: strategy.allocate("g", cid, mqs, cids) for cid in cids}
    assert allocate_all(strategy, "g", mq_all, cid_all) == expected
