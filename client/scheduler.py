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


class Wakeup:
    """An ``asyncio.Event`` for one waiting task whose ``wait`` can also end after a delay.

    A service thread's ``waitForRunning(interval)``: woken by ``set`` or by the interval's end. Waiting
    as ``async with asyncio.timeout(d): await event.wait()`` cancels the task and raises twice to end
    every wait that times out, and the scheduler's and the rebalance service's waits mostly do. Here a
    plain timer completes the waiter instead, armed where ``asyncio.timeout`` arms its own (at
    ``loop.time() + d``, or at once when that is not in the future), so the waiting task resumes at
    the same point of the loop's order: after the timer's callback, as the next ready callback.
    """

    __slots__ = ("_expired", "_set", "_waiter")

    def __init__(self) -> None:
        self._set = False
        self._waiter: asyncio.Future[bool] | None = None
        self._expired = False

    def _expire(self, waiter: asyncio.Future[bool]) -> None:
        # As a timeout's cancel: it wins over a set() whose wakeup has not run yet.
        if waiter is self._waiter:
            self._expired = True
            if not waiter.done():
                waiter.set_result(False)

    def is_set(self) -> bool:
        return self._set

    def set(self) -> None:
        if not self._set:
            self._set = True
            waiter = self._waiter
            if waiter is not None and not waiter.done():
                waiter.set_result(True)

    def clear(self) -> None:
        self._set = False

    async def wait(self, timeout_s: float | None = None) -> bool:
        """True once set; False when ``timeout_s`` passed before the waiting task resumed."""
        if self._set:
            return True
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[bool] = loop.create_future()
        timer: asyncio.Handle | None = None
        if timeout_s is not None:
            when = loop.time() + timeout_s
            if when <= loop.time():
                timer = loop.call_soon(self._expire, waiter)
            else:
                timer = loop.call_at(when, self._expire, waiter)
        self._waiter = waiter
        self._expired = False
        try:
            await waiter
            return not self._expired
        finally:
            self._waiter = None
            if timer is not None:
                timer.cancel()


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
        self._changed = Wakeup()
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
                await self._changed.wait(wait)  # an earlier task scheduled meanwhile wakes the loop up
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
