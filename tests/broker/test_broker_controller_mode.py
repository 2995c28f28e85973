"""RocketMQ 5's controller mode over real sockets: a name server with the controller in it
(enableControllerInNamesrv), a master and its slave; the election when the master goes away or falls
silent, the route's new master, and the old master coming back as a slave."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from kit import wait_until
from kit.broker import RecordingLog

from rmqlab.broker.controller import BrokerController
from rmqlab.broker.namesrv import NamesrvController
from rmqlab.broker.server_config import BrokerConfig, NamesrvConfig
from rmqlab.protocol.codes import RequestCode, ResponseCode

SCALE = 0.1  # controller heartbeat timeout 10 s -> 1 s, scans every 0.5 s: a loaded machine stalls 0.2 s


@pytest.fixture
async def cluster():
    started: list[Any] = []
    ns = NamesrvController(
        NamesrvConfig(port=0, time_scale=SCALE, enable_controller_in_namesrv=True), log=RecordingLog()
    )
    await ns.start()
    started.append(ns)

    async def broker(broker_id: int, **kw: Any) -> BrokerController:
        b = BrokerController(
            BrokerConfig(
                namesrv=ns.address,
                time_scale=SCALE,
                broker_id=broker_id,
                controller_mode=True,
                **{"port": 0, "broker_role": "SYNC_MASTER", **kw},
            ),
            log=RecordingLog(),
        )
        await b.start()
        started.append(b)
        return b

    broker.namesrv = ns  # type: ignore[attr-defined]
    broker.started = started  # type: ignore[attr-defined]
    yield broker
    for x in reversed(started):
        await x.shutdown()


async def master_addr(peer) -> str | None:
    route = await peer.ok(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "T"})
    return route.body["brokerDatas"][0]["brokerAddrs"].get("0")


async def test_the_first_master_is_elected_and_its_slave_joins_the_sync_state_set(cluster, make_peer):
    master = await cluster(0)
    await wait_until(lambda: master.status()["brokerRole"] == "SYNC_MASTER", what="the first election")
    slave = await cluster(1)
    await wait_until(lambda: slave.slave is not None and slave.slave.master_addr == master.broker_addr)
    assert slave.config.broker_id == 2 and master.config.broker_id == 0  # route ids: master 0
    ctl = cluster.namesrv.controller
    await wait_until(lambda: ctl.replicas.sets["broker-a"].sync_state_set == {1, 2}, what="the set")
    assert master.replicas.sync_state_set == {1, 2}
    # a SYNC_MASTER with a slave in its set answers once the slave holds the message
    resp = await make_peer(master.address).send("T", body=b"x")
    assert resp.code == ResponseCode.SUCCESS
    assert slave.store.get_max_offset("T", 0) == 1
    assert (await make_peer(slave.address).send("T")).code == ResponseCode.SERVICE_NOT_AVAILABLE
    assert cluster.namesrv.log.of("master_elected", broker="broker-a", master_id=1, master_epoch=1)


async def test_a_stopped_master_is_replaced_by_its_slave_which_keeps_the_messages_and_offsets(
    cluster, make_peer
):
    master = await cluster(0)
    await wait_until(lambda: master.status()["brokerRole"] == "SYNC_MASTER")
    slave = await cluster(1)
    ctl = cluster.namesrv.controller
    await wait_until(lambda: ctl.replicas.sets["broker-a"].sync_state_set == {1, 2}, what="the set")
    peer = make_peer(master.address)
    for _ in range(5):
        assert (await peer.send("T")).code == ResponseCode.SUCCESS
    await peer.ok(
        RequestCode.UPDATE_CONSUMER_OFFSET,
        {"consumerGroup": "g", "topic": "T", "queueId": 0, "commitOffset": 3},
    )
    await wait_until(lambda: slave.offset_manager.query_offset("g", "T", 0) == 3, what="the offset sync")
    await master.shutdown()
    await wait_until(lambda: slave.status()["brokerRole"] == "SYNC_MASTER", what="the election")
    ns = make_peer(cluster.namesrv.address)
    routes = cluster.namesrv.route_info
    await wait_until(lambda: routes.master_addr("broker-a") == slave.broker_addr, what="the route")
    assert await master_addr(ns) == slave.broker_addr
    e = cluster.namesrv.log.of("master_elected", master_id=2)[-1]
    assert (e["old_master_id"], e["master_epoch"], e["trigger"]) == (1, 2, "master_inactive")
    assert slave.log.of("broker_role_changed", broker_role="SYNC_MASTER", master_epoch=2, broker_id=0)
    # the new master serves what it copied and the offsets it synced, and takes writes (alone in its set)
    new = make_peer(slave.address)
    assert slave.store.get_max_offset("T", 0) == 5
    resp = await new.call(
        RequestCode.QUERY_CONSUMER_OFFSET, {"consumerGroup": "g", "topic": "T", "queueId": 0}
    )
    assert resp.ext["offset"] == 3
    assert (await new.send("T")).code == ResponseCode.SUCCESS
    # the old master restarts (empty store): the controller makes it a slave of the new master, epoch 2
    back = await cluster(0)
    await wait_until(lambda: back.slave is not None and back.replicas.master_epoch == 2, what="rejoin")
    assert back.role.value == "SLAVE" and back.config.broker_id == 1
    await wait_until(lambda: back.store.get_max_offset("T", 0) == 6, what="the catch-up")
    await wait_until(lambda: back.offset_manager.query_offset("g", "T", 0) == 3, what="the offsets")
    assert await master_addr(ns) == slave.broker_addr
    assert (await make_peer(back.address).send("T")).code == ResponseCode.SERVICE_NOT_AVAILABLE


async def test_a_silent_master_loses_the_set_after_the_heartbeat_timeout(cluster, make_peer):
    master = await cluster(0)
    await wait_until(lambda: master.status()["brokerRole"] == "SYNC_MASTER")
    slave = await cluster(1)
    ctl = cluster.namesrv.controller
    await wait_until(lambda: ctl.replicas.sets["broker-a"].sync_state_set == {1, 2}, what="the set")
    assert (await make_peer(master.address).send("T")).code == ResponseCode.SUCCESS
    master._runner.cancel()  # no more heartbeats; its connections stay open
    await wait_until(lambda: slave.status()["brokerRole"] == "SYNC_MASTER", what="the election")
    assert cluster.namesrv.log.of("controller_broker_inactive", broker_id=1, reason="heartbeat_timeout")
    assert cluster.namesrv.log.of("master_elected", master_id=2, trigger="master_inactive")
    ns = make_peer(cluster.namesrv.address)
    routes = cluster.namesrv.route_info
    await wait_until(lambda: routes.master_addr("broker-a") == slave.broker_addr, what="the route")
    assert await master_addr(ns) == slave.broker_addr
    # the deposed master's registration (older stateVersion) does not take the route back
    await master.register_broker_all()
    assert await master_addr(ns) == slave.broker_addr
    assert cluster.namesrv.log.of("broker_registration_ignored", broker_addr=master.broker_addr)


async def test_a_slave_outside_the_sync_state_set_is_not_elected(cluster, make_peer):
    master = await cluster(0)
    await wait_until(lambda: master.status()["brokerRole"] == "SYNC_MASTER")
    # a slave that never catches up (every batch held 100 s) stays out of the set
    slave = await cluster(1, ha_replication_lag_ms=100_000)
    await make_peer(master.address).send("T")
    await wait_until(lambda: slave.slave is not None and slave.slave.master_addr is not None)
    await master.shutdown()
    await wait_until(lambda: cluster.namesrv.log.of("master_elected", reason="no_candidate"), what="vote")
    assert slave.role.value == "SLAVE"


async def test_a_deposed_master_cuts_its_unreplicated_tail_back_to_the_new_epochs_start(cluster, make_peer):
    # the slave stays in the SyncStateSet however far behind (haMaxTimeSlaveNotCatchup very long)
    kw = {"broker_role": "ASYNC_MASTER", "ha_max_time_slave_not_catchup_ms": 10**9}
    master = await cluster(0, **kw)
    await wait_until(lambda: master.status()["brokerRole"] == "ASYNC_MASTER")
    slave = await cluster(1, **kw)
    ctl = cluster.namesrv.controller
    await wait_until(lambda: ctl.replicas.sets["broker-a"].sync_state_set == {1, 2}, what="the set")
    peer = make_peer(master.address)
    for _ in range(2):
        assert (await peer.send("T")).code == ResponseCode.SUCCESS
    await wait_until(lambda: slave.store.get_max_offset("T", 0) == 2, what="the copy")
    slave.config = replace(slave.config, ha_replication_lag_ms=10**7)  # batches after the next never land
    assert (await peer.send("T")).code == ResponseCode.SUCCESS  # answers the transfer held already
    await wait_until(lambda: slave.store.get_max_offset("T", 0) == 3, what="the last copy")
    for _ in range(3):
        assert (await peer.send("T")).code == ResponseCode.SUCCESS  # acknowledged by the master alone
    assert master.store.get_max_offset("T", 0) == 6 and slave.store.get_max_offset("T", 0) == 3
    # an operator's electMaster for the slave: the master is demoted, not stopped
    resp = await make_peer(cluster.namesrv.address).call(
        RequestCode.CONTROLLER_ELECT_MASTER, {"brokerName": "broker-a", "brokerId": 2, "designateElect": True}
    )
    assert resp.code == ResponseCode.SUCCESS and resp.ext["masterEpoch"] == 2
    await wait_until(lambda: slave.role.value == "ASYNC_MASTER" and master.role.value == "SLAVE")
    new = await make_peer(slave.address).send("T", body=b"after")
    assert new.code == ResponseCode.SUCCESS and new.ext["queueOffset"] == 3
    # the old master drops offsets 3..5 (the new master never had them) and copies the new offset 3
    await wait_until(
        lambda: [m.msg_id for m in master.store.consume_queue("T", 0).messages][-1:] == [new.ext["msgId"]]
    )
    assert [m.msg_id for m in master.store.consume_queue("T", 0).messages] == [
        m.msg_id for m in slave.store.consume_queue("T", 0).messages
    ]
    assert master.log.of("replica_truncated", topic="T", queue_id=0, prev_max_offset=6, max_offset=3)
    assert [m.msg_id for m in master.replication_log.entries] == [
        m.msg_id for m in master.store.consume_queue("T", 0).messages
    ]
