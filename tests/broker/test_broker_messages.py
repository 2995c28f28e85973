"""The message path over real sockets: send, pull, long polling, filters, offsets, retry and DLQ."""

from __future__ import annotations

import asyncio
import time

from kit import wait_until

from rmqlab.protocol.codes import RequestCode, ResponseCode
from rmqlab.protocol.model import Message


async def test_send_pull_round_trip(broker, make_peer):
    p = make_peer(broker.address)
    await p.heartbeat("C", topics=["T"])
    sent = []
    for i in range(5):
        resp = await p.send("T", f"m{i}".encode(), queue_id=1, tags="a", keys=f"k{i}")
        assert resp.code == ResponseCode.SUCCESS, resp.remark
        assert resp.ext["queueId"] == 1 and resp.ext["queueOffset"] == i
        sent.append(resp.ext["msgId"])
    assert len(set(sent)) == 5
    assert broker.topic_manager.select("T").queue_nums == 4  # auto-created with 4 queues
    resp = await p.pull("T", 0, queue_id=1, max_nums=3)
    assert resp.code == ResponseCode.SUCCESS
    assert (resp.ext["nextBeginOffset"], resp.ext["minOffset"], resp.ext["maxOffset"]) == (3, 0, 5)
    msgs = [Message.from_wire(m) for m in resp.body["messages"]]
    assert [m.msg_id for m in msgs] == sent[:3]
    m = msgs[0]
    assert (m.topic, m.broker_name, m.queue_id, m.queue_offset, m.body) == ("T", "broker-a", 1, 0, b"m0")
    assert (m.tags, m.keys, m.reconsume_times, m.properties) == ("a", "k0", 0, {"p": "v"})
    assert m.store_timestamp >= m.born_timestamp - 1000
    resp = await p.pull("T", 3, queue_id=1)
    assert [d["queueOffset"] for d in resp.body["messages"]] == [3, 4]
    for code, q in (
        (RequestCode.GET_MAX_OFFSET, 1),
        (RequestCode.GET_MIN_OFFSET, 1),
        (RequestCode.GET_MAX_OFFSET, 2),
    ):
        resp = await p.ok(code, {"topic": "T", "queueId": q})
        assert resp.ext["offset"] == (5 if code == RequestCode.GET_MAX_OFFSET and q == 1 else 0)
    ts = msgs[2].store_timestamp
    resp = await p.ok(RequestCode.SEARCH_OFFSET_BY_TIMESTAMP, {"topic": "T", "queueId": 1, "timestamp": ts})
    assert resp.ext["offset"] <= 2
    resp = await p.ok(
        RequestCode.SEARCH_OFFSET_BY_TIMESTAMP, {"topic": "T", "queueId": 1, "timestamp": ts + 10**9}
    )
    assert resp.ext["offset"] == 5
    served = broker.log.of("pull_served", client_id="C", queue_id=1)
    assert served and served[0]["count"] == 3 and served[0]["code"] == 0


async def test_commit_offset_piggy_backed_on_pull(broker, make_peer):
    p = make_peer(broker.address)
    await p.heartbeat("C")
    await p.send("T")
    await p.pull("T", 1, commitOffset=1)
    assert broker.offset_manager.query_offset("g", "T", 0) == 1
    await p.pull("T", 1, commitOffset=0)
    await p.pull("T", 1, commitOffset=-1)
    assert [e["offset"] for e in broker.log.of("offset_committed", group="g")] == [1]


async def test_offset_moved_and_not_found(broker, make_peer):
    p = make_peer(broker.address)
    await p.heartbeat("C")
    for _ in range(3):
        await p.send("T")
    resp = await p.pull("T", 10)
    assert resp.code == ResponseCode.PULL_OFFSET_MOVED and resp.ext["nextBeginOffset"] == 3
    resp = await p.pull("T", -1)
    assert resp.code == ResponseCode.PULL_OFFSET_MOVED and resp.ext["nextBeginOffset"] == 0
    resp = await p.pull("T", 3)
    assert resp.code == ResponseCode.PULL_NOT_FOUND and resp.ext["nextBeginOffset"] == 3
    resp = await p.pull("T", 0, queue_id=2)  # empty queue of a known topic
    assert resp.code == ResponseCode.PULL_NOT_FOUND and resp.ext["maxOffset"] == 0
    await broker.store.truncate("T", 0, 2)
    resp = await p.pull("T", 1)
    assert resp.code == ResponseCode.PULL_OFFSET_MOVED and resp.ext["nextBeginOffset"] == 2
    assert resp.ext["minOffset"] == 2


