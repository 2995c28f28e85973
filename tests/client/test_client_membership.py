"""Consumers of one group against a real broker: allocation, join and leave through the notification path,
the periodic loop alone, and no message lost while membership changes."""

from __future__ import annotations

import asyncio

import pytest
from kit import wait_until
from kit.cluster import Cluster, add_fault, allocation_matches, crash, queues

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


async def test_a_heartbeat_timeout_closes_the_connection_and_costs_two_rebalances(cluster: Cluster) -> None:
    """invokeSync closes the channel when HEART_BEAT times out (3 s, scaled): the broker drops the
    member and notifies the group, and the member comes back with its next heartbeat."""
    broker = await cluster.start_broker()
    await cluster.create_topic("T", 4)
    mq_all = queues("T", 4)
    consumers = make_consumers(cluster, 2, "T")
    for c in consumers:
        await c.start()
    await wait_until(lambda: allocation_matches(consumers, "T", mq_all), 10, "two consumers")
    slow = consumers[0]
    registered_before = len(cluster.events("consumer_registered"))
    # one heartbeat answered 0.4 s late: past the 0.15 s the client waits at this time scale
    await add_fault(broker.address, requestCode=34, clientId=slow.client_id, latencyMs=400, count=1)

    def rejoined() -> bool:
        regs = [e for e in cluster.events("consumer_registered") if e["client_id"] == slow.client_id]
        return len(cluster.events("consumer_registered")) > registered_before and len(regs) >= 2

    await wait_until(rejoined, 15, "the slow member re-registered")
    dropped = [e for e in cluster.events("consumer_unregistered") if e["client_id"] == slow.client_id]
    assert [e["reason"] for e in dropped] == ["channel_closed"]
    causes = [e["cause"] for e in cluster.events("notify_sent")]
    assert "channel_closed" in causes
    await wait_until(lambda: allocation_matches(consumers, "T", mq_all), 10, "balanced again")


async def test_heartbeat_timeout_keeps_the_connection_when_the_setting_is_off(cluster: Cluster) -> None:
    broker = await cluster.start_broker()
    await cluster.create_topic("T", 4)
    con = make_consumers(cluster, 1, "T", client_close_socket_if_timeout=False)[0]
    await con.start()
    await wait_until(lambda: len(cluster.events("heartbeat_sent")) >= 2, 10, "heartbeats")
    await add_fault(broker.address, requestCode=34, clientId=con.client_id, latencyMs=400, count=1)
    await wait_until(
        lambda: any(e["failed"] for e in cluster.events("heartbeat_sent")), 10, "a failed heartbeat"
    )
    await asyncio.sleep(0.5)
    assert cluster.events("consumer_unregistered") == []


@pytest.mark.parametrize("needs_heartbeat", [False, True])
async def test_start_rebalances_at_once_even_without_a_heartbeat_in_4_9(
    cluster: Cluster, needs_heartbeat: bool
) -> None:
    """DefaultMQPushConsumerImpl#start in 4.9.8 calls rebalanceImmediately() unconditionally; from 5.2
    only when a heartbeat went out."""
    broker = await cluster.start_broker()
    await cluster.create_topic("T", 4)
    con = make_consumers(
        cluster, 1, "T", rebalance_wait_interval=NO_LOOP, rebalance_at_start_needs_heartbeat=needs_heartbeat
    )[0]
    await add_fault(
        broker.address,
        requestCode=34,
        clientId=con.client_id,
        errors=[{"code": 1, "remark": "down"}],
        durationMs=60_000,  # every heartbeat fails: no registration, so no NOTIFY wakes the rebalance
    )
    await con.start()
    await asyncio.sleep(0.5)
    assert con.instance.rebalance_service.rounds == (0 if needs_heartbeat else 1)


async def test_an_error_while_handling_a_pull_result_retries_the_pull(cluster: Cluster) -> None:
    """An exception in the pull callback's success path goes to its exception path, which pulls again
    after the exception delay; the queue is not left silent until the 120 s pull expiry."""
    await cluster.start_broker()
    await cluster.create_topic("T", 1)
    con = make_consumers(cluster, 1, "T")[0]
    await con.start()
    assert con.consume_service is not None
    submit = con.consume_service.submit_consume_request
    failures = [RuntimeError("listener pool is gone")]

    def flaky_submit(*args: object) -> None:
        if failures:
            raise failures.pop()
        submit(*args)  # type: ignore[arg-type]

    con.consume_service.submit_consume_request = flaky_submit  # type: ignore[method-assign]
    producer = cluster.producer()
    await producer.start()
    await producer.send("T", b"one")  # its batch is cached but never handed to the listener

    def failed() -> list[dict[str, object]]:
        return [e for e in cluster.events("pull_failed") if e["code"] == "RuntimeError"]

    await wait_until(lambda: bool(failed()), 4, "the failed pull result")
    assert failed()[0]["delay_ms"] == 50  # 1 s at this time scale
    second = await producer.send("T", b"two")
    # well inside the 6 s pull expiry at this scale: the queue is still being pulled
    await wait_until(
        lambda: any(e["msg_id"] == second.msg_id for e in cluster.events("message_consumed")),
        3,
        "the next message consumed",
    )


@pytest.mark.parametrize("on_connect", [False, True])
async def test_5_2_heartbeats_a_broker_when_it_connects(cluster: Cluster, on_connect: bool) -> None:
    """5.2's channel event listener: a new connection to a known broker gets a heartbeat at once and then
    an immediate rebalance, e.g. after a timed-out call closed the old one."""
    await cluster.start_broker()
    await cluster.create_topic("T", 2)
    con = make_consumers(cluster, 1, "T", rebalance_wait_interval=NO_LOOP, heartbeat_on_connect=on_connect)[0]
    await con.start()
    await wait_until(lambda: bool(con.owned_queues()), 5, "queues")
    await asyncio.sleep(0.3)  # the round the broker's NOTIFY for our registration asks for
    rounds = con.instance.rebalance_service.rounds
    addr = next(iter(con.instance.broker_addr_table["broker-a"].values()))
    con.instance.remoting.close_connection(addr)
    await con.instance.remoting.connection(addr)  # any call re-connects
    await asyncio.sleep(0.3)
    on_connect_beats = [e for e in cluster.events("heartbeat_sent") if e.get("cause") == "connect"]
    assert bool(on_connect_beats) is on_connect
    assert (con.instance.rebalance_service.rounds > rounds) is on_connect


async def test_an_unchanged_route_is_no_change_once_every_producer_has_it(cluster: Cluster) -> None:
    """MQClientInstance gives a fetched route to every producer, the consumer's inner one included; one
    left without it would make every later poll of the topic a change (isNeedUpdateTopicRouteInfo)."""
    await cluster.start_broker()
    await cluster.create_topic("T", 4)
    consumer = make_consumers(cluster, 1, "T")[0]
    await consumer.start()
    instance = consumer.instance
    assert await instance.update_topic_route_info_from_name_server("T")
    inner = instance.producer_table["CLIENT_INNER_PRODUCER"]
    assert not inner.is_publish_topic_need_update("T")
    assert set(inner.publish_table["T"].message_queues) == queues("T", 4)
    route = instance.topic_route_table["T"]
    assert await instance.update_topic_route_info_from_name_server("T")
    assert instance.topic_route_table["T"] is route  # equal, so not taken again
