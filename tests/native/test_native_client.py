"""Our client over RocketMQ's native protocol (``protocol = "native"``) against our broker's native port,
on real loopback sockets: heartbeat, consumer list, rebalance, pull and commit, orderly locks, a send, and
the broker's NOTIFY_CONSUMER_IDS_CHANGED reaching the client. The broker serves the route itself, so the
native port is all the clients know."""

from __future__ import annotations

import asyncio

import pytest
from kit import wait_until
from kit.cluster import Cluster

from rmqlab.client.api import MQClientAPI
from rmqlab.client.consume import ConsumeOrderlyStatus
from rmqlab.protocol.model import HeartbeatData, Message, MessageQueue, ProducerData
from rmqlab.protocol.native import native_client_codec_factory
from rmqlab.protocol.native.message_ext import UniqIdGenerator
from rmqlab.protocol.remoting import RemotingClient


@pytest.fixture
async def native_cluster(tmp_path):  # type: ignore[no-untyped-def]
    c = Cluster(str(tmp_path))
    broker = await c.start_broker()
    await c.create_topic("T", 4)
    c.namesrv = await broker.start_native_port(0)  # clients reach route and broker natively only
    yield c
    await c.close()


def native_client() -> RemotingClient:
    return RemotingClient(
        codec_factory=native_client_codec_factory(UniqIdGenerator("10.0.0.1", 1, 2, lambda: 0))
    )


async def test_consumers_and_producer_over_native(native_cluster: Cluster) -> None:
    c = native_cluster
    consumed: list[Message] = []

    async def listener(msgs: list[Message]) -> None:
        consumed.extend(msgs)

    first = c.consumer("g", "consumer-1", protocol="native", consume_from_where="first")
    first.subscribe("T")
    first.register_message_listener(listener)
    await first.start()
    producer = c.producer(protocol="native")
    await producer.start()
    sent = [await producer.send("T", b"m%d" % i, tags="TagA", keys=f"k{i}") for i in range(20)]
    await wait_until(lambda: {m.msg_id for m in consumed} >= {r.msg_id for r in sent}, within=20)
    # the message ids the producer learnt are the ones the consumer sees (UNIQ_KEY, as RocketMQ's)
    assert len({r.msg_id for r in sent}) == 20
    by_id = {m.msg_id: m for m in consumed}
    m0 = by_id[sent[0].msg_id]
    assert (m0.body, m0.tags, m0.keys, m0.broker_name) == (b"m0", "TagA", "k0", "broker-a")
    assert m0.queue_offset == sent[0].queue_offset and m0.commit_log_offset is not None

    # a second member: the broker notifies the first over its native connection, both rebalance
    second = c.consumer("g", "consumer-2", protocol="native", consume_from_where="first")
    second.subscribe("T")
    second.register_message_listener(listener)
    await second.start()
    api = MQClientAPI(native_client())
    try:
        ids = await api.get_consumer_id_list(c.brokers[0].native_addr, "g", 3.0)
        assert sorted(ids) == sorted([first.client_id, second.client_id])
    finally:
        await api.remoting.close()

    def split() -> bool:
        rebalances = [e for e in c.events("rebalance") if e["topic"] == "T"]
        last = {e["client_id"]: e for e in rebalances}
        return len(last) == 2 and all(
            len(e["allocated"]) == 2 and len(e["cid_all"]) == 2 for e in last.values()
        )

    await wait_until(split, within=20)
    notified = [
        e for e in c.events() if e.get("node") == "consumer-1" and e.get("event") == "notify_received"
    ]
    assert notified, "consumer-1 never saw NOTIFY_CONSUMER_IDS_CHANGED"
    await wait_until(
        lambda: any(e.get("node") == "consumer-1" for e in c.events("offset_committed")), within=20
    )
    # the commits reached the broker: its own offset table moved to the end of each queue consumed
    broker_commits = [e for e in c.events("offset_committed") if e.get("role") == "broker"]
    assert broker_commits and max(e["offset"] for e in broker_commits) > 0


