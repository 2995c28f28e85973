"""The member fields of ``rebalance`` events in large groups (EVENTS.md: cid_all_digest)."""

from __future__ import annotations

import hashlib
import json

from rmqlab.client.group_state import cid_all_digest, member_set, rebalance_event_fields
from rmqlab.protocol.event_log import EventLog
from tests.client.test_client_rebalance_impl import FakeGroupApi, Rig, mq


def test_digest_is_sha256_of_distinct_sorted_ids_one_per_line() -> None:
    ids = ["10.0.0.2@9#1", "10.0.0.1@3#1", "10.0.0.2@9#1", "Z@1"]
    expected = hashlib.sha256(b"10.0.0.1@3#1\n10.0.0.2@9#1\nZ@1").hexdigest()
    assert cid_all_digest(ids) == expected
    assert cid_all_digest(reversed(ids)) == expected
    assert len(expected) == 64 and expected == expected.lower()


def test_digest_sorts_by_code_point() -> None:
    # Java's String order would put the surrogate pair (U+1F600) before U+FF5E; code points do not.
    a, b = "\uff5e", "\U0001f600"
    assert cid_all_digest([b, a]) == hashlib.sha256(f"{a}\n{b}".encode()).hexdigest()


def test_list_up_to_the_threshold_digest_above() -> None:
    small = rebalance_event_fields(["a", "b"], ["broker-a:0"], 2)
    assert small == {"cid_all": ["a", "b"], "allocated": ["broker-a:0"]}
    big = rebalance_event_fields(["a", "b", "c"], [], 2)
    assert big == {"cid_all_digest": cid_all_digest(["a", "b", "c"]), "allocated": []}
    assert "cid_all" not in big
    # repeated ids count once
    assert "cid_all" in rebalance_event_fields(["a", "a", "b"], [], 2)
    assert "cid_all" in rebalance_event_fields(["a"] * 100, [], None)


def test_a_member_list_seen_again_gives_the_same_set_and_digest() -> None:
    ids = [f"10.0.0.{i}@{i}#1" for i in range(40)]
    members = member_set(ids)
    assert members == frozenset(ids) and member_set(ids) is members  # one set per list object
    assert member_set(list(ids)) == members and member_set(list(ids)) is not members  # another list
    assert member_set(["a", "b"]) == {"a", "b"}
    fields = rebalance_event_fields(ids, [], 2, members)
    assert fields == {"cid_all_digest": cid_all_digest(ids), "allocated": []}
    assert fields == rebalance_event_fields(list(reversed(ids)), [], 2)  # the set made here instead
    two = ids[:2]
    assert rebalance_event_fields(two, [], 2, member_set(two)) == {"cid_all": two, "allocated": []}


class Lines:
    """An EventLog sink that keeps the rendered lines."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def put(self, line: str) -> None:
        self.lines.append(line)

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass

    def rebalances(self, topic: str = "T") -> list[dict[str, object]]:
        events = [json.loads(line) for line in self.lines]
        return [e for e in events if e["event"] == "rebalance" and e["topic"] == topic]


async def _rounds(omit: bool, digest_over: int | None) -> tuple[Lines, FakeGroupApi]:
    lines = Lines()
    r = Rig(omit_repeated_rebalance_events=omit, rebalance_event_digest_over=digest_over)
    r.impl.log = EventLog("c", "consumer", None, console=False, sink=lines)
    r.api.cids = ["c1", "10.0.0.9@1#1"]
    r.route(mq(0), mq(1), mq(2), mq(3))
    await r.rebalance()  # changed
    await r.rebalance()  # the same members and allocation
    r.api.cids.append("10.0.0.9@2#2")
    await r.rebalance()  # a member joined: allocation changes
    r.api.cids.reverse()
    await r.rebalance()  # the same set in another order: still the same round
    return lines, r.api


async def test_repeated_rounds_are_written_unless_omitted() -> None:
    lines, _ = await _rounds(omit=False, digest_over=None)
    assert [e["changed"] for e in lines.rebalances()] == [True, False, True, False]
    assert all("cid_all" in e for e in lines.rebalances())


async def test_omitted_rounds_leave_only_the_changes() -> None:
    lines, inst = await _rounds(omit=True, digest_over=1)
    got = lines.rebalances()
    assert [e["changed"] for e in got] == [True, True]
    assert got[0]["allocated"] != got[1]["allocated"]
    assert got[-1]["cid_all_digest"] == cid_all_digest(inst.cids) and "cid_all" not in got[-1]


async def test_a_new_member_list_is_written_even_when_the_allocation_stays() -> None:
    """Omission compares the member set too: the allocation cache hands an unchanged view the same
    list object, but another list (members joined or left) is another round to write."""
    lines = Lines()
    r = Rig(omit_repeated_rebalance_events=True)
    r.impl.log = EventLog("c", "consumer", None, console=False, sink=lines)
    r.route(mq(0))
    for cids in (["c1", "z1"], ["c1", "z1"], ["c1", "z1", "z2"], ["c1", "z2", "z1"], ["c1", "z1"]):
        r.api.cids = list(cids)
        await r.rebalance()
    got = lines.rebalances()
    assert [e["cid_all"] for e in got] == [["c1", "z1"], ["c1", "z1", "z2"], ["c1", "z1"]]
    assert [e["allocated"] for e in got] == [["BrokerA:0"]] * 3
    assert [e["changed"] for e in got] == [True, False, False]
