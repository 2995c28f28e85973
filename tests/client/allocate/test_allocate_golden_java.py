"""Replay outputs recorded from RocketMQ's own Java allocation classes (see ``about`` in the JSON file)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path
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
    AllocateMessageQueueStrategy,
    PrefixMachineRoomResolver,
    sort_cid_all,
    sort_mq_all,
)
from rmqlab.protocol.model import MessageQueue

DOC = json.loads((Path(__file__).parent / "golden_java_cases.json").read_text(encoding="utf-8"))
CASES: list[dict[str, Any]] = DOC["cases"]


def _md5(key: str) -> bytes:
    return hashlib.md5(key.encode("utf-8", "replace"), usedforsecurity=False).digest()


def hash_function(kind: str) -> Callable[[str], int] | None:
    if kind == "md5":
        return None
    if kind == "md5_long":
        return lambda key: int.from_bytes(_md5(key)[:8], "big", signed=True)
    m = int(kind.removeprefix("md5_mod_"))
    return lambda key: int.from_bytes(_md5(key)[:4], "big") % m - m // 2


def mqs(items: list[list[Any]]) -> list[MessageQueue]:
    return [MessageQueue(t, b, q) for t, b, q in items]


def build(spec: dict[str, Any], case: dict[str, Any]) -> AllocateMessageQueueStrategy:
    kind = spec["strategy"]
    if kind == "AVG":
        return AllocateMessageQueueAveragely()
    if kind == "AVG_BY_CIRCLE":
        return AllocateMessageQueueAveragelyByCircle()
    if kind == "CONFIG":
        return AllocateMessageQueueByConfig(mqs(case["message_queue_list"]))
    if kind == "MACHINE_ROOM":
        return AllocateMessageQueueByMachineRoom(case["consumer_idcs"])
    if kind == "CONSISTENT_HASH":
        return AllocateMessageQueueConsistentHash(spec["virtual_node_cnt"], hash_function(spec["hash"]))
    assert kind == "MACHINE_ROOM_NEARBY" and spec["resolver"] == "prefix"
    return AllocateMachineRoomNearby(build(spec["inner"], case), PrefixMachineRoomResolver())


def test_file_covers_every_strategy_and_odd_case() -> None:
    kinds = {c["strategy"] for c in CASES} | {c["inner"]["strategy"] for c in CASES if "inner" in c}
    assert kinds == set(STRATEGY_NAMES)
    assert len(CASES) >= 250
    results = [r for c in CASES for r in c.get("results", [])]
    assert any("error" in r for r in results)
    assert any(r.get("queues") == [] for r in results)
    assert any(c.get("virtual_node_cnt") == 0 for c in CASES)
    assert any(len(set(c["cid_all"])) < len(c["cid_all"]) for c in CASES)


CASE_IDS = [f"{i}-{c.get('name', c['strategy'])}" for i, c in enumerate(CASES)]


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_same_as_java(case: dict[str, Any]) -> None:
    if "constructor_error" in case:
        with pytest.raises(ValueError, match="virtualNodeCnt"):
            build(case, case)
        return
    strategy = build(case, case)
    assert strategy.name == case["name"]
    mq_all, cid_all = mqs(case["mq_all"]), list(case["cid_all"])
    if case["sort_first"]:
        mq_all, cid_all = sort_mq_all(mq_all), sort_cid_all(cid_all)
        assert mq_all == mqs(case["sorted_mq_all"])
        assert cid_all == case["sorted_cid_all"]
    for expected in case["results"]:
        cur = expected["current_cid"]
        if "error" in expected:
            with pytest.raises(ValueError):
                strategy.allocate("GID", cur, mq_all, cid_all)
        else:
            assert strategy.allocate("GID", cur, mq_all, cid_all) == mqs(expected["queues"]), cur


def test_common_check_messages_match_java() -> None:
    """The shared argument check raises with RocketMQ's own wording."""
    seen = 0
    for case in CASES:
        if "constructor_error" in case or case["strategy"] == "CONFIG":
            continue
        strategy = build(case, case)
        mq_all, cid_all = mqs(case["mq_all"]), list(case["cid_all"])
        if case["sort_first"]:
            mq_all, cid_all = sort_mq_all(mq_all), sort_cid_all(cid_all)
        for expected in case["results"]:
            java = expected.get("error", "")
            if java.endswith(("is empty", "empty")) and "Machine room" not in java:
                with pytest.raises(ValueError) as info:
                    strategy.allocate("GID", expected["current_cid"], mq_all, cid_all)
                assert f"IllegalArgumentException: {info.value}" == java
                seen += 1
    assert seen > 50