async def test_tag_filter_from_request_or_registration(broker, make_peer):
    p = make_peer(broker.address)
    await p.heartbeat("C", topics={"T": "b"})
    for tag in ("a", "b", "a", "b", None):
        await p.send("T", tags=tag)
    resp = await p.pull("T", 0)  # no subscription in the request: the registered one ("b")
    assert [d["queueOffset"] for d in resp.body["messages"]] == [1, 3]
    assert resp.ext["nextBeginOffset"] == 5
    resp = await p.pull("T", 0, subscription="a || zz")
    assert [d["tags"] for d in resp.body["messages"]] == ["a", "a"]
    resp = await p.pull("T", 4, subscription="a")
    assert resp.code == ResponseCode.PULL_RETRY_IMMEDIATELY and resp.ext["nextBeginOffset"] == 5
    resp = await p.pull("T", 0, subscription="*")
    assert len(resp.body["messages"]) == 5


async def test_long_poll_answered_early_by_a_matching_send(make_broker, make_peer):
    broker = await make_broker(time_scale=1.0)  # hold check every 5 s: only arrivals answer here
    p, producer = make_peer(broker.address), make_peer(broker.address)
    await p.heartbeat("C", topics={"T": "want"})
    await producer.send("T")  # offset 0 on queue 0
    t0 = time.monotonic()
    pull = asyncio.create_task(p.pull("T", 1, suspend_ms=10_000, timeout_s=15))
    await wait_until(lambda: len(broker.hold_service) == 1)
    await producer.send("T", queue_id=1, tags="want")  # other queue: no wake-up
    await producer.send("T", tags="other")  # not matching: no wake-up
    await asyncio.sleep(0.1)
    assert not pull.done()
    await producer.send("T", tags="want")
    resp = await pull
    assert time.monotonic() - t0 < 5
    assert resp.code == ResponseCode.SUCCESS
    assert [d["tags"] for d in resp.body["messages"]] == ["want"]
    assert resp.body["messages"][0]["queueOffset"] == 2


async def test_hold_check_answers_a_pull_whose_queue_grew_with_other_tags(broker, make_peer):
    """PullRequestHoldService#checkHoldRequest wakes a held pull whenever its queue grew, matching or
    not; the re-run finds nothing that matches and answers PULL_RETRY_IMMEDIATELY."""
    p, producer = make_peer(broker.address), make_peer(broker.address)
    await p.heartbeat("C", topics={"T": "want"})
    await producer.send("T", tags="want")  # offset 0
    pull = asyncio.create_task(p.pull("T", 1, suspend_ms=10_000, timeout_s=15))
    await wait_until(lambda: len(broker.hold_service) == 1)
    await producer.send("T", tags="other")  # offset 1: no wake-up on arrival
    async with asyncio.timeout(3):  # the hold check runs every 50 ms here; the suspend time is 10 s
        resp = await pull
    assert resp.code == ResponseCode.PULL_RETRY_IMMEDIATELY
    assert resp.ext["nextBeginOffset"] == 2


async def test_a_woken_pull_runs_its_checks_again(broker, make_peer):
    """executeRequestWhenWakeup re-runs the whole request: a group whose subscription lost the topic
    while the pull was held answers SUBSCRIPTION_NOT_EXIST, not the message."""
    p, producer = make_peer(broker.address), make_peer(broker.address)
    await p.heartbeat("C", topics=["T"])
    await producer.send("T")
    pull = asyncio.create_task(p.pull("T", 1, suspend_ms=10_000, timeout_s=15))
    await wait_until(lambda: len(broker.hold_service) == 1)
    await p.heartbeat("C", topics=["U"])  # the group's subscription table now lacks T
    await producer.send("T")
    async with asyncio.timeout(3):
        resp = await pull
    assert resp.code == ResponseCode.SUBSCRIPTION_NOT_EXIST


async def test_long_poll_times_out_with_not_found(broker, make_peer):
    p = make_peer(broker.address)
    await p.heartbeat("C")
    await p.send("T")
    t0 = time.monotonic()
    resp = await p.pull("T", 1, suspend_ms=300)
    elapsed = time.monotonic() - t0
    assert resp.code == ResponseCode.PULL_NOT_FOUND
    assert elapsed >= 0.28  # answered no earlier than its suspend time (hold check every 50 ms here)
    assert len(broker.hold_service) == 0


async def test_held_pull_of_closed_connection_is_dropped(broker, make_peer):
    p = make_peer(broker.address)
    await p.heartbeat("C")
    task = asyncio.create_task(p.pull("T", 0, suspend_ms=10_000, timeout_s=15))
    await p.send("U")  # make sure the connection is up; T is unknown until sent
    assert (await task).code == ResponseCode.TOPIC_NOT_EXIST
    await p.send("T")
    task = asyncio.create_task(p.pull("T", 1, suspend_ms=10_000, timeout_s=15))
    await wait_until(lambda: len(broker.hold_service) == 1)
    await p.close()
    await wait_until(lambda: len(broker.hold_service) == 0)
    task.cancel()


