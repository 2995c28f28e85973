"""Apache's Go client (rocketmq-client-go v2, interop/go) as a lab member against our broker's native port.

Needs ``go`` (the driver is built by scripts/setup_go_client.sh, run here; quick once built); the mixed
group also needs the C++ client's environment (scripts/setup_real_clients.sh). Skipped with the reason
otherwise.
"""

from __future__ import annotations

import shutil
import subprocess
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from kit.interop import ROOT, Lab, Proc, averagely, cpp_client_missing, max_offsets, ownership, wait_for

pytestmark = pytest.mark.slow

GO_SETUP = "scripts/setup_go_client.sh"
GO_DRIVER = ROOT / ".cache" / "go" / "rocketmq-go-consumer"


def go_client_missing() -> str | None:
    if shutil.which("go") is None:
        return f"go is not installed (it builds the Go client's driver, {GO_SETUP})"
    setup = subprocess.run(["bash", GO_SETUP], cwd=ROOT, capture_output=True, text=True, timeout=1200)
    if setup.returncode != 0 or not GO_DRIVER.exists():
        return f"{GO_SETUP} failed: {(setup.stderr or setup.stdout)[-500:]}"
    return None


_go_missing: list[str | None] = []


@pytest.fixture
def go_client() -> None:
    """The driver built (on first use, so that collecting these tests builds nothing), else a skip."""
    if not _go_missing:
        _go_missing.append(go_client_missing())
    if _go_missing[0] is not None:
        pytest.skip(_go_missing[0])


@pytest.fixture
def cpp_client() -> None:
    why = cpp_client_missing()
    if why is not None:
        pytest.skip(why)


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[Lab]:
    lab = Lab(tmp_path)
    try:
        yield lab
    finally:
        lab.close()


def go_consumer(lab: Lab, name: str, group: str, topic: str, *extra: str) -> Proc:
    argv = [str(GO_DRIVER), "--namesrv", lab.native, "--group", group, "--topic", topic, "--node", name]
    argv += ["--log-file", str(lab.dir / f"{name}.jsonl")]
    argv += ["--client-log-dir", str(lab.dir / f"{name}.client-log"), *extra]
    return lab.start(name, argv)


def latest_rounds(lab: Lab, names: list[str], topic: str, clients: list[str]) -> dict[str, dict] | None:
    """Each node's latest rebalance of ``topic`` whose members are exactly ``clients``, once all have one."""
    out = {}
    for name in names:
        rounds = [e for e in lab.events(name, "rebalance") if e["topic"] == topic]
        if not rounds or sorted(rounds[-1]["cid_all"]) != sorted(clients):
            return None
        out[name] = rounds[-1]
    return out


def consumptions(lab: Lab, group: str, topic: str) -> Counter[tuple[int, int]]:
    """How many times each (queue id, queue offset) was consumed in the group."""
    return Counter(
        (e["queue_id"], e["queue_offset"])
        for e in lab.events(event="message_consumed")
        if e["group"] == group and e["topic"] == topic
    )


@pytest.mark.usefixtures("go_client")
@pytest.mark.parametrize("mode", ["CONCURRENTLY", "ORDERLY"])
def test_two_go_consumers_consume_a_batch_exactly_once(lab: Lab, mode: str) -> None:
    group, topic, queues, count = f"GG-{mode}", "TG", 8, 40
    orderly = mode == "ORDERLY"
    # Orderly: our broker at half time, a 30 s queue-lock lease (see below); channels still expire after
    # 60 s, twice the clients' 30 s heartbeat.
    lab.start_broker([topic], queues, *(("--time-scale", "0.5") if orderly else ()))
    extra = ("--orderly",) if orderly else ()
    first = go_consumer(lab, "go-1", group, topic, *extra).wait_ready()
    wait_for(
        "the first to take every queue",
        lambda: ownership(lab, group, topic).get(first) == set(range(queues)),
        20,
        lab,
    )
    second = go_consumer(lab, "go-2", group, topic, *extra).wait_ready()
    ids = {"go-1": first, "go-2": second}
    clients = sorted(ids.values())
    assert len(set(clients)) == 2
    held = wait_for(
        "two Go consumers to split the queues",
        lambda: (
            (h := {c: q for c, q in ownership(lab, group, topic).items() if c in clients})
            == averagely(clients, queues)
            and h
        ),
        100 if orderly else 40,
        lab,
    )
    # Their own allocation calls name both members and give each what the events say it holds.
    rounds = wait_for(
        "both rebalances over both", lambda: latest_rounds(lab, list(ids), topic, clients), 20, lab
    )
    for name, cid in ids.items():
        assert rounds[name]["strategy"] == "AVG"
        assert sorted(rounds[name]["allocated"]) == sorted(f"broker-a:{q}" for q in held[cid])
    if orderly:
        # rocketmq-client-go 2.1.2 does not unlock a queue it gives up (its push consumer's
        # removeUnnecessaryMessageQueue leaves orderly as a TODO; Java's unlocks it): the newcomer gets
        # each such queue only when the broker's lease on the old lock ran out.
        moved = held[second]
        locks = [e for e in lab.events("broker-a") if e.get("group") == group and e.get("topic") == topic]
        unlocked = {e["queue_id"] for e in locks if e["event"] == "lock_released" and e["client_id"] == first}
        taken = {
            e["queue_id"]: e.get("previous_client_id")
            for e in locks
            if e["event"] == "lock_acquired" and e["client_id"] == second
        }
        assert not unlocked & moved, f"go-1 unlocked {sorted(unlocked & moved)}"
        assert {q: taken.get(q) for q in moved} == dict.fromkeys(moved, first), taken
        assert {e["queue_id"] for e in lab.events("go-2", "lock_failed")} >= moved

    assert lab.py_producer("py-producer", topic, count).popen.wait(30) == 0
    positions = {(q, o) for q, top in max_offsets(lab, topic).items() for o in range(top)}
    assert len(positions) == count
    got = wait_for(
        f"all {count} messages consumed",
        lambda: (c := consumptions(lab, group, topic)) and positions <= set(c) and c,
        30,
        lab,
    )
    assert set(got) == positions and set(got.values()) == {1}, "each message consumed exactly once"
    by_client = {
        (e["queue_id"], e["queue_offset"]): e["client_id"]
        for e in lab.events(event="message_consumed")
        if e["group"] == group
    }
    owner = {q: cid for cid, qs in held.items() for q in qs}
    assert all(by_client[pos] == owner[pos[0]] for pos in positions)
    assert {e["mode"] for e in lab.events(event="message_consumed")} == {mode}

    for proc in [p for p in lab.procs if p.name in ids]:
        assert proc.stop(20) == 0
    assert {e["client_id"] for e in lab.events(event="consumer_stopped")} == set(clients)


