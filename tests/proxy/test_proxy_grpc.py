"""rmq-proxy through real gRPC calls, over an in-process broker: routes, membership, sends and the statuses
bad input gets (missing fields, unknown topics, no client id, no settings)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from kit import wait_until
from kit.cluster import Cluster

from rmqlab.protocol.codes import RequestCode, ResponseCode
from rmqlab.protocol.command import RemotingCommand
from rmqlab.protocol.event_log import EventLog
from rmqlab.protocol.remoting import RemotingClient
from rmqlab.proxy.proxy_config import ProxyConfig
from rmqlab.proxy.server import ProxyServer
from rmqlab.proxy.v5 import Code, MessagingServiceStub, aio, pb, svc


class Lab:
    def __init__(self, cluster: Cluster, server: ProxyServer, channel: Any) -> None:
        self.cluster = cluster
        self.server = server
        self.channel = channel
        self.stub = MessagingServiceStub(channel)
        self.calls: list[Any] = []  # telemetry streams, cancelled at the end

    @staticmethod
    def meta(client_id: str = "10.0.0.1@1@0@abc") -> tuple[tuple[str, str], ...]:
        return (("x-mq-client-id", client_id), ("x-mq-client-version", "5.1.2"))

    async def broker_call(self, code: int, ext: dict[str, Any]) -> RemotingCommand:
        rc = RemotingClient()
        try:
            return await rc.invoke(self.cluster.brokers[0].address, RemotingCommand.request(code, ext), 3.0)
        finally:
            await rc.close()

    async def members(self, group: str) -> list[str]:
        resp = await self.broker_call(RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": group})
        return sorted(resp.body["consumerIdList"]) if resp.code == ResponseCode.SUCCESS else []

    async def settings(self, settings: Any, client_id: str) -> Any:
        """Opens a telemetry stream, sends the settings and returns the proxy's answer (stream left open)."""
        queue: asyncio.Queue[Any] = asyncio.Queue()
        await queue.put(svc.TelemetryCommand(settings=settings))

        async def commands() -> AsyncIterator[Any]:
            while True:
                yield await queue.get()

        call = self.stub.Telemetry(commands(), metadata=self.meta(client_id))
        answer = await call.read()
        self.calls.append(call)
        return answer


@contextlib.asynccontextmanager
async def make_lab(tmp_path: Any, **config: Any) -> AsyncIterator[Lab]:
    cluster = Cluster(str(tmp_path))
    await cluster.start_broker(auto_create_topic=False)
    await cluster.create_topic("T", 4)
    server = ProxyServer(
        ProxyConfig(namesrv=cluster.namesrv, port=0, **config),
        EventLog("proxy", "proxy", str(tmp_path / "proxy.jsonl")),
    )
    await server.start()
    channel = aio.insecure_channel(server.address)
    out = Lab(cluster, server, channel)
    try:
        yield out
    finally:
        for call in out.calls:
            call.cancel()
        await channel.close()
        await server.stop()
        await cluster.close()


@pytest.fixture
async def lab(tmp_path: Any) -> AsyncIterator[Lab]:
    async with make_lab(tmp_path) as out:
        yield out


def consumer_settings(group: str = "G", topic: str = "T", kind: int = pb.SIMPLE_CONSUMER) -> Any:
    s = pb.Settings(client_type=kind)
    s.subscription.group.name = group
    entry = s.subscription.subscriptions.add()
    entry.topic.name = topic
    entry.expression.type = pb.TAG
    entry.expression.expression = "*"
    return s


async def test_query_route_points_every_broker_at_the_proxy(lab: Lab) -> None:
    resp = await lab.stub.QueryRoute(svc.QueryRouteRequest(topic=pb.Resource(name="T")), metadata=lab.meta())
    assert resp.status.code == Code.OK
    assert [(q.broker.name, q.id, q.permission) for q in resp.message_queues] == [
        ("broker-a", i, pb.READ_WRITE) for i in range(4)
    ]
    addr = resp.message_queues[0].broker.endpoints.addresses[0]
    assert f"{addr.host}:{addr.port}" == lab.server.address
    # the endpoints the client came by, when it names them (a proxy behind another address)
    named = pb.Endpoints(scheme=pb.DOMAIN_NAME, addresses=[pb.Address(host="proxy.example", port=9)])
    req = svc.QueryRouteRequest(topic=pb.Resource(name="T"), endpoints=named)
    resp = await lab.stub.QueryRoute(req, metadata=lab.meta())
    assert all(q.broker.endpoints == named for q in resp.message_queues)


