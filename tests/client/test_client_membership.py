"""Consumers of one group against a real broker: allocation, join and leave through the notification path,
the periodic loop alone, and no message lost while membership changes."""

from __future__ import annotations

import asyncio

import pytest
from kit import wait_until
from kit.cluster import Cluster, allocation_matches, crash, queues

NO_LOOP = 10**9  # a rebalance period that never elapses: only notifications can trigger a round


@pytest.fixture
async def cluster(tmp_path):  # type: ignore[no-untyped-def]
    c = Cluster(str(tmp_path))
    yield c
    await c.close()


def make_consumers(cluster: Cluster, n: int, topic: str, **kw):  # type: ignore[no-untyped-def]
    out = []
    for i in range(n):
        con = cluster.consumer("g", f"consumer-{len(cluster.logs)}-{i}", consume_from_where="first", **kw)
        con.subscribe(topic)
        con.register_message_listener(lambda msgs: None)
        out.append(con)
    return out


@pytest.mark.parametrize("strategy", ["AVG", "AVG_BY_CIRCLE", "CONSISTENT_HASH"])
async def test_initial_allocation_matches_strategy(cluster: Cluster, strategy: str) -> None:
    await cluster.start_broker()
    await cluster.create_topic("T", 8)
    consumers = make_consumers(cluster, 3, "T", strategy=strategy)
    for c in consumers:
        await c.start()
    mq_all = queues("T", 8)

    def last_rounds_saw_everyone() -> bool:
        # A client's allocation can already equal the 3-member answer while its latest round saw only 2
        # members (consistent hashing moves few queues), so wait for the rounds themselves too.
        last = {e["client_id"]: e for e in cluster.events("rebalance") if e["topic"] == "T"}
        return len(last) == 3 and all(len(e["cid_all"]) == 3 for e in last.values())

    await wait_until(
        lambda: allocation_matches(consumers, "T", mq_all, strategy) and last_rounds_saw_everyone(),
        10,
        "allocation",
    )
    owned_all = [q for c in consumers for q in c.owned_queues() if q.topic == "T"]
    if strategy != "CONSISTENT_HASH":
        assert sorted(owned_all) == sorted(mq_all)  # AVG and AVG_BY_CIRCLE cover each queue exactly once
    rebalances = [e for e in cluster.events("rebalance") if e["topic"] == "T"]
    assert rebalances and all(e["strategy"] == strategy for e in rebalances)
    assert allocation_matches(consumers, "T", mq_all, strategy)


async def test_join_and_leave_rebalance_through_notifications(cluster: Cluster) -> None:
    await cluster.start_broker()
    await cluster.create_topic("T", 6)
    mq_all = queues("T", 6)
    consumers = make_consumers(cluster, 2, "T", rebalance_wait_interval=NO_LOOP)
    for c in consumers:
        await c.start()
    await wait_until(lambda: allocation_matches(consumers, "T", mq_all), 10, "two consumers")

    joiner = make_consumers(cluster, 1, "T", rebalance_wait_interval=NO_LOOP)[0]
    await joiner.start()
    consumers.append(joiner)
    await wait_until(lambda: allocation_matches(consumers, "T", mq_all), 10, "after a join")

    await consumers[0].shutdown()  # graceful: UNREGISTER_CLIENT
    left = consumers[1:]
    await wait_until(lambda: allocation_matches(left, "T", mq_all), 10, "after a graceful leave")

    await crash(left[0])  # abrupt: the connection resets, nothing is unregistered
    survivors = left[1:]
    await wait_until(lambda: allocation_matches(survivors, "T", mq_all), 10, "after a connection loss")
    notified = {e["client_id"] for e in cluster.events("notify_received")}
    assert survivors[0].client_id in notified
    # the periodic loop never ran a round: every rebalance came from a start or a notification
    assert all(c.instance.rebalance_service.rounds >= 1 for c in survivors)


async def test_periodic_loop_alone_converges_without_notifications(cluster: Cluster) -> None:
    await cluster.start_broker(notify_consumer_ids_changed=False)
    await cluster.create_topic("T", 4)
    mq_all = queues("T", 4)
    consumers = make_consumers(cluster, 2, "T")
    for c in consumers:
        await c.start()
    await wait_until(lambda: allocation_matches(consumers, "T", mq_all), 10, "loop-driven allocation")
    extra = make_consumers(cluster, 1, "T")[0]
    await extra.start()
    consumers.append(extra)
    await wait_until(lambda: allocation_matches(consumers, "T", mq_all), 10, "loop-driven join")
    assert cluster.events("notify_received") == []


async def test_no_message_lost_while_membership_changes(cluster: Cluster) -> None:
    await cluster.start_broker()
    await cluster.create_topic("T", 4)
    consumed: set[str] = set()
    consumers = []
    for i in range(3):
        c = cluster.consumer("g", f"consumer-{i}", consume_from_where="first")
        c.subscribe("T")
        c.register_message_listener(lambda msgs: consumed.update(m.msg_id for m in msgs))
        consumers.append(c)
    await consumers[0].start()
    await consumers[1].start()
    producer = cluster.producer()
    await producer.start()
    sent: set[str] = set()

    async def produce(n: int) -> None:
        for i in range(n):
            sent.add((await producer.send("T", b"m%d" % i)).msg_id)
            await asyncio.sleep(0.005)

    async with asyncio.TaskGroup() as tg:
        tg.create_task(produce(150))
        await asyncio.sleep(0.2)
        await consumers[2].start()
        await asyncio.sleep(0.3)
        await consumers[0].shutdown()
        await asyncio.sleep(0.3)
        await crash(consumers[1])
    await wait_until(lambda: sent <= consumed, 20, "every sent message consumed")
    assert len(sent) == 150
