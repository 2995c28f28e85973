"""Consumer offset stores: RemoteBrokerOffsetStore (clustering) and LocalFileOffsetStore (broadcasting).

The in-memory rules (increase-only updates, frozen offsets, persistAll dropping the queues no longer
held) are plain methods; the broker or the disk is reached only through ``persist*``/``read_offset``.
File writes run in a worker thread, atomically (temp file, fsync, rename), the previous file kept as .bak.
"""

from __future__ import annotations

import asyncio
import enum
import json
import os
from collections.abc import Awaitable, Iterable
from typing import Protocol

from rmqlab.client.errors import MQBrokerError, OffsetNotFoundError
from rmqlab.protocol.event_log import EventLog
from rmqlab.protocol.model import MessageQueue

NOT_FOUND = -1  # QUERY_NOT_FOUND / no entry
READ_ERROR = -2  # any other failure reading the store
NO_QUEUE = -3


class ReadOffsetType(enum.Enum):
    """Where readOffset looks: memory, the store, or memory first."""

    READ_FROM_MEMORY = "READ_FROM_MEMORY"
    READ_FROM_STORE = "READ_FROM_STORE"
    MEMORY_FIRST_THEN_STORE = "MEMORY_FIRST_THEN_STORE"


class OffsetBrokerApi(Protocol):
    """The broker calls RemoteBrokerOffsetStore makes for one queue."""

    async def query_consumer_offset(self, mq: MessageQueue, group: str) -> int: ...

    def update_consumer_offset_oneway(
        self, mq: MessageQueue, group: str, offset: int
    ) -> Awaitable[None] | None:
        """Send the offset one-way: None when it is sent already, otherwise an awaitable that sends it (an
        ``async def`` does, always). A commit per held queue every 5 s: at thousands of queues the usual
        case must not cost a chain of coroutines."""


class OffsetStore:
    """The in-memory offset table shared by both stores."""

    def __init__(self, group: str) -> None:
        self.group = group
        self.offset_table: dict[MessageQueue, int] = {}
        self._frozen: set[MessageQueue] = set()

    def update_offset(self, mq: MessageQueue, offset: int, increase_only: bool) -> None:
        if mq in self._frozen:
            return
        old = self.offset_table.get(mq)
        if old is None:
            self.offset_table[mq] = offset
        elif increase_only:
            self.offset_table[mq] = max(old, offset)
        else:
            self.offset_table[mq] = offset

    def update_and_freeze_offset(self, mq: MessageQueue, offset: int) -> None:
        """Set the offset and ignore later updates until removed (RocketMQ >=5.2 ControllableOffset)."""
        self.offset_table[mq] = offset
        self._frozen.add(mq)

    def read_offset_from_memory(self, mq: MessageQueue | None) -> int:
        if mq is None:
            return NO_QUEUE
        return self.offset_table.get(mq, NOT_FOUND)

    def remove_offset(self, mq: MessageQueue) -> None:
        self.offset_table.pop(mq, None)
        self._frozen.discard(mq)

    def clone_offset_table(self, topic: str) -> dict[MessageQueue, int]:
        return {mq: off for mq, off in self.offset_table.items() if not topic or mq.topic == topic}

    def plan_persist_all(
        self, mqs: Iterable[MessageQueue]
    ) -> tuple[list[tuple[MessageQueue, int]], list[MessageQueue]]:
        """(offsets to send, queues to forget): RemoteBrokerOffsetStore.persistAll's split."""
        held = set(mqs)
        if not held:
            return [], []
        send: list[tuple[MessageQueue, int]] = []
        unused: list[MessageQueue] = []
        for mq, off in sorted(self.offset_table.items()):
            if mq in held:
                send.append((mq, off))
            else:
                unused.append(mq)
        return send, unused

    async def load(self) -> None:
        return None

    async def read_offset(self, mq: MessageQueue | None, how: ReadOffsetType) -> int:
        """readOffset: the in-memory offset where ``how`` allows it, otherwise (or when memory has none
        and ``how`` is MEMORY_FIRST_THEN_STORE) the store's; NOT_FOUND, READ_ERROR or NO_QUEUE below 0."""
        if mq is None:
            return NO_QUEUE
        if how in (ReadOffsetType.READ_FROM_MEMORY, ReadOffsetType.MEMORY_FIRST_THEN_STORE):
            off = self.offset_table.get(mq)
            if off is not None:
                return off
            if how is ReadOffsetType.READ_FROM_MEMORY:
                return NOT_FOUND
        return await self._read_offset_from_store(mq)

    async def _read_offset_from_store(self, mq: MessageQueue) -> int:
        """The READ_FROM_STORE branch of readOffset: the stored offset, also put in memory."""
        raise NotImplementedError

    async def persist_all(self, mqs: Iterable[MessageQueue]) -> None:
        raise NotImplementedError

    async def persist(self, mq: MessageQueue) -> None:
        raise NotImplementedError