async def test_orderly_consumer_locks_its_queues_over_native(native_cluster: Cluster) -> None:
    c = native_cluster
    consumed: list[Message] = []

    async def listener(msgs: list[Message]) -> ConsumeOrderlyStatus:
        consumed.extend(msgs)
        return ConsumeOrderlyStatus.SUCCESS

    consumer = c.consumer("og", "orderly-1", protocol="native", consume_from_where="first")
    consumer.subscribe("T")
    consumer.register_message_listener_orderly(listener)
    await consumer.start()
    producer = c.producer(protocol="native")
    await producer.start()
    sent = [await producer.send("T", b"o%d" % i) for i in range(12)]
    await wait_until(lambda: {m.msg_id for m in consumed} >= {r.msg_id for r in sent}, within=20)
    api = MQClientAPI(native_client())
    try:
        mqs = {MessageQueue("T", "broker-a", i) for i in range(4)}
        # the consumer holds every queue's lock: another client (known to the broker by its heartbeat,
        # as a producer so that the group stays as it is) gets none of them
        addr = c.brokers[0].native_addr
        await api.send_heartbeat(addr, HeartbeatData("other@1", producer_data_set=[ProducerData("PG")]), 3.0)
        assert await api.lock_batch_mq(addr, "og", "other@1", mqs, 3.0) == set()
        assert all(pq.locked for pq in consumer.state.process_queue_table.values())
        await consumer.shutdown()  # unlocks its queues (UNLOCK_BATCH_MQ, one-way in shutdown)
        for _ in range(400):  # the one-way unlock and this lock travel on two connections
            if await api.lock_batch_mq(addr, "og", "other@1", mqs, 3.0) == mqs:
                break
            await asyncio.sleep(0.05)
        else:
            pytest.fail("the queues stayed locked after the orderly consumer's shutdown")
    finally:
        await api.remoting.close()


def test_protocol_setting_is_checked(capsys: pytest.CaptureFixture[str]) -> None:
    from rmqlab.client.cli_common import layered_settings
    from rmqlab.client.client_config import ConfigError, ConsumerConfig, ProducerConfig
    from rmqlab.client.consumer_main import build_parser, make_config
    from rmqlab.client.producer_main import build_parser as producer_parser

    with pytest.raises(ConfigError, match="protocol must be one of msgpack, native, got 'grpc'"):
        ConsumerConfig.from_mapping({"protocol": "grpc"})
    with pytest.raises(ConfigError, match="does not sign"):
        ConsumerConfig.from_mapping({"protocol": "native", "access_key": "a", "secret_key": "b"})
    base = ["--namesrv", "127.0.0.1:9876", "--group", "g", "--topic", "T"]
    assert make_config(build_parser().parse_args(base)).protocol == "msgpack"
    assert make_config(build_parser().parse_args([*base, "--protocol", "native"])).protocol == "native"
    args = producer_parser().parse_args(["--namesrv", "h:1", "--topic", "T", "--rate", "1", "--count", "1"])
    args.protocol = "native"
    assert (
        ProducerConfig.from_mapping(layered_settings(ProducerConfig, args, "producer", {})).protocol
        == "native"
    )
    with pytest.raises(SystemExit) as info:
        build_parser().parse_args([*base, "--protocol", "grpc"])
    assert info.value.code == 2
    assert "--protocol: invalid choice: 'grpc' (choose from 'msgpack', 'native')" in capsys.readouterr().err


async def test_admin_creates_a_topic_and_reads_its_route_over_native(native_cluster: Cluster) -> None:
    from rmqlab.lab.admin_client import AdminClient, route_brokers

    addr = native_cluster.brokers[0].native_addr
    assert addr is not None
    async with AdminClient(timeout_s=5.0, native=True) as admin:
        assert await admin.route(addr, "Fresh") is None  # TOPIC_NOT_EXIST, read from a native answer
        await admin.topic_create(addr, "Fresh", 3)
        route = await admin.route(addr, "Fresh")
    assert route_brokers(route) == {"broker-a"}
    assert route is not None and route["queueDatas"][0]["readQueueNums"] == 3


def test_rmq_admin_refuses_access_keys_over_native(capsys: pytest.CaptureFixture[str]) -> None:
    from rmqlab.chaos.admin_main import main

    argv = ["--broker", "h:1", "--protocol", "native", "--access-key", "a", "--secret-key", "b", "status"]
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    assert "--protocol native does not sign requests" in capsys.readouterr().err


async def test_lite_pull_consumer_polls_and_commits_over_native(native_cluster: Cluster) -> None:
    from rmqlab.client.lite_pull_consumer import LitePullConsumer

    c = native_cluster
    lite = LitePullConsumer(
        "lg",
        namesrv=c.namesrv,
        time_scale=c.scale,
        protocol="native",
        consume_from_where="first",
        auto_commit=False,
        log=c.log("lite-1", "consumer"),
    )
    lite.subscribe("T")
    c.closers.append(lite.shutdown)
    await lite.start()
    producer = c.producer(protocol="native")
    await producer.start()
    sent = {(await producer.send("T", b"l%d" % i)).msg_id for i in range(12)}
    polled: set[str] = set()
    async with asyncio.timeout(20):
        while not sent <= polled:
            polled.update(m.msg_id for m in await lite.poll(timeout_ms=1000))
    await lite.commit()
    broker = c.brokers[0]
    await wait_until(
        lambda: sum(max(broker.offset_manager.query_offset("lg", "T", q), 0) for q in range(4)) == 12, 10
    )