async def test_route_errors(lab: Lab) -> None:
    missing = await lab.stub.QueryRoute(svc.QueryRouteRequest(), metadata=lab.meta())
    assert missing.status.code == Code.ILLEGAL_TOPIC
    unknown = await lab.stub.QueryRoute(
        svc.QueryRouteRequest(topic=pb.Resource(name="Nope")), metadata=lab.meta()
    )
    assert unknown.status.code == Code.TOPIC_NOT_FOUND
    no_group = await lab.stub.QueryAssignment(
        svc.QueryAssignmentRequest(topic=pb.Resource(name="T")), metadata=lab.meta()
    )
    assert no_group.status.code == Code.ILLEGAL_CONSUMER_GROUP


async def test_query_assignment_is_any_queue_of_each_broker(lab: Lab) -> None:
    req = svc.QueryAssignmentRequest(topic=pb.Resource(name="T"), group=pb.Resource(name="G"))
    resp = await lab.stub.QueryAssignment(req, metadata=lab.meta())
    assert resp.status.code == Code.OK
    assert [(a.message_queue.broker.name, a.message_queue.id) for a in resp.assignments] == [("broker-a", -1)]
    await lab.stub.QueryAssignment(req, metadata=lab.meta())
    written = proxy_events(lab, "assignment")
    assert [(e["group"], e["topic"], e["pop"], e["pull"], e["changed"]) for e in written] == [
        ("G", "T", ["broker-a:-1"], [], False)
    ]


async def test_calls_without_client_id_or_settings(lab: Lab) -> None:
    hb = svc.HeartbeatRequest(group=pb.Resource(name="G"), client_type=pb.SIMPLE_CONSUMER)
    assert (await lab.stub.Heartbeat(hb)).status.code == Code.CLIENT_ID_REQUIRED
    assert (await lab.stub.Heartbeat(hb, metadata=lab.meta())).status.code == Code.UNRECOGNIZED_CLIENT_TYPE
    bye = await lab.stub.NotifyClientTermination(
        svc.NotifyClientTerminationRequest(), metadata=lab.meta("x@y")
    )
    assert bye.status.code == Code.UNRECOGNIZED_CLIENT_TYPE


async def test_calls_with_missing_fields_get_a_status_saying_what_is_missing(lab: Lab) -> None:
    client = "10.0.0.1@12@0@m"
    await lab.settings(consumer_settings(), client)
    meta = lab.meta(client)
    g, t = pb.Resource(name="G"), pb.Resource(name="T")
    ten_s = {"invisible_duration": {"seconds": 10}}
    unary = [
        (lab.stub.AckMessage, svc.AckMessageRequest(topic=t), Code.ILLEGAL_CONSUMER_GROUP, "consumer group"),
        (lab.stub.AckMessage, svc.AckMessageRequest(group=g), Code.ILLEGAL_TOPIC, "topic name"),
        (lab.stub.AckMessage, svc.AckMessageRequest(group=g, topic=t), Code.BAD_REQUEST, "no entry"),
        (
            lab.stub.ChangeInvisibleDuration,
            svc.ChangeInvisibleDurationRequest(group=g, topic=t, receipt_handle="x", message_id="m"),
            Code.ILLEGAL_INVISIBLE_TIME,
            "invisible_duration is missing",
        ),
        (
            lab.stub.ChangeInvisibleDuration,
            svc.ChangeInvisibleDurationRequest(group=g, topic=t, message_id="m", **ten_s),
            Code.INVALID_RECEIPT_HANDLE,
            "receipt handle is missing",
        ),
        (
            lab.stub.ChangeInvisibleDuration,
            svc.ChangeInvisibleDurationRequest(topic=t, receipt_handle="x", **ten_s),
            Code.ILLEGAL_CONSUMER_GROUP,
            "consumer group",
        ),
        (
            lab.stub.ForwardMessageToDeadLetterQueue,
            svc.ForwardMessageToDeadLetterQueueRequest(group=g, topic=t, message_id="m"),
            Code.INVALID_RECEIPT_HANDLE,
            "receipt handle is missing",
        ),
        (
            lab.stub.ForwardMessageToDeadLetterQueue,
            svc.ForwardMessageToDeadLetterQueueRequest(group=g, receipt_handle="x"),
            Code.ILLEGAL_TOPIC,
            "topic name",
        ),
    ]
    for call, request, code, says in unary:
        resp = await call(request, metadata=meta)
        assert (resp.status.code, says in resp.status.message) == (code, True), (request, resp.status)
    queue = pb.MessageQueue(topic=t, id=-1)
    receives = [
        (svc.ReceiveMessageRequest(group=g, batch_size=1), Code.BAD_REQUEST, "message_queue is missing"),
        (svc.ReceiveMessageRequest(message_queue=queue, batch_size=1), Code.ILLEGAL_CONSUMER_GROUP, "group"),
        (
            svc.ReceiveMessageRequest(group=g, message_queue=pb.MessageQueue(id=-1), batch_size=1),
            Code.ILLEGAL_TOPIC,
            "topic name",
        ),
        (svc.ReceiveMessageRequest(group=g, message_queue=queue, **ten_s), Code.BAD_REQUEST, "batch_size"),
    ]
    for request, code, says in receives:
        [first, *_] = [r async for r in lab.stub.ReceiveMessage(request, metadata=meta, timeout=10)]
        assert (first.status.code, says in first.status.message) == (code, True), (request, first.status)
    assert lab.cluster.brokers[0].pop_state.in_flight() == 0


