"""Apache's RocketMQ 5 clients (Python 5.1.2 and Node.js 1.0.8) through rmq-proxy over our broker's POP.

Needs the [v5] extra and the v5 clients' environments (scripts/setup_real_clients.sh); skipped with the
reason otherwise. The clients keep their own timers (10 s heartbeats, 20-30 s long polls); the broker runs
at a quarter time, so its revive scan and its 120 s channel expiry (30 s here) stay clear of them.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest
from kit.interop import Lab, v5_clients_missing, wait_for

pytestmark = pytest.mark.slow

_missing = v5_clients_missing()
needs_v5 = pytest.mark.skipif(_missing is not None, reason=_missing or "")
BROKER_OPTS = ("--time-scale", "0.25")


@pytest.fixture
def lab(tmp_path: Path):
    lab = Lab(tmp_path)
    try:
        yield lab
    finally:
        lab.close()


def consumed(lab: Lab, group: str) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for e in lab.events(event="message_consumed"):
        if e.get("group") == group:
            out.setdefault(e["msg_id"], []).append(e)
    return out


def registered(lab: Lab, group: str) -> set[str]:
    return {e["client_id"] for e in lab.events("broker-a", "consumer_registered") if e["group"] == group}


@needs_v5
def test_push_and_simple_consumers_of_both_clients_receive_ack_and_produce(lab: Lab) -> None:
    topic = "T5"
    lab.start_broker([topic], 4, *BROKER_OPTS)
    lab.start_proxy()
    groups = {
        ("py5", "push"): "G-py-push",
        ("py5", "simple"): "G-py-simple",
        ("js5", "push"): "G-js-push",
        ("js5", "simple"): "G-js-simple",
    }
    procs = {g: lab.v5_consumer(client, g, g, topic, "--kind", kind) for (client, kind), g in groups.items()}
    ids = {g: p.wait_ready(60) for g, p in procs.items()}
    for g, cid in ids.items():
        wait_for(f"{g} registered on the broker", lambda g=g, cid=cid: cid in registered(lab, g), 30, lab)

    for client in ("py5", "js5"):
        producer = lab.v5_producer(client, f"{client}-producer", topic, 5, client)
        producer.wait_ready(60)
        assert producer.popen.wait(60) == 0, producer.out_path.read_text()[-2000:]
        sent_lines = [line for line in (producer.popen.stdout.read() or "").splitlines() if '"sent"' in line]
        assert len(sent_lines) == 5
    # The proxy, the producer the broker sees, names each message's queue.
    sent = {e["msg_id"] for e in lab.events("proxy", "message_sent")}
    assert len(sent) == 10

    for g in groups.values():
        wait_for(f"{g} consumed all", lambda g=g: set(consumed(lab, g)) >= sent, 60, lab)
        acked = lambda g=g: {  # noqa: E731
            (e["topic"], e["queue_id"], e["queue_offset"])
            for e in lab.events("broker-a", "message_acked")
            if e["group"] == g
        }
        wait_for(f"{g} acked all", lambda acked=acked: len(acked()) >= 10, 30, lab)
        by_id = consumed(lab, g)
        assert all(len(by_id[m]) == 1 for m in sent), f"{g} consumed a message twice"
        # message_consumed names the queue the proxy sent it to
        queue_of = {
            e["msg_id"]: (e["queue_id"], e["queue_offset"]) for e in lab.events("proxy", "message_sent")
        }
        assert {m: (by_id[m][0]["queue_id"], by_id[m][0]["queue_offset"]) for m in sent} == {
            m: queue_of[m] for m in sent
        }
    assert not lab.events("broker-a", "message_revived")
    for p in procs.values():  # a graceful stop of the Node.js push consumer waits out its long polls
        p.kill()


@needs_v5
def test_killed_consumers_in_flight_messages_come_back_after_the_invisible_time(lab: Lab) -> None:
    topic, group, invisible_s = "TK", "GK", 3
    lab.start_broker([topic], 4, *BROKER_OPTS)
    lab.start_proxy("--min-invisible-ms", "1000")
    # A hangs in its listener on the first message of a batch: the whole batch stays in flight with it.
    hung = lab.v5_consumer(
        "py5",
        "hung",
        group,
        topic,
        "--kind",
        "simple",
        "--invisible-s",
        str(invisible_s),
        "--consume-ms",
        "600000",
    )
    hung_id = hung.wait_ready(60)
    wait_for("hung registered", lambda: hung_id in registered(lab, group), 30, lab)
    producer = lab.v5_producer("js5", "producer", topic, 8, "k")
    assert producer.popen.wait(60) == 0, producer.out_path.read_text()[-2000:]
    sent = {e["msg_id"] for e in lab.events("proxy", "message_sent")}
    assert len(sent) == 8

    # The broker's events name its own stored ids; the clients see the producer's: match by position.
    sent_at = {(e["queue_id"], e["queue_offset"]): e["msg_id"] for e in lab.events("proxy", "message_sent")}

    def popped_by_hung() -> dict[str, int]:
        return {
            sent_at[(e["queue_id"], e["queue_offset"])]: e["ts_ms"]
            for e in lab.events("broker-a", "message_popped")
            if e["client_id"] == hung_id and e["topic"] == topic
        }

    wait_for("the hung consumer popped messages", popped_by_hung, 30, lab)
    hung.signal(signal.SIGKILL)
    hung.popen.wait(10)
    held = popped_by_hung()

    other = lab.v5_consumer("py5", "other", group, topic, "--kind", "push")
    other.wait_ready(60)
    wait_for("the other consumer got every message", lambda: set(consumed(lab, group)) >= sent, 90, lab)
    by_id = consumed(lab, group)
    # What the killed consumer held came back through revive, as a second delivery, after its invisible time.
    assert held and set(held) <= sent
    for msg_id, popped_ms in held.items():
        got = [e for e in by_id[msg_id] if e["node"] == "other"]
        assert got, f"{msg_id} never came back"
        assert got[0]["reconsume_times"] >= 1
        assert got[0]["ts_ms"] >= popped_ms + invisible_s * 1000
    revived = [e for e in lab.events("broker-a", "message_revived") if e["group"] == group]
    assert len(revived) >= len(held)


@needs_v5
def test_a_hung_v5_listener_holds_what_it_popped_until_released(lab: Lab) -> None:
    topic = "TH"
    lab.start_broker([topic], 4, *BROKER_OPTS)
    lab.start_proxy()
    procs = {c: lab.v5_consumer(c, f"{c}-hung", f"G-{c}", topic, "--kind", "push") for c in ("py5", "js5")}
    ids = {c: p.wait_ready(60) for c, p in procs.items()}
    for c, cid in ids.items():
        wait_for(f"{c} registered", lambda c=c, cid=cid: cid in registered(lab, f"G-{c}"), 30, lab)
        procs[c].signal(signal.SIGUSR1)
        wait_for(f"{c} hung", lambda c=c: lab.events(f"{c}-hung", "listener_hung"), 10, lab)
    producer = lab.v5_producer("py5", "producer", topic, 4, "h")
    assert producer.popen.wait(60) == 0, producer.out_path.read_text()[-2000:]
    sent = {e["msg_id"] for e in lab.events("proxy", "message_sent")}

    def popped(group: str) -> int:
        return sum(1 for e in lab.events("broker-a", "message_popped") if e["group"] == group)

    for c in procs:
        wait_for(f"{c} popped everything", lambda c=c: popped(f"G-{c}") >= 4, 60, lab)
    time.sleep(1)
    assert not lab.events(event="message_consumed")  # popped, in the hung listeners' hands
    for c, p in procs.items():
        p.signal(signal.SIGUSR2)
        wait_for(f"{c} consumed all", lambda c=c: set(consumed(lab, f"G-{c}")) >= sent, 30, lab)
        assert lab.events(f"{c}-hung", "listener_released")
    for p in procs.values():
        p.kill()
