"""In-process cluster for client integration tests: brokers on ephemeral ports, an event log per test.

Imported by the integration tests (not a conftest, so the name cannot clash with other test folders).
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rmqlab.broker.controller import BrokerController
from rmqlab.broker.namesrv import NamesrvController
from rmqlab.broker.server_config import BrokerConfig, NamesrvConfig
from rmqlab.client.instance import MQClientManager
from rmqlab.client.producer import Producer
from rmqlab.client.push_consumer import PushConsumer
from rmqlab.protocol.allocate import get_strategy, sort_cid_all, sort_mq_all
from rmqlab.protocol.codes import RequestCode, ResponseCode
from rmqlab.protocol.command import RemotingCommand
from rmqlab.protocol.event_log import EventLog
from rmqlab.protocol.model import MessageQueue
from rmqlab.protocol.remoting import RemotingClient

SCALE = 0.05  # 20 s rebalance -> 1 s, 30 s heartbeat -> 1.5 s, 60 s broker lock -> 3 s
# The request deadlines of the tests' producer, in wall seconds at any scale. RocketMQ's 3 s (sendMsgTimeout,
# the client API's timeout, connectTimeoutMillis) scaled is 150 ms: a loaded machine keeps the test's
# process (broker, clients and producer on one loop) off the CPU for longer than that. A send that runs
# out fails the test before anything under test happened; a route poll or heartbeat that runs out closes
# the connection (clientCloseSocketIfTimeout) under a send in flight, whose retry stores the message a
# second time under an id the test never learns. A test about these timeouts passes its own values.
PRODUCER_TIMEOUT_S = 30.0
PRODUCER_TIMEOUTS = ("send_msg_timeout", "mq_client_api_timeout", "connect_timeout_millis")


@dataclass
class Cluster:
    tmp: str
    scale: float = SCALE
    brokers: list[BrokerController] = field(default_factory=list)
    logs: list[EventLog] = field(default_factory=list)
    closers: list[Callable[[], Any]] = field(default_factory=list)
    namesrv: str = ""
    namesrv_controller: NamesrvController | None = None

    @property
    def events_path(self) -> str:
        return os.path.join(self.tmp, "events")

    def log(self, node: str, role: str) -> EventLog:
        log = EventLog(node, role, os.path.join(self.events_path, f"{node}.jsonl"))
        self.logs.append(log)
        return log

    async def start_namesrv(self) -> str:
        ns = NamesrvController(
            NamesrvConfig(port=0, time_scale=self.scale), log=self.log("namesrv", "namesrv")
        )
        await ns.start()
        self.namesrv_controller = ns
        self.namesrv = ns.address
        return ns.address

    async def start_broker(self, name: str = "broker-a", **overrides: Any) -> BrokerController:
        if self.namesrv_controller is not None:
            overrides.setdefault("namesrv", self.namesrv)
        # a slave's node is "<broker>-s<id>", as experiments name it
        node = overrides.pop(
            "node", f"{name}-s{overrides['broker_id']}" if overrides.get("broker_id") else name
        )
        cfg = BrokerConfig(broker_name=name, port=0, time_scale=self.scale, **overrides)
        broker = BrokerController(cfg, log=self.log(node, "broker"))
        await broker.start()
        self.brokers.append(broker)
        if not self.namesrv:
            self.namesrv = broker.address
        return broker

    async def create_topic(self, topic: str, queues: int = 4, broker: BrokerController | None = None) -> None:
        targets = [broker] if broker is not None else self.brokers
        rc = RemotingClient()
        try:
            for b in targets:
                cmd = RemotingCommand.request(
                    RequestCode.UPDATE_AND_CREATE_TOPIC,
                    {"topic": topic, "readQueueNums": queues, "writeQueueNums": queues, "perm": 6},
                )
                resp = await rc.invoke(b.address, cmd, 3.0)
                assert resp.code == ResponseCode.SUCCESS, resp.remark
        finally:
            await rc.close()

    def consumer(self, group: str, node: str, **kwargs: Any) -> PushConsumer:
        kwargs.setdefault("namesrv", self.namesrv)
        kwargs.setdefault("time_scale", self.scale)
        c = PushConsumer(group, log=self.log(node, "consumer"), **kwargs)
        self.closers.append(c.shutdown)
        return c

    def producer(self, node: str = "producer", **kwargs: Any) -> Producer:
        kwargs.setdefault("namesrv", self.namesrv)
        kwargs.setdefault("time_scale", self.scale)
        for option in PRODUCER_TIMEOUTS:
            kwargs.setdefault(option, round(PRODUCER_TIMEOUT_S * 1000 / kwargs["time_scale"]))
        p = Producer(log=self.log(node, "producer"), **kwargs)
        self.closers.append(p.shutdown)
        return p

    async def close(self) -> None:
        for close in reversed(self.closers):
            try:
                async with asyncio.timeout(10):
                    await close()
            except Exception:
                pass
        for b in self.brokers:
            await b.shutdown()
        if self.namesrv_controller is not None:
            await self.namesrv_controller.shutdown()
        for log in self.logs:
            log.close()

    def events(self, name: str | None = None) -> list[dict[str, Any]]:
        for log in self.logs:
            log.flush()
        out: list[dict[str, Any]] = []
        for fn in sorted(os.listdir(self.events_path)):
            with open(os.path.join(self.events_path, fn), encoding="utf-8") as fh:
                for line in fh:
                    line = line.strip()
                    if line:
                        ev = json.loads(line)
                        if name is None or ev.get("event") == name:
                            out.append(ev)
        out.sort(key=lambda e: e["ts_ms"])
        return out


async def add_fault(broker_addr: str, **body: Any) -> None:
    """ADMIN_FAULT_ADD (9000) with ``body`` as the fault spec (README: fault injection)."""
    rc = RemotingClient()
    try:
        resp = await rc.invoke(broker_addr, RemotingCommand.request(9000, body=body), 3.0)
        assert resp.code == ResponseCode.SUCCESS, resp.remark
    finally:
        await rc.close()


async def crash(consumer: PushConsumer) -> None:
    """Lose a consumer abruptly: its connections are reset, nothing is unregistered or unlocked."""
    inst = consumer.instance
    consumer.running = False
    inst.pull_service.stop()
    for conn in list(inst.remoting._conns.values()):
        conn.abort()
    inst.remoting._shut = True
    if inst._runner is not None:
        inst._runner.cancel()
        try:
            await inst._runner
        except BaseException:
            pass
    consumer.state.destroy()
    MQClientManager.remove(inst.client_id)


def owned(consumer: PushConsumer, topic: str) -> set[MessageQueue]:
    return {mq for mq in consumer.owned_queues() if mq.topic == topic}


def expected_allocation(
    consumers: list[PushConsumer], mq_all: set[MessageQueue], strategy: str = "AVG"
) -> dict[str, set[MessageQueue]]:
    strat = get_strategy(strategy)
    cids = sort_cid_all(c.client_id for c in consumers)
    mqs = sort_mq_all(mq_all)
    return {cid: set(strat.allocate("g", cid, mqs, cids)) for cid in cids}


def allocation_matches(
    consumers: list[PushConsumer], topic: str, mq_all: set[MessageQueue], strategy: str = "AVG"
) -> bool:
    want = expected_allocation(consumers, mq_all, strategy)
    return all(owned(c, topic) == want[c.client_id] for c in consumers)


def queues(topic: str, n: int, broker: str = "broker-a") -> set[MessageQueue]:
    return {MessageQueue(topic, broker, i) for i in range(n)}
