"""Producer: queue selection, the latency fault table, retries on another broker when one dies."""

from __future__ import annotations

import pytest
from kit.cluster import Cluster

from rmqlab.client.errors import MQClientError
from rmqlab.client.latency import LatencyFaultTolerance, MQFaultStrategy
from rmqlab.client.publish_info import TopicPublishInfo
from rmqlab.protocol.model import MessageQueue
from rmqlab.protocol.route import BrokerData, QueueData, TopicRouteData


def info() -> TopicPublishInfo:
    route = TopicRouteData(
        (BrokerData("c", "broker-a", ((0, "a:1"),)), BrokerData("c", "broker-b", ((0, "b:1"),))),
        (QueueData("broker-a", 2, 2, 6), QueueData("broker-b", 2, 2, 6)),
    )
    return TopicPublishInfo("T", route.publish_queues("T"), route)


def test_publish_queues_need_a_master_and_write_permission() -> None:
    route = TopicRouteData(
        (
            BrokerData("c", "a", ((0, "a:1"),)),
            BrokerData("c", "b", ((1, "b:1"),)),
            BrokerData("c", "r", ((0, "r:1"),)),
        ),
        (QueueData("a", 2, 2, 6), QueueData("b", 2, 2, 6), QueueData("r", 3, 3, 4)),
    )
    assert route.publish_queues("T") == (MessageQueue("T", "a", 0), MessageQueue("T", "a", 1))
    assert len(route.subscribe_queues("T")) == 7  # readable queues, master or not


def test_round_robin_avoids_the_last_failed_broker() -> None:
    tp = info()
    picks = [tp.select_one().short for _ in range(4)]
    assert sorted(picks) == ["broker-a:0", "broker-a:1", "broker-b:0", "broker-b:1"]
    for _ in range(8):
        assert tp.select_one("broker-a").broker_name == "broker-b"


def test_latency_table_4_9() -> None:
    f = MQFaultStrategy(
        enabled=True,
        latency_max=(50, 100, 550, 1000, 2000, 3000, 15000),
        not_available_duration=(0, 0, 30000, 60000, 120000, 180000, 600000),
        isolation_latency=30000,
    )
    assert [f.compute_not_available_duration(x) for x in (0, 99, 550, 1999, 2000, 14999, 30000)] == [
        0,
        0,
        30000,
        60000,
        120000,
        180000,
        600000,
    ]
    f.update_fault_item("broker-a", 0, True, now_ms=1000)  # a failed send isolates the broker
    assert not f.tolerance.is_available("broker-a", 1000 + 599_999)
    assert f.tolerance.is_available("broker-a", 1000 + 600_000)
    tp = info()
    assert all(f.select_one_message_queue(tp, None, 2000).broker_name == "broker-b" for _ in range(6))


def test_pick_one_at_least_prefers_available_then_low_latency() -> None:
    t = LatencyFaultTolerance()
    t.update_fault_item("slow", 900, 10_000, 0)
    t.update_fault_item("fast", 10, 10_000, 0)
    assert t.pick_one_at_least(now_ms=5) == "fast"  # half of 2 is 1: always the best one
    t.update_fault_item("fast", 10, 10_000, 5)
    t.update_fault_item("slow", 900, 0, 5)
    assert t.pick_one_at_least(now_ms=6) == "slow"  # available beats lower latency


@pytest.fixture
async def cluster(tmp_path):  # type: ignore[no-untyped-def]
    c = Cluster(str(tmp_path))
    yield c
    await c.close()


@pytest.mark.parametrize("fault_tolerance", [False, True])
async def test_producer_fails_over_when_a_broker_dies(cluster: Cluster, fault_tolerance: bool) -> None:
    await cluster.start_namesrv()
    a = await cluster.start_broker("broker-a")
    await cluster.start_broker("broker-b")
    await cluster.create_topic("T", 2)
    producer = cluster.producer(send_latency_fault_enable=fault_tolerance)
    await producer.start()
    first = [await producer.send("T", b"before%d" % i) for i in range(8)]
    assert {r.broker_name for r in first} == {"broker-a", "broker-b"}
    await a.server.close()  # broker-a dies; the producer's route still lists it
    after = [await producer.send("T", b"after%d" % i) for i in range(12)]
    assert {r.broker_name for r in after} == {"broker-b"}
    sent = [e for e in cluster.events("message_sent")]
    assert len(sent) == 20 and len({e["msg_id"] for e in sent}) == 20
    failures = [e for e in cluster.events("send_failed") if e["broker"] == "broker-a"]
    assert failures
    if fault_tolerance:
        assert len(failures) == 1  # isolated after the first failure: never tried again


async def test_send_rejects_bad_input_clearly(cluster: Cluster) -> None:
    await cluster.start_broker(auto_create_topic=False)
    producer = cluster.producer()
    with pytest.raises(MQClientError, match="not running"):
        await producer.send("T", b"x")
    await producer.start()
    with pytest.raises(MQClientError, match="illegal characters"):
        await producer.send("bad topic", b"x")
    with pytest.raises(MQClientError, match="length is zero"):
        await producer.send("T", b"")
    with pytest.raises(MQClientError, match="must be bytes"):
        await producer.send("T", "text")  # type: ignore[arg-type]
    with pytest.raises(MQClientError, match="no route info"):
        await producer.send("NoSuchTopic", b"x")


async def test_send_to_an_unknown_topic_creates_it_through_tbw102(cluster: Cluster) -> None:
    """With auto-creation on, the producer finds the broker through TBW102's route and the broker
    creates the topic on the first send (PROTOCOL.md: 4 queues)."""
    broker = await cluster.start_broker()
    producer = cluster.producer()
    await producer.start()
    try:
        result = await producer.send("BrandNewTopic", b"x")
        assert result.queue_offset == 0
        tc = broker.topic_manager.select("BrandNewTopic")
        assert tc is not None and tc.write_queue_nums == 4
    finally:
        await producer.shutdown()


def test_equal_routes_share_their_publish_queues_and_different_ones_do_not() -> None:
    """publish_queues is remembered per (topic, writable queues of brokers with a master): each thing
    that decides the answer gives another one."""

    def route(write: int = 2, perm: int = 6, master: bool = True) -> TopicRouteData:
        return TopicRouteData(
            (BrokerData("c", "a", ((0 if master else 1, "a:1"),)),),
            (QueueData("a", 4, write, perm),),
        )

    first = route().publish_queues("T")
    assert route().publish_queues("T") is first
    assert first == (MessageQueue("T", "a", 0), MessageQueue("T", "a", 1))
    assert route().publish_queues("U") == (MessageQueue("U", "a", 0), MessageQueue("U", "a", 1))
    assert len(route(write=3).publish_queues("T")) == 3
    assert route(perm=4).publish_queues("T") == ()
    assert route(master=False).publish_queues("T") == ()
    assert route().publish_queues("T") is first
