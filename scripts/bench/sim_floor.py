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

- ``sim_remoting_oneway``: one-way requests (``RemotingClient.send_oneway``, as the offset store's
  commits and the broker's NOTIFY_CONSUMER_IDS_CHANGED go) to a handler that only counts them; per frame.
- ``event_line``: one EVENTS.md line written as a simulated node writes it (``EventLog`` into the
  run's files and the live tally), over the field sets of a real run's lines; per line.

``--experiment CONSUMERS SECONDS`` (default ``100 600``; ``1000 3600`` is the hour of the goal case,
several minutes) then runs ``scripts/bench/sim.py``'s experiment of that size in this process, counts
its frames (requests that get an answer, one-way requests) and event lines, and prices them at the
cheapest measured cases: a pair at ``sim_remoting_sync_handler`` (a held pull pays more: its handler
waits), a one-way frame at ``sim_remoting_oneway``, a line at ``event_line``. That sum is a floor for
the experiment with every frame and line kept and no broker or client logic at all; the goals are 1,000
RocketMQ seconds per CPU second at 100 consumers and the hour of 1,000 consumers in 120 s.

    python scripts/bench/sim_floor.py [--pairs 200000] [--callers 100] [--experiment 100 600]
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import multiprocessing
import os
import platform
import tempfile
import time
from collections.abc import Callable, Coroutine
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from rmqlab.protocol.clock import ManualClock
from rmqlab.protocol.codes import RequestCode, ResponseCode
from rmqlab.protocol.command import RemotingCommand
from rmqlab.protocol.event_log import EventLog
from rmqlab.protocol.remoting import Connection, RemotingClient, RemotingServer
from rmqlab.sim.dist import Distribution
from rmqlab.sim.loop import VirtualLoop, VirtualProcess
from rmqlab.sim.network import Network
from rmqlab.sim.sim_cluster import LogFiles, SimCluster, _Sink
from rmqlab.sim.sim_table import parse as parse_sim_experiment

REPO = Path(__file__).resolve().parents[2]

# scripts/bench/sim.py's 100 consumers over 600 RocketMQ seconds: ~199,000 frames; 1,000x is 0.6 CPU s
GOAL_US_PER_PAIR = 0.6 / (199_000 / 2) * 1e6
TIMEOUT_S = 30.0
# the goals as rates: 100 consumers at 1,000x real time; an hour of 1,000 in 120 s (30x)
GOALS = {"100 consumers": 1000.0, "1,000 consumers": 3600 / 120}
ONEWAY_BURST = 20  # one-way frames a sender writes before it sleeps


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


async def _remoting(pairs: int, callers: int, net: Network, sync: bool = False, oneway: bool = False) -> None:
    loop = asyncio.get_running_loop()
    server = RemotingServer(net.ip_of("server"), 10911)
    received = 0
    all_received: asyncio.Future[None] = loop.create_future()

    def take(_conn: Connection, _cmd: RemotingCommand) -> None:
        nonlocal received
        received += 1
        if received == pairs:
            all_received.set_result(None)

    async def echo(_conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        return cmd.response(ResponseCode.SUCCESS, None)

    def echo_sync(_conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        return cmd.response(ResponseCode.SUCCESS, None)

    server.register(RequestCode.HEART_BEAT, echo_sync if sync else echo)
    server.register(RequestCode.UPDATE_CONSUMER_OFFSET, take)
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

    async def sender(n: int) -> None:
        # one-way frames in bursts, as persistAll writes one per held queue, then a pause
        for i in range(n):
            wait = client.send_oneway(
                server.address, RemotingCommand.request(RequestCode.UPDATE_CONSUMER_OFFSET)
            )
            if wait is not None:
                await wait
            if i % ONEWAY_BURST == ONEWAY_BURST - 1:
                await asyncio.sleep(0.001)

    async with asyncio.TaskGroup() as tg:
        for _ in range(callers):
            tg.create_task(sender(pairs // callers) if oneway else caller(pairs // callers))
    if oneway:
        await all_received
    server_main.cancel()


def _event_lines(n: int, samples: list[tuple[str, dict[str, Any]]], work: Path) -> None:
    """``n`` lines through a simulated node's EventLog, cycling over real lines' events and fields."""
    files = LogFiles()
    log = EventLog(
        "consumer-1",
        "consumer",
        None,
        clock=ManualClock(),
        console=False,
        sink=_Sink(files, work / "consumer-1.jsonl", lambda _line: None, lambda _record: None),
    )
    emit = log.emit
    k = len(samples)
    for i in range(n):
        event, fields = samples[i % k]
        emit(event, **fields)  # a fresh dict per call, as the roles pass keyword fields
    files.flush()


def _bench_experiment_module() -> Any:
    spec = importlib.util.spec_from_file_location("bench_sim", Path(__file__).with_name("sim.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def count_experiment(consumers: int, seconds: float, work: Path) -> dict[str, Any]:
    """Run ``scripts/bench/sim.py``'s experiment here and count what crossed the network, by kind."""
    text = _bench_experiment_module().experiment(consumers, seconds)
    sx = parse_sim_experiment(text, default_name=f"bench-{consumers}")
    counts = {"answered_requests": 0, "oneway_requests": 0, "responses": 0}
    send = Network.send

    def counting_send(self: Network, sender: Any, data: RemotingCommand) -> None:
        # a command object: the simulator's default wire, which the benchmark's experiment uses
        if data.is_response:
            counts["responses"] += 1
        elif data.is_oneway:
            counts["oneway_requests"] += 1
        else:
            counts["answered_requests"] += 1
        send(self, sender, data)

    Network.send = counting_send  # type: ignore[method-assign,assignment]
    try:
        with open(os.devnull, "w", encoding="utf-8") as quiet:
            cpu0 = time.process_time()
            cluster = SimCluster(sx, work / "run", progress=False, out=quiet)
            result = cluster.run()
            cpu = time.process_time() - cpu0
    finally:
        Network.send = send  # type: ignore[method-assign]
    return {
        "consumers": consumers,
        "rocketmq_seconds": seconds,
        "frames": cluster.net.frames,
        **counts,
        "event_lines": result.events,
        "drained": result.drained,
        "cpu_s_counting": round(cpu, 1),
    }


def _samples(run_dir: Path, lines: int, limit: int = 5000) -> list[tuple[str, dict[str, Any]]]:
    """About ``limit`` of the run's ``lines`` event lines, evenly spread over its files, so the mix is
    the run's; each as (event, fields) without the fields ``EventLog`` adds itself."""
    step = max(1, lines // limit)
    out: list[tuple[str, dict[str, Any]]] = []
    i = 0
    for path in sorted(run_dir.glob("*.jsonl")):
        with open(path, encoding="utf-8") as fh:
            for line in fh:
                i += 1
                if i % step:
                    continue
                ev = json.loads(line)
                event = ev.pop("event")
                for key in ("ts_ms", "node", "role"):
                    ev.pop(key, None)
                out.append((event, ev))
    return out


def _count_and_sample(
    consumers: int, seconds: float, work: Path
) -> tuple[dict[str, Any], list[tuple[str, dict[str, Any]]]]:
    counted = count_experiment(consumers, seconds, work)
    return counted, _samples(work / "run", counted["event_lines"])


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
    p.add_argument(
        "--experiment",
        nargs=2,
        type=float,
        default=(100, 600),
        metavar=("CONSUMERS", "SECONDS"),
        help="price this sim.py experiment's frames and lines at the floor (default: 100 600)",
    )
    a = p.parse_args()
    consumers, seconds = int(a.experiment[0]), a.experiment[1]
    if consumers < 1 or seconds <= 0:
        p.error("--experiment needs a positive number of consumers and of seconds")
    pairs = a.pairs // a.callers * a.callers
    latency = Distribution("uniform", (0.05, 0.2))  # rmq-sim's default latency_ms

    async def virtual(loop: VirtualLoop) -> None:
        await _bare(pairs, a.callers, True, 0.0001)

    async def remoting(loop: VirtualLoop) -> None:
        await _remoting(pairs, a.callers, Network(loop, 1, latency))

    async def remoting_sync(loop: VirtualLoop) -> None:
        await _remoting(pairs, a.callers, Network(loop, 1, latency), sync=True)

    async def remoting_oneway(loop: VirtualLoop) -> None:
        await _remoting(pairs, a.callers, Network(loop, 1, latency), oneway=True)

    cases: dict[str, Callable[[], None]] = {
        "bare_callbacks": _on_stock_loop(lambda: _bare(pairs, a.callers, False, None)),
        "bare_task_per_request": _on_stock_loop(lambda: _bare(pairs, a.callers, True, None)),
        "virtual_loop": _on_virtual_loop(virtual),
        "sim_remoting": _on_virtual_loop(remoting),
        "sim_remoting_sync_handler": _on_virtual_loop(remoting_sync),
        "sim_remoting_oneway": _on_virtual_loop(remoting_oneway),
    }
    with open("/proc/loadavg", encoding="ascii") as fh:
        load_before = [float(x) for x in fh.read().split()[:3]]
    with tempfile.TemporaryDirectory(prefix="sim-floor-") as tmp:
        work = Path(tmp)
        # The experiment runs in a child: a simulated cluster leaves this process's heap larger (the
        # hour: about 800 MB), which would make every case measured after it slower.
        with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("fork")) as child:
            counted, samples = child.submit(_count_and_sample, consumers, seconds, work).result()
        results = {name: _measure(run, pairs) for name, run in cases.items()}
        results["event_line"] = _measure(lambda: _event_lines(pairs, samples, work), pairs)
    with open("/proc/loadavg", encoding="ascii") as fh:
        load_after = [float(x) for x in fh.read().split()[:3]]
    us = {name: r["us_per_pair_cpu"] for name, r in results.items()}
    floor_s = (
        counted["answered_requests"] * us["sim_remoting_sync_handler"]
        + counted["oneway_requests"] * us["sim_remoting_oneway"]
        + counted["event_lines"] * us["event_line"]
    ) / 1e6
    experiment_floor = {
        **counted,
        "floor_cpu_s": round(floor_s, 2),
        "floor_parts_cpu_s": {
            "pairs": round(counted["answered_requests"] * us["sim_remoting_sync_handler"] / 1e6, 2),
            "oneway_frames": round(counted["oneway_requests"] * us["sim_remoting_oneway"] / 1e6, 2),
            "event_lines": round(counted["event_lines"] * us["event_line"] / 1e6, 2),
        },
        "rocketmq_s_per_cpu_s_at_floor": round(seconds / floor_s, 1),
        "goals_rocketmq_s_per_cpu_s": GOALS,
    }
    print(
        json.dumps(
            {
                "benchmark": "sim_floor",
                "python": platform.python_version(),
                "pairs": pairs,
                "callers": a.callers,
                "goal_us_per_pair": round(GOAL_US_PER_PAIR, 2),
                "cases": results,
                "experiment_floor": experiment_floor,
                "load_avg_before_after": [load_before, load_after],
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
