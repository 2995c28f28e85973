"""Apache's Java clients in the lab: rocketmq-client 4.9.8 (push and lite pull), rocketmq-client 5.5.0 (a
push consumer the broker assigns, PULL or POP) over our broker's native port, and the v5 gRPC client
(rocketmq-client-java 5.2.0) through rmq-proxy, each run by interop/java/consumer.sh.

Needs java and mvn; skipped with the reason otherwise. The module builds the clients first
(scripts/setup_java_clients.sh: a no-op when up to date; the first build fetches them from Maven Central).
The remoting clients run at a quarter time (--time-scale 0.25: a 5 s rebalance, 1.25 s offset commits)
and react to NOTIFY_CONSUMER_IDS_CHANGED at once; the gRPC client keeps its own timers.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kit.interop import Lab, consumed_positions, max_offsets, ownership, wait_for
from kit.java import build_java_clients, java_consumer, java_tools_missing, rss_kb

pytestmark = pytest.mark.slow

_missing = java_tools_missing()
needs_java = pytest.mark.skipif(_missing is not None, reason=_missing or "")

OPTS = ("--consume-from", "first", "--time-scale", "0.25")
QUEUES = {f"broker-a:{q}" for q in range(4)}
RSS_BUDGET_KB = 150 * 1024


@pytest.fixture(scope="module", autouse=True)
def java_clients() -> None:
    if _missing is None:
        build_java_clients()


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[Lab]:
    lab = Lab(tmp_path)
    try:
        yield lab
    finally:
        lab.close()


def latest_rebalance(lab: Lab, name: str, topic: str) -> dict[str, Any] | None:
    rounds = [e for e in lab.events(name, "rebalance") if e["topic"] == topic]
    return rounds[-1] if rounds else None


def settled(lab: Lab, group: str, topic: str, ids: dict[str, str]) -> dict[str, set[str]] | None:
    """Each client's allocation once every one's latest rebalance saw all of them, the allocations split
    the queues, and each client holds what it was allocated (its mq_added / mq_removed); else None."""
    allocated: dict[str, set[str]] = {}
    for name, cid in ids.items():
        last = latest_rebalance(lab, name, topic)
        if last is None or sorted(last["cid_all"]) != sorted(ids.values()):
            return None
        allocated[cid] = set(last["allocated"])
    if set().union(*allocated.values()) != QUEUES or sum(map(len, allocated.values())) != len(QUEUES):
        return None
    held = ownership(lab, group, topic)
    if any({f"broker-a:{q}" for q in held.get(cid, set())} != qs for cid, qs in allocated.items()):
        return None
    return allocated


def produce(lab: Lab, name: str, topic: str, count: int) -> set[tuple[int, int]]:
    """Our producer sends ``count`` messages; returns every (queue, offset) sent to the topic so far."""
    assert lab.py_producer(name, topic, count).popen.wait(30) == 0
    return {(q, o) for q, top in max_offsets(lab, topic).items() for o in range(top)}


def consumed_lines(lab: Lab, group: str, topic: str) -> list[dict[str, Any]]:
    return [
        e for e in lab.events(event="message_consumed") if e.get("group") == group and e["topic"] == topic
    ]


def committed_to(lab: Lab, group: str, topic: str, tops: dict[int, int]) -> bool:
    """The broker holds the group's offsets up to ``tops`` (queue -> offset)."""
    done: dict[int, int] = {}
    for e in lab.events("broker-a", "offset_committed"):
        if e["group"] == group and e["topic"] == topic:
            done[e["queue_id"]] = max(done.get(e["queue_id"], 0), e["offset"])
    return all(done.get(q, 0) >= top for q, top in tops.items())


