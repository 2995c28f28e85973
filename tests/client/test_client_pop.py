"""The RocketMQ 5 push consumer with clientRebalance = false: the broker assigns the queues
(QUERY_ASSIGNMENT), POP queues are popped and acked, failures change the invisible time, and a crashed
consumer's in-flight messages come back to the others after the invisible time. Real sockets, time scale
0.05; plus the sans-IO decisions of client/pop_core.py."""

from __future__ import annotations

import asyncio

import pytest
from kit import wait_until
from kit.cluster import Cluster, crash

from rmqlab.client.client_config import ConsumerConfig
from rmqlab.client.consume import ConsumeConcurrentlyStatus
from rmqlab.client.pop_core import (
    POP_DELAY_LEVEL_S,
    PopProcessQueue,
    change_invisible_delay_s,
    effective_invisible_time,
    is_pop_timeout,
    past_max_decision,
    split_assignments,
)
from rmqlab.protocol.model import Message, MessageQueue
from rmqlab.protocol.pop_receipt import PROPERTY_POP_CK, ExtraInfo

FIVE = {**ConsumerConfig.rocketmq5(), "client_rebalance": False, "consume_from_where": "first"}


@pytest.fixture
async def cluster(tmp_path):  # type: ignore[no-untyped-def]
    c = Cluster(str(tmp_path))
    yield c
    await c.close()


async def produce(cluster: Cluster, n: int, topic: str = "T") -> list[str]:
    producer = cluster.producer()
    await producer.start()
    return [(await producer.send(topic, b"m%d" % i)).msg_id for i in range(n)]


def consumed_ids(cluster: Cluster) -> list[str]:
    return [e["msg_id"] for e in cluster.events("message_consumed")]


async def test_pop_group_consumes_everything_and_retries_a_failure(cluster: Cluster) -> None:
    broker = await cluster.start_broker(default_message_request_mode="POP")
    await cluster.create_topic("T", 4)
    failed_once: set[str] = set()

    def listener(msgs: list[Message]) -> ConsumeConcurrentlyStatus:
        for m in msgs:
            if m.body == b"m3" and "m3" not in failed_once:
                failed_once.add("m3")
                return ConsumeConcurrentlyStatus.RECONSUME_LATER
        return ConsumeConcurrentlyStatus.CONSUME_SUCCESS

    consumers = []
    for i in range(2):
        c = cluster.consumer("g", f"c{i}", **FIVE)
        c.subscribe("T")
        c.register_message_listener(listener)
        await c.start()
        consumers.append(c)
    sent = await produce(cluster, 20)
    await wait_until(lambda: set(sent) <= set(consumed_ids(cluster)), within=20, what="all consumed")
    # every consumer pops every queue of the broker (popShareQueueNum -1)
    assignments = [e for e in cluster.events("assignment") if e["topic"] == "T"]
    assert {tuple(e["pop"]) for e in assignments} == {("broker-a:-1",)}
    assert {e["client_id"] for e in assignments} == {c.client_id for c in consumers}
    assert not [e for e in cluster.events("mq_added") if e["topic"] == "T"]  # not through the pull path
    # m3 failed once: its invisible time was changed (10 s, scaled) and it came back through the retry topic
    m3 = sent[3]
    assert failed_once == {"m3"}
    assert cluster.events("invisible_time_changed"), "the failure must change the invisible time"
    revived = [e for e in cluster.events("message_revived") if e["msg_id"] == m3]
    assert len(revived) == 1 and revived[0]["retry_topic"] == "%RETRY%g_T"
    retry_consumed = [e for e in cluster.events("message_consumed") if e["msg_id"] == m3]
    assert [e["topic"] for e in retry_consumed] == ["%RETRY%g_T"]
    # every message acked, nothing left in flight
    await wait_until(lambda: broker.pop_state.in_flight() == 0, within=10, what="all acked")