@pytest.mark.usefixtures("go_client", "cpp_client")
def test_go_and_cpp_consumers_agree_on_the_allocation(lab: Lab) -> None:
    """One Go and one C++ consumer in one group (apache/rocketmq-client-go#419 saw queues owned twice and
    none in mixed groups): both allocate AVG over the same sorted members and queues, so no queue is
    owned twice and none is left unowned. Seven queues, so that the remainder branch counts too."""
    group, topic, queues, count = "GX", "TX", 7, 42
    lab.start_broker([topic], queue_nums=queues)
    ids = {"go-1": go_consumer(lab, "go-1", group, topic).wait_ready()}
    ids["cpp-1"] = lab.cpp_consumer("cpp-1", group, topic).wait_ready()
    clients = sorted(ids.values())
    rounds = wait_for(
        "both clients' rebalances over both members",
        lambda: latest_rounds(lab, list(ids), topic, clients),
        40,
        lab,
    )
    allocated = {name: {int(q.split(":")[1]) for q in r["allocated"]} for name, r in rounds.items()}
    every = set(range(queues))
    # The question: do their allocations agree?
    assert not allocated["go-1"] & allocated["cpp-1"], f"owned twice: {allocated}"
    assert allocated["go-1"] | allocated["cpp-1"] == every, (
        f"unowned: {every - set().union(*allocated.values())}"
    )
    assert {ids[n]: a for n, a in allocated.items()} == averagely(clients, queues)
    held = wait_for(
        "the queues held as allocated",
        lambda: (
            (h := {c: q for c, q in ownership(lab, group, topic).items() if c in clients})
            == {ids[n]: a for n, a in allocated.items()}
            and h
        ),
        20,
        lab,
    )

    assert lab.py_producer("py-producer", topic, count).popen.wait(30) == 0
    positions = {(q, o) for q, top in max_offsets(lab, topic).items() for o in range(top)}
    got = wait_for(
        f"all {count} messages consumed",
        lambda: (c := consumptions(lab, group, topic)) and positions <= set(c) and c,
        30,
        lab,
    )
    assert set(got) == positions and set(got.values()) == {1}, "each message consumed exactly once"
    consumers = {e["client_id"] for e in lab.events(event="message_consumed") if e["group"] == group}
    assert consumers == set(held)


@pytest.mark.usefixtures("go_client")
def test_the_go_producer_sends_what_a_go_consumer_reports(lab: Lab) -> None:
    """The driver's producer mode: every acknowledged send is a message_sent naming the queue and offset
    the broker stored it at, under the id a consumer of Apache's reports for it (the client's UNIQ_KEY)."""
    lab.start_broker(["GoSend"])
    argv = [str(GO_DRIVER), "producer", "--namesrv", lab.native, "--topic", "GoSend", "--rate", "200"]
    argv += ["--count", "60", "--node", "go-producer", "--log-file", str(lab.dir / "go-producer.jsonl")]
    producer = lab.start("go-producer", argv)
    producer.wait_ready()
    assert producer.popen.wait(60) == 0
    sent = {e["msg_id"]: e for e in lab.events("go-producer", "message_sent")}
    assert len(sent) == 60
    assert sum(max_offsets(lab, "GoSend").values()) == 60
    assert {e["broker"] for e in sent.values()} == {"broker-a"}
    assert len({(e["queue_id"], e["queue_offset"]) for e in sent.values()}) == 60
    go_consumer(lab, "go-1", "GID_go_send", "GoSend", "--consume-from", "first").wait_ready()
    wait_for(
        "a Go consumer to consume the Go producer's messages",
        lambda: len({e["msg_id"] for e in lab.events("go-1", "message_consumed")}) >= 60,
        60,
        lab,
    )
    assert {e["role"] for e in lab.events("go-producer")} == {"producer"}
    where = ("queue_id", "queue_offset")
    for e in lab.events("go-1", "message_consumed"):
        assert [e[k] for k in where] == [sent[e["msg_id"]][k] for k in where], e