@needs_java
def test_two_java_consumers_split_a_topic_and_the_survivor_of_a_kill_takes_it_all(lab: Lab) -> None:
    group, topic = "GJ", "TJ"
    lab.start_broker([topic])
    procs = {n: java_consumer(lab, n, "java", group, topic, *OPTS) for n in ("java-1", "java-2")}
    ids = {n: p.wait_ready(60) for n, p in procs.items()}
    split = wait_for("the two to split the queues", lambda: settled(lab, group, topic, ids), 30, lab)
    # AllocateMessageQueueAveragely over the sorted client ids: the first two queues to the first
    first, second = sorted(ids.values())
    assert split == {first: {"broker-a:0", "broker-a:1"}, second: {"broker-a:2", "broker-a:3"}}
    for name, cid in ids.items():
        last = latest_rebalance(lab, name, topic)
        assert last is not None
        assert last["client_id"] == cid and last["strategy"] == "AVG"
        assert last["mq_all"] == sorted(QUEUES)
    routes = {tuple(e["queues"]) for e in lab.events("java-1", "topic_route") if e["topic"] == topic}
    assert routes == {tuple(sorted(QUEUES))}

    positions = produce(lab, "producer-1", topic, 40)
    assert len(positions) == 40
    wait_for(
        "the 40 messages consumed",
        lambda: positions <= set(consumed_positions(lab, group, topic)),
        20,
        lab,
    )
    owner = {int(mq.split(":")[1]): cid for cid, mqs in split.items() for mq in mqs}
    lines = consumed_lines(lab, group, topic)
    assert sorted((e["queue_id"], e["queue_offset"]) for e in lines) == sorted(positions)  # each once
    assert all(e["client_id"] == owner[e["queue_id"]] and e["mode"] == "CONCURRENTLY" for e in lines)
    rss = rss_kb(procs["java-2"].popen.pid)

    # The client commits what it consumed (the broker's offsets, and the driver's own lines): no message
    # comes back to the survivor after the kill.
    tops = max_offsets(lab, topic)
    wait_for("the offsets committed", lambda: committed_to(lab, group, topic, tops), 15, lab)
    mine = {(e["queue_id"], e["offset"]) for e in lab.events("java-1", "offset_committed")}
    assert {(int(mq.split(":")[1]), tops[int(mq.split(":")[1])]) for mq in split[ids["java-1"]]} <= mine
    procs["java-1"].kill()
    survivor = ids["java-2"]

    def took_over() -> bool:
        last = latest_rebalance(lab, "java-2", topic)
        return (
            last is not None
            and last["cid_all"] == [survivor]
            and set(last["allocated"]) == QUEUES
            and ownership(lab, group, topic).get(survivor) == {0, 1, 2, 3}
        )

    wait_for("the survivor to take every queue", took_over, 30, lab)
    positions = produce(lab, "producer-2", topic, 20)
    assert len(positions) == 60
    wait_for(
        "the next 20 consumed by the survivor",
        lambda: positions <= set(consumed_positions(lab, group, topic)),
        20,
        lab,
    )
    lines = consumed_lines(lab, group, topic)
    assert sorted((e["queue_id"], e["queue_offset"]) for e in lines) == sorted(positions)  # each once
    assert {e["client_id"] for e in lines[40:]} == {survivor}

    # SIGTERM: shutdown() in the shutdown hook, exit status 0, the client leaves the group.
    assert procs["java-2"].stop() == 0
    assert lab.events("java-2", "consumer_stopped")
    left = [e for e in lab.events("broker-a", "consumer_unregistered") if e["client_id"] == survivor]
    assert "unregister" in {e["reason"] for e in left}
    assert rss < RSS_BUDGET_KB, f"java-2 resident {rss} KiB"


