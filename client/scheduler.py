"""A single-threaded scheduled executor for asyncio: RocketMQ's Executors.newSingleThreadScheduledExecutor.

MQClientInstance runs route refresh, heartbeats, offset persistence and the delayed orderly unlocks on
one such thread, and PullMessageService its delayed tasks on another. One task runs at a time, awaited
to its end, so a slow one (a heartbeat waiting 3 s on an unreachable broker) delays every task due
meanwhile. Periodic tasks keep a fixed rate (scheduleAtFixedRate): the next run is due one period after
the previous one was due, so runs that fell behind follow each other at once instead of overlapping.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

Task = Callable[[], Awaitable[Any]]


@dataclass(order=True, slots=True)
class _Entry:
    due: float
    seq: int
    fn: Task = field(compare=False)
    period: float | None = field(compare=False)
    what: str = field(compare=False)


class SingleThreadScheduler:
    """Runs scheduled coroutine functions one after another on one task (``run``)."""

    def __init__(self, name: str, log: Any = None) -> None:
        self.name = name
        self.log = log
        self._heap: list[_Entry] = []
        self._seq = itertools.count()
        self._changed = asyncio.Event()
        self._stopped = False

    def schedule(self, fn: Task, delay_s: float, what: str = "task") -> None:
        """Run ``fn`` once, ``delay_s`` from now (ScheduledExecutorService#schedule)."""
        self._push(fn, delay_s, None, what)

    def schedule_at_fixed_rate(self, fn: Task, first_delay_s: float, period_s: float, what: str) -> None:
        if period_s <= 0:
            raise ValueError(f"{what}: the period must be > 0, got {period_s}")
        self._push(fn, first_delay_s, period_s, what)

    def _push(self, fn: Task, delay_s: float, period: float | None, what: str) -> None:
        if self._stopped:
            return
        due = asyncio.get_running_loop().time() + max(0.0, delay_s)
        heapq.heappush(self._heap, _Entry(due, next(self._seq), fn, period, what))
        self._changed.set()

    def pending(self) -> int:
        return len(self._heap)

    def stop(self) -> None:
        self._stopped = True
        self._heap.clear()
        self._changed.set()

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while not self._stopped:
            self._changed.clear()
            if not self._heap:
                await self._changed.wait()
                continue
            wait = self._heap[0].due - loop.time()
            if wait > 0:
                # an earlier task scheduled meanwhile wakes the loop up
                try:
                    async with asyncio.timeout(wait):
                        await self._changed.wait()
                except TimeoutError:
                    pass
                continue
            entry = heapq.heappop(self._heap)
            try:
                await entry.fn()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # RocketMQ's tasks catch and log their own errors, and go on
                if self.log is not None:
                    self.log.error(
                        "scheduled task failed", executor=self.name, task=entry.what, error=repr(exc)
                    )
            if entry.period is not None and not self._stopped:
                entry.due += entry.period
                entry.seq = next(self._seq)
                heapq.heappush(self._heap, entry)