async def test_settings_register_the_client_in_its_group_and_termination_removes_it(lab: Lab) -> None:
    answer = await lab.settings(consumer_settings(), "10.0.0.1@1@0@one")
    assert answer.status.code == Code.OK
    assert answer.settings.subscription.receive_batch_size == 32
    assert answer.settings.backoff_policy.max_attempts == 17
    await lab.settings(consumer_settings(kind=pb.PUSH_CONSUMER), "10.0.0.1@2@0@two")
    assert await lab.members("G") == ["10.0.0.1@1@0@one", "10.0.0.1@2@0@two"]
    hb = svc.HeartbeatRequest(group=pb.Resource(name="G"), client_type=pb.SIMPLE_CONSUMER)
    assert (await lab.stub.Heartbeat(hb, metadata=lab.meta("10.0.0.1@1@0@one"))).status.code == Code.OK
    bye = svc.NotifyClientTerminationRequest(group=pb.Resource(name="G"))
    resp = await lab.stub.NotifyClientTermination(bye, metadata=lab.meta("10.0.0.1@1@0@one"))
    assert resp.status.code == Code.OK
    assert await lab.members("G") == ["10.0.0.1@2@0@two"]


async def test_bad_settings_get_a_status_on_the_stream(lab: Lab) -> None:
    bad = await lab.settings(consumer_settings(group=""), "10.0.0.1@3@0@bad")
    assert bad.status.code == Code.ILLEGAL_CONSUMER_GROUP
    sql = consumer_settings()
    sql.subscription.subscriptions[0].expression.type = pb.SQL
    assert (await lab.settings(sql, "10.0.0.1@4@0@sql")).status.code == Code.ILLEGAL_FILTER_EXPRESSION
    assert await lab.members("G") == []


async def test_send_stores_the_messages_with_the_producers_ids(lab: Lab) -> None:
    producer = pb.Settings(client_type=pb.PRODUCER)
    producer.publishing.topics.add().name = "T"
    assert (await lab.settings(producer, "10.0.0.1@5@0@p")).status.code == Code.OK
    msgs = []
    for i in range(4):
        m = pb.Message(topic=pb.Resource(name="T"), body=f"m{i}".encode())
        m.system_properties.message_id = f"ID{i}"
        m.system_properties.tag = "tagA"
        msgs.append(m)
    ids = []
    for m in msgs:
        resp = await lab.stub.SendMessage(
            svc.SendMessageRequest(messages=[m]), metadata=lab.meta("10.0.0.1@5@0@p")
        )
        assert resp.status.code == Code.OK, resp
        ids.append(resp.entries[0].message_id)
    assert ids == ["ID0", "ID1", "ID2", "ID3"]
    # round robin over the four queues, as the Java proxy's write selector
    offsets = []
    for qid in range(4):
        resp = await lab.broker_call(RequestCode.GET_MAX_OFFSET, {"topic": "T", "queueId": qid})
        offsets.append(resp.ext["offset"])
    assert offsets == [1, 1, 1, 1]