async def test_pull_check_order_and_subscription_errors(broker, make_peer):
    p = make_peer(broker.address)
    resp = await p.pull("Nope", 0)
    assert resp.code == ResponseCode.TOPIC_NOT_EXIST
    await p.send("T")
    await p.send("Other")
    resp = await p.pull("T", 0, queue_id=4)
    assert resp.code == ResponseCode.INVALID_PARAMETER and "queueId" in resp.remark
    resp = await p.pull("T", 0, max_nums=0)
    assert resp.code == ResponseCode.INVALID_PARAMETER and "maxMsgNums" in resp.remark
    resp = await p.pull("T", 0)
    assert resp.code == ResponseCode.SUBSCRIPTION_NOT_EXIST and "group info" in resp.remark
    await p.heartbeat("C", topics=["Other"], version=100)
    resp = await p.pull("T", 0)
    assert resp.code == ResponseCode.SUBSCRIPTION_NOT_EXIST and "subscription not exist" in resp.remark
    resp = await p.pull("Other", 0, subVersion=101)
    assert resp.code == ResponseCode.SUBSCRIPTION_NOT_LATEST
    resp = await p.pull("Other", 0, subVersion=100)
    assert resp.code == ResponseCode.SUCCESS
    resp = await p.pull("Other", "0")
    assert resp.code == ResponseCode.INVALID_PARAMETER and "queueOffset" in resp.remark


async def test_send_errors(make_broker, make_peer):
    broker = await make_broker(time_scale=0.01, auto_create_topic=False)
    p = make_peer(broker.address)
    resp = await p.send("T")
    assert resp.code == ResponseCode.TOPIC_NOT_EXIST
    topic = {"topic": "T", "readQueueNums": 2, "writeQueueNums": 2, "perm": 6}
    await p.ok(RequestCode.UPDATE_AND_CREATE_TOPIC, topic)
    assert (await p.send("T", queue_id=1)).code == ResponseCode.SUCCESS
    resp = await p.send("T", queue_id=2)
    assert resp.code == ResponseCode.INVALID_PARAMETER and "queueId" in resp.remark
    resp = await p.send("T", body=b"x" * (4 * 1024 * 1024 + 1))
    assert resp.code == ResponseCode.MESSAGE_ILLEGAL
    await p.ok(RequestCode.UPDATE_AND_CREATE_TOPIC, {**topic, "perm": 4})
    assert (await p.send("T")).code == ResponseCode.NO_PERMISSION
    await p.ok(RequestCode.UPDATE_AND_CREATE_TOPIC, {**topic, "perm": 2})
    await p.heartbeat("C")
    assert (await p.pull("T", 0)).code == ResponseCode.NO_PERMISSION
    resp = await p.call(RequestCode.UPDATE_AND_CREATE_TOPIC, {**topic, "perm": 5})
    assert resp.code == ResponseCode.INVALID_PARAMETER and "perm" in resp.remark
    resp = await p.call(RequestCode.UPDATE_AND_CREATE_TOPIC, {**topic, "topic": "bad topic"})
    assert resp.code == ResponseCode.INVALID_PARAMETER and "topic" in resp.remark
    resp = await p.call(
        RequestCode.SEND_MESSAGE,
        {"producerGroup": "p", "topic": "T", "queueId": 0, "bornTimestamp": 1},
        {"body": "s"},
    )
    assert resp.code == ResponseCode.INVALID_PARAMETER and "body.body" in resp.remark
    resp = await p.call(
        RequestCode.SEND_MESSAGE_V2,
        {"producerGroup": "p", "topic": "T", "queueId": 0, "bornTimestamp": 1},
        {"body": b"s", "properties": {"a": 1}},
    )
    assert resp.code == ResponseCode.INVALID_PARAMETER and "body.properties.a" in resp.remark


