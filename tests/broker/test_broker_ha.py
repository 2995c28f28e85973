"""Master-slave HA over real sockets: a name server, a master and its slave (RocketMQ 4.9.8's
HAService, SlaveSynchronize and the slave's answers to pulls)."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import pytest
from kit import wait_until
from kit.broker import RecordingLog

from rmqlab.broker.controller import BrokerController
from rmqlab.broker.namesrv import NamesrvController
from rmqlab.broker.server_config import BrokerConfig, NamesrvConfig
from rmqlab.protocol.codes import RequestCode, ResponseCode


@pytest.fixture
async def cluster():
    """make(role=..., **slave_kw) -> (master, slave or None); everything shut down afterwards."""
    started: list[Any] = []
    ns = NamesrvController(NamesrvConfig(port=0, time_scale=0.01), log=RecordingLog())
    await ns.start()
    started.append(ns)

    async def broker(**kw: Any) -> BrokerController:
        kw.setdefault("port", 0)
        kw.setdefault("time_scale", 0.01)
        b = BrokerController(BrokerConfig(namesrv=ns.address, **kw), log=RecordingLog())
        await b.start()
        started.append(b)
        return b

    async def make(
        role: str = "ASYNC_MASTER", slave: bool = True, master_kw: Any = None, **slave_kw: Any
    ) -> tuple[BrokerController, BrokerController | None]:
        master = await broker(broker_role=role, **(master_kw or {}))
        s = await broker(broker_id=1, broker_role="SLAVE", **slave_kw) if slave else None
        if s is not None:
            await wait_until(lambda: master.ha_progress.slaves, what="the slave's HA connection")
        return master, s

    make.broker = broker  # type: ignore[attr-defined]
    make.namesrv = ns  # type: ignore[attr-defined]
    yield make
    for x in reversed(started):
        await x.shutdown()


def ids(b: BrokerController, topic: str, queue_id: int) -> list[tuple[int, str]]:
    cq = b.store.consume_queue(topic, queue_id)
    return [(m.queue_offset, m.msg_id) for m in cq.messages] if cq is not None else []


async def test_slave_registers_under_the_masters_name_and_copies_in_order(cluster, make_peer):
    master, slave = await cluster()
    assert slave.config.broker_name == master.config.broker_name
    assert slave.slave.master_addr == master.broker_addr
    peer = make_peer(master.address)
    sent = []
    for i in range(12):
        resp = await peer.send("T", body=b"m%d" % i, queue_id=i % 3)
        assert resp.code == ResponseCode.SUCCESS
        sent.append(resp.ext["msgId"])
    await wait_until(lambda: slave.store.message_count() == 12, what="the copy")
    for q in range(3):
        assert ids(slave, "T", q) == ids(master, "T", q)
    # the slave's commit log is the master's, message for message
    assert [m.msg_id for m in slave.replication_log.entries] == sent
    route = await make_peer(cluster.namesrv.address).ok(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "T"})
    assert route.body["brokerDatas"][0]["brokerAddrs"] == {"0": master.broker_addr, "1": slave.broker_addr}
    assert master.log.of("ha_slave_connected", slave_addr=slave.broker_addr)
    assert slave.log.of("ha_master_connected", master_addr=master.broker_addr)
    assert slave.status()["brokerRole"] == "SLAVE" and master.status()["haSlaves"] == 1


async def test_async_master_answers_before_a_lagging_slave_has_the_message(cluster, make_peer):
    master, slave = await cluster(ha_replication_lag_ms=50_000)  # 0.5 s at this time scale
    resp = await make_peer(master.address).send("T")
    assert resp.code == ResponseCode.SUCCESS
    assert slave.store.get_max_offset("T", 0) == 0
    await wait_until(lambda: slave.store.get_max_offset("T", 0) == 1, what="the lagging copy")


async def test_sync_master_acknowledges_once_the_slave_holds_the_message(cluster, make_peer):
    master, slave = await cluster("SYNC_MASTER", time_scale=0.1, master_kw={"time_scale": 0.1})
    peer = make_peer(master.address)
    for i in range(3):
        resp = await peer.send("T", body=b"x" * 100)
        assert resp.code == ResponseCode.SUCCESS, resp.remark
        assert slave.store.get_max_offset("T", 0) == i + 1  # already there when the answer came


async def test_sync_master_without_a_slave_stores_and_says_slave_not_available(cluster, make_peer):
    master, _ = await cluster("SYNC_MASTER", slave=False)
    resp = await make_peer(master.address).send("T")
    assert resp.code == ResponseCode.SLAVE_NOT_AVAILABLE
    assert resp.ext["queueOffset"] == 0 and resp.ext["msgId"]
    assert master.store.get_max_offset("T", 0) == 1
    assert master.log.of("replica_wait_failed", code=int(ResponseCode.SLAVE_NOT_AVAILABLE))


async def test_sync_master_times_out_on_a_slow_slave(cluster, make_peer):
    # slaveTimeout 3 s against a slave that holds each batch 30 s (both scaled by 0.01)
    master, slave = await cluster("SYNC_MASTER", ha_replication_lag_ms=30_000)
    resp = await make_peer(master.address).send("T")
    assert resp.code == ResponseCode.FLUSH_SLAVE_TIMEOUT
    assert master.store.get_max_offset("T", 0) == 1
    assert master.ha_progress.waiters == []
    await wait_until(lambda: slave.store.get_max_offset("T", 0) == 1, what="the late copy")


async def test_slave_refuses_writes(cluster, make_peer):
    _, slave = await cluster()
    peer = make_peer(slave.address)
    assert (await peer.send("T")).code == ResponseCode.SERVICE_NOT_AVAILABLE
    resp = await peer.call(
        RequestCode.CONSUMER_SEND_MSG_BACK, {"group": "g", "originTopic": "T", "queueId": 0, "offset": 0}
    )
    assert resp.code == ResponseCode.SERVICE_NOT_AVAILABLE
    resp = await peer.call(RequestCode.HA_TRANSFER, {"offset": 0})
    assert resp.code == ResponseCode.SERVICE_NOT_AVAILABLE


async def test_slave_syncs_topics_offsets_and_delay_offsets(cluster, make_peer):
    master, slave = await cluster()
    peer = make_peer(master.address)
    await peer.ok(
        RequestCode.UPDATE_AND_CREATE_TOPIC,
        {"topic": "Wide", "readQueueNums": 8, "writeQueueNums": 8, "perm": 6},
    )
    await peer.ok(
        RequestCode.UPDATE_CONSUMER_OFFSET,
        {"consumerGroup": "g", "topic": "Wide", "queueId": 5, "commitOffset": 42},
    )
    # a delayed message (level 1: 1 s) moves the master's delay offset of level 1 when it is delivered
    resp = await peer.call(
        RequestCode.SEND_MESSAGE,
        {"producerGroup": "pg", "topic": "T", "queueId": 0, "bornTimestamp": 0},
        {"body": b"d", "properties": {"DELAY": "1"}},
    )
    assert resp.code == ResponseCode.SUCCESS
    await wait_until(lambda: master.schedule_service.offset_table, what="delivery")
    await wait_until(
        lambda: (
            slave.offset_manager.query_offset("g", "Wide", 5) == 42
            and slave.schedule_service.offset_table == master.schedule_service.offset_table
            and (tc := slave.topic_manager.select("Wide")) is not None
            and tc.read_queue_nums == 8
        ),
        what="the slave's sync",
    )
    assert slave.log.of("offset_synced", group="g", topic="Wide", queue_id=5, offset=42, prev_offset=-1)
    # the slave answers offset queries from its copy
    resp = await make_peer(slave.address).ok(
        RequestCode.QUERY_CONSUMER_OFFSET, {"consumerGroup": "g", "topic": "Wide", "queueId": 5}
    )
    assert resp.ext["offset"] == 42


async def test_restarted_master_offsets_overwrite_the_slaves_newer_ones(cluster, make_peer, tmp_path):
    """apache/rocketmq#1094: offsets committed to the slave while the master was down are replaced by the
    restarted master's older ones at the slave's next sync."""
    store = str(tmp_path / "master")
    master, slave = await cluster(master_kw={"store_dir": store})
    commit = {"consumerGroup": "g", "topic": "T", "queueId": 0}
    await make_peer(master.address).ok(RequestCode.UPDATE_CONSUMER_OFFSET, {**commit, "commitOffset": 5})
    await wait_until(lambda: slave.offset_manager.query_offset("g", "T", 0) == 5, what="sync of 5")
    await master.shutdown()
    await wait_until(lambda: slave.slave.master_addr is None, what="the slave to lose its master")
    await make_peer(slave.address).ok(RequestCode.UPDATE_CONSUMER_OFFSET, {**commit, "commitOffset": 9})
    assert slave.offset_manager.query_offset("g", "T", 0) == 9
    assert slave.log.of("master_addr_changed", master_addr=None)
    await wait_until(
        lambda: slave.log.of("ha_master_disconnected", master_addr=master.broker_addr), what="copy"
    )
    assert master.log.of("ha_slave_disconnected", slave_addr=slave.broker_addr, reason="closed")
    restarted = await cluster.broker(store_dir=store)
    await wait_until(lambda: slave.slave.master_addr == restarted.broker_addr, what="the new master")
    assert slave.log.of("master_addr_changed", master_addr=restarted.broker_addr)
    await wait_until(lambda: slave.offset_manager.query_offset("g", "T", 0) == 5, what="the overwrite")
    assert slave.log.of("offset_synced", group="g", queue_id=0, offset=5, prev_offset=9)
    assert restarted.offset_manager.query_offset("g", "T", 0) == 5


async def test_pulls_answered_by_the_slave(cluster, make_peer):
    master, slave = await cluster()
    for _ in range(3):
        await make_peer(master.address).send("T")
    await wait_until(lambda: slave.store.get_max_offset("T", 0) == 3, what="the copy")
    peer = make_peer(slave.address)
    await peer.heartbeat("c1")
    # the copied messages' topic exists on the slave once its sync has fetched the master's topics
    assert (await peer.pull("T", 1)).code == ResponseCode.TOPIC_NOT_EXIST
    await wait_until(lambda: slave.topic_manager.select("T") is not None, what="topic sync")
    resp = await peer.pull("T", 1, commitOffset=2)
    assert resp.code == ResponseCode.SUCCESS
    assert [m["queueOffset"] for m in resp.body["messages"]] == [1, 2]
    assert resp.ext["suggestWhichBrokerId"] == 0  # slaveReadEnable off: back to the master
    # a slave never takes the offset a pull carries (4.9.x)
    assert slave.offset_manager.query_offset("g", "T", 0) == -1
    # nor tells a consumer to move its offset: PULL_OFFSET_MOVED becomes PULL_RETRY_IMMEDIATELY
    resp = await peer.pull("T", 99)
    assert resp.code == ResponseCode.PULL_RETRY_IMMEDIATELY
    # a pull held on the slave wakes when the copy brings a message
    held = make_peer(slave.address)
    await held.heartbeat("c2")
    task = asyncio.create_task(held.pull("T", 3, suspend_ms=5_000))
    await asyncio.sleep(0.05)
    await make_peer(master.address).send("T")
    resp = await task
    assert resp.code == ResponseCode.SUCCESS and resp.body["messages"][0]["queueOffset"] == 3


async def test_offset_moved_on_a_slave_with_offset_check(cluster, make_peer):
    master, slave = await cluster(offset_check_in_slave=True)
    await make_peer(master.address).send("T")
    await wait_until(lambda: slave.topic_manager.select("T") is not None, what="topic sync")
    peer = make_peer(slave.address)
    await peer.heartbeat("c1")
    resp = await peer.pull("T", 99)
    assert resp.code == ResponseCode.PULL_OFFSET_MOVED and resp.ext["nextBeginOffset"] == 1


async def test_master_suggests_the_slave_to_a_consumer_far_behind(cluster, make_peer):
    master, _ = await cluster(
        slave=False, master_kw={"slave_read_enable": True, "access_message_in_memory_max_bytes": 25}
    )
    peer = make_peer(master.address)
    for _ in range(5):
        await peer.send("T", body=b"0123456789")
    await peer.heartbeat("c1")
    far = await peer.pull("T", 0, max_nums=1)  # 40 bytes after it
    near = await peer.pull("T", 3, max_nums=1)  # 10 bytes after it
    assert (far.ext["suggestWhichBrokerId"], near.ext["suggestWhichBrokerId"]) == (1, 0)
    assert master.log.of("pull_served", queue_offset=0, suggest_broker_id=1)


async def test_without_slave_read_enable_the_master_is_always_suggested(cluster, make_peer):
    master, _ = await cluster(slave=False, master_kw={"access_message_in_memory_max_bytes": 0})
    peer = make_peer(master.address)
    for _ in range(3):
        await peer.send("T")
    await peer.heartbeat("c1")
    assert (await peer.pull("T", 0, max_nums=1)).ext["suggestWhichBrokerId"] == 0


def test_role_and_id_must_agree():
    with pytest.raises(ValueError, match="does not fit role SLAVE"):
        BrokerController(BrokerConfig(broker_role="SLAVE", namesrv="x:1"))
    with pytest.raises(ValueError, match="does not fit role ASYNC_MASTER"):
        BrokerController(BrokerConfig(broker_id=2))
    with pytest.raises(ValueError, match="needs a name server"):
        BrokerController(BrokerConfig(broker_role="SLAVE", broker_id=1))


async def test_restarts_copy_nothing_twice(cluster, make_peer, tmp_path):
    """A restarted master (a new run: its slave copies its log from the start) and a restarted durable
    slave (its copy on disk) leave every queue exactly as the master has it."""
    master_store, slave_store = str(tmp_path / "m"), str(tmp_path / "s")
    master, slave = await cluster(master_kw={"store_dir": master_store}, store_dir=slave_store)
    for i in range(6):
        assert (await make_peer(master.address).send("T", queue_id=i % 2)).code == ResponseCode.SUCCESS
    await wait_until(lambda: slave.store.message_count() == 6, what="the copy")
    await master.shutdown()
    master = await cluster.broker(store_dir=master_store)
    await wait_until(lambda: slave.slave.applier.epoch == master.ha_epoch, what="the new master run")
    await wait_until(lambda: slave.slave.applier.position == 6, what="the log copied again")
    assert slave.store.message_count() == 6
    assert not slave.log.of("replica_gap")
    await slave.shutdown()
    slave = await cluster.broker(broker_id=1, broker_role="SLAVE", store_dir=slave_store)
    assert slave.store.message_count() == 6  # from its own disk
    assert (await make_peer(master.address).send("T", queue_id=1)).code == ResponseCode.SUCCESS
    await wait_until(lambda: slave.store.message_count() == 7, what="the next message")
    for q in (0, 1):
        assert ids(slave, "T", q) == ids(master, "T", q)


async def test_a_master_that_lost_its_messages_and_its_slave_disagree(cluster, make_peer):
    """A master restarted without its store starts its queues at 0 again; the slave keeps what it holds
    and stores only what goes past it (RocketMQ's slave is just as inconsistent then)."""
    master, slave = await cluster()
    for _ in range(2):
        await make_peer(master.address).send("T")
    await wait_until(lambda: slave.store.message_count() == 2, what="the copy")
    await master.shutdown()
    master = await cluster.broker()  # in memory: an empty log, queue offsets from 0 again
    await wait_until(lambda: slave.slave.applier.epoch == master.ha_epoch, what="the new master run")
    for _ in range(3):
        await make_peer(master.address).send("T")
    await wait_until(lambda: slave.slave.applier.position == 3, what="the new log copied")
    # offsets 0 and 1 it already holds (the old master's); offset 2 is the new master's third message
    old, new = ids(slave, "T", 0), ids(master, "T", 0)
    assert [o for o, _ in old] == [0, 1, 2]
    assert old[2] == new[2] and old[:2] != new[:2]


async def test_a_silent_slave_is_disconnected_and_sync_sends_stop_waiting(cluster, make_peer):
    master, slave = await cluster("SYNC_MASTER")
    # the slave stops asking (as a paused process does) while its connection stays open
    slave._runner.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await slave._runner
    await wait_until(
        lambda: master.log.of("ha_slave_disconnected", slave_addr=slave.broker_addr, reason="silent"),
        what="haHousekeepingInterval",
    )
    assert master.status()["haSlaves"] == 0
    assert (await make_peer(master.address).send("T")).code == ResponseCode.SLAVE_NOT_AVAILABLE