async def test_a_crashed_pop_consumer_holds_only_its_in_flight_messages(cluster: Cluster) -> None:
    broker = await cluster.start_broker(default_message_request_mode="POP")
    await cluster.create_topic("T", 2)
    stuck = asyncio.Event()

    async def hang(msgs: list[Message]) -> None:
        await stuck.wait()  # never returns: the consumer is crashed while these are in flight

    a = cluster.consumer("g", "a", pop_invisible_time=5_000, **FIVE)
    a.subscribe("T")
    a.register_message_listener(hang)
    await a.start()
    sent = await produce(cluster, 6)
    await wait_until(lambda: broker.pop_state.in_flight() >= 1, within=10, what="a pops")
    held = broker.pop_state.in_flight()
    await crash(a)
    b = cluster.consumer("g", "b", pop_invisible_time=5_000, **FIVE)
    b.subscribe("T")
    b.register_message_listener(lambda msgs: ConsumeConcurrentlyStatus.CONSUME_SUCCESS)
    await b.start()
    await wait_until(lambda: set(sent) <= set(consumed_ids(cluster)), within=20, what="b consumes all")
    revived = {e["msg_id"] for e in cluster.events("message_revived")}
    assert len(revived) == held  # exactly what a held, after its invisible time (5 s scaled)
    stuck.set()


async def test_pull_assignment_goes_through_the_pull_path(cluster: Cluster) -> None:
    await cluster.start_broker()  # default mode PULL: the broker allocates queues with AVG
    await cluster.create_topic("T", 4)
    c = cluster.consumer("g", "c0", **FIVE)
    c.subscribe("T")
    c.register_message_listener(lambda msgs: None)
    await c.start()
    sent = await produce(cluster, 8)
    await wait_until(lambda: set(sent) <= set(consumed_ids(cluster)), within=20, what="all consumed")
    assignment = [e for e in cluster.events("assignment") if e["topic"] == "T"]
    assert assignment[-1]["pull"] == [f"broker-a:{i}" for i in range(4)] and assignment[-1]["pop"] == []
    assert {e["queue_id"] for e in cluster.events("mq_added") if e["topic"] == "T"} == {0, 1, 2, 3}
    # all PULL: the pop retry topic is subscribed too, to drain what a POP period left there
    assert "%RETRY%g_T" in c.state.subscription_inner


# -- sans-IO ----------------------------------------------------------------------------------------


def _msg(receipt: ExtraInfo | None, reconsume: int = 0, born: int = 0) -> Message:
    props = {PROPERTY_POP_CK: receipt.build()} if receipt else {}
    return Message(
        "id", "T", "broker-a", 0, 0, b"", born_timestamp=born, reconsume_times=reconsume, properties=props
    )


def test_split_and_invisible_time_bounds() -> None:
    a, b = MessageQueue("T", "broker-a", -1), MessageQueue("T", "broker-b", 2)
    assert split_assignments([(a, "POP"), (b, "PULL")]) == ({b}, {a})
    assert effective_invisible_time(4_999) == 60_000 and effective_invisible_time(5_000) == 5_000
    assert effective_invisible_time(300_000) == 300_000 and effective_invisible_time(300_001) == 60_000


def test_pop_timeout_and_delays() -> None:
    r = ExtraInfo(0, 1_000, 500, 0, "0", "broker-a", 0, 0)
    assert not is_pop_timeout([_msg(r)], 1_499) and is_pop_timeout([_msg(r)], 1_500)
    assert not is_pop_timeout([], 10**9) and not is_pop_timeout([_msg(None)], 10**9)
    assert change_invisible_delay_s(0, 0) == 10 and change_invisible_delay_s(3, 0) == 120
    assert change_invisible_delay_s(3, 1) == 30 and change_invisible_delay_s(99, 0) == 7200
    assert past_max_decision(0, 9_999) == -1  # younger than 10 s: RocketMQ's lookup fails, nothing done
    assert past_max_decision(0, 10_000) == 1 and past_max_decision(0, 7_200_000) == len(POP_DELAY_LEVEL_S)
    assert past_max_decision(0, 14_400_000) == len(POP_DELAY_LEVEL_S)
    assert past_max_decision(0, 14_400_001) is None  # older than twice the longest delay: acked


def test_pop_process_queue_counts() -> None:
    pq = PopProcessQueue(100)
    pq.inc_found_msg(3)
    assert pq.ack() == 3 and pq.wait_ack_count == 2
    pq.dec_found_msg(-2)
    assert pq.wait_ack_count == 0
    assert not pq.is_pull_expired(220, 120) and pq.is_pull_expired(221, 120)
