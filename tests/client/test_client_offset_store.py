"""Offset stores: ports of RocketMQ's RemoteBrokerOffsetStoreTest and LocalFileOffsetStoreTest."""

from __future__ import annotations

import asyncio
import json
import os
from typing import Any

import pytest

from rmqlab.client.client_config import ConsumerConfig
from rmqlab.client.errors import MQBrokerError, MQClientError, OffsetNotFoundError
from rmqlab.client.instance import InstanceOffsetApi
from rmqlab.client.offset_store import (
    LocalFileOffsetStore,
    ReadOffsetType,
    RemoteBrokerOffsetStore,
    read_offset_file,
)
from rmqlab.protocol.model import MessageQueue

MEM = ReadOffsetType.READ_FROM_MEMORY
STORE = ReadOffsetType.READ_FROM_STORE


class FakeBroker:
    def __init__(self) -> None:
        self.committed: dict[MessageQueue, int] = {}
        self.fail: Exception | None = None
        self.sent: list[tuple[MessageQueue, int]] = []

    async def query_consumer_offset(self, mq: MessageQueue, group: str) -> int:
        if self.fail is not None:
            raise self.fail
        if mq not in self.committed:
            raise OffsetNotFoundError("not found")
        return self.committed[mq]

    async def update_consumer_offset_oneway(self, mq: MessageQueue, group: str, offset: int) -> None:
        self.sent.append((mq, offset))
        self.committed[mq] = offset


def mq(q: int) -> MessageQueue:
    return MessageQueue("FooBar", "aaa", q)


async def test_remote_update_offset_increase_only() -> None:
    store = RemoteBrokerOffsetStore("g", FakeBroker())
    store.update_offset(mq(1), 1024, False)
    assert await store.read_offset(mq(1), MEM) == 1024
    store.update_offset(mq(1), 1023, False)
    assert await store.read_offset(mq(1), MEM) == 1023
    store.update_offset(mq(1), 1022, True)
    assert await store.read_offset(mq(1), MEM) == 1023


async def test_remote_read_offset_with_exception() -> None:
    broker = FakeBroker()
    store = RemoteBrokerOffsetStore("g", broker)
    store.update_offset(mq(2), 1024, False)
    broker.fail = MQBrokerError(-1, "")
    assert await store.read_offset(mq(2), STORE) == -1  # 4.9: a broker error reads as "not found"
    broker.fail = ConnectionError("down")
    assert await store.read_offset(mq(2), STORE) == -2
    store5 = RemoteBrokerOffsetStore("g", broker, broker_error_as_not_found=False)
    broker.fail = MQBrokerError(1, "boom")
    assert await store5.read_offset(mq(2), STORE) == -2
    broker.fail = OffsetNotFoundError()
    assert await store5.read_offset(mq(2), STORE) == -1
    assert await store5.read_offset(None, STORE) == -3


async def test_remote_read_offset_success_and_persist() -> None:
    broker = FakeBroker()
    store = RemoteBrokerOffsetStore("g", broker)
    store.update_offset(mq(3), 1024, False)
    await store.persist(mq(3))
    assert await store.read_offset(mq(3), STORE) == 1024
    store.update_offset(mq(3), 1023, False)
    await store.persist(mq(3))
    assert await store.read_offset(mq(3), STORE) == 1023
    store.update_offset(mq(3), 1022, True)
    await store.persist(mq(3))
    assert await store.read_offset(mq(3), STORE) == 1023
    store.update_offset(mq(3), 1025, False)
    await store.persist_all({mq(3)})
    assert await store.read_offset(mq(3), STORE) == 1025


async def test_remote_memory_first_then_store() -> None:
    broker = FakeBroker()
    broker.committed[mq(5)] = 7
    store = RemoteBrokerOffsetStore("g", broker)
    assert await store.read_offset(mq(5), ReadOffsetType.MEMORY_FIRST_THEN_STORE) == 7
    store.update_offset(mq(5), 9, False)
    assert await store.read_offset(mq(5), ReadOffsetType.MEMORY_FIRST_THEN_STORE) == 9
    assert await store.read_offset(mq(6), MEM) == -1


async def test_remote_remove_offset_and_persist_all_forgets_unused() -> None:
    broker = FakeBroker()
    store = RemoteBrokerOffsetStore("g", broker)
    store.update_offset(mq(4), 1024, False)
    store.remove_offset(mq(4))
    assert await store.read_offset(mq(4), MEM) == -1
    store.update_offset(mq(0), 10, False)
    store.update_offset(mq(1), 11, False)
    await store.persist_all([])  # nothing held: nothing happens at all
    assert broker.sent == [] and set(store.offset_table) == {mq(0), mq(1)}
    await store.persist_all([mq(0)])
    assert broker.sent == [(mq(0), 10)]
    assert set(store.offset_table) == {mq(0)}


class Warnings:
    def __init__(self) -> None:
        self.lines: list[tuple[str, dict[str, object]]] = []

    def warning(self, msg: str, **kv: object) -> None:
        self.lines.append((msg, kv))


class SometimesWaitingBroker:
    """update_consumer_offset_oneway as the client's own API has it: a plain function that sends at once
    (None), fails at once, or returns what is left to await, which may fail too."""

    def __init__(self) -> None:
        self.sent: list[tuple[int, int]] = []

    async def query_consumer_offset(self, mq: MessageQueue, group: str) -> int:
        raise OffsetNotFoundError("not found")

    def update_consumer_offset_oneway(self, mq: MessageQueue, group: str, offset: int) -> Any:
        if mq.queue_id == 1:
            raise ConnectionError("connection to aaa is closed")

        async def later() -> None:
            await asyncio.sleep(0)
            if mq.queue_id == 3:
                raise TimeoutError("peer not reading")
            self.sent.append((mq.queue_id, offset))

        if mq.queue_id in (2, 3):
            return later()
        self.sent.append((mq.queue_id, offset))
        return None


