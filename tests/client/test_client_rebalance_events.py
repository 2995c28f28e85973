"""The member fields of ``rebalance`` events in large groups (EVENTS.md: cid_all_digest)."""

from __future__ import annotations

import hashlib

from client.group_state import cid_all_digest, rebalance_event_fields


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
