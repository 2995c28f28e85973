"""AllocationCache gives the Java classes' answers (the golden cases) and reuses work only when the
strategy, the queue set and the member list are all the same."""

from __future__ import annotations

from typing import Any

import pytest

from rmqlab.protocol.allocate import (
    AllocateMessageQueueAveragely,
    AllocateMessageQueueConsistentHash,
    AllocationCache,
    get_strategy,
)
from rmqlab.protocol.model import MessageQueue
from tests.client.allocate.test_allocate_golden_java import CASES, build, mqs

CACHED = [
    c
    for c in CASES
    if "constructor_error" not in c
    and c["sort_first"]
    # RebalanceImpl's queue set cannot hold a queue twice; the Java cases with repeated queues cannot arise
    and len({tuple(q) for q in c["mq_all"]}) == len(c["mq_all"])
    and (
        c["strategy"] in ("AVG", "AVG_BY_CIRCLE")
        or (c["strategy"] == "CONSISTENT_HASH" and c["hash"] == "md5")
    )
]


def test_the_golden_cases_include_cached_strategies() -> None:
    assert {c["strategy"] for c in CACHED} == {"AVG", "AVG_BY_CIRCLE", "CONSISTENT_HASH"}


@pytest.mark.parametrize("case", CACHED, ids=[f"{i}-{c['strategy']}" for i, c in enumerate(CACHED)])
def test_cached_answers_equal_java(case: dict[str, Any]) -> None:
    cache = AllocationCache()
    mq_set, cid_all = set(mqs(case["mq_all"])), list(case["cid_all"])
    for _round in range(2):  # the second round is answered from the cache
        for expected in case["results"]:
            # a fresh strategy object per client, as every consumer builds its own
            strategy = build(case, case)
            if "error" in expected:
                with pytest.raises(ValueError):
                    cache.allocate(strategy, "GID", expected["current_cid"], mq_set, cid_all)
                continue
            mq_all, cids, mine = cache.allocate(strategy, "GID", expected["current_cid"], mq_set, cid_all)
            assert mq_all == mqs(case["sorted_mq_all"])
            assert cids == case["sorted_cid_all"]
            assert mine == mqs(expected["queues"]), expected["current_cid"]
    ok = sum(1 for r in case["results"] if "error" not in r)
    assert cache.hits >= ok


