"""The floor under rmq-sim's speed: what one request/response pair costs in CPU on this interpreter,
from the bare asyncio primitives a pair needs up to the simulator's own remoting path. Prints JSON.

Each case runs ``--pairs`` pairs from ``--callers`` concurrent callers (each waits for its answer
before it sends again) and reports CPU microseconds per pair (process time, so load on a shared
machine inflates it less than wall time would):

- ``bare_callbacks``: a stock asyncio loop; a pair is a future, one timer armed and cancelled (the
  request's timeout), a callback that serves the request and one that delivers the answer, and the
  caller's wakeup. No handler code, no frames: the least an asyncio program can spend on a pair.
- ``bare_task_per_request``: the same with an asyncio Task per served request, as a server running
  each request concurrently does.
- ``virtual_loop``: ``bare_task_per_request`` on the simulator's loop (virtual time, per-process
  callbacks) with a timer per frame for the network's latency, as the in-memory network delivers.
- ``sim_remoting``: the real ``RemotingClient.invoke`` against a ``RemotingServer`` echo handler over
  the in-memory network (frames as copied command objects): the whole transport a simulated pair
  pays for before any broker or client logic runs.
- ``sim_remoting_sync_handler``: the same with the echo handler a plain function, which the server
  runs from one callback instead of a task (as the broker's offset, member-list and route handlers).

The goal of 1,000 RocketMQ seconds per CPU second at 100 consumers: the benchmark's 100-consumer run
(600 s) sends about 199,000 frames, about 99,500 pairs, in 0.6 CPU s at 1,000x, so about 6 us a pair
all-in, broker and client logic included; compare the cases with it (``goal_us_per_pair``).

    python scripts/bench/sim_floor.py [--pairs 200000] [--callers 100]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import sys
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from protocol.codes import RequestCode, ResponseCode  # noqa: E402
from protocol.command import RemotingCommand  # noqa: E402
from protocol.remoting import Connection, RemotingClient, RemotingServer  # noqa: E402
from sim.dist import Distribution  # noqa: E402
from sim.loop import VirtualLoop, VirtualProcess  # noqa: E402
from sim.network import Network  # noqa: E402

# scripts/bench/sim.py's 100 consumers over 600 RocketMQ seconds: ~199,000 frames; 1,000x is 0.6 CPU s
GOAL_US_PER_PAIR = 0.6 / (199_000 / 2) * 1e6
TIMEOUT_S = 30.0


async def _bare(pairs: int, callers: int, task_per_request: bool, latency_s: float | None) -> None:
    """Callers and a server that live in callbacks only; ``latency_s`` delivers by timer, else soon."""
    loop = asyncio.get_running_loop()

    def later(fn: Callable[..., None], arg: Any) -> None:
        if latency_s is None:
            loop.call_soon(fn, arg)
        else:
            loop.call_at(loop.time() + latency_s, fn, arg)

    def answer(fut: asyncio.Future[int]) -> None:
        if not fut.done():
            fut.set_result(1)

    serving: dict[asyncio.Task[None], None] = {}  # referenced while they run, as Connection keeps them

    async def handler(fut: asyncio.Future[int]) -> None:
        later(answer, fut)
        serving.pop(asyncio.current_task(), None)  # type: ignore[arg-type]

    def serve(fut: asyncio.Future[int]) -> None:
        if task_per_request:
            serving[loop.create_task(handler(fut))] = None
        else:
            later(answer, fut)

    def expire(fut: asyncio.Future[int]) -> None:
        if not fut.done():
            fut.set_exception(TimeoutError())

    async def caller(n: int) -> None:
        for _ in range(n):
            fut: asyncio.Future[int] = loop.create_future()
            timer = loop.call_at(loop.time() + TIMEOUT_S, expire, fut)
            later(serve, fut)
            await fut
            timer.cancel()

    async with asyncio.TaskGroup() as tg:
        for _ in range(callers):
            tg.create_task(caller(pairs // callers))


async def _remoting(pairs: int, callers: int, net: Network, sync: bool = False) -> None:
    loop = asyncio.get_running_loop()
    server = RemotingServer(net.ip_of("server"), 10911)

    async def echo(_conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        return cmd.response(ResponseCode.SUCCESS, None)

    def echo_sync(_conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        return cmd.response(ResponseCode.SUCCESS, None)

    server.register(RequestCode.HEART_BEAT, echo_sync if sync else echo)
    started: asyncio.Future[None] = loop.create_future()

    async def serve() -> None:
        await server.start()
        started.set_result(None)
        await asyncio.Event().wait()

    assert isinstance(loop, VirtualLoop)
    server_main = loop.create_task(serve(), context=VirtualProcess("server").context)
    await started
    client = RemotingClient()
    await client.connection(server.address)  # connect outside the measured pairs' steady state

    async def caller(n: int) -> None:
        for _ in range(n):
            await client.invoke(server.address, RemotingCommand.request(RequestCode.HEART_BEAT), TIMEOUT_S)

    async with asyncio.TaskGroup() as tg:
        for _ in range(callers):
            tg.create_task(caller(pairs // callers))
    server_main.cancel()


def _measure(run: Callable[[], None], pairs: int) -> dict[str, float]:
    wall0, cpu0 = time.perf_counter(), time.process_time()
    run()
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    return {
        "cpu_s": round(cpu, 3),
        "wall_s": round(wall, 3),
        "us_per_pair_cpu": round(cpu / pairs * 1e6, 2),
        "pairs_per_cpu_s": round(pairs / cpu),
    }


def _on_stock_loop(coro: Callable[[], Coroutine[Any, Any, None]]) -> Callable[[], None]:
    return lambda: asyncio.run(coro())


def _on_virtual_loop(coro: Callable[[VirtualLoop], Coroutine[Any, Any, None]]) -> Callable[[], None]:
    def run() -> None:
        loop = VirtualLoop()
        try:
            loop.run_until_complete(loop.create_task(coro(loop), context=VirtualProcess("caller").context))
        finally:
            loop.close()

    return run


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pairs", type=int, default=200_000, help="request/response pairs per case")
    p.add_argument("--callers", type=int, default=100, help="concurrent callers")
    a = p.parse_args()
    pairs = a.pairs // a.callers * a.callers
    latency = Distribution("uniform", (0.05, 0.2))  # rmq-sim's default latency_ms

    async def virtual(loop: VirtualLoop) -> None:
        await _bare(pairs, a.callers, True, 0.0001)

    async def remoting(loop: VirtualLoop) -> None:
        await _remoting(pairs, a.callers, Network(loop, 1, latency))

    async def remoting_sync(loop: VirtualLoop) -> None:
        await _remoting(pairs, a.callers, Network(loop, 1, latency), sync=True)

    cases: dict[str, Callable[[], None]] = {
        "bare_callbacks": _on_stock_loop(lambda: _bare(pairs, a.callers, False, None)),
        "bare_task_per_request": _on_stock_loop(lambda: _bare(pairs, a.callers, True, None)),
        "virtual_loop": _on_virtual_loop(virtual),
        "sim_remoting": _on_virtual_loop(remoting),
        "sim_remoting_sync_handler": _on_virtual_loop(remoting_sync),
    }
    with open("/proc/loadavg", encoding="ascii") as fh:
        load_before = [float(x) for x in fh.read().split()[:3]]
    results = {name: _measure(run, pairs) for name, run in cases.items()}
    with open("/proc/loadavg", encoding="ascii") as fh:
        load_after = [float(x) for x in fh.read().split()[:3]]
    print(
        json.dumps(
            {
                "benchmark": "sim_floor",
                "python": platform.python_version(),
                "pairs": pairs,
                "callers": a.callers,
                "goal_us_per_pair": round(GOAL_US_PER_PAIR, 2),
                "cases": results,
                "load_avg_before_after": [load_before, load_after],
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
