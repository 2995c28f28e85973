"""Membership, notification, expiry, locks and offsets over real sockets against an in-process broker."""

from __future__ import annotations

import asyncio

import pytest
from kit import wait_until

from rmqlab.protocol.codes import RequestCode, ResponseCode
from rmqlab.protocol.model import MessageModel, MessageQueue


def mq(i: int, topic: str = "T") -> MessageQueue:
    return MessageQueue(topic, "broker-a", i)


async def consumer_list(peer, group: str = "g"):
    resp = await peer.call(RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": group})
    return resp.body["consumerIdList"] if resp.code == ResponseCode.SUCCESS else (resp.code, resp.remark)


async def test_join_notifies_every_connection_including_the_joining_one(broker, make_peer):
    a, b = make_peer(broker.address), make_peer(broker.address)
    await a.heartbeat("A")
    assert await a.next_notify() == "g"
    await b.heartbeat("B")
    assert await a.next_notify() == "g" and await b.next_notify() == "g"
    assert await consumer_list(a) == ["A", "B"]
    # a refreshing heartbeat with the same topics is no change
    await a.heartbeat("A")
    assert await a.drain_notifies(0.1) == [] and await b.drain_notifies(0) == []
    events = broker.log.of("consumer_registered", group="g")
    assert [e["client_id"] for e in events] == ["A", "B"]
    assert len(broker.log.of("notify_sent", group="g")) == 2


async def test_notify_sent_lists_the_members_up_to_a_limit(make_broker, make_peer):
    broker = await make_broker(time_scale=0.01, notify_event_ids_max=2)
    peers = [make_peer(broker.address) for _ in range(3)]
    for cid, p in zip("ABC", peers, strict=True):
        await p.heartbeat(cid)
        await p.next_notify()
    events = broker.log.of("notify_sent", group="g")
    assert [e["client_count"] for e in events] == [1, 2, 3]
    assert [e.get("client_ids") for e in events] == [["A"], ["A", "B"], None]  # 3 > 2: the number only


async def test_empty_group_is_system_error_and_connection_list(broker, make_peer):
    a = make_peer(broker.address)
    assert await consumer_list(a, "nobody") == (
        ResponseCode.SYSTEM_ERROR,
        "no consumer for this group, nobody",
    )
    resp = await a.call(RequestCode.GET_CONSUMER_CONNECTION_LIST, {"consumerGroup": "nobody"})
    assert resp.code == ResponseCode.CONSUMER_NOT_ONLINE
    await a.heartbeat("A", topics={"T": "x || y"})
    resp = await a.ok(RequestCode.GET_CONSUMER_CONNECTION_LIST, {"consumerGroup": "g"})
    (c,) = resp.body["connectionSet"]
    assert c["clientId"] == "A" and c["clientAddr"].startswith("127.0.0.1:") and c["lastUpdateTimestamp"] > 0
    assert resp.body["subscriptionTable"]["T"]["tagsSet"] == ["x", "y"]
    assert resp.body["messageModel"] == "CLUSTERING"
    assert resp.body["consumeFromWhere"] == "CONSUME_FROM_LAST_OFFSET"


async def test_topic_set_change_notifies_and_inconsistency_is_reported(broker, make_peer):
    a, b = make_peer(broker.address), make_peer(broker.address)
    await a.heartbeat("A", topics=["T1"])
    await b.heartbeat("B", topics=["T1"])
    await a.drain_notifies()
    await b.drain_notifies()
    await b.heartbeat("B", topics=["T2"])  # last heartbeat wins: T1 is gone from the group's table
    assert await a.next_notify() == "g" and await b.next_notify() == "g"
    resp = await a.ok(RequestCode.GET_CONSUMER_CONNECTION_LIST, {"consumerGroup": "g"})
    assert list(resp.body["subscriptionTable"]) == ["T2"]
    (inc,) = broker.log.of("subscription_inconsistent")
    assert inc["group"] == "g" and inc["client_id"] == "B"
    assert inc["topics"] == ["T2"] and inc["previous_topics"] == ["T1"]
    assert inc["other_client_id"] == "A" and inc["other_topics"] == ["T1"]
    await a.heartbeat("A", topics=["T1"])  # and back: the table flips with every heartbeat
    assert len(broker.log.of("subscription_inconsistent")) == 2
    # the retry topic of the group was created on heartbeat
    assert broker.topic_manager.select("%RETRY%g").queue_nums == 1


async def test_unregister_notifies_remaining_members(broker, make_peer):
    a, b = make_peer(broker.address), make_peer(broker.address)
    await a.heartbeat("A")
    await b.heartbeat("B")
    await a.drain_notifies()
    await b.drain_notifies()
    await b.ok(RequestCode.UNREGISTER_CLIENT, {"clientID": "B", "consumerGroup": "g"})
    assert await a.next_notify() == "g"
    assert await b.drain_notifies() == []
    assert await consumer_list(a) == ["A"]
    assert broker.log.of("consumer_unregistered", client_id="B")[0]["reason"] == "unregister"
    resp = await b.call(RequestCode.UNREGISTER_CLIENT, {"clientID": "B"})
    assert resp.code == ResponseCode.INVALID_PARAMETER and "consumerGroup" in resp.remark


async def test_close_unregisters_at_once_and_notifies_but_locks_survive(broker, make_peer):
    a, b = make_peer(broker.address), make_peer(broker.address)
    await a.heartbeat("A")
    await b.heartbeat("B")
    assert await b.lock("g", "B", [mq(0)]) == [("T", 0)]
    await a.drain_notifies()
    await b.close()
    assert await a.next_notify() == "g"
    assert await consumer_list(a) == ["A"]
    (ev,) = broker.log.of("consumer_unregistered", client_id="B")
    assert ev["reason"] == "channel_closed"
    assert await a.lock("g", "A", [mq(0), mq(1)]) == [("T", 1)]  # B's lock is still there
    assert broker.lock_manager.holder("g", mq(0), broker.clock.monotonic_ms()) == "B"


async def test_release_locks_on_close_policy(make_broker, make_peer):
    broker = await make_broker(time_scale=0.01, release_locks_on_close=True)
    a, b = make_peer(broker.address), make_peer(broker.address)
    await a.heartbeat("A")
    await b.heartbeat("B")
    assert await b.lock("g", "B", [mq(0)]) == [("T", 0)]
    await b.close()
    await wait_until(lambda: broker.log.of("lock_released", client_id="B"))
    assert broker.log.of("lock_released", client_id="B")[0]["reason"] == "channel_closed"
    assert await a.lock("g", "A", [mq(0)]) == [("T", 0)]


async def test_expiry_removes_without_notification_and_keeps_locks(make_broker, make_peer):
    # time scale 0.01: channel expiry 1.2 s, scanned every 0.1 s
    broker = await make_broker(time_scale=0.01)
    a, b = make_peer(broker.address), make_peer(broker.address)
    await a.heartbeat("A")
    await b.heartbeat("B")

    async def keep_alive():
        while True:
            await a.heartbeat("A")
            await b.lock("g", "B", [mq(0)])  # B renews its lock but sends no heartbeat
            await asyncio.sleep(0.2)

    task = asyncio.create_task(keep_alive())
    try:
        await a.drain_notifies()
        await wait_until(lambda: broker.log.of("consumer_unregistered", client_id="B"), within=5)
        ev = broker.log.of("consumer_unregistered", client_id="B")[0]
        assert ev["reason"] == "channel_expired"
        assert broker.consumer_manager.find("g").all_client_ids() == ["A"]
        holder = broker.lock_manager.holder("g", mq(0), broker.clock.monotonic_ms())
        assert holder == "B"
        assert await a.drain_notifies(0.3) == []  # RocketMQ sends no notification on expiry
        assert not broker.log.of("notify_sent", cause="channel_closed")
    finally:
        task.cancel()


async def test_notify_on_channel_expired_policy(make_broker, make_peer):
    broker = await make_broker(time_scale=0.01, notify_on_channel_expired=True)
    a, b = make_peer(broker.address), make_peer(broker.address)
    await b.heartbeat("B")
    await a.heartbeat("A")

    async def keep_alive():
        while True:
            await a.heartbeat("A")
            await b.lock("g", "B", [mq(0)])  # traffic, so the idle handler leaves B's connection open
            await asyncio.sleep(0.2)

    task = asyncio.create_task(keep_alive())
    try:
        await a.drain_notifies()
        assert await a.next_notify(timeout_s=5) == "g"
        assert broker.log.of("notify_sent", cause="channel_expired")
    finally:
        task.cancel()


async def test_an_idle_connection_is_closed_and_its_member_dropped(make_broker, make_peer):
    """The Netty idle handler closes a connection with no read or write for 120 s (1.2 s here), before
    the channel-expiry scan would find the registration: a close, so the group is notified."""
    # Both timers start at B's last heartbeat; a scan tick landing between the 120 s mark and the idle
    # close would expire B first (rare in Java, frequent on a loaded machine). A longer expiry here
    # leaves the idle handler alone to act, which is what this test is about.
    broker = await make_broker(time_scale=0.01, channel_expired_timeout_ms=240_000)
    a, b = make_peer(broker.address), make_peer(broker.address)
    await b.heartbeat("B")
    await a.heartbeat("A")

    async def keep_alive():
        while True:
            await a.heartbeat("A")
            await asyncio.sleep(0.2)

    task = asyncio.create_task(keep_alive())
    try:
        await a.drain_notifies()
        await wait_until(lambda: broker.log.of("consumer_unregistered", client_id="B"), 5)
        assert broker.log.of("consumer_unregistered", client_id="B")[0]["reason"] == "channel_closed"
        assert await a.next_notify(timeout_s=2) == "g"
        assert broker.consumer_manager.find("g").all_client_ids() == ["A"]
    finally:
        task.cancel()


async def test_a_member_that_stopped_reading_does_not_delay_the_others_notification(make_broker, make_peer):
    """NOTIFY_CONSUMER_IDS_CHANGED is one-way with a 10 ms send (Broker2Client): a member whose socket
    is full costs the next member nothing worth noticing."""
    broker = await make_broker(time_scale=1.0)
    await make_peer(broker.address).send("T", b"x" * (1 << 20))  # a 1 MiB message at offset 0
    stalled = make_peer(broker.address)
    await stalled.heartbeat("S")
    conn = next(c for c in broker.connections.values() if c.attrs.get("client_id") == "S")
    # pulls of the big message that the stalled member never reads, until the broker's buffer is full
    peer_conn = await stalled.rc.connection(broker.address)
    peer_conn._transport.pause_reading()
    pulls: list[asyncio.Task[object]] = []
    for _ in range(64):
        if conn._write_paused:
            break
        pulls += [asyncio.create_task(stalled.pull("T", 0, timeout_s=30)) for _ in range(4)]
        await asyncio.sleep(0.05)
    try:
        assert conn._write_paused
        a = make_peer(broker.address)
        await a.heartbeat("A")
        await a.drain_notifies()
        joiner = make_peer(broker.address)
        t0 = asyncio.get_running_loop().time()
        await joiner.heartbeat("J")  # a new member: NOTIFY to S first, then A and J
        assert await a.next_notify(timeout_s=2) == "g"
        assert asyncio.get_running_loop().time() - t0 < 0.5  # not the old 1 s wait on S
    finally:
        for t in pulls:
            t.cancel()


async def test_disable_notify(make_broker, make_peer):
    broker = await make_broker(time_scale=0.01, notify_consumer_ids_changed=False)
    a = make_peer(broker.address)
    await a.heartbeat("A")
    assert await a.drain_notifies(0.1) == []


async def test_lock_rules_over_the_wire(make_broker, make_peer):
    broker = await make_broker(time_scale=0.005)  # lock life 300 ms
    a, b = make_peer(broker.address), make_peer(broker.address)
    await a.heartbeat("A")
    await b.heartbeat("B")
    assert await a.lock("g", "A", [mq(0), mq(1)]) == [("T", 0), ("T", 1)]
    assert await b.lock("g", "B", [mq(1), mq(2)]) == [("T", 2)]
    await b.lock("g", "B", [mq(0)], unlock=True)  # not the holder: nothing happens
    assert await b.lock("g", "B", [mq(0)]) == []
    await a.lock("g", "A", [mq(0)], unlock=True)
    assert await b.lock("g", "B", [mq(0)]) == [("T", 0)]
    await asyncio.sleep(0.4)  # A's lock on mq1 expires
    assert await b.lock("g", "B", [mq(1)]) == [("T", 1)]
    acquired = broker.log.of("lock_acquired", client_id="B", queue_id=1)
    assert acquired[0]["previous_client_id"] == "A" and acquired[0]["broker"] == "broker-a"
    resp = await a.call(
        RequestCode.LOCK_BATCH_MQ, body={"consumerGroup": "g", "clientId": "A", "mqSet": [{}]}
    )
    assert resp.code == ResponseCode.INVALID_PARAMETER and "body.mqSet[0].topic" in resp.remark


async def test_a_lock_names_the_client_of_its_own_connection(broker, make_peer):
    a, b = make_peer(broker.address), make_peer(broker.address)
    await a.heartbeat("A")
    assert await a.lock("g", "A", [mq(0)]) == [("T", 0)]
    for code in (RequestCode.UNLOCK_BATCH_MQ, RequestCode.LOCK_BATCH_MQ):
        body = {"consumerGroup": "g", "clientId": "A", "mqSet": [mq(0).to_wire()]}
        resp = await b.call(code, body=body)  # a stranger naming A: no heartbeat on its connection
        assert resp.code == ResponseCode.NO_PERMISSION and "clientId A" in resp.remark
    await b.heartbeat("B")
    resp = await b.call(
        RequestCode.UNLOCK_BATCH_MQ, body={"consumerGroup": "g", "clientId": "A", "mqSet": [mq(0).to_wire()]}
    )
    assert resp.code == ResponseCode.NO_PERMISSION and "registered on this connection is B" in resp.remark
    assert await b.lock("g", "B", [mq(0)]) == []  # A still holds it
    assert not broker.log.of("lock_released")


async def test_offsets_commit_query_and_set_zero_rule(broker, make_peer):
    a = make_peer(broker.address)
    q = {"consumerGroup": "g", "topic": "T", "queueId": 0}
    assert (await a.ok(RequestCode.QUERY_CONSUMER_OFFSET, q)).ext["offset"] == 0  # min offset 0
    resp = await a.call(RequestCode.QUERY_CONSUMER_OFFSET, {**q, "setZeroIfNotFound": False})
    assert resp.code == ResponseCode.QUERY_NOT_FOUND
    await a.ok(RequestCode.UPDATE_CONSUMER_OFFSET, {**q, "commitOffset": 42})
    assert (await a.ok(RequestCode.QUERY_CONSUMER_OFFSET, q)).ext["offset"] == 42
    await a.oneway(RequestCode.UPDATE_CONSUMER_OFFSET, {**q, "commitOffset": 7})  # backwards is fine
    assert (await a.ok(RequestCode.QUERY_CONSUMER_OFFSET, q)).ext["offset"] == 7
    assert [e["offset"] for e in broker.log.of("offset_committed", group="g")] == [42, 7]
    # a queue whose min offset moved past 0 has no implicit zero
    for _ in range(3):
        await a.send("U")
    await broker.store.truncate("U", 0, 2)
    resp = await a.call(RequestCode.QUERY_CONSUMER_OFFSET, {**q, "topic": "U"})
    assert resp.code == ResponseCode.QUERY_NOT_FOUND
    resp = await a.call(RequestCode.UPDATE_CONSUMER_OFFSET, {**q, "commitOffset": "3"})
    assert resp.code == ResponseCode.INVALID_PARAMETER and "commitOffset" in resp.remark


async def test_offset_committed_only_when_the_committed_offset_changes(make_broker, make_peer, tmp_path):
    store = str(tmp_path / "store")
    b1 = await make_broker(time_scale=0.01, store_dir=store)
    a = make_peer(b1.address)
    q = {"consumerGroup": "g", "topic": "T", "queueId": 0}
    for offset in (5, 5, 6, 6, 5):  # persistAll re-sends an offset that did not move: no second event
        await a.ok(RequestCode.UPDATE_CONSUMER_OFFSET, {**q, "commitOffset": offset})
    await a.oneway(RequestCode.UPDATE_CONSUMER_OFFSET, {**q, "commitOffset": 5})
    await a.ok(RequestCode.UPDATE_CONSUMER_OFFSET, {**q, "queueId": 1, "commitOffset": 5})  # another queue
    assert (await a.ok(RequestCode.QUERY_CONSUMER_OFFSET, q)).ext["offset"] == 5  # every commit was stored
    events = [(e["queue_id"], e["offset"]) for e in b1.log.of("offset_committed", group="g")]
    assert events == [(0, 5), (0, 6), (0, 5), (1, 5)]
    await b1.shutdown()
    # a restarted broker compares with the offset it restored from its store
    b2 = await make_broker(time_scale=0.01, store_dir=store)
    c = make_peer(b2.address)
    await c.ok(RequestCode.UPDATE_CONSUMER_OFFSET, {**q, "commitOffset": 5})
    assert not b2.log.of("offset_committed")
    await c.ok(RequestCode.UPDATE_CONSUMER_OFFSET, {**q, "commitOffset": 7})
    assert [e["offset"] for e in b2.log.of("offset_committed", group="g")] == [7]


@pytest.mark.parametrize("rocketmq5", [False, True])
async def test_broadcasting_groups_get_no_notify_from_a_rocketmq5_broker(make_broker, make_peer, rocketmq5):
    """RocketMQ 5.3.1's ConsumerManager skips NOTIFY_CONSUMER_IDS_CHANGED for broadcasting groups
    (their members never divide queues); 4.9 notifies them like any group."""
    broker = await make_broker(time_scale=0.01, rocketmq5=rocketmq5)
    a, b = make_peer(broker.address), make_peer(broker.address)
    await a.heartbeat("A", model=MessageModel.BROADCASTING)
    await a.drain_notifies()
    await b.heartbeat("B", model=MessageModel.BROADCASTING)
    notified = await a.drain_notifies(0.2)
    assert notified == ([] if rocketmq5 else ["g"])