@needs_java
def test_orderly_java_consumer_locks_its_queues_and_consumes_each_in_order(lab: Lab) -> None:
    group, topic = "GO", "TO"
    lab.start_broker([topic])
    proc = java_consumer(lab, "java-o", "java", group, topic, "--orderly", "--consume-ms", "2", *OPTS)
    cid = proc.wait_ready(60)
    wait_for(
        "java-o to hold every queue", lambda: ownership(lab, group, topic).get(cid) == {0, 1, 2, 3}, 30, lab
    )
    positions = produce(lab, "producer", topic, 40)
    wait_for(
        "every message consumed", lambda: positions <= set(consumed_positions(lab, group, topic)), 20, lab
    )
    locks = [e for e in lab.events("broker-a", "lock_acquired") if e["group"] == group]
    assert {e["queue_id"] for e in locks if e["topic"] == topic and e["client_id"] == cid} == {0, 1, 2, 3}
    lines = consumed_lines(lab, group, topic)
    assert {e["mode"] for e in lines} == {"ORDERLY"}
    for q in range(4):
        offsets = [e["queue_offset"] for e in lines if e["queue_id"] == q]
        assert offsets == sorted(set(offsets)), f"queue {q} consumed out of order or twice: {offsets}"
        locked_at = min(e["ts_ms"] for e in locks if e["topic"] == topic and e["queue_id"] == q)
        assert locked_at <= min(e["started_ms"] for e in lines if e["queue_id"] == q)
    # The queue is taken (mq_added) once the broker has locked it for the client.
    for e in lab.events("java-o", "mq_added"):
        if e["topic"] == topic:
            assert any(lk["queue_id"] == e["queue_id"] and lk["ts_ms"] <= e["ts_ms"] for lk in locks)

    assert proc.stop() == 0
    released = {
        e["queue_id"]
        for e in lab.events("broker-a", "lock_released")
        if e["client_id"] == cid and e["topic"] == topic and e["reason"] == "unlock"
    }
    assert released == {0, 1, 2, 3}


@needs_java
def test_lite_pull_and_a_broker_assigned_java5_consumer_each_consume_a_batch(lab: Lab) -> None:
    topic = "TB"
    lab.start_broker([topic])
    lite = java_consumer(lab, "lite", "java-lite", "GL", topic, *OPTS)
    java5 = java_consumer(lab, "java5", "java5", "G5", topic, *OPTS)
    lite_id, java5_id = lite.wait_ready(60), java5.wait_ready(60)
    for group, cid in (("GL", lite_id), ("G5", java5_id)):
        wait_for(
            f"{group} to hold every queue",
            lambda group=group, cid=cid: ownership(lab, group, topic).get(cid) == {0, 1, 2, 3},
            30,
            lab,
        )
    # The lite consumer allocates itself; the 5.x push consumer asks the broker (QUERY_ASSIGNMENT) and
    # takes its queues in the mode of the broker's answer (PULL by default).
    assert set(latest_rebalance(lab, "lite", topic)["allocated"]) == QUEUES  # type: ignore[index]
    assert not lab.events("java5", "rebalance")
    answer = [e for e in lab.events("java5", "assignment") if e["topic"] == topic][-1]
    assert (set(answer["pull"]), answer["pop"], answer["strategy"]) == (QUEUES, [], "AVG")
    queried = [e for e in lab.events("broker-a", "assignment_queried") if e["client_id"] == java5_id]
    assert queried and {e["mode"] for e in queried} == {"PULL"}

    # The hung listener: nothing consumed until SIGUSR2.
    java5.signal(signal.SIGUSR1)
    wait_for("java5's listener hung", lambda: lab.events("java5", "listener_hung"), 10, lab)
    positions = produce(lab, "producer", topic, 20)
    wait_for(
        "the lite consumer to consume the batch",
        lambda: positions <= set(consumed_positions(lab, "GL", topic)),
        20,
        lab,
    )
    time.sleep(1)
    assert not consumed_lines(lab, "G5", topic)
    java5.signal(signal.SIGUSR2)
    wait_for(
        "java5 to consume the batch",
        lambda: positions <= set(consumed_positions(lab, "G5", topic)),
        20,
        lab,
    )
    assert lab.events("java5", "listener_released")
    for group in ("GL", "G5"):
        lines = consumed_lines(lab, group, topic)
        assert sorted((e["queue_id"], e["queue_offset"]) for e in lines) == sorted(positions)
    assert lite.stop() == 0 and java5.stop() == 0
    assert lab.events("lite", "consumer_stopped") and lab.events("java5", "consumer_stopped")


