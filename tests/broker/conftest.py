"""Fixtures: in-process brokers on ephemeral ports with an event recorder, and wire-level peers."""

from __future__ import annotations

from typing import Any

import pytest
from kit.broker import Peer, RecordingLog

from rmqlab.broker.controller import BrokerController
from rmqlab.broker.server_config import BrokerConfig


@pytest.fixture
async def make_broker():
    brokers: list[BrokerController] = []

    async def make(**kw: Any) -> BrokerController:
        kw.setdefault("port", 0)
        b = BrokerController(BrokerConfig(**kw), log=RecordingLog())
        await b.start()
        brokers.append(b)
        return b

    yield make
    for b in brokers:
        await b.shutdown()


@pytest.fixture
async def broker(make_broker):
    return await make_broker(time_scale=0.01)


@pytest.fixture
async def make_peer():
    peers: list[Peer] = []

    def make(addr: str) -> Peer:
        p = Peer(addr)
        peers.append(p)
        return p

    yield make
    for p in peers:
        await p.close()
