"""rmq-proxy through real gRPC calls, over an in-process broker: routes, membership, sends and the statuses
bad input gets (missing fields, unknown topics, no client id, no settings)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from kit.cluster import Cluster

from protocol.codes import RequestCode, ResponseCode
from protocol.command import RemotingCommand
from protocol.remoting import RemotingClient
from protocol.runtime import EventLog
from proxy.config import ProxyConfig
from proxy.server import ProxyServer
from proxy.v5 import Code, MessagingServiceStub, aio, pb, svc


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


@pytest.fixture
async def lab(tmp_path: Any) -> AsyncIterator[Lab]:
    cluster = Cluster(str(tmp_path))
    await cluster.start_broker(auto_create_topic=False)
    await cluster.create_topic("T", 4)
    server = ProxyServer(
        ProxyConfig(namesrv=cluster.namesrv, port=0),
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


async def test_calls_without_client_id_or_settings(lab: Lab) -> None:
    hb = svc.HeartbeatRequest(group=pb.Resource(name="G"), client_type=pb.SIMPLE_CONSUMER)
    assert (await lab.stub.Heartbeat(hb)).status.code == Code.CLIENT_ID_REQUIRED
    assert (await lab.stub.Heartbeat(hb, metadata=lab.meta())).status.code == Code.UNRECOGNIZED_CLIENT_TYPE
    bye = await lab.stub.NotifyClientTermination(
        svc.NotifyClientTerminationRequest(), metadata=lab.meta("x@y")
    )
    assert bye.status.code == Code.UNRECOGNIZED_CLIENT_TYPE


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
