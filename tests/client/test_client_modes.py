"""Orderly, broadcasting and lite-pull consumption against a real broker."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from typing import Any

import pytest
from kit import wait_until
from kit.cluster import Cluster, add_fault, crash, queues

from rmqlab.client.consume import ConsumeConcurrentlyStatus, ConsumeOrderlyStatus
from rmqlab.client.lite_pull_consumer import LitePullConsumer
from rmqlab.protocol.model import MessageQueue


@pytest.fixture
async def cluster(tmp_path):  # type: ignore[no-untyped-def]
    c = Cluster(str(tmp_path))
    yield c
    await c.close()


def overlapping_consumption(events: list[dict[str, Any]]) -> list[tuple[str, str, str]]:
    """Pairs of different clients whose listener calls on one queue overlapped in time."""
    by_queue: dict[tuple[str, str, int], list[tuple[int, int, str]]] = defaultdict(list)
    for e in events:
        by_queue[(e["topic"], e["broker"], e["queue_id"])].append(
            (e["started_ms"], e["ts_ms"], e["client_id"])
        )
    bad = []
    for q, spans in by_queue.items():
        spans.sort()
        for i, (_s1, e1, c1) in enumerate(spans):
            for s2, _e2, c2 in spans[i + 1 :]:
                if s2 >= e1:
                    break
                if c1 != c2:
                    bad.append((f"{q}", c1, c2))
    return bad


async def test_orderly_never_consumes_a_queue_from_two_clients(cluster: Cluster, tmp_path: Any) -> None:
    await cluster.start_broker()
    await cluster.create_topic("T", 4)
    consumed: set[str] = set()

    async def listener(msgs: list[Any]) -> ConsumeOrderlyStatus:
        await asyncio.sleep(0.01)
        for m in msgs:
            consumed.add(m.msg_id)
        return ConsumeOrderlyStatus.SUCCESS

    consumers = []
    for i in range(3):
        c = cluster.consumer("og", f"orderly-{i}", consume_from_where="first")
        c.subscribe("T")
        c.register_message_listener_orderly(listener)
        consumers.append(c)
    await consumers[0].start()
    await consumers[1].start()
    producer = cluster.producer()
    await producer.start()
    sent: list[str] = []

    async def produce() -> None:
        for i in range(120):
            sent.append((await producer.send("T", b"o%d" % i)).msg_id)
            await asyncio.sleep(0.005)

    async with asyncio.TaskGroup() as tg:
        tg.create_task(produce())
        await asyncio.sleep(0.3)
        await consumers[2].start()
        await asyncio.sleep(0.3)
        await consumers[0].shutdown()
        await asyncio.sleep(0.2)
        await crash(consumers[1])
    # the crashed client's broker locks only expire after 60 s (3 s scaled): then the survivor takes over
    await wait_until(lambda: set(sent) <= consumed, 20, "every orderly message consumed")
    events = [e for e in cluster.events("message_consumed") if e["topic"] == "T"]
    assert events and all(e["mode"] == "ORDERLY" for e in events)
    assert overlapping_consumption(events) == []
    # within one client and queue, offsets never go backwards while it keeps the queue
    last: dict[tuple[str, int], int] = {}
    removed = {(e["client_id"], e["queue_id"]) for e in cluster.events("mq_removed") if e["topic"] == "T"}
    for e in events:
        key = (e["client_id"], e["queue_id"])
        if key not in removed:
            assert e["queue_offset"] > last.get(key, -1)
        last[key] = e["queue_offset"]
    locks = cluster.events("mq_lock")
    assert any(e["result"] == "ok" for e in locks)
    assert any(e["event"] == "unlock_all" for e in cluster.events("unlock_all"))


async def test_orderly_suspend_retries_the_same_message(cluster: Cluster) -> None:
    await cluster.start_broker()
    await cluster.create_topic("T", 1)
    calls: list[int] = []

    def listener(msgs: list[Any]) -> ConsumeOrderlyStatus:  # a plain function: runs in the thread pool
        calls.append(msgs[0].queue_offset)
        return (
            ConsumeOrderlyStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT
            if len(calls) < 3
            else ConsumeOrderlyStatus.SUCCESS
        )

    c = cluster.consumer("sg", "orderly", consume_from_where="first")
    c.subscribe("T")
    c.register_message_listener_orderly(listener)
    await c.start()
    producer = cluster.producer()
    await producer.start()
    await producer.send("T", b"one")
    await producer.send("T", b"two")
    await wait_until(lambda: len(calls) >= 4, 10, "suspend and retry")
    assert calls[:4] == [0, 0, 0, 1]


async def test_broadcasting_delivers_every_message_to_every_consumer(cluster: Cluster, tmp_path: Any) -> None:
    await cluster.start_broker()
    await cluster.create_topic("T", 4)
    got: dict[int, set[str]] = defaultdict(set)
    consumers = []
    for i in range(3):
        c = cluster.consumer(
            "bg",
            f"bcast-{i}",
            message_model="BROADCASTING",
            consume_from_where="first",
            local_offset_store_dir=str(tmp_path / "offsets"),
            instance_name=f"bcast-{i}",  # three "hosts" in one process
        )
        c.subscribe("T")
        c.register_message_listener(lambda msgs, _i=i: got[_i].update(m.msg_id for m in msgs))
        consumers.append(c)
        await c.start()
    await wait_until(
        lambda: all(len(c.owned_queues()) == 4 for c in consumers), 10, "every consumer owns all"
    )
    producer = cluster.producer()
    await producer.start()
    sent = {(await producer.send("T", b"b%d" % i)).msg_id for i in range(40)}
    await wait_until(lambda: all(got[i] >= sent for i in range(3)), 10, "broadcast delivery")
    # broadcasting keeps offsets in a local file, not on the broker
    await consumers[0].persist_consumer_offset()
    stored = consumers[0].offset_store.clone_offset_table("T")
    assert sum(stored.values()) == 40


async def test_a_restarted_broadcasting_consumer_resumes_from_its_local_offsets(
    cluster: Cluster, tmp_path: Any
) -> None:
    """A BROADCASTING client keeps instanceName DEFAULT (changeInstanceNameToPID is for CLUSTERING), so
    its client id is ip@DEFAULT after a restart too and LocalFileOffsetStore finds its file again."""
    await cluster.start_broker()
    await cluster.create_topic("T", 2)
    got: list[str] = []

    async def start() -> Any:
        c = cluster.consumer(
            "bg",
            "bcast",
            message_model="BROADCASTING",
            consume_from_where="first",
            local_offset_store_dir=str(tmp_path / "offsets"),
            time_scale=0.5,  # the shutdown's offset write gets 3 s, not 0.3 s, on a busy machine
        )
        c.subscribe("T")
        c.register_message_listener(lambda msgs: got.extend(m.msg_id for m in msgs))
        await c.start()
        return c

    first = await start()
    assert first.client_id.endswith("@DEFAULT")
    producer = cluster.producer()
    await producer.start()
    before = [(await producer.send("T", b"a%d" % i)).msg_id for i in range(10)]
    await wait_until(lambda: set(got) >= set(before), 10, "the first messages")
    await first.shutdown()  # persists its offsets to the local file
    after = [(await producer.send("T", b"b%d" % i)).msg_id for i in range(10)]
    second = await start()
    assert second.client_id == first.client_id
    await wait_until(lambda: set(got) >= set(after), 10, "the later messages")
    await asyncio.sleep(0.3)
    assert sorted(got) == sorted(before + after)  # nothing consumed twice


async def test_lite_pull_subscribe_poll_and_commit(cluster: Cluster) -> None:
    await cluster.start_broker()
    await cluster.create_topic("T", 4)
    consumers = []
    for i in range(2):
        c = LitePullConsumer(
            "lg",
            namesrv=cluster.namesrv,
            time_scale=cluster.scale,
            consume_from_where="first",
            log=cluster.log(f"lite-{i}", "consumer"),
            auto_commit=False,
        )
        c.subscribe("T")
        cluster.closers.append(c.shutdown)
        consumers.append(c)
        await c.start()
    await wait_until(
        lambda: (
            sorted(q for c in consumers for q in c.assignment() if q.topic == "T") == sorted(queues("T", 4))
        ),
        10,
        "lite-pull assignment",
    )
    assert all(len(c.assignment()) == 2 for c in consumers)
    producer = cluster.producer()
    await producer.start()
    sent = {(await producer.send("T", b"l%d" % i)).msg_id for i in range(30)}
    polled: set[str] = set()

    async def drain(c: LitePullConsumer) -> None:
        while not sent <= polled:
            polled.update(m.msg_id for m in await c.poll(timeout_ms=2000))

    async with asyncio.timeout(10):
        await asyncio.gather(*(drain(c) for c in consumers))
    for c in consumers:
        await c.commit()
    committed = sum(c.committed(q) for c in consumers for q in c.assignment())
    assert committed == 30
    broker = cluster.brokers[0]
    await wait_until(
        lambda: sum(broker.offset_manager.query_offset("lg", "T", q) for q in range(4)) == 30,
        5,
        "broker offsets",
    )


async def test_lite_pull_assign_reads_only_assigned_queues(cluster: Cluster) -> None:
    await cluster.start_broker()
    await cluster.create_topic("T", 2)
    producer = cluster.producer()
    await producer.start()
    results = [await producer.send("T", b"a%d" % i) for i in range(10)]
    c = LitePullConsumer(
        "ag", namesrv=cluster.namesrv, time_scale=cluster.scale, consume_from_where="first", auto_commit=False
    )
    cluster.closers.append(c.shutdown)
    q0 = MessageQueue("T", "broker-a", 0)
    c.assign([q0])
    await c.start()
    want = {r.msg_id for r in results if r.queue_id == 0}
    got: set[str] = set()
    async with asyncio.timeout(10):
        while got != want:
            for m in await c.poll(timeout_ms=1000):
                assert m.queue_id == 0
                got.add(m.msg_id)


async def test_reconsume_later_goes_through_the_retry_topic(cluster: Cluster) -> None:
    await cluster.start_broker()
    await cluster.create_topic("T", 2)
    attempts: dict[str, int] = defaultdict(int)
    seen_topics: list[str] = []

    def listener(msgs: list[Any]) -> ConsumeConcurrentlyStatus:
        m = msgs[0]
        attempts[m.body] += 1
        seen_topics.append(m.topic)
        if attempts[m.body] == 1:
            raise RuntimeError("first delivery fails")  # counts as RECONSUME_LATER
        return ConsumeConcurrentlyStatus.CONSUME_SUCCESS

    c = cluster.consumer("rg", "retry-consumer", consume_from_where="first")
    c.subscribe("T")
    c.register_message_listener(listener)
    await c.start()
    producer = cluster.producer()
    await producer.start()
    sent = {(await producer.send("T", b"r%d" % i)).msg_id for i in range(3)}
    # delay level 3 is 10 s, 0.5 s scaled; the retry topic's route is learnt at the next 30 s poll
    await wait_until(lambda: len(attempts) == 3 and all(v >= 2 for v in attempts.values()), 15, "redelivery")
    # the listener runs on the consume thread pool: its success is logged once it has returned
    await wait_until(lambda: len(cluster.events("message_consumed")) >= 3, 5, "message_consumed events")
    assert set(seen_topics) == {"T"}  # the listener sees the original topic, also for retried messages
    consumed = cluster.events("message_consumed")
    assert {e["msg_id"] for e in consumed} == sent  # a retried message keeps the id the producer got
    assert {e["topic"] for e in consumed} == {"%RETRY%rg"}
    assert len(cluster.events("message_sent_back")) >= 3


SEND_BACK_FAILS = {"requestCode": 36, "errors": [{"code": 1, "remark": "send back refused"}]}


async def test_a_failed_send_back_goes_to_the_retry_topic_via_the_inner_producer(cluster: Cluster) -> None:
    """DefaultMQPushConsumerImpl#sendMessageBack: when CONSUMER_SEND_MSG_BACK fails, the message is sent
    to %RETRY%<group> by the client's internal producer; it is not re-run locally. That producer starts
    with the client instance (MQClientInstance#start), so the start's heartbeat already names its group,
    and the instance's shutdown unregisters it."""
    broker = await cluster.start_broker()
    await cluster.create_topic("T", 1)
    await add_fault(broker.address, **SEND_BACK_FAILS, durationMs=600_000)
    attempts: dict[bytes, int] = defaultdict(int)

    def listener(msgs: list[Any]) -> ConsumeConcurrentlyStatus:
        attempts[msgs[0].body] += 1
        if attempts[msgs[0].body] == 1:
            return ConsumeConcurrentlyStatus.RECONSUME_LATER
        return ConsumeConcurrentlyStatus.CONSUME_SUCCESS

    c = cluster.consumer("fg", "fallback-consumer", consume_from_where="first")
    c.subscribe("T")
    c.register_message_listener(listener)
    await c.start()
    producers = broker.producer_manager.groups
    await wait_until(lambda: "CLIENT_INNER_PRODUCER" in producers, 5, "the inner producer in a heartbeat")
    assert [i.client_id for i in producers["CLIENT_INNER_PRODUCER"].values()] == [c.client_id]
    assert cluster.events("message_sent_back") == []
    producer = cluster.producer()
    await producer.start()
    sent = (await producer.send("T", b"x")).msg_id
    await wait_until(lambda: bool(cluster.events("message_consumed")), 15, "redelivery")
    (consumed,) = cluster.events("message_consumed")
    assert (consumed["msg_id"], consumed["topic"]) == (sent, "%RETRY%fg")
    (back,) = cluster.events("message_sent_back")
    assert back["via"] == "retry_topic" and back["delay_level"] == 3
    await c.shutdown()
    inner = producers.get("CLIENT_INNER_PRODUCER", {})
    assert c.client_id not in [i.client_id for i in inner.values()]


async def test_orderly_past_max_reconsume_times_sends_to_the_retry_topic_which_goes_to_the_dlq(
    cluster: Cluster,
) -> None:
    """ConsumeMessageOrderlyService#sendMessageBack is a plain send to the retry topic (the broker
    diverts it to the DLQ), so it does not depend on CONSUMER_SEND_MSG_BACK."""
    broker = await cluster.start_broker()
    await cluster.create_topic("T", 1)
    await add_fault(broker.address, **SEND_BACK_FAILS, durationMs=600_000)
    calls: list[bytes] = []

    def listener(msgs: list[Any]) -> ConsumeOrderlyStatus:
        calls.append(msgs[0].body)
        if msgs[0].body == b"bad":
            return ConsumeOrderlyStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT
        return ConsumeOrderlyStatus.SUCCESS

    c = cluster.consumer(
        "og",
        "orderly-dlq",
        consume_from_where="first",
        max_reconsume_times=1,
        suspend_current_queue_time_millis=10,
    )
    c.subscribe("T")
    c.register_message_listener_orderly(listener)
    await c.start()
    producer = cluster.producer()
    await producer.start()
    await producer.send("T", b"bad")
    await producer.send("T", b"good")
    await wait_until(lambda: b"good" in calls, 15, "the queue moving past the bad message")
    assert calls == [b"bad", b"bad", b"good"]
    dlq = broker.store.get_message("%DLQ%og", 0, 0, 32, 1 << 20, [], 100)
    assert [m.body for m in dlq.messages] == [b"bad"]
