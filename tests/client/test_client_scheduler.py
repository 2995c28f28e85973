"""The single-threaded executors of MQClientInstance and PullMessageService: one task at a time, fixed
rates, and a blocking step that holds up everything queued behind it."""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

from client.process_queue import ProcessQueue, PullRequest
from client.rebalance import PullMessageService
from client.scheduler import SingleThreadScheduler
from protocol.model import MessageQueue
from protocol.runtime import EventLog


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
