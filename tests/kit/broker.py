"""Test helpers for the broker: an event recorder, a wire-level peer, and message builders."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from rmqlab.protocol.codes import RequestCode, ResponseCode
from rmqlab.protocol.command import RemotingCommand
from rmqlab.protocol.event_log import EventLog
from rmqlab.protocol.model import ConsumerData, HeartbeatData, MessageModel, SubscriptionData
from rmqlab.protocol.remoting import Connection, RemotingClient


class RecordingLog(EventLog):
    """An EventLog that keeps events and log lines in memory for assertions instead of writing them."""

    def __init__(self) -> None:
        super().__init__("test", "test", None, _discard=True)
        self.events: list[dict[str, Any]] = []
        self.lines: list[tuple[str, str, dict[str, Any]]] = []

    def emit(self, event: str, **fields: Any) -> None:
        self.events.append({"event": event, **fields})

    def _text(self, level: str, msg: str, kv: dict[str, Any]) -> None:
        self.lines.append((level, msg, kv))

    def of(self, event: str, **match: Any) -> list[dict[str, Any]]:
        return [
            e for e in self.events if e["event"] == event and all(e.get(k) == v for k, v in match.items())
        ]


class Peer:
    """One client connection to a broker that records the NOTIFY_CONSUMER_IDS_CHANGED pushes it gets."""

    def __init__(self, addr: str) -> None:
        self.addr = addr
        self.rc = RemotingClient(connect_timeout_s=2.0)
        self.notifies: asyncio.Queue[str] = asyncio.Queue()
        self.rc.register(RequestCode.NOTIFY_CONSUMER_IDS_CHANGED, self._on_notify)

    async def _on_notify(self, conn: Connection, cmd: RemotingCommand) -> None:
        self.notifies.put_nowait(cmd.ext.get("consumerGroup"))
        return None

    async def call(
        self, code: int, ext: dict[str, Any] | None = None, body: Any = None, timeout_s: float = 5.0
    ) -> RemotingCommand:
        return await self.rc.invoke(self.addr, RemotingCommand.request(code, ext, body), timeout_s)

    async def ok(self, code: int, ext: dict[str, Any] | None = None, body: Any = None) -> RemotingCommand:
        resp = await self.call(code, ext, body)
        assert resp.code == ResponseCode.SUCCESS, (resp.code, resp.remark)
        return resp

    async def oneway(self, code: int, ext: dict[str, Any] | None = None, body: Any = None) -> None:
        await self.rc.invoke_oneway(self.addr, RemotingCommand.request(code, ext, body, oneway=True))

    async def heartbeat(
        self,
        client_id: str,
        group: str | None = "g",
        topics: dict[str, str] | list[str] = ("T",),
        version: int = 1,
        model: MessageModel = MessageModel.CLUSTERING,
        producer_group: str | None = None,
    ) -> RemotingCommand:
        if not isinstance(topics, dict):
            topics = {t: "*" for t in topics}
        subs = [SubscriptionData.build(t, expr, version) for t, expr in topics.items()]
        consumers = [ConsumerData(group, message_model=model, subscription_data_set=subs)] if group else []
        hb = HeartbeatData(client_id, consumer_data_set=consumers)
        body = hb.to_wire()
        if producer_group:
            body["producerDataSet"] = [{"groupName": producer_group}]
        return await self.ok(RequestCode.HEART_BEAT, body=body)

    async def send(
        self, topic: str, body: bytes = b"x", queue_id: int = 0, tags: str | None = None, **ext: Any
    ) -> RemotingCommand:
        e: dict[str, Any] = {
            "producerGroup": "pg",
            "topic": topic,
            "queueId": queue_id,
            "bornTimestamp": int(time.time() * 1000),
        }
        if tags is not None:
            e["tags"] = tags
        e.update(ext)
        return await self.call(RequestCode.SEND_MESSAGE, e, {"body": body, "properties": {"p": "v"}})

    async def pull(
        self,
        topic: str,
        offset: int,
        group: str = "g",
        queue_id: int = 0,
        max_nums: int = 32,
        suspend_ms: int = 0,
        timeout_s: float = 5.0,
        **ext: Any,
    ) -> RemotingCommand:
        e: dict[str, Any] = {
            "consumerGroup": group,
            "topic": topic,
            "queueId": queue_id,
            "queueOffset": offset,
            "maxMsgNums": max_nums,
            "commitOffset": 0,
            "suspendTimeoutMillis": suspend_ms,
            "subVersion": 0,
        }
        e.update(ext)
        return await self.call(RequestCode.PULL_MESSAGE, e, timeout_s=timeout_s)

    async def lock(self, group: str, client_id: str, mqs: list[Any], unlock: bool = False) -> list[Any]:
        code = RequestCode.UNLOCK_BATCH_MQ if unlock else RequestCode.LOCK_BATCH_MQ
        body = {
            "consumerGroup": group,
            "clientId": client_id,
            "onlyThisBroker": False,
            "mqSet": [m.to_wire() for m in mqs],
        }
        resp = await self.ok(code, body=body)
        return [] if unlock else [(d["topic"], d["queueId"]) for d in resp.body["lockOKMQSet"]]

    async def drain_notifies(self, settle: float = 0.05) -> list[str]:
        await asyncio.sleep(settle)
        out = []
        while not self.notifies.empty():
            out.append(self.notifies.get_nowait())
        return out

    async def next_notify(self, timeout_s: float = 2.0) -> str:
        async with asyncio.timeout(timeout_s):
            return await self.notifies.get()

    async def close(self) -> None:
        await self.rc.close()
