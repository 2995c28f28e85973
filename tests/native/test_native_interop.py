"""Real RocketMQ clients against the emulator's native port, mixed with our own clients in one group.

Needs the real clients' environments (scripts/setup_real_clients.sh); skipped with the reason otherwise.
Real clients keep RocketMQ's real timers (10 s rebalance, 15 s long polls), so these tests rely on
NOTIFY_CONSUMER_IDS_CHANGED, to which the C++ client reacts at once.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from kit.interop import (
    Lab,
    averagely,
    consumed_positions,
    cpp_client_missing,
    js_client_missing,
    max_offsets,
    ownership,
    wait_for,
)

pytestmark = pytest.mark.slow

_cpp_missing = cpp_client_missing()
_js_missing = js_client_missing()
needs_cpp = pytest.mark.skipif(_cpp_missing is not None, reason=_cpp_missing or "")
needs_js = pytest.mark.skipif(_js_missing is not None, reason=_js_missing or "")

# Our consumers at half time: a 10 s rebalance like the real clients', heartbeats well inside the broker's
# (unscaled) 120 s channel expiry.
PY_OPTS = ("--consume-from", "first", "--time-scale", "0.5")


@pytest.fixture
def lab(tmp_path: Path):
    lab = Lab(tmp_path)
    try:
        yield lab
    finally:
        lab.close()


def converged(
    lab: Lab, group: str, topic: str, clients: list[str], queues: int
) -> dict[str, set[int]] | None:
    held = {c: qs for c, qs in ownership(lab, group, topic).items() if c in clients}
    if set(held) != set(clients):
        return None
    # Settled: every client holds what averagely gives it over this set of clients.
    if held != averagely(clients, queues):
        return None
    return held


@needs_cpp
def test_cpp_and_python_consumers_share_a_group(lab: Lab):
    group, topic, queues = "GM", "TM", 8
    lab.start_broker([topic], queue_nums=queues)
    ids: dict[str, str] = {}
    # Joins one at a time, ours first, then the C++ ones: the C++ consumer that stays after the kill below
    # then only ever gains queues. (A C++ 2.1.0 consumer that gets back a queue it gave up stops pulling
    # it: see test_cpp_client_stops_pulling_a_queue_it_gets_back.)
    procs = {}
    for name in ("py-1", "py-2", "cpp-1", "cpp-2"):
        if name.startswith("py"):
            procs[name] = lab.py_consumer(name, group, topic, *PY_OPTS)
        else:
            procs[name] = lab.cpp_consumer(name, group, topic)
        ids[name] = procs[name].wait_ready()
        clients = list(ids.values())
        held = wait_for(
            f"{len(clients)} consumers to split the {queues} queues",
            lambda clients=clients: converged(lab, group, topic, clients, queues),
            30,
            lab,
        )
    # C++ and Python computed the same averagely allocation over the same sorted client ids.
    assert held == averagely(clients, queues)
    for name in ids:
        latest = wait_for(
            f"{name}'s rebalance over all four",
            lambda name=name: [
                e
                for e in lab.events(name, "rebalance")
                if e["topic"] == topic and set(e["cid_all"]) == set(clients)
            ],
            15,
            lab,
        )[-1]
        assert sorted(latest["allocated"]) == sorted(f"broker-a:{q}" for q in held[ids[name]])

    # Ours -> everyone: our producer's messages are consumed, each by the owner of its queue.
    assert lab.py_producer("py-producer", topic, 40).popen.wait(30) == 0
    sent = max_offsets(lab, topic)
    positions = {(q, o) for q, top in sent.items() for o in range(top)}
    assert len(positions) == 40
    got = wait_for(
        "all 40 messages consumed",
        lambda: (c := consumed_positions(lab, group, topic)) and positions <= set(c) and c,
        20,
        lab,
    )
    owner = {q: cid for cid, qs in held.items() for q in qs}
    for pos in positions:
        assert got[pos] == {owner[pos[0]]}, f"{pos} consumed by {got[pos]}, owner {owner[pos[0]]}"
    assert set(ids.values()) <= {c for cs in got.values() for c in cs}

    # Kill the first C++ consumer: the others take its queues over, and nothing is lost.
    procs["cpp-1"].kill()
    survivors = [ids["py-1"], ids["py-2"], ids["cpp-2"]]
    held = wait_for(
        "the three survivors to split the queues",
        lambda: converged(lab, group, topic, survivors, queues),
        30,
        lab,
    )
    assert held == averagely(survivors, queues)

    # Theirs -> everyone: a real producer's messages reach our consumers and theirs.
    assert lab.cpp_producer("cpp-producer", topic, 40, "cpp").popen.wait(30) == 0
    sent = max_offsets(lab, topic)
    positions = {(q, o) for q, top in sent.items() for o in range(top)}
    assert len(positions) == 80
    got = wait_for(
        "all 80 messages consumed",
        lambda: (c := consumed_positions(lab, group, topic)) and positions <= set(c) and c,
        30,
        lab,
    )
    real_sent = {(e["queue_id"], e["queue_offset"]) for e in lab.events("cpp-producer", "message_sent")}
    consumers_of_real = {c for pos in real_sent for c in got[pos]}
    assert ids["cpp-2"] in consumers_of_real
    assert consumers_of_real & {ids["py-1"], ids["py-2"]}


@needs_js
def test_js_client_consumes_and_commits(lab: Lab):
    group, topic = "GJ", "TJ"
    lab.start_broker([topic])
    js = lab.js_consumer("js-1", group, topic, "--rebalance-ms", "2000", "--persist-ms", "1000")
    cid = js.wait_ready()
    wait_for(
        "the JS consumer to take all queues",
        lambda: ownership(lab, group, topic).get(cid) == {0, 1, 2, 3},
        20,
        lab,
    )
    assert lab.py_producer("py-producer", topic, 12).popen.wait(30) == 0
    sent = max_offsets(lab, topic)
    positions = {(q, o) for q, top in sent.items() for o in range(top)}
    wait_for(
        "the JS consumer to consume every message",
        lambda: positions <= set(consumed_positions(lab, group, topic)),
        20,
        lab,
    )

    def committed() -> bool:
        done: dict[int, int] = {}
        for e in lab.events("broker-a", "offset_committed"):
            if e["group"] == group and e["topic"] == topic:
                done[e["queue_id"]] = max(done.get(e["queue_id"], 0), e["offset"])
        return all(done.get(q, 0) >= top for q, top in sent.items())

    wait_for("the JS consumer's offsets to be committed", committed, 15, lab)
    assert js.stop() == 0
    assert lab.events("js-1", "consumer_stopped")
    unregistered = [e for e in lab.events("broker-a", "consumer_unregistered") if e["client_id"] == cid]
    assert unregistered and unregistered[0]["reason"] == "unregister"


def pulls_by(lab: Lab, group: str, topic: str, client: str, queue: int, since_ms: int) -> list[dict]:
    return [
        e
        for e in lab.events("broker-a", "pull_served")
        if e["group"] == group
        and e["topic"] == topic
        and e["client_id"] == client
        and e["queue_id"] == queue
        and e["ts_ms"] >= since_ms
    ]


@needs_cpp
def test_cpp_client_stops_pulling_a_queue_it_gets_back(lab: Lab):
    """The finding: Apache's C++ client 2.1.0 pulls a queue it gave up and got back once, then never again.

    Its per-queue pull callback (DefaultMQPushConsumerImpl::getAsyncPullCallBack) is cached and keeps a
    weak reference to the queue's first PullRequest; it is re-pointed only once that request is gone. A
    queue given up and taken back while the old request is still alive gets a new PullRequest whose first
    pull is answered into the old, dropped one ("has been set as dropped. Will NOT pull this queue any
    more"), so nothing pulls it again until the 120 s pull-expiry check drops and re-adds it. This test
    pins the behaviour down through the broker's pull events; it fails the day the client is fixed.
    """
    group, topic = "GB", "TB"
    lab.start_broker([topic])
    cpp = lab.cpp_consumer("cpp-1", group, topic)
    cpp_id = cpp.wait_ready()
    wait_for("cpp-1 to own every queue", lambda: converged(lab, group, topic, [cpp_id], 4), 20, lab)

    py = lab.py_consumer("py-1", group, topic, *PY_OPTS)
    py_id = py.wait_ready()
    held = wait_for(
        "the queues to be split", lambda: converged(lab, group, topic, [cpp_id, py_id], 4), 20, lab
    )
    given_up = held[py_id]
    kept = held[cpp_id]
    assert len(given_up) == 2

    assert py.stop() == 0  # unregisters: cpp-1 is notified and takes the two queues back
    wait_for("cpp-1 to get every queue back", lambda: converged(lab, group, topic, [cpp_id], 4), 20, lab)
    regained_at = max(e["ts_ms"] for e in lab.events("cpp-1", "mq_added") if e["queue_id"] in given_up)

    assert lab.py_producer("py-producer", topic, 40).popen.wait(30) == 0
    sent = max_offsets(lab, topic)
    kept_positions = {(q, o) for q in kept for o in range(sent[q])}
    wait_for(
        "cpp-1 to consume the messages of the queues it kept",
        lambda: kept_positions <= set(consumed_positions(lab, group, topic)),
        20,
        lab,
    )

    def answers_dropped() -> bool:
        dropped = {
            e["queue_id"] for e in lab.events("cpp-1", "pull_answer_ignored") if e["ts_ms"] >= regained_at
        }
        return set(given_up) <= dropped

    # what the client does wrong shows first (the answer dropped); under load it can take a while
    wait_for("cpp-1 to drop the first pull answer of each regained queue", answers_dropped, 20, lab)
    time.sleep(2.0)  # then as long again: a working client would have pulled the queues by now
    consumed = consumed_positions(lab, group, topic)
    for q in given_up:
        # Answered pulls since the queue came back: the new request's first pull and the long poll the
        # old request had left at the broker, both at the first offset, both with the first message.
        after = [(e["queue_offset"], e["count"]) for e in pulls_by(lab, group, topic, cpp_id, q, regained_at)]
        assert 1 <= len(after) <= 2, f"queue {q}: pulls since it came back {after}"
        assert {off for off, _ in after} == {0}, f"queue {q}: pulls since it came back {after}"
        assert not [pos for pos, who in consumed.items() if pos[0] == q and cpp_id in who], (
            f"queue {q}: cpp-1 consumed from it after getting it back"
        )
        assert sent[q] >= 2  # messages are waiting there
        ignored = [
            e
            for e in lab.events("cpp-1", "pull_answer_ignored")
            if e["queue_id"] == q and e["ts_ms"] >= regained_at
        ]
        assert ignored, f"queue {q}: the client's log does not say it dropped the pull answer"
    for q in kept:
        offsets = {e["queue_offset"] for e in pulls_by(lab, group, topic, cpp_id, q, regained_at)}
        assert len(offsets) >= 2, f"kept queue {q} was pulled at offsets {offsets}"


@needs_cpp
def test_cpp_driver_ignores_a_client_log_left_by_an_earlier_process_with_its_pid(lab: Lab):
    # The library names its log files after the process id alone, and ids come round again: what an
    # earlier process wrote there is not this client's (it once gave a test a dead client's id).
    group, topic = "GS", "TS"
    lab.start_broker([topic])
    argv = lab.cpp_consumer_argv("cpp-s", group, topic)
    log_dir = lab.dir / "cpp-s.client-log"
    log_dir.mkdir()
    stale = "[2026-01-01 00:00:00.000001](info):MQClientFactory:10.9.9.9@1#OLD start[start:70]\n"
    stale += "[2026-01-01 00:00:00.000002](info):Add mq:MessageQueue [topic=TS, brokerName=broker-a, "
    stale += "queueId=7], request initial offset:0\n"
    (lab.dir / "stale.log").write_text(stale)
    # The earlier process's file, named with the pid the driver is about to run as (exec keeps it).
    seed = f'cp {lab.dir / "stale.log"} {log_dir}/$$_rocketmq-cpp.log.0; exec "$@"'
    cpp = lab.start("cpp-s", ["bash", "-c", seed, "bash", *argv])
    cid = cpp.wait_ready()
    assert "#OLD" not in cid
    wait_for("cpp-s to own every queue", lambda: converged(lab, group, topic, [cid], 4), 20, lab)
    assert cid in {e["client_id"] for e in lab.events("broker-a", "consumer_registered")}
    assert {e["queue_id"] for e in lab.events("cpp-s", "mq_added")} == {0, 1, 2, 3}
    assert (log_dir / f"{cpp.popen.pid}_rocketmq-cpp.log.0").read_text().startswith(stale)


@needs_cpp
def test_cpp_orderly_consumer_locks_consumes_in_order_and_leaves(lab: Lab):
    group, topic = "GO", "TO"
    lab.start_broker([topic])
    cpp = lab.cpp_consumer("cpp-o", group, topic, "--orderly")
    cid = cpp.wait_ready()
    wait_for("cpp-o to own every queue", lambda: converged(lab, group, topic, [cid], 4), 20, lab)
    assert lab.cpp_producer("cpp-producer", topic, 24, "o").popen.wait(30) == 0
    sent = max_offsets(lab, topic)
    positions = {(q, o) for q, top in sent.items() for o in range(top)}
    wait_for(
        "every message consumed", lambda: positions <= set(consumed_positions(lab, group, topic)), 20, lab
    )
    locked = {e["queue_id"] for e in lab.events("broker-a", "lock_acquired") if e["client_id"] == cid}
    assert locked == {0, 1, 2, 3}
    consumed = lab.events("cpp-o", "message_consumed")
    assert {e["mode"] for e in consumed} == {"ORDERLY"}
    for q in range(4):
        offsets = [e["queue_offset"] for e in consumed if e["queue_id"] == q]
        assert offsets == sorted(offsets), f"queue {q} consumed out of order: {offsets}"
    # A graceful shutdown (message trace OPEN, see the driver) unregisters instead of crashing.
    assert cpp.stop() == 0
    assert lab.events("cpp-o", "consumer_stopped")
    reasons = {e["reason"] for e in lab.events("broker-a", "consumer_unregistered") if e["client_id"] == cid}
    assert "unregister" in reasons