async def test_send_errors(lab: Lab) -> None:
    meta = lab.meta("10.0.0.1@6@0@p")
    empty = await lab.stub.SendMessage(svc.SendMessageRequest(), metadata=meta)
    assert empty.status.code == Code.BAD_REQUEST
    no_id = pb.Message(topic=pb.Resource(name="T"), body=b"x")
    assert (
        await lab.stub.SendMessage(svc.SendMessageRequest(messages=[no_id]), metadata=meta)
    ).status.code == (Code.ILLEGAL_MESSAGE_ID)
    unknown = pb.Message(topic=pb.Resource(name="Nope"), body=b"x")
    unknown.system_properties.message_id = "ID"
    resp = await lab.stub.SendMessage(svc.SendMessageRequest(messages=[unknown]), metadata=meta)
    assert resp.status.code == Code.TOPIC_NOT_FOUND


async def send(lab: Lab, client_id: str, *bodies: str) -> list[str]:
    ids = []
    for i, body in enumerate(bodies):
        m = pb.Message(topic=pb.Resource(name="T"), body=body.encode())
        m.system_properties.message_id = f"{client_id}-{i}"
        resp = await lab.stub.SendMessage(svc.SendMessageRequest(messages=[m]), metadata=lab.meta(client_id))
        assert resp.status.code == Code.OK, resp
        ids.append(resp.entries[0].message_id)
    return ids


async def receive(
    lab: Lab, client_id: str, batch: int, *, auto_renew: bool, invisible_s: int = 0
) -> list[Any]:
    req = svc.ReceiveMessageRequest(
        group=pb.Resource(name="G"),
        message_queue=pb.MessageQueue(topic=pb.Resource(name="T"), id=-1, broker=pb.Broker(name="broker-a")),
        batch_size=batch,
        auto_renew=auto_renew,
    )
    req.filter_expression.type = pb.TAG
    req.filter_expression.expression = "*"
    req.long_polling_timeout.seconds = 5
    if invisible_s:
        req.invisible_duration.seconds = invisible_s
    out = []
    async for r in lab.stub.ReceiveMessage(req, metadata=lab.meta(client_id), timeout=15):
        out.append(r)
    return out


def proxy_events(lab: Lab, event: str) -> list[dict[str, Any]]:
    lab.server.log.flush()
    lines = Path(lab.server.log.path or "").read_text().splitlines()
    return [e for e in map(json.loads, lines) if e["event"] == event]


async def test_receive_answers_status_messages_then_delivery_time_and_bad_input_gets_statuses(
    lab: Lab,
) -> None:
    await lab.settings(consumer_settings(), "10.0.0.1@7@0@s")
    ids = await send(lab, "10.0.0.1@7@0@s", "a", "b")
    got = await receive(lab, "10.0.0.1@7@0@s", 8, auto_renew=False, invisible_s=30)
    kinds = [r.WhichOneof("content") for r in got]
    assert kinds == ["status", "message", "message", "delivery_timestamp"]
    assert got[0].status.code == Code.OK
    assert sorted(r.message.system_properties.message_id for r in got[1:3]) == sorted(ids)
    too_short = await receive(lab, "10.0.0.1@7@0@s", 8, auto_renew=False, invisible_s=9)
    assert too_short[0].status.code == Code.ILLEGAL_INVISIBLE_TIME
    # a group with no consumer registered on the broker: the broker's refusal as a status
    req = svc.ReceiveMessageRequest(
        group=pb.Resource(name="Nobody"),
        message_queue=pb.MessageQueue(topic=pb.Resource(name="T"), id=-1),
        batch_size=1,
    )
    req.invisible_duration.seconds = 30
    [status, _] = [r async for r in lab.stub.ReceiveMessage(req, metadata=lab.meta("x@1"), timeout=10)]
    assert status.status.code == Code.CONSUMER_GROUP_NOT_FOUND
    # acks: a malformed receipt, an expired one, one no longer in flight, then a good one
    msg = got[1].message
    ack = svc.AckMessageRequest(group=pb.Resource(name="G"), topic=pb.Resource(name="T"))
    entry = ack.entries.add(message_id=msg.system_properties.message_id, receipt_handle="not a receipt")
    resp = await lab.stub.AckMessage(ack, metadata=lab.meta("10.0.0.1@7@0@s"))
    assert resp.status.code == Code.INVALID_RECEIPT_HANDLE and "malformed" in resp.status.message
    parts = msg.system_properties.receipt_handle.split(" ")
    expired = " ".join([parts[0], "1000", *parts[2:]])
    entry.receipt_handle = expired
    resp = await lab.stub.AckMessage(ack, metadata=lab.meta("10.0.0.1@7@0@s"))
    assert resp.status.code == Code.INVALID_RECEIPT_HANDLE and "expired" in resp.status.message
    entry.receipt_handle = msg.system_properties.receipt_handle
    assert (await lab.stub.AckMessage(ack, metadata=lab.meta("10.0.0.1@7@0@s"))).status.code == Code.OK
    again = await lab.stub.AckMessage(ack, metadata=lab.meta("10.0.0.1@7@0@s"))
    assert again.status.code == Code.INVALID_RECEIPT_HANDLE and "not in flight" in again.status.message
    assert again.entries[0].status.code == Code.INVALID_RECEIPT_HANDLE


