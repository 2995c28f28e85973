"""Queue locks for orderly consumers (RocketMQ's RebalanceLockManager), sans-IO.

A lock lives ``lock_max_live_time_ms`` after its holder's last successful lock of it; only
LOCK_BATCH_MQ renews it, only the holder unlocks it, and an expired lock can be taken by anyone.
Disconnects and expiry of the holder's registration leave locks alone (RocketMQ's behaviour).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rmqlab.protocol.model import MessageQueue


@dataclass(slots=True)
class LockEntry:
    """Who holds a queue's lock and when it was last renewed."""

    client_id: str
    last_update_ms: int

    def is_expired(self, now_ms: int, live_ms: int) -> bool:
        return now_ms - self.last_update_ms > live_ms


@dataclass(slots=True)
class LockBatchResult:
    """LOCK_BATCH_MQ's outcome: the queues locked and those newly taken."""

    locked: list[MessageQueue]  # every queue now held by the client, in request order
    acquired: list[tuple[MessageQueue, str | None]] = field(
        default_factory=list
    )  # new: (mq, previous holder)


class RebalanceLockManager:
    """Queue locks of orderly consumers per group, expiring after lockMaxLiveTime."""

    def __init__(self, lock_max_live_time_ms: int = 60_000) -> None:
        self.lock_max_live_time_ms = lock_max_live_time_ms
        self.mq_lock_table: dict[str, dict[MessageQueue, LockEntry]] = {}

    def try_lock_batch(
        self, group: str, mqs: list[MessageQueue], client_id: str, now_ms: int
    ) -> LockBatchResult:
        table = self.mq_lock_table.setdefault(group, {})
        live = self.lock_max_live_time_ms
        result = LockBatchResult([])
        seen: set[MessageQueue] = set()
        for mq in mqs:
            if mq in seen:
                continue
            seen.add(mq)
            entry = table.get(mq)
            if entry is None:
                table[mq] = LockEntry(client_id, now_ms)
                result.locked.append(mq)
                result.acquired.append((mq, None))
            elif entry.client_id == client_id:
                expired = entry.is_expired(now_ms, live)
                entry.last_update_ms = now_ms
                result.locked.append(mq)
                if expired:
                    # Its own lock had lapsed: anyone could have taken it, so this is a fresh acquisition.
                    result.acquired.append((mq, client_id))
            elif entry.is_expired(now_ms, live):
                prev = entry.client_id
                entry.client_id = client_id
                entry.last_update_ms = now_ms
                result.locked.append(mq)
                result.acquired.append((mq, prev))
        return result

    def unlock_batch(self, group: str, mqs: list[MessageQueue], client_id: str) -> list[MessageQueue]:
        """Release the queues held by ``client_id`` (expired or not); others' locks are left alone."""
        table = self.mq_lock_table.get(group)
        released: list[MessageQueue] = []
        if table is None:
            return released
        for mq in mqs:
            entry = table.get(mq)
            if entry is not None and entry.client_id == client_id:
                del table[mq]
                released.append(mq)
        if not table:
            del self.mq_lock_table[group]
        return released

    def release_client(self, group: str, client_id: str) -> list[MessageQueue]:
        """Release every lock of the client in the group (the release-locks-on-close what-if policy)."""
        table = self.mq_lock_table.get(group)
        if table is None:
            return []
        mqs = [mq for mq, e in table.items() if e.client_id == client_id]
        return self.unlock_batch(group, mqs, client_id)

    def is_locked(self, group: str, mq: MessageQueue, client_id: str, now_ms: int) -> bool:
        table = self.mq_lock_table.get(group)
        entry = table.get(mq) if table else None
        return (
            entry is not None
            and entry.client_id == client_id
            and not entry.is_expired(now_ms, self.lock_max_live_time_ms)
        )

    def holder(self, group: str, mq: MessageQueue, now_ms: int) -> str | None:
        table = self.mq_lock_table.get(group)
        entry = table.get(mq) if table else None
        if entry is None or entry.is_expired(now_ms, self.lock_max_live_time_ms):
            return None
        return entry.client_id

    def is_lock_all_expired(self, group: str, now_ms: int) -> bool:
        table = self.mq_lock_table.get(group)
        if not table:
            return True
        return all(e.is_expired(now_ms, self.lock_max_live_time_ms) for e in table.values())

    def lock_count(self) -> int:
        return sum(len(t) for t in self.mq_lock_table.values())
