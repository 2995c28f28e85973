"""Held pulls (RocketMQ's PullRequestHoldService), sans-IO.

A pull that finds nothing new is held per queue. An arriving message wakes the pulls its tags match;
the periodic check wakes every pull whose queue has grown past its offset, matching or not (RocketMQ
checks without a tag code, which matches everything), and those whose suspend time ran out; an arrival
also wakes pulls whose suspend time ran out. The caller owns the waiting (``waiter`` is opaque here)
and re-runs the whole pull.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rmqlab.protocol.model import tag_matches


@dataclass(eq=False, slots=True)
class HeldPull:
    """A pull waiting for messages: its queue, offset, deadline and how to answer it."""

    topic: str
    queue_id: int
    offset: int  # the queueOffset the pull asked for
    tags_set: list[str]  # the pull's filter; empty = everything
    deadline_ms: int  # monotonic
    conn_id: int = 0
    waiter: Any = None
    extra: dict[str, Any] = field(default_factory=dict)


class PullRequestHoldService:
    """The held pulls by queue, woken by a new message or their deadline."""

    def __init__(self) -> None:
        self.pull_request_table: dict[tuple[str, int], list[HeldPull]] = {}
        self._count = 0
        # The queues each connection has held a pull on (a superset: woken pulls leave their queue
        # here), so a closed connection looks at those queues only, not at every held queue.
        self._conn_queues: dict[int, dict[tuple[str, int], None]] = {}

    def __len__(self) -> int:
        return self._count

    def suspend_pull_request(self, req: HeldPull) -> None:
        key = (req.topic, req.queue_id)
        self.pull_request_table.setdefault(key, []).append(req)
        self._conn_queues.setdefault(req.conn_id, {})[key] = None
        self._count += 1

    def notify_message_arriving(
        self, topic: str, queue_id: int, max_offset: int, tags: str | None, now_ms: int
    ) -> list[HeldPull]:
        """A message with ``tags`` made the queue's max offset ``max_offset``: the pulls it wakes (those
        it matches, and those whose suspend time has run out)."""
        return self._wake(topic, queue_id, max_offset, lambda req: tag_matches(req.tags_set, tags), now_ms)

    def check_hold_request(self, now_ms: int, max_offset: Callable[[str, int], int]) -> list[HeldPull]:
        """The periodic check (every 5 s): pulls whose queue grew past their offset, whatever the tags,
        and pulls whose suspend time has run out. ``max_offset(topic, queue_id)`` reads the store."""
        woken: list[HeldPull] = []
        for topic, queue_id in list(self.pull_request_table):
            woken += self._wake(topic, queue_id, max_offset(topic, queue_id), lambda _req: True, now_ms)
        return woken

    def _wake(
        self,
        topic: str,
        queue_id: int,
        max_offset: int,
        matches: Callable[[HeldPull], bool],
        now_ms: int,
    ) -> list[HeldPull]:
        held = self.pull_request_table.get((topic, queue_id))
        if not held:
            return []
        woken: list[HeldPull] = []
        kept: list[HeldPull] = []
        for req in held:
            if (max_offset > req.offset and matches(req)) or now_ms >= req.deadline_ms:
                woken.append(req)
            else:
                kept.append(req)
        self._store(topic, queue_id, kept, len(woken))
        return woken

    def remove_connection(self, conn_id: int) -> list[HeldPull]:
        removed: list[HeldPull] = []
        mine = self._conn_queues.pop(conn_id, None)
        if not mine:
            return removed
        # in the table's order, as a scan of every queue found them (the order the pulls are answered)
        for (topic, queue_id), held in [kv for kv in self.pull_request_table.items() if kv[0] in mine]:
            kept = [r for r in held if r.conn_id != conn_id]
            if len(kept) != len(held):
                removed.extend(r for r in held if r.conn_id == conn_id)
                self._store(topic, queue_id, kept, len(held) - len(kept))
        return removed

    def remove(self, req: HeldPull) -> bool:
        held = self.pull_request_table.get((req.topic, req.queue_id))
        if not held or req not in held:
            return False
        kept = [r for r in held if r is not req]
        self._store(req.topic, req.queue_id, kept, 1)
        return True

    def pop_all(self) -> list[HeldPull]:
        out = [r for held in self.pull_request_table.values() for r in held]
        self.pull_request_table.clear()
        self._conn_queues.clear()
        self._count = 0
        return out

    def _store(self, topic: str, queue_id: int, kept: list[HeldPull], removed: int) -> None:
        self._count -= removed
        if kept:
            self.pull_request_table[(topic, queue_id)] = kept
        else:
            self.pull_request_table.pop((topic, queue_id), None)
