"""Consumers and a master-slave broker: pulls from the slave while the master is down or suggests it,
offset commits while the master is down, and the restarted master's offsets (apache/rocketmq#1094)."""

from __future__ import annotations

from typing import Any

import pytest
from kit import wait_until
from kit.cluster import Cluster

from rmqlab.client.consume import ConsumeConcurrentlyStatus
from rmqlab.protocol.codes import RequestCode, ResponseCode
from rmqlab.protocol.command import RemotingCommand
from rmqlab.protocol.remoting import RemotingClient
from rmqlab.protocol.route import FindBrokerResult, find_broker_in_subscribe


@pytest.fixture
async def cluster(tmp_path):  # type: ignore[no-untyped-def]
    c = Cluster(str(tmp_path))
    await c.start_namesrv()
    yield c
    await c.close()


def test_find_broker_in_subscribe_as_4_9_8():
    both = {0: "m:1", 1: "s:1"}
    assert find_broker_in_subscribe(both, 0, True) == FindBrokerResult("m:1", False)
    assert find_broker_in_subscribe(both, 1, False) == FindBrokerResult("s:1", True)
    # a missing slave id: the next id, then (unless only this broker) the lowest id
    assert find_broker_in_subscribe({0: "m:1", 2: "s:2"}, 1, True) == FindBrokerResult("s:2", True)
    assert find_broker_in_subscribe({0: "m:1", 3: "s:3"}, 1, True) is None
    assert find_broker_in_subscribe({0: "m:1", 3: "s:3"}, 1, False) == FindBrokerResult("m:1", False)
    # the master gone: master-only lookups find nothing, the others the lowest slave
    slaves = {2: "s:2", 1: "s:1"}
    assert find_broker_in_subscribe(slaves, 0, True) is None
    assert find_broker_in_subscribe(slaves, 0, False) == FindBrokerResult("s:1", True)
    assert find_broker_in_subscribe({}, 0, False) is None and find_broker_in_subscribe(None, 0, False) is None


async def commit(addr: str, group: str, topic: str, queue_id: int, offset: int) -> None:
    rc = RemotingClient()
    try:
        ext = {"consumerGroup": group, "topic": topic, "queueId": queue_id, "commitOffset": offset}
        resp = await rc.invoke(addr, RemotingCommand.request(RequestCode.UPDATE_CONSUMER_OFFSET, ext), 3.0)
        assert resp.code == ResponseCode.SUCCESS
    finally:
        await rc.close()


def listener_into(seen: list[tuple[int, int]]) -> Any:
    async def listener(msgs: list[Any]) -> ConsumeConcurrentlyStatus:
        seen.extend((m.queue_id, m.queue_offset) for m in msgs)
        return ConsumeConcurrentlyStatus.CONSUME_SUCCESS

    return listener