def _queues(n: int) -> set[MessageQueue]:
    return {MessageQueue("T", f"broker-{'ab'[i % 2]}", i // 2) for i in range(n)}


def test_a_change_of_members_or_queues_is_a_new_computation() -> None:
    cache = AllocationCache()
    avg = AllocateMessageQueueAveragely()
    cids = ["c1", "c2", "c3"]
    _, _, first = cache.allocate(avg, "G", "c1", _queues(12), cids)
    assert len(first) == 4 and cache.misses == 1
    cache.allocate(avg, "G", "c1", _queues(12), list(cids))
    assert cache.hits == 1
    _, _, fewer_members = cache.allocate(avg, "G", "c1", _queues(12), ["c1", "c2"])
    assert len(fewer_members) == 6 and cache.misses == 2
    _, _, more_queues = cache.allocate(avg, "G", "c1", _queues(18), cids)
    assert len(more_queues) == 6 and cache.misses == 3
    # another strategy with the same inputs does not reuse AVG's answer
    _, _, circle = cache.allocate(get_strategy("AVG_BY_CIRCLE"), "G", "c1", _queues(12), cids)
    assert circle != first and cache.misses == 4


def test_consistent_hash_ring_is_built_once_for_all_clients(monkeypatch: pytest.MonkeyPatch) -> None:
    routes = 0
    route = AllocateMessageQueueConsistentHash.route

    def counting(self: AllocateMessageQueueConsistentHash, mq_all: Any, cid_all: Any) -> Any:
        nonlocal routes
        routes += 1
        return route(self, mq_all, cid_all)

    monkeypatch.setattr(AllocateMessageQueueConsistentHash, "route", counting)
    cache = AllocationCache()
    cids = [f"c{i}" for i in range(20)]
    got = {
        c: cache.allocate(AllocateMessageQueueConsistentHash(), "G", c, _queues(40), cids)[2] for c in cids
    }
    assert routes == 1
    plain = AllocateMessageQueueConsistentHash()
    from rmqlab.protocol.allocate import sort_cid_all, sort_mq_all

    for c in cids:
        assert got[c] == plain.allocate("G", c, sort_mq_all(_queues(40)), sort_cid_all(cids))
    assert sorted(q for qs in got.values() for q in qs) == sorted(_queues(40))


def test_strategies_with_user_objects_are_not_cached() -> None:
    cache = AllocationCache()
    ch = AllocateMessageQueueConsistentHash(4, lambda key: len(key))
    for _ in range(2):
        cache.allocate(ch, "G", "c1", _queues(4), ["c1", "c2"])
    assert cache.hits == 0 and cache.misses == 0


def test_eviction_keeps_the_most_recent_entries() -> None:
    cache = AllocationCache(max_entries=2)
    avg = AllocateMessageQueueAveragely()
    for n in (4, 6, 8):
        cache.allocate(avg, "G", "c1", _queues(n), ["c1"])
    cache.allocate(avg, "G", "c1", _queues(8), ["c1"])
    assert cache.hits == 1
    cache.allocate(avg, "G", "c1", _queues(4), ["c1"])  # evicted
    assert cache.misses == 4


@pytest.mark.parametrize("name", ["AVG", "AVG_BY_CIRCLE"])
def test_a_round_of_the_whole_group_checks_the_queues_once(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every client's share is the strategy's own answer (repeated ids, an id not in the group, more
    clients than queues), while the queue list is checked by the first client only."""
    import rmqlab.protocol.allocate as allocate_mod
    from rmqlab.protocol.allocate import sort_cid_all, sort_mq_all

    checks = 0
    check_mqs = allocate_mod._check_mqs

    def counting(mqs: Any, what: str) -> None:
        nonlocal checks
        checks += 1
        check_mqs(mqs, what)

    for n_queues, cids in ((13, ["c3", "c1", "c2", "c1", "c4"]), (3, [f"c{i}" for i in range(7)])):
        cache = AllocationCache()
        queues = _queues(n_queues)
        plain = get_strategy(name)
        expected = {
            c: plain.allocate("G", c, sort_mq_all(queues), sort_cid_all(cids)) for c in [*cids, "absent"]
        }
        monkeypatch.setattr(allocate_mod, "_check_mqs", counting)
        checks = 0
        got = {c: cache.allocate(get_strategy(name), "G", c, queues, cids)[2] for c in [*cids, "absent"]}
        monkeypatch.setattr(allocate_mod, "_check_mqs", check_mqs)
        assert got == expected
        assert checks == 2  # sorting the queue set, then the first client's full check
        with pytest.raises(ValueError):
            cache.allocate(get_strategy(name), "G", "", queues, cids)


def test_a_client_keeping_its_queue_set_is_answered_without_comparing_queues(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two clients with equal queue sets built apart (as each parses its own route): after the first
    round, a lookup compares no MessageQueue; a replaced set is a new view and a new answer."""
    eq = MessageQueue.__eq__
    compared = 0

    def counting(self: MessageQueue, other: object) -> bool:
        nonlocal compared
        compared += 1
        return eq(self, other)

    cache = AllocationCache()
    avg = AllocateMessageQueueAveragely()
    cids = ["c1", "c2"]
    views = {c: frozenset(_queues(40)) for c in cids}
    first = {c: cache.allocate(avg, "G", c, views[c], cids)[2] for c in cids}
    monkeypatch.setattr(MessageQueue, "__eq__", counting)
    again = {c: cache.allocate(avg, "G", c, views[c], cids)[2] for c in cids}
    assert again == first and compared == 0 and cache.hits == 2
    monkeypatch.setattr(MessageQueue, "__eq__", eq)
    fewer = frozenset(_queues(38))
    assert len(cache.allocate(avg, "G", "c1", fewer, cids)[2]) == 19
    assert cache.allocate(avg, "G", "c1", set(_queues(40)), cids)[2] == first["c1"]  # a plain set too


def test_a_changing_member_list_sorts_an_unchanged_queue_set_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Members join one by one (a rolling start): every view is a new entry, but the queue set is the
    same object each time and is sorted once; each answer is still the strategy's own."""
    import rmqlab.protocol.allocate as allocate_mod

    sorts = 0
    sort_mq_all = allocate_mod.sort_mq_all

    def counting(mq_all: Any) -> list[MessageQueue]:
        nonlocal sorts
        sorts += 1
        return sort_mq_all(mq_all)

    monkeypatch.setattr(allocate_mod, "sort_mq_all", counting)
    cache = AllocationCache(max_entries=4)
    queues = frozenset(_queues(12))
    avg = AllocateMessageQueueAveragely()
    cids = [f"c{i}" for i in range(10)]
    for n in range(1, len(cids) + 1):
        for cid in cids[:n]:
            _, _, mine = cache.allocate(avg, "G", cid, queues, cids[:n])
            assert mine == avg.allocate("G", cid, sort_mq_all(queues), cids[:n])
    assert sorts == 1
    other = frozenset(_queues(8))  # another queue set is sorted for itself
    _, _, mine = cache.allocate(avg, "G", "c0", other, cids)
    assert mine == avg.allocate("G", "c0", sort_mq_all(other), cids) and sorts == 2


def test_member_lists_are_told_apart_by_value_whatever_happens_to_the_caller_s_list() -> None:
    """The cache remembers the last member lists as its own copies: a list changed after the call is seen
    as changed, an equal list (another object, or a tuple) finds the entry, and so does another order of
    the same members (the strategies sort them), down to the sorted list object."""
    cache = AllocationCache()
    avg = AllocateMessageQueueAveragely()
    cids = ["c1", "c2", "c3"]
    first = cache.allocate(avg, "G", "c1", _queues(6), cids)[2]
    assert len(first) == 2
    cids.append("c4")  # the caller changes its list and asks again with it
    assert cache.allocate(avg, "G", "c1", _queues(6), cids)[1] == ["c1", "c2", "c3", "c4"]
    assert cache.allocate(avg, "G", "c1", _queues(6), ["c1", "c2", "c3"])[2] == first
    assert cache.allocate(avg, "G", "c2", _queues(6), ("c1", "c2", "c3"))[1] == ["c1", "c2", "c3"]
    assert (cache.hits, cache.misses) == (1, 3)  # c1's first view found again; c2 new in it
    _, sorted_cids, mine = cache.allocate(avg, "G", "c1", _queues(6), ["c3", "c2", "c1"])
    assert mine == first and (cache.hits, cache.misses) == (2, 3)
    assert sorted_cids is cache.allocate(avg, "G", "c2", _queues(6), ["c1", "c2", "c3"])[1]