async def test_push_receipts_are_renewed_acked_by_the_first_receipt_and_cleared_when_the_client_leaves(
    tmp_path: Any,
) -> None:
    # An 11 s invisible time is renewed one second after the pop (10 s ahead), on a 50 ms scan.
    async with make_lab(tmp_path, default_invisible_ms=11_000, time_scale=0.01) as lab:
        client = "10.0.0.1@8@0@push"
        await lab.settings(consumer_settings(kind=pb.PUSH_CONSUMER), client)
        await send(lab, client, "a", "b")
        got = await receive(lab, client, 8, auto_renew=True)
        msgs = [r.message for r in got if r.WhichOneof("content") == "message"]
        assert len(msgs) == 2

        def renewed() -> set[str]:
            return {e["msg_id"] for e in proxy_events(lab, "proxy_receipt_renewal") if e["ok"]}

        await wait_until(lambda: len(renewed()) == 2, 10, "both receipts renewed", 0.1)
        # The client still holds its first receipts; the proxy acks with the renewed one.
        first = msgs[0]
        ack = svc.AckMessageRequest(group=pb.Resource(name="G"), topic=pb.Resource(name="T"))
        ack.entries.add(
            message_id=first.system_properties.message_id,
            receipt_handle=first.system_properties.receipt_handle,
        )
        assert (await lab.stub.AckMessage(ack, metadata=lab.meta(client))).status.code == Code.OK
        # Leaving hands the other message back at once (1 s), and another client gets it.
        bye = svc.NotifyClientTerminationRequest(group=pb.Resource(name="G"))
        assert (await lab.stub.NotifyClientTermination(bye, metadata=lab.meta(client))).status.code == Code.OK
        cleared = [e for e in proxy_events(lab, "proxy_receipt_renewal") if e["kind"] == "CLEAR_GROUP"]
        assert [(e["msg_id"], e["invisible_ms"], e["ok"]) for e in cleared] == [
            (msgs[1].system_properties.message_id, 1000, True)
        ]
        other = "10.0.0.1@9@0@other"
        await lab.settings(consumer_settings(), other)
        again = await receive(lab, other, 8, auto_renew=False, invisible_s=30)
        back = [r.message for r in again if r.WhichOneof("content") == "message"]
        assert [m.system_properties.message_id for m in back] == [msgs[1].system_properties.message_id]
        assert back[0].system_properties.delivery_attempt == 2


async def test_a_closed_telemetry_stream_keeps_the_client_and_its_renewals(tmp_path: Any) -> None:
    """As RocketMQ 5's proxy: a telemetry stream that ends is only logged (ClientActivity#telemetry), and
    DefaultReceiptHandleManager renews until the client leaves the consumer manager (termination or the
    120 s channel expiry); gRPC has no channel-close event like the remoting port's housekeeping."""
    # 0.05: the expiry is 6 s of wall time away; the 11 s invisible time is renewed after about 1 s.
    async with make_lab(tmp_path, default_invisible_ms=11_000, time_scale=0.05) as lab:
        client = "10.0.0.1@13@0@closed"
        await lab.settings(consumer_settings(kind=pb.PUSH_CONSUMER), client)
        await send(lab, client, "a")
        got = await receive(lab, client, 8, auto_renew=True)
        [msg] = [r.message for r in got if r.WhichOneof("content") == "message"]
        for call in lab.calls:
            call.cancel()  # the client's stream goes away, as when its process is killed
        lab.calls.clear()

        def renewals() -> list[dict[str, Any]]:
            return proxy_events(lab, "proxy_receipt_renewal")

        await wait_until(lambda: bool(renewals()), 10, "the held receipt renewed", 0.1)
        assert [(e["kind"], e["msg_id"], e["ok"]) for e in renewals()] == [
            ("RENEW", msg.system_properties.message_id, True)
        ]
        assert await lab.members("G") == [client]
        assert not proxy_events(lab, "proxy_client_expired")