async def test_retry_then_dlq(make_broker, make_peer):
    broker = await make_broker(time_scale=0.001)  # delay level 3 (10 s) becomes 10 ms
    p = make_peer(broker.address)
    await p.heartbeat("C", topics=["T", "%RETRY%g"])
    orig = await p.send("T", b"payload", tags="t")
    back = {
        "group": "g",
        "originTopic": "T",
        "queueId": 0,
        "offset": 0,
        "originMsgId": orig.ext["msgId"],
        "delayLevel": 0,
        "maxReconsumeTimes": 2,
    }
    await p.ok(RequestCode.CONSUMER_SEND_MSG_BACK, back)
    await wait_until(lambda: broker.store.get_max_offset("%RETRY%g", 0) == 1)
    r1 = Message.from_wire((await p.pull("%RETRY%g", 0)).body["messages"][0])
    assert r1.reconsume_times == 1 and r1.body == b"payload" and r1.tags == "t"
    assert r1.properties["ORIGIN_MESSAGE_ID"] == orig.ext["msgId"]
    assert r1.properties["RETRY_TOPIC"] == "T"
    assert "DELAY" not in r1.properties and r1.msg_id != orig.ext["msgId"]
    (ev,) = broker.log.of("message_sent_back")
    assert ev["delay_level"] == 3 and not ev["dlq"]
    # the consumer names the real topic for a message it pulled from the retry topic
    await p.ok(RequestCode.CONSUMER_SEND_MSG_BACK, {**back, "originMsgId": r1.msg_id})
    await wait_until(lambda: broker.store.get_max_offset("%RETRY%g", 0) == 2)
    r2 = Message.from_wire((await p.pull("%RETRY%g", 1)).body["messages"][0])
    assert r2.reconsume_times == 2 and r2.properties["ORIGIN_MESSAGE_ID"] == orig.ext["msgId"]
    # reconsumeTimes 2 >= maxReconsumeTimes 2: dead letter
    await p.ok(
        RequestCode.CONSUMER_SEND_MSG_BACK,
        {**back, "originTopic": "%RETRY%g", "offset": 1, "originMsgId": r2.msg_id},
    )
    assert broker.store.get_max_offset("%DLQ%g", 0) == 1
    dead = broker.store.lookup("%DLQ%g", 0, 0)
    assert dead.reconsume_times == 3 and dead.properties["ORIGIN_MESSAGE_ID"] == orig.ext["msgId"]
    assert broker.topic_manager.select("%DLQ%g").readable
    resp = await p.call(RequestCode.CONSUMER_SEND_MSG_BACK, {**back, "offset": 99})
    assert resp.code == ResponseCode.SYSTEM_ERROR and "look message by offset failed" in resp.remark


async def test_rocketmq5_send_to_retry_topic_goes_to_dlq_while_group_holds_locks(make_broker, make_peer):
    from rmqlab.protocol.model import MessageQueue

    # RocketMQ's own time: the 60 s lock must outlive a slow machine's gap between the lock and the send
    broker = await make_broker(time_scale=1.0, rocketmq5=True)
    p = make_peer(broker.address)
    await p.heartbeat("C")
    await p.lock("g", "C", [MessageQueue("T", "broker-a", 0)])
    resp = await p.send("%RETRY%g", reconsumeTimes=1)
    assert resp.code == ResponseCode.SUCCESS
    assert broker.store.get_max_offset("%DLQ%g", 0) == 1 and broker.store.get_max_offset("%RETRY%g", 0) == 0


async def test_send_to_retry_topic_goes_to_dlq_at_max_reconsume_times_in_4_9(broker, make_peer):
    """4.9.8's handleRetryAndDLQ: reconsumeTimes >= maxReconsumeTimes goes to the DLQ; locks play no part."""
    from rmqlab.protocol.model import MessageQueue

    p = make_peer(broker.address)
    await p.heartbeat("C")
    await p.lock("g", "C", [MessageQueue("T", "broker-a", 0)])
    await p.send("%RETRY%g", reconsumeTimes=1, maxReconsumeTimes=2)
    assert broker.store.get_max_offset("%RETRY%g", 0) == 1 and broker.store.get_max_offset("%DLQ%g", 0) == 0
    await p.send("%RETRY%g", reconsumeTimes=2, maxReconsumeTimes=2)
    assert broker.store.get_max_offset("%DLQ%g", 0) == 1


async def test_a_send_with_a_delay_level_is_delivered_when_due(make_broker, make_peer):
    """CommitLog#putMessage parks a message whose DELAY property is > 0 in the schedule topic."""
    broker = await make_broker(time_scale=0.1)  # delay level 2 (5 s) is 0.5 s here
    p = make_peer(broker.address)
    await p.heartbeat("C")
    ext = {"producerGroup": "pg", "topic": "T", "queueId": 0, "bornTimestamp": int(time.time() * 1000)}
    resp = await p.call(RequestCode.SEND_MESSAGE, ext, {"body": b"later", "properties": {"DELAY": "2"}})
    assert resp.code == ResponseCode.SUCCESS
    assert (await p.pull("T", 0)).code != ResponseCode.SUCCESS  # not there yet
    await wait_until(lambda: broker.store.get_max_offset("T", 0) == 1, 5)
    msgs = (await p.pull("T", 0)).body["messages"]
    assert [m["body"] for m in msgs] == [b"later"]
    bad = await p.call(RequestCode.SEND_MESSAGE, ext, {"body": b"x", "properties": {"DELAY": "soon"}})
    assert bad.code == ResponseCode.INVALID_PARAMETER and "DELAY" in bad.remark
