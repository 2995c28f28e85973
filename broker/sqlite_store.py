"""The durable message store (``--store-dir``): SQLite in WAL mode, written by one writer thread.

Messages, consume-queue offsets, committed consumer offsets and topic configs go to ``broker.db`` in
the store directory. Writes are queued to a thread that commits them in batches; a message becomes
visible to pulls, and its send is answered, only after its batch is committed, so a broker killed at
any moment restarts with every message and offset it acknowledged. Reads are served from the in-memory
consume queues of ``MemoryMessageStore``, which ``open`` fills from the database.

Commits use ``synchronous=NORMAL``: in WAL mode a committed transaction survives the process being
killed; only an operating-system crash or power loss can lose the last commits.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import os
import queue
import sqlite3
import threading
from collections.abc import Callable
from typing import Any

import msgpack

from rmqlab.broker.store import (
    ConsumeQueue,
    MemoryMessageStore,
    MessageDraft,
    MessageIdFactory,
    StoredMessage,
    StoreError,
)
from rmqlab.broker.topic_config import TopicConfig
from rmqlab.protocol.clock import Clock

DB_NAME = "broker.db"
_MAX_BATCH = 2048

_SCHEMA = """
CREATE TABLE IF NOT EXISTS message (
    topic TEXT NOT NULL, queue_id INTEGER NOT NULL, queue_offset INTEGER NOT NULL,
    msg_id TEXT NOT NULL, body BLOB NOT NULL, tags TEXT, keys TEXT,
    born_ts INTEGER NOT NULL, store_ts INTEGER NOT NULL, reconsume_times INTEGER NOT NULL,
    properties BLOB,
    PRIMARY KEY (topic, queue_id, queue_offset)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS consume_queue (
    topic TEXT NOT NULL, queue_id INTEGER NOT NULL, min_offset INTEGER NOT NULL,
    PRIMARY KEY (topic, queue_id)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS consumer_offset (
    grp TEXT NOT NULL, topic TEXT NOT NULL, queue_id INTEGER NOT NULL, offset INTEGER NOT NULL,
    PRIMARY KEY (grp, topic, queue_id)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS topic_config (
    topic TEXT PRIMARY KEY, read_queue_nums INTEGER NOT NULL, write_queue_nums INTEGER NOT NULL,
    perm INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""

# Write operations queued to the writer thread: (kind, seq, payload...).
_MSG = "m"
_OFFSET = "o"
_TOPIC = "t"
_TRUNCATE = "q"
_TRUNCATE_TAIL = "z"
_TOPIC_REMOVED = "r"
_STOP = "stop"


class SqliteMessageStore(MemoryMessageStore):
    """The message store kept durably in SQLite (WAL), with topics and offsets."""

    durable = True

    def __init__(
        self,
        store_dir: str,
        broker_name: str = "broker-a",
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        clock: Clock | None = None,
    ) -> None:
        super().__init__(broker_name, host=host, port=port, clock=clock)
        self.store_dir = store_dir
        self.path = os.path.join(store_dir, DB_NAME)
        self._db: sqlite3.Connection | None = None
        self._ops: queue.SimpleQueue[tuple[Any, ...]] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._seq = itertools.count(1)
        self._last_seq = 0
        self._msg_futures: dict[int, asyncio.Future[StoredMessage]] = {}
        self._seq_waiters: list[tuple[int, int, asyncio.Future[None]]] = []
        self._waiter_ids = itertools.count()
        self.failed: BaseException | None = None
        self.batches_committed = 0
        # Writes the database refused while the store carried on (seq -> reason), until someone waits.
        self._rejected: dict[int, str] = {}
        self.rejected_writes = 0
        self.on_rejected: Callable[[int, str], None] | None = None

    # -- life cycle ---------------------------------------------------------------------------------
    async def open(self) -> None:
        self._loop = asyncio.get_running_loop()
        rows = await asyncio.to_thread(self._open_and_load, self.clock.now_ms())
        self._build(*rows)
        self._thread = threading.Thread(target=self._writer_main, name="store-writer", daemon=True)
        self._thread.start()

    async def close(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            self._ops.put((_STOP, 0))
            await asyncio.to_thread(self._thread.join, 10)
        self._thread = None

    def _open_and_load(self, now_ms: int) -> tuple[Any, ...]:
        os.makedirs(self.store_dir, exist_ok=True)
        db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")
        db.executescript(_SCHEMA)
        # Message ids embed the run's epoch: make it later than every earlier run's, even if the
        # wall clock stepped back, so ids stay unique across restarts.
        row = db.execute("SELECT value FROM meta WHERE key='epoch_ms'").fetchone()
        epoch = max(now_ms, int(row[0]) + 1) if row else now_ms
        db.execute("INSERT OR REPLACE INTO meta(key, value) VALUES ('epoch_ms', ?)", (str(epoch),))
        topics = [TopicConfig(*r) for r in db.execute("SELECT * FROM topic_config ORDER BY topic")]
        offsets = list(db.execute("SELECT grp, topic, queue_id, offset FROM consumer_offset"))
        mins = {(t, q): m for t, q, m in db.execute("SELECT topic, queue_id, min_offset FROM consume_queue")}
        msgs = db.execute(
            "SELECT topic, queue_id, queue_offset, msg_id, body, tags, keys, born_ts, store_ts,"
            " reconsume_times, properties FROM message ORDER BY topic, queue_id, queue_offset"
        ).fetchall()
        self._db = db
        return epoch, topics, offsets, mins, msgs

    def _build(
        self, epoch: int, topics: list[TopicConfig], offsets: list[Any], mins: dict, msgs: list
    ) -> None:
        self.msg_ids = MessageIdFactory(self._host, self._port, epoch)
        self.loaded_topics = topics
        self.loaded_offsets = [(g, t, q, o) for g, t, q, o in offsets]
        for key, min_offset in mins.items():
            self.queues[key] = ConsumeQueue(min_offset)
        for topic, qid, off, msg_id, body, tags, keys, born, store_ts, rt, props in msgs:
            key = (topic, qid)
            cq = self.queues.get(key)
            if cq is None:
                cq = self.queues[key] = ConsumeQueue(off)
            if not cq.messages and off > cq.min_offset:
                cq.min_offset = off  # rows below it were never written or were truncated
            if off != cq.max_offset:
                raise StoreError(f"{self.path}: queue {topic}:{qid} has a gap before offset {off}")
            properties = msgpack.unpackb(props, raw=False) if props else {}
            cq.messages.append(
                StoredMessage(
                    msg_id,
                    topic,
                    qid,
                    off,
                    bytes(body),
                    tags,
                    keys,
                    born,
                    store_ts,
                    rt,
                    properties,
                    self.broker_name,
                )
            )
        for cq in self.queues.values():
            cq.next_offset = cq.max_offset
            if cq.messages:
                cq.last_store_timestamp = cq.messages[-1].store_timestamp

    # -- writes ---------------------------------------------------------------------------------------
    def _enqueue(self, *op: Any) -> int:
        if self.failed is not None:
            raise StoreError(f"store is not writable after an earlier failure: {self.failed}")
        if self._thread is None:
            raise StoreError("store is not open")
        seq = next(self._seq)
        self._last_seq = seq
        self._ops.put((op[0], seq, *op[1:]))
        return seq

    async def put_message(self, draft: MessageDraft) -> StoredMessage:
        if self.failed is not None:
            raise StoreError(f"store is not writable after an earlier failure: {self.failed}")
        msg = self._reserve(draft)
        await self._commit(msg)
        return msg

    async def _commit(self, msg: StoredMessage) -> None:
        assert self._loop is not None
        fut: asyncio.Future[StoredMessage] = self._loop.create_future()
        seq = self._enqueue(_MSG, msg)
        self._msg_futures[seq] = fut
        await fut

    def persist_offset(self, group: str, topic: str, queue_id: int, offset: int) -> int:
        return self._enqueue(_OFFSET, group, topic, queue_id, offset)

    def persist_topic(self, tc: TopicConfig) -> int:
        return self._enqueue(_TOPIC, tc)

    def persist_topic_removal(self, topic: str) -> int:
        return self._enqueue(_TOPIC_REMOVED, topic)

    async def wait_durable(self, seq: int) -> None:
        if seq > self.committed_seq:
            if self.failed is not None:
                raise StoreError(f"store write failed: {self.failed}")
            assert self._loop is not None
            fut: asyncio.Future[None] = self._loop.create_future()
            heapq.heappush(self._seq_waiters, (seq, next(self._waiter_ids), fut))
            await fut
        reason = self._rejected.pop(seq, None)
        if reason is not None:
            raise StoreError(f"store write rejected: {reason}")

    def is_rejected(self, seq: int) -> bool:
        return seq in self._rejected

    async def sync(self) -> None:
        """Wait until everything queued so far is committed."""
        await self.wait_durable(self._last_seq)

    async def truncate(self, topic: str, queue_id: int, min_offset: int) -> None:
        await self.sync()
        self._truncate_memory(topic, queue_id, min_offset)
        cq = self.queues[(topic, queue_id)]
        await self.wait_durable(self._enqueue(_TRUNCATE, topic, queue_id, cq.min_offset))

    async def truncate_tail(self, topic: str, queue_id: int, end_offset: int) -> list[StoredMessage]:
        await self.sync()
        removed = self._truncate_tail_memory(topic, queue_id, end_offset)
        if removed:
            await self.wait_durable(self._enqueue(_TRUNCATE_TAIL, topic, queue_id, removed[0].queue_offset))
        return removed

    # -- the writer thread ------------------------------------------------------------------------------
    def _writer_main(self) -> None:
        db = self._db
        assert db is not None and self._loop is not None
        stop = False
        try:
            while not stop:
                batch = [self._ops.get()]
                while len(batch) < _MAX_BATCH:
                    try:
                        batch.append(self._ops.get_nowait())
                    except queue.Empty:
                        break
                if batch[-1][0] == _STOP or any(op[0] == _STOP for op in batch):
                    stop = True
                    batch = [op for op in batch if op[0] != _STOP]
                if not batch:
                    continue
                error, rejected = self._write_or_split(db, batch)
                try:
                    self._loop.call_soon_threadsafe(self._on_committed, batch, error, rejected)
                except RuntimeError:  # the loop is gone (shutdown)
                    return
                if error is not None:
                    return
        finally:
            db.close()

    def _write_or_split(
        self, db: sqlite3.Connection, batch: list[tuple[Any, ...]]
    ) -> tuple[BaseException | None, dict[int, str]]:
        """Commit a batch; when it fails, commit its operations one by one so that one bad value costs
        only its own write. Returns (an error that stops the store, rejected seq -> reason).

        A message that cannot be written stops the store: its queue offset is already taken, and a
        consume queue cannot have a hole. An offset or topic config that cannot be written is reported
        to the connection that wrote it and the store carries on."""
        try:
            self._write_batch(db, batch)
            return None, {}
        except Exception as exc:
            if len(batch) == 1 and batch[0][0] == _MSG:
                return exc, {}
        rejected: dict[int, str] = {}
        for op in batch:
            try:
                self._write_batch(db, [op])
            except Exception as exc:
                if op[0] == _MSG:
                    return exc, rejected
                rejected[op[1]] = f"{type(exc).__name__}: {exc}"
        return None, rejected

    @staticmethod
    def _write_batch(db: sqlite3.Connection, batch: list[tuple[Any, ...]]) -> None:
        msgs = []
        offsets = []
        db.execute("BEGIN")
        try:
            for op in batch:
                kind = op[0]
                if kind == _MSG:
                    m: StoredMessage = op[2]
                    msgs.append(
                        (
                            m.topic,
                            m.queue_id,
                            m.queue_offset,
                            m.msg_id,
                            m.body,
                            m.tags,
                            m.keys,
                            m.born_timestamp,
                            m.store_timestamp,
                            m.reconsume_times,
                            msgpack.packb(m.properties, use_bin_type=True) if m.properties else None,
                        )
                    )
                elif kind == _OFFSET:
                    offsets.append(op[2:6])
                elif kind == _TOPIC:
                    tc: TopicConfig = op[2]
                    db.execute(
                        "INSERT OR REPLACE INTO topic_config VALUES (?, ?, ?, ?)",
                        (tc.topic_name, tc.read_queue_nums, tc.write_queue_nums, tc.perm),
                    )
                elif kind == _TOPIC_REMOVED:
                    db.execute("DELETE FROM topic_config WHERE topic=?", (op[2],))
                elif kind == _TRUNCATE_TAIL:
                    _, _, topic, qid, end_offset = op
                    if msgs:
                        db.executemany("INSERT INTO message VALUES (?,?,?,?,?,?,?,?,?,?,?)", msgs)
                        msgs = []
                    db.execute(
                        "DELETE FROM message WHERE topic=? AND queue_id=? AND queue_offset>=?",
                        (topic, qid, end_offset),
                    )
                elif kind == _TRUNCATE:
                    _, _, topic, qid, min_offset = op
                    if msgs:
                        db.executemany("INSERT INTO message VALUES (?,?,?,?,?,?,?,?,?,?,?)", msgs)
                        msgs = []
                    db.execute(
                        "DELETE FROM message WHERE topic=? AND queue_id=? AND queue_offset<?",
                        (topic, qid, min_offset),
                    )
                    db.execute(
                        "INSERT OR REPLACE INTO consume_queue VALUES (?, ?, ?)", (topic, qid, min_offset)
                    )
            if msgs:
                db.executemany("INSERT INTO message VALUES (?,?,?,?,?,?,?,?,?,?,?)", msgs)
            if offsets:
                db.executemany("INSERT OR REPLACE INTO consumer_offset VALUES (?, ?, ?, ?)", offsets)
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise

    # -- back on the loop ---------------------------------------------------------------------------------
    def _on_committed(
        self,
        batch: list[tuple[Any, ...]],
        error: BaseException | None,
        rejected: dict[int, str] | None = None,
    ) -> None:
        if error is not None:
            self.failed = error
            exc = StoreError(f"store write failed: {error}")
            for op in batch:
                fut = self._msg_futures.pop(op[1], None)
                if fut is not None and not fut.done():
                    fut.set_exception(exc)
            for fut in self._msg_futures.values():
                if not fut.done():
                    fut.set_exception(exc)
            self._msg_futures.clear()
            for _, _, w in self._seq_waiters:
                if not w.done():
                    w.set_exception(exc)
            self._seq_waiters.clear()
            return
        self.batches_committed += 1
        if rejected:
            self.rejected_writes += len(rejected)
            self._rejected.update(rejected)
            while len(self._rejected) > 1024:  # nobody waits for old ones; keep the table small
                del self._rejected[next(iter(self._rejected))]
            if self.on_rejected is not None:
                for seq, reason in rejected.items():
                    self.on_rejected(seq, reason)
        for op in batch:
            if op[0] == _MSG:
                msg: StoredMessage = op[2]
                self._publish(msg)
                fut = self._msg_futures.pop(op[1], None)
                if fut is not None and not fut.done():
                    fut.set_result(msg)
        self.committed_seq = batch[-1][1]
        waiters = self._seq_waiters
        while waiters and waiters[0][0] <= self.committed_seq:
            _, _, w = heapq.heappop(waiters)
            if not w.done():
                w.set_result(None)