async def test_persist_all_sends_each_queue_whether_its_send_waits_or_fails() -> None:
    broker, warnings = SometimesWaitingBroker(), Warnings()
    store = RemoteBrokerOffsetStore("g", broker, warnings)  # type: ignore[arg-type]
    for q in range(5):
        store.update_offset(mq(q), 100 + q, False)
    await store.persist_all([mq(q) for q in range(5)])
    assert broker.sent == [(0, 100), (2, 102), (4, 104)]  # in queue order, past both failures
    assert [(kv["mq"], kv["error"]) for _, kv in warnings.lines] == [
        (mq(1).short, repr(ConnectionError("connection to aaa is closed"))),
        (mq(3).short, repr(TimeoutError("peer not reading"))),
    ]
    await store.persist(mq(2))  # one queue: the same rules
    await store.persist(mq(1))
    assert broker.sent[-1] == (2, 102) and len(warnings.lines) == 3


class AddressBook:
    """The GroupApi calls InstanceOffsetApi makes: the broker's address is known only after a lookup."""

    def __init__(self) -> None:
        self.known: dict[str, str] = {}
        self.sent: list[tuple[str, int]] = []

    def find_broker_address_in_subscribe(self, broker_name: str, broker_id: int, only_master: bool) -> Any:
        return self.known.get(broker_name)

    async def find_broker_address_in_subscribe_or_update(
        self, topic: str, broker_name: str, broker_id: int, only_master: bool
    ) -> Any:
        await asyncio.sleep(0)  # the name server's answer
        if broker_name == "aaa":
            self.known[broker_name] = "10.0.0.2:10911"
        return self.known.get(broker_name)

    def update_consumer_offset_oneway(self, addr: str, group: str, mq: MessageQueue, offset: int) -> None:
        self.sent.append((addr, offset))


async def test_offset_api_sends_at_once_when_the_address_is_known_and_looks_it_up_otherwise() -> None:
    book = AddressBook()
    api = InstanceOffsetApi(book, ConsumerConfig())  # type: ignore[arg-type]
    pending = api.update_consumer_offset_oneway(mq(0), "g", 7)
    assert pending is not None and book.sent == []  # unknown broker: the lookup is left to await
    await pending
    assert book.sent == [("10.0.0.2:10911", 7)]
    assert api.update_consumer_offset_oneway(mq(0), "g", 8) is None  # known now: sent, nothing to await
    assert book.sent[-1] == ("10.0.0.2:10911", 8)
    with pytest.raises(MQClientError, match="not exist"):
        await api.update_consumer_offset_oneway(MessageQueue("FooBar", "bbb", 0), "g", 9)  # type: ignore[misc]


async def test_frozen_offset_ignores_updates_until_removed() -> None:
    store = RemoteBrokerOffsetStore("g", FakeBroker())
    store.update_and_freeze_offset(mq(0), 50)
    store.update_offset(mq(0), 70, False)
    assert store.read_offset_from_memory(mq(0)) == 50
    store.remove_offset(mq(0))
    store.update_offset(mq(0), 70, False)
    assert store.read_offset_from_memory(mq(0)) == 70


@pytest.fixture
def local(tmp_path: object) -> LocalFileOffsetStore:
    return LocalFileOffsetStore("g", "127.0.0.1@1#2", str(tmp_path))


async def test_local_update_offset(local: LocalFileOffsetStore) -> None:
    local.update_offset(mq(1), 1024, False)
    assert await local.read_offset(mq(1), MEM) == 1024
    local.update_offset(mq(1), 1023, False)
    local.update_offset(mq(1), 1022, True)
    assert await local.read_offset(mq(1), MEM) == 1023


async def test_local_read_from_store_and_persist_all_merges(local: LocalFileOffsetStore) -> None:
    local.update_offset(mq(2), 1024, False)
    assert await local.read_offset(mq(2), STORE) == -1
    await local.persist_all({mq(2)})
    assert await local.read_offset(mq(2), STORE) == 1024
    local.update_offset(mq(0), 1025, False)
    local.update_offset(mq(1), 1026, False)
    await local.persist_all([mq(0), mq(1)])
    assert await local.read_offset(mq(2), STORE) == 1024
    assert await local.read_offset(mq(1), STORE) == 1026
    assert local.clone_offset_table("FooBar")[mq(0)] == 1025


async def test_local_persist_single_and_reload(local: LocalFileOffsetStore, tmp_path: object) -> None:
    local.update_offset(mq(0), 1024, False)
    await local.persist(mq(0))
    assert await local.read_offset(mq(0), STORE) == 1024
    assert await local.read_offset(mq(1), STORE) == -1
    again = LocalFileOffsetStore("g", "127.0.0.1@1#2", str(tmp_path))
    await again.load()
    assert again.read_offset_from_memory(mq(0)) == 1024


async def test_local_file_falls_back_to_backup_when_torn(local: LocalFileOffsetStore) -> None:
    local.update_offset(mq(0), 1, False)
    await local.persist(mq(0))
    local.update_offset(mq(0), 2, False)
    await local.persist(mq(0))  # the version with 1 is now the .bak
    await asyncio.to_thread(_tear_and_check, local.path)


def _tear_and_check(path: str) -> None:
    with open(path, "w") as fh:
        fh.write('{"offsetTable": {')  # torn write
    assert read_offset_file(path) == {mq(0): 1}
    assert os.path.exists(path + ".bak")
    with open(path + ".bak") as fh:
        assert json.load(fh)["offsetTable"]
