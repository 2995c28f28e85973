"""NOTIFY_CONSUMER_IDS_CHANGED's fan-out (ConsumerIdsChangeListener): every member in order from one
callback, a member whose write buffer is full waited for (10 ms) on a task while the rest follow it, a
failed member costing the others nothing, and close() dropping a fan-out that has not started."""

from __future__ import annotations

import asyncio
from typing import Any

from kit.broker import RecordingLog

from rmqlab.broker.consumer_manager import ClientChannelInfo, ConsumerIdsChangeListener, ConsumerManager
from rmqlab.protocol.codes import RequestCode
from rmqlab.protocol.command import RemotingCommand
from rmqlab.protocol.model import ConsumeFromWhere, ConsumeType, MessageModel, SubscriptionData
from rmqlab.protocol.remoting import RemotingConnectionError, RemotingTimeoutError


class Channel:
    """What the fan-out uses of a Connection, with a full write buffer or a closed socket on demand."""

    def __init__(
        self, n: int, sent: list[tuple[int, str]], *, full: bool = False, dead: bool = False
    ) -> None:
        self.n, self.sent, self.full, self.dead = n, sent, full, dead
        self.closed = False
        self.remote_addr = f"10.0.0.{n}:40000"
        self.waited: list[float] = []

    def send_oneway(self, cmd: RemotingCommand) -> bool:
        if self.dead:
            raise RemotingConnectionError(f"connection to {self.remote_addr} is closed")
        assert cmd.code == RequestCode.NOTIFY_CONSUMER_IDS_CHANGED
        self.sent.append((self.n, cmd.ext["consumerGroup"]))
        return not self.full

    async def wait_oneway_written(self, cmd: RemotingCommand, timeout_s: float) -> None:
        self.waited.append(timeout_s)
        await asyncio.sleep(0)
        raise RemotingTimeoutError(f"one-way to {self.remote_addr}: peer not reading")

    async def invoke_oneway(self, cmd: RemotingCommand, timeout_s: float = 3.0) -> None:
        if not self.send_oneway(cmd):
            await self.wait_oneway_written(cmd, timeout_s)


def _group(channels: list[Channel]) -> tuple[ConsumerIdsChangeListener, RecordingLog]:
    manager, log = ConsumerManager(), RecordingLog()
    for ch in channels:
        manager.register_consumer(
            "g",
            ClientChannelInfo(ch.n, f"c{ch.n}", ch.remote_addr, 0, 0),
            ConsumeType.CONSUME_PASSIVELY,
            MessageModel.CLUSTERING,
            ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET,
            [SubscriptionData("T", "*")],
        )
    conns: dict[int, Any] = {ch.n: ch for ch in channels}
    return ConsumerIdsChangeListener(manager, conns, log, enabled=True, rocketmq5=False), log


async def test_every_member_in_order_past_a_full_buffer_and_a_closed_socket() -> None:
    sent: list[tuple[int, str]] = []
    channels = [Channel(1, sent), Channel(2, sent, dead=True), Channel(3, sent, full=True), Channel(4, sent)]
    listener, log = _group(channels)
    listener.notify_group("g", "register")
    assert sent == []  # sent from the loop, where a task's first step would run
    await asyncio.sleep(0)
    assert sent == [(1, "g"), (3, "g")]  # member 3's buffer is full: the rest wait behind it
    for _ in range(5):
        await asyncio.sleep(0)
    assert sent == [(1, "g"), (3, "g"), (4, "g")]
    assert channels[2].waited == [0.01]  # Broker2Client's 10 ms
    assert [kv["peer"] for level, msg, kv in log.lines if msg == "notify failed"] == [
        channels[1].remote_addr,
        channels[2].remote_addr,
    ]
    assert log.of("notify_sent", group="g", cause="register", client_count=4)


async def test_close_drops_a_fan_out_not_yet_started() -> None:
    sent: list[tuple[int, str]] = []
    listener, _ = _group([Channel(1, sent), Channel(2, sent)])
    listener.notify_group("g", "register")
    listener.close()
    for _ in range(3):
        await asyncio.sleep(0)
    assert sent == []
    listener.notify_group("g", "channel_closed")  # a later change is sent again
    await asyncio.sleep(0)
    assert sent == [(1, "g"), (2, "g")]