async def test_master_down_consumes_from_the_slave_and_the_restarted_master_wins(cluster, tmp_path):
    store = str(tmp_path / "master-store")
    master = await cluster.start_broker(store_dir=store)
    slave = await cluster.start_broker(broker_id=1, broker_role="SLAVE")
    await cluster.create_topic("T", 2, broker=master)
    producer = cluster.producer()
    await producer.start()
    for i in range(20):
        await producer.send("T", b"m%d" % i)
    await producer.shutdown()
    for q in (0, 1):
        await commit(master.address, "g", "T", q, 3)
    await wait_until(
        lambda: (
            slave.store.message_count() == 20
            and slave.topic_manager.select("T") is not None
            and all(slave.offset_manager.query_offset("g", "T", q) == 3 for q in (0, 1))
        ),
        what="the slave's copy and sync",
    )
    await master.shutdown()
    cluster.brokers.remove(master)
    await wait_until(lambda: slave.slave.master_addr is None, what="the slave to see the master gone")

    seen: list[tuple[int, int]] = []
    consumer = cluster.consumer("g", "consumer-1")
    consumer.subscribe("T")
    consumer.register_message_listener(listener_into(seen))
    await consumer.start()
    # the offsets come from the slave (the only address), the messages too, the commits go there
    await wait_until(lambda: len(seen) == 14, within=10, what="consumption from the slave")
    assert sorted(seen) == [(q, o) for q in (0, 1) for o in range(3, 10)]
    await wait_until(
        lambda: all(slave.offset_manager.query_offset("g", "T", q) == 10 for q in (0, 1)),
        within=10,
        what="commits on the slave",
    )
    served = [e for e in cluster.events("pull_served") if e["node"] == "broker-a-s1" and e["count"] > 0]
    assert served and all(e["client_id"] == consumer.client_id for e in served)

    await consumer.shutdown()  # its last commits go to the slave as well

    restarted = await cluster.start_broker(store_dir=store)
    # the slave's next sync puts the master's older offsets over the ones the consumer committed
    await wait_until(
        lambda: all(slave.offset_manager.query_offset("g", "T", q) == 3 for q in (0, 1)),
        within=10,
        what="the slave's offsets overwritten",
    )
    synced = [(e["queue_id"], e["prev_offset"], e["offset"]) for e in cluster.events("offset_synced")]
    assert (0, 10, 3) in synced and (1, 10, 3) in synced
    # a consumer of the group starting now reads the master's offsets: everything after 3 comes again
    again: list[tuple[int, int]] = []
    consumer2 = cluster.consumer("g", "consumer-2")
    consumer2.subscribe("T")
    consumer2.register_message_listener(listener_into(again))
    await consumer2.start()
    await wait_until(lambda: len(again) == 14, within=10, what="the duplicates")
    assert sorted(again) == sorted(seen)
    assert any(e["node"] == "broker-a" and e["count"] > 0 for e in cluster.events("pull_served")[-50:])
    assert restarted.offset_manager.query_offset("g", "T", 0) >= 3


async def test_consumer_follows_the_suggestion_to_pull_from_the_slave(cluster):
    # every pull that leaves anything behind counts as slow: the master suggests broker 1
    master = await cluster.start_broker(slave_read_enable=True, access_message_in_memory_max_bytes=0)
    slave = await cluster.start_broker(broker_id=1, broker_role="SLAVE")
    await cluster.create_topic("T", 1, broker=master)
    producer = cluster.producer()
    await producer.start()
    for i in range(100):
        await producer.send("T", b"m%d" % i)
    await wait_until(
        lambda: slave.store.message_count() == 100 and slave.topic_manager.select("T") is not None,
        what="the slave's copy",
    )
    seen: list[tuple[int, int]] = []
    consumer = cluster.consumer("g", "consumer-1", consume_from_where="first")
    consumer.subscribe("T")
    consumer.register_message_listener(listener_into(seen))
    await consumer.start()
    await wait_until(lambda: len(seen) == 100, within=10, what="consumption")
    assert sorted(seen) == [(0, o) for o in range(100)]
    changes = cluster.events("pull_node_changed")
    assert [e["broker_id"] for e in changes][:2] == [1, 0]  # to the slave, then told back to the master
    assert any(e["node"] == "broker-a-s1" and e["count"] > 0 for e in cluster.events("pull_served"))
    # the pulls to the slave carried no offset for it to keep; the offsets are the master's
    await wait_until(lambda: master.offset_manager.query_offset("g", "T", 0) == 100, what="commits")


async def test_sync_master_without_a_slave_gives_a_send_result_not_an_error(cluster):
    await cluster.start_broker(broker_role="SYNC_MASTER")
    await cluster.create_topic("T", 1)
    producer = cluster.producer()
    await producer.start()
    result = await producer.send("T", b"x")
    assert result.send_status == "SLAVE_NOT_AVAILABLE" and result.queue_offset == 0
    sent = cluster.events("message_sent")
    assert [e["send_status"] for e in sent] == ["SLAVE_NOT_AVAILABLE"]
    assert cluster.events("send_failed") == []