class RemoteBrokerOffsetStore(OffsetStore):
    """Offsets committed to the broker (CLUSTERING)."""

    def __init__(
        self,
        group: str,
        api: OffsetBrokerApi,
        log: EventLog | None = None,
        *,
        broker_error_as_not_found: bool = True,
        record_commits: bool = False,
    ) -> None:
        super().__init__(group)
        self.api = api
        self.log = log
        # Write a consumer-side ``offset_committed`` for each offset sent that moved (EVENTS.md): for a
        # broker that writes no events of its own (Apache's), as the Java drivers' offset store does.
        self.record_commits = record_commits
        self._sent: dict[MessageQueue, int] = {}
        # 4.9 reads any broker error code as "no offset" (-1); >=5.0 only QUERY_NOT_FOUND, others are -2.
        self.broker_error_as_not_found = broker_error_as_not_found

    async def _read_offset_from_store(self, mq: MessageQueue) -> int:
        try:
            off = await self.api.query_consumer_offset(mq, self.group)
        except OffsetNotFoundError:
            return NOT_FOUND
        except MQBrokerError as exc:
            if self.broker_error_as_not_found:
                return NOT_FOUND
            self._warn_read(mq, exc)
            return READ_ERROR
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self._warn_read(mq, exc)
            return READ_ERROR
        self.update_offset(mq, off, increase_only=False)
        return off

    def _warn_read(self, mq: MessageQueue, exc: Exception) -> None:
        if self.log is not None:
            self.log.warning("query consumer offset failed", mq=mq.short, topic=mq.topic, error=repr(exc))

    async def persist_all(self, mqs: Iterable[MessageQueue]) -> None:
        send, unused = self.plan_persist_all(mqs)
        for mq, off in send:
            # every held queue every 5 s: a coroutine only for a send that has to wait
            if (pending := self._send(mq, off)) is not None:
                await pending
        for mq in unused:
            self.remove_offset(mq)

    async def persist(self, mq: MessageQueue) -> None:
        off = self.offset_table.get(mq)
        if off is not None and (pending := self._send(mq, off)) is not None:
            await pending

    def _send(self, mq: MessageQueue, off: int) -> Awaitable[None] | None:
        """Send ``mq``'s offset one-way: None when that is done (a failure logged), otherwise what is left
        of it to await (its failure logged too)."""
        try:
            pending = self.api.update_consumer_offset_oneway(mq, self.group, off)
        except Exception as exc:
            self._warn_persist(mq, exc)
            return None
        if self.record_commits and self.log is not None and self._sent.get(mq) != off:
            self._sent[mq] = off
            self.log.emit(
                "offset_committed",
                group=self.group,
                topic=mq.topic,
                broker=mq.broker_name,
                queue_id=mq.queue_id,
                offset=off,
                store="broker",
            )
        return None if pending is None else self._finish_send(mq, pending)

    async def _finish_send(self, mq: MessageQueue, pending: Awaitable[None]) -> None:
        try:
            await pending
        except Exception as exc:  # CancelledError is not an Exception: it passes
            self._warn_persist(mq, exc)

    def _warn_persist(self, mq: MessageQueue, exc: Exception) -> None:
        if self.log is not None:
            self.log.warning("persist consumer offset failed", mq=mq.short, topic=mq.topic, error=repr(exc))