async def test_messages_popped_for_a_receive_whose_client_left_come_back_after_a_second(
    tmp_path: Any,
) -> None:
    async with make_lab(tmp_path) as lab:
        gone, other = "10.0.0.1@10@0@gone", "10.0.0.1@11@0@other"
        await lab.settings(consumer_settings(), gone)
        req = svc.ReceiveMessageRequest(
            group=pb.Resource(name="G"),
            message_queue=pb.MessageQueue(
                topic=pb.Resource(name="T"), id=-1, broker=pb.Broker(name="broker-a")
            ),
            batch_size=4,
        )
        req.invisible_duration.seconds = 60
        req.long_polling_timeout.seconds = 10
        call = lab.stub.ReceiveMessage(req, metadata=lab.meta(gone), timeout=20)
        await asyncio.sleep(0.5)  # the pop is held at the broker
        call.cancel()
        await asyncio.sleep(0.2)
        [msg_id] = await send(lab, other, "late")

        def nacked() -> list[dict[str, Any]]:
            return [e for e in proxy_events(lab, "proxy_receipt_renewal") if e["kind"] == "NACK_UNWRITTEN"]

        await wait_until(lambda: bool(nacked()), 10, "the unwritten message handed back")
        assert [(e["msg_id"], e["invisible_ms"], e["ok"]) for e in nacked()] == [(msg_id, 1000, True)]
        await lab.settings(consumer_settings(), other)
        got = await receive(lab, other, 4, auto_renew=False, invisible_s=30)
        back = [r.message for r in got if r.WhichOneof("content") == "message"]
        assert [m.system_properties.message_id for m in back] == [msg_id]
        assert back[0].system_properties.delivery_attempt == 2


async def test_routes_are_cached_and_refreshed_in_the_background(tmp_path: Any) -> None:
    async with make_lab(tmp_path, time_scale=0.01) as lab:  # refreshed after 0.2 s
        req = svc.QueryRouteRequest(topic=pb.Resource(name="T"))
        assert len((await lab.stub.QueryRoute(req, metadata=lab.meta())).message_queues) == 4
        resp = await lab.broker_call(
            RequestCode.UPDATE_AND_CREATE_TOPIC,
            {"topic": "T", "readQueueNums": 8, "writeQueueNums": 8, "perm": 6},
        )
        assert resp.code == ResponseCode.SUCCESS
        assert len((await lab.stub.QueryRoute(req, metadata=lab.meta())).message_queues) == 4  # cached
        await asyncio.sleep(0.3)
        await lab.stub.QueryRoute(req, metadata=lab.meta())  # stale: answered, and refreshed behind it
        counts: list[int] = []

        async def count() -> None:
            counts.append(len((await lab.stub.QueryRoute(req, metadata=lab.meta())).message_queues))

        async with asyncio.timeout(5):
            while not counts or counts[-1] != 8:
                await count()
                await asyncio.sleep(0.05)


async def test_only_heartbeats_and_settings_keep_a_client_from_expiring(tmp_path: Any) -> None:
    """RocketMQ 5's proxy registers a client's channel anew on a heartbeat or on settings
    (ClientActivity), never on a send, receive or ack: a client that keeps sending but stopped its
    heartbeats expires at the channel expiry, while one that keeps heartbeating stays."""
    # 0.05: the 120 s expiry is 6 s of wall time, the 10 s scan half a second.
    async with make_lab(tmp_path, time_scale=0.05) as lab:
        sender, beating = "10.0.0.1@21@0@sender", "10.0.0.1@22@0@beating"
        await lab.settings(consumer_settings(), sender)
        await lab.settings(consumer_settings(), beating)

        def expired() -> set[str]:
            return {e["client_id"] for e in proxy_events(lab, "proxy_client_expired")}

        async def keep_calling() -> None:
            while sender not in expired():
                await send(lab, sender, "still here")
                hb = await lab.stub.Heartbeat(
                    svc.HeartbeatRequest(group=pb.Resource(name="G"), client_type=pb.SIMPLE_CONSUMER),
                    metadata=lab.meta(beating),
                )
                assert hb.status.code == Code.OK, hb
                await asyncio.sleep(0.2)

        await asyncio.wait_for(keep_calling(), 30)
        assert expired() == {sender}
        assert await lab.members("G") == [beating]