@needs_java
def test_java5_consumer_pops_when_the_broker_says_pop(lab: Lab) -> None:
    group, topic = "GP", "TP"
    lab.start_broker([topic], 4, "--default-message-request-mode", "POP", "--time-scale", "0.25")
    proc = java_consumer(lab, "java5-pop", "java5", group, topic, *OPTS)
    cid = proc.wait_ready(60)
    wait_for(
        "a POP assignment",
        lambda: [e for e in lab.events("java5-pop", "assignment") if e["topic"] == topic and e["pop"]],
        30,
        lab,
    )
    answer = [e for e in lab.events("java5-pop", "assignment") if e["topic"] == topic][-1]
    assert (answer["pull"], answer["pop"]) == ([], ["broker-a:-1"])  # every queue of the broker
    assert {(e["topic"], e["queue_id"]) for e in lab.events("java5-pop", "pop_mq_added")} == {(topic, -1)}
    assert not [e for e in lab.events("java5-pop", "mq_added") if e["topic"] == topic]

    positions = produce(lab, "producer", topic, 20)
    wait_for("the batch consumed", lambda: positions <= set(consumed_positions(lab, group, topic)), 30, lab)
    lines = consumed_lines(lab, group, topic)
    assert sorted((e["queue_id"], e["queue_offset"]) for e in lines) == sorted(positions)
    sent_ids = {e["msg_id"] for e in lab.events("producer", "message_sent")}
    assert {e["msg_id"] for e in lines} == sent_ids

    def acked() -> set[tuple[int, int]]:
        return {
            (e["queue_id"], e["queue_offset"])
            for e in lab.events("broker-a", "message_acked")
            if e["group"] == group and e["client_id"] == cid
        }

    wait_for("every message acked", lambda: acked() >= positions, 20, lab)
    assert not lab.events("broker-a", "message_revived")
    assert proc.stop() == 0


@needs_java
def test_java_grpc_push_consumer_through_the_proxy_consumes_a_batch(lab: Lab) -> None:
    group, topic = "GG", "TG"
    lab.start_broker([topic], 4, "--time-scale", "0.25")
    lab.start_proxy()
    proc = java_consumer(lab, "java-grpc", "java-grpc", group, topic)
    cid = proc.wait_ready(60)
    wait_for(
        "the gRPC client registered through the proxy",
        lambda: cid in {e["client_id"] for e in lab.events("broker-a", "consumer_registered")},
        30,
        lab,
    )
    settings = [e for e in lab.events("proxy", "proxy_client_settings") if e["client_id"] == cid]
    assert settings and settings[0]["client_type"] == "PUSH_CONSUMER" and settings[0]["group"] == group
    positions = produce(lab, "producer", topic, 20)
    wait_for("the batch consumed", lambda: positions <= set(consumed_positions(lab, group, topic)), 60, lab)
    lines = consumed_lines(lab, group, topic)
    assert sorted((e["queue_id"], e["queue_offset"]) for e in lines) == sorted(positions)
    assert {e["msg_id"] for e in lines} == {e["msg_id"] for e in lab.events("producer", "message_sent")}
    assert {e["client_id"] for e in lines} == {cid}
    wait_for(
        "every message acked",
        lambda: (
            len({(e["queue_id"], e["queue_offset"]) for e in lab.events("broker-a", "message_acked")}) >= 20
        ),
        20,
        lab,
    )
    rss = rss_kb(proc.popen.pid)
    proc.kill()  # a graceful close waits out the client's 30 s long polls
    assert rss < RSS_BUDGET_KB, f"java-grpc resident {rss} KiB"