def _mq_key(mq: MessageQueue) -> str:
    return json.dumps(mq.to_wire(), sort_keys=True, separators=(",", ":"))


def read_offset_file(path: str) -> dict[MessageQueue, int]:
    """Offsets in a LocalFileOffsetStore file, falling back to its .bak; {} when neither is readable."""
    for candidate in (path, path + ".bak"):
        try:
            with open(candidate, encoding="utf-8") as fh:
                doc = json.load(fh)
            table = doc["offsetTable"]
            out: dict[MessageQueue, int] = {}
            for key, off in table.items():
                mq = MessageQueue.from_wire(json.loads(key))
                if isinstance(off, int) and not isinstance(off, bool):
                    out[mq] = off
            return out
        except FileNotFoundError:
            continue
        except (ValueError, KeyError, TypeError, AttributeError):
            continue  # a torn or foreign file: try the backup, as RocketMQ's load() does
    return {}


def write_offset_file(path: str, offsets: dict[MessageQueue, int]) -> None:
    """Atomically replace the file; the previous version becomes ``.bak``."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    doc = {"offsetTable": {_mq_key(mq): off for mq, off in sorted(offsets.items())}}
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(doc, fh, indent=1, sort_keys=True)
        fh.flush()
        os.fsync(fh.fileno())
    if os.path.exists(path):
        try:
            os.replace(path, path + ".bak")
        except OSError:
            pass
    os.replace(tmp, path)


def default_offset_dir() -> str:
    return os.path.join(os.path.expanduser("~"), ".rocketmq_offsets")


class LocalFileOffsetStore(OffsetStore):
    """Offsets kept in ``<dir>/<client id>/<group>/offsets.json`` (BROADCASTING)."""

    def __init__(
        self, group: str, client_id: str, base_dir: str | None = None, log: EventLog | None = None
    ) -> None:
        super().__init__(group)
        safe_instance = client_id.replace(os.sep, "_")
        safe_group = group.replace(os.sep, "_")
        self.path = os.path.join(base_dir or default_offset_dir(), safe_instance, safe_group, "offsets.json")
        self.log = log
        self._write_lock = asyncio.Lock()

    async def load(self) -> None:
        loaded = await asyncio.to_thread(read_offset_file, self.path)
        self.offset_table.update(loaded)

    async def _read_offset_from_store(self, mq: MessageQueue) -> int:
        try:
            stored = await asyncio.to_thread(read_offset_file, self.path)
        except OSError:
            return READ_ERROR
        off = stored.get(mq)
        if off is None:
            return NOT_FOUND
        self.update_offset(mq, off, increase_only=False)
        return off

    async def persist_all(self, mqs: Iterable[MessageQueue]) -> None:
        held = set(mqs)
        if not held:
            return
        mine = {mq: off for mq, off in self.offset_table.items() if mq in held}
        await self._merge_and_write(mine)

    async def persist(self, mq: MessageQueue) -> None:
        off = self.offset_table.get(mq)
        if off is not None:
            await self._merge_and_write({mq: off})

    async def _merge_and_write(self, entries: dict[MessageQueue, int]) -> None:
        async with self._write_lock:

            def merge_write() -> None:
                current = read_offset_file(self.path)
                current.update(entries)
                write_offset_file(self.path, current)

            try:
                await asyncio.to_thread(merge_write)
            except OSError as exc:
                if self.log is not None:
                    self.log.warning("persist local offsets failed", path=self.path, error=repr(exc))
