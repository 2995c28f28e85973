"""The single-threaded executors of MQClientInstance and PullMessageService: one task at a time, fixed
rates, and a blocking step that holds up everything queued behind it."""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

from rmqlab.client.process_queue import ProcessQueue, PullRequest
from rmqlab.client.pull_service import PullMessageService
from rmqlab.client.scheduler import SingleThreadScheduler, Wakeup
from rmqlab.protocol.event_log import EventLog
from rmqlab.protocol.model import MessageQueue


async def test_tasks_run_one_at_a_time_and_a_slow_one_delays_the_others() -> None:
    loop = asyncio.get_running_loop()
    sched = SingleThreadScheduler("t")
    runs: list[tuple[str, float, float]] = []

    def task(name: str, seconds: float) -> Any:
        async def run() -> None:
            start = loop.time()
            await asyncio.sleep(seconds)
            runs.append((name, start, loop.time()))

        return run

    t0 = loop.time()
    sched.schedule(task("heartbeat", 0.3), 0.0, "heartbeat")  # e.g. waiting on an unreachable broker
    sched.schedule(task("persist", 0.0), 0.05, "persist")
    runner = asyncio.create_task(sched.run())
    try:
        async with asyncio.timeout(3):
            while len(runs) < 2:  # noqa: ASYNC110 - two tasks finishing, no single event to wait on
                await asyncio.sleep(0.01)
    finally:
        runner.cancel()
    (_, _, hb_end), (name, persist_start, _) = runs
    assert name == "persist"
    assert persist_start >= hb_end  # due at +0.05 s, but the thread was busy until the heartbeat ended
    assert persist_start - t0 >= 0.29


async def test_fixed_rate_runs_that_fell_behind_follow_each_other() -> None:
    """scheduleAtFixedRate: each run is due one period after the previous one was due, so after a run
    that took three periods the missed runs come back to back, never two at once."""
    loop = asyncio.get_running_loop()
    sched = SingleThreadScheduler("t")
    starts: list[float] = []
    active = 0
    overlaps = 0

    async def tick() -> None:
        nonlocal active, overlaps
        active += 1
        overlaps += active > 1
        starts.append(loop.time())
        await asyncio.sleep(0.35 if len(starts) == 1 else 0)
        active -= 1

    sched.schedule_at_fixed_rate(tick, 0.0, 0.1, "tick")
    runner = asyncio.create_task(sched.run())
    try:
        async with asyncio.timeout(3):
            while len(starts) < 6:  # noqa: ASYNC110
                await asyncio.sleep(0.01)
    finally:
        runner.cancel()
    assert overlaps == 0
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    assert gaps[0] >= 0.34  # the slow first run
    assert max(gaps[1:3]) < 0.04  # the runs due at 0.1, 0.2 and 0.3 s: caught up at once
    assert gaps[3] < 0.09  # the run due at 0.4 s keeps the rate of the first one (0.05 s after 0.35)
    assert 0.06 <= gaps[4] <= 0.2  # then every 0.1 s


async def test_pull_service_awaits_each_pull_before_taking_the_next() -> None:
    """PullMessageService is one thread: a pull whose blocking part (connect, the orderly first pull's
    offset query) takes long holds up the pulls of every other queue."""
    consumers: dict[str, object] = {}
    service = PullMessageService(consumers, EventLog.null())  # type: ignore[arg-type]
    loop = asyncio.get_running_loop()
    log: list[tuple[int, float, float]] = []

    class SlowFirst:
        group = "g"

        async def pull_message(self, request: PullRequest) -> None:
            start = loop.time()
            await asyncio.sleep(0.3 if request.message_queue.queue_id == 0 else 0)
            log.append((request.message_queue.queue_id, start, loop.time()))

    consumers["g"] = SlowFirst()
    for q in (0, 1):
        pq = ProcessQueue(now_ms=0)
        service.execute_pull_request_immediately(PullRequest("g", MessageQueue("T", "b", q), pq, 0))
    runner = asyncio.create_task(service.run())
    try:
        async with asyncio.timeout(3):
            while len(log) < 2:  # noqa: ASYNC110
                await asyncio.sleep(0.01)
    finally:
        runner.cancel()
        service.stop()
    (first, _, first_end), (second, second_start, _) = log
    assert (first, second) == (0, 1)
    assert second_start >= first_end


def _wait_trace(use_wakeup: bool) -> list[tuple[float, str]]:
    """Waits that time out, are set, are set and time out at one instant, or are already set, among
    timers due at the same virtual instants; what ran, in order."""
    from rmqlab.sim.loop import VirtualLoop  # timers due at one instant fire in the order they were set

    trace: list[tuple[float, str]] = []
    loop = VirtualLoop()

    async def main() -> None:
        wakeup = Wakeup()
        event = asyncio.Event()

        def note(what: str) -> None:
            trace.append((loop.time(), what))

        def set_both() -> None:
            note("set")
            wakeup.set()
            event.set()

        def clear() -> None:
            wakeup.clear()
            event.clear()

        async def wait(label: str, timeout_s: float) -> None:
            if use_wakeup:
                got = await wakeup.wait(timeout_s)
            else:
                try:
                    async with asyncio.timeout(timeout_s):
                        await event.wait()
                    got = True
                except TimeoutError:
                    got = False
            note(f"{label} {got}")

        loop.call_at(1.0, note, "before")  # due with the timeout, set before it
        loop.call_soon(note, "ready")
        await wait("times out", 1.0)
        loop.call_at(1.5, set_both)  # due with the timeout, set before it: the timeout still wins
        loop.call_later(0.5, note, "after")
        await wait("set and timed out", 0.5)
        await wait("already set", 1.0)
        clear()
        loop.call_later(0.25, set_both)
        await wait("set", 1.0)
        clear()
        loop.call_soon(note, "soon")
        await wait("due now", 0.0)  # a timeout already due comes after what is ready

    try:
        loop.run_until_complete(main())
    finally:
        loop.close()
    return trace


def test_wakeup_wait_resumes_where_an_asyncio_timeout_would() -> None:
    """Wakeup.wait(d) replaces ``async with asyncio.timeout(d): await event.wait()`` in the scheduler
    and the rebalance service; the virtual clock's ties make any change of order visible."""
    trace = _wait_trace(use_wakeup=True)
    assert trace == _wait_trace(use_wakeup=False)
    assert trace == [
        (0.0, "ready"),
        (1.0, "before"),
        (1.0, "times out False"),
        (1.5, "set"),
        (1.5, "after"),
        (1.5, "set and timed out False"),
        (1.5, "already set True"),
        (1.75, "set"),
        (1.75, "set True"),
        (1.75, "soon"),
        (1.75, "due now False"),
    ]
