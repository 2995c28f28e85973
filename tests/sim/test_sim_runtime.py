"""The simulation runtime without the roles: virtual time, virtual processes (pause, kill), and the
in-memory network under the real remoting layer (frames in order, latency, blackhole, loss, reset, kill)."""

from __future__ import annotations

import asyncio
import collections
import gc
import itertools
import weakref
from collections.abc import Callable, Coroutine
from typing import Any

import pytest

from rmqlab.protocol.codes import RequestCode, ResponseCode
from rmqlab.protocol.command import RemotingCommand
from rmqlab.protocol.remoting import (
    Connection,
    RemotingClient,
    RemotingConnectionError,
    RemotingServer,
    RemotingTimeoutError,
)
from rmqlab.sim.dist import Distribution, parse_distribution
from rmqlab.sim.loop import (
    CURRENT,
    HOUSEKEEPING_EVERY,
    SimDeadlock,
    VirtualClock,
    VirtualLoop,
    VirtualProcess,
)
from rmqlab.sim.network import Network
from rmqlab.sim.sim_cluster import GarbageCollector


def run(
    main: Callable[[VirtualLoop, Network], Coroutine[Any, Any, Any]],
    latency_ms: float = 1.0,
    *,
    seed: int = 7,
    latency: Distribution | None = None,
) -> Any:
    """main(loop, net) run by a driver process on a fresh loop and network (a constant latency unless
    `latency` is given)."""
    loop = VirtualLoop()
    net = Network(loop, seed, latency or Distribution("constant", (latency_ms,)))
    driver = VirtualProcess("driver")
    try:
        return loop.run_until_complete(loop.create_task(main(loop, net), context=driver.context))
    finally:
        loop.close()


def spawn(
    loop: VirtualLoop, name: str, coro: Coroutine[Any, Any, Any]
) -> tuple[VirtualProcess, asyncio.Task[Any]]:
    proc = VirtualProcess(name)
    return proc, loop.create_task(coro, context=proc.context)


def test_time_jumps_to_the_next_timer_and_the_clock_follows() -> None:
    async def main(loop: VirtualLoop, _: Network) -> tuple[float, int, int]:
        clock = VirtualClock(loop)
        before = clock.now_ms()
        await asyncio.sleep(3600)
        async with asyncio.timeout(5):
            await asyncio.sleep(4.5)
        return loop.time(), clock.now_ms() - before, clock.monotonic_ms()

    t, wall_ms, mono = run(main)
    assert t == pytest.approx(3604.5)
    assert wall_ms == 3_604_500 and mono == 3_604_500


def test_timers_due_at_one_instant_fire_in_the_order_they_were_set() -> None:
    """Ties are common on a virtual clock; their order must not depend on the heap's shape, which any
    cancelled timer elsewhere changes."""

    async def main(loop: VirtualLoop, _: Network) -> list[int]:
        fired: list[int] = []
        stray = [loop.call_at(loop.time() + 0.5 + i / 10, lambda: None) for i in range(7)]
        for i in range(20):
            loop.call_at(loop.time() + 1.0, fired.append, i)
            if i % 3 == 0:
                stray.pop().cancel()
        await asyncio.sleep(2)
        return fired

    assert run(main) == list(range(20))


def test_deliveries_and_timers_fire_in_one_order_by_time_then_by_when_they_were_set() -> None:
    """The network's deliveries wait apart from the other timers; merged, they keep the order of one
    heap: by due time, and at one instant by the order they were set, whichever kind."""

    async def main(loop: VirtualLoop, _: Network) -> list[str]:
        fired: list[str] = []
        ctx = CURRENT.get().context  # type: ignore[union-attr]
        t0 = loop.time()
        for i in range(12):
            when = t0 + 1.0 + (i % 3) / 10  # three instants, four timers each, the kinds interleaved
            if i % 2:
                loop.call_io_at(when, fired.append, f"io{i}", context=ctx)
            else:
                loop.call_at(when, fired.append, f"timer{i}")
        loop.call_io_at(t0 + 0.5, fired.append, "io-first", context=ctx)
        loop.call_at(t0 + 2.0, fired.append, "timer-last")
        await asyncio.sleep(3)
        return fired

    by_instant = [[f"{'io' if i % 2 else 'timer'}{i}" for i in range(12) if i % 3 == k] for k in range(3)]
    assert run(main) == ["io-first", *by_instant[0], *by_instant[1], *by_instant[2], "timer-last"]


def test_deliveries_queued_per_link_merge_with_the_timers_in_one_order() -> None:
    """Each link's frames wait in a FIFO with only its head in the loop's heap; a delivery due before
    its link's last waits in the heap on its own. The merge is still by due time, then by the order
    set, whichever link or kind."""

    async def main(loop: VirtualLoop, _: Network) -> list[str]:
        fired: list[str] = []
        proc = CURRENT.get()
        assert proc is not None
        t0 = loop.time()
        links: list[collections.deque[Any]] = [collections.deque() for _ in range(3)]
        plan = [  # (link, offset in ms, label); per link mostly in time order, two out of it
            (0, 10, "a1"),
            (1, 5, "b1"),
            (0, 10, "a2"),
            (2, 30, "c1"),
            (1, 20, "b2"),
            (0, 25, "a3"),
            (2, 30, "c2"),
            (1, 15, "b3-early"),
            (0, 40, "a4"),
            (2, 12, "c3-early"),
        ]
        for link, ms, label in plan:
            loop.deliver_at(t0 + ms / 1000, fired.append, label, proc, links[link])
        loop.call_at(t0 + 0.010, fired.append, "timer@10")
        loop.call_at(t0 + 0.030, fired.append, "timer@30")
        await asyncio.sleep(1)
        assert not any(links)  # every FIFO emptied
        return fired

    assert run(main) == [
        "b1",
        "a1",
        "a2",
        "timer@10",
        "c3-early",
        "b3-early",
        "b2",
        "a3",
        "c1",
        "c2",
        "timer@30",
        "a4",
    ]


def test_timeout_fires_in_virtual_time() -> None:
    async def main(loop: VirtualLoop, _: Network) -> float:
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(30):
                await asyncio.Event().wait()
        return loop.time()

    assert run(main) == pytest.approx(30)


def test_nothing_left_to_wait_for_is_a_deadlock() -> None:
    async def main(loop: VirtualLoop, _: Network) -> None:
        await asyncio.Event().wait()

    with pytest.raises(SimDeadlock):
        run(main)


def test_pause_holds_every_callback_until_resume_and_kill_drops_them_without_finally() -> None:
    log: list[tuple[str, float]] = []

    async def ticker(name: str) -> None:
        try:
            while True:
                await asyncio.sleep(1)
                log.append((name, asyncio.get_running_loop().time()))
        finally:
            log.append((f"{name} finally", asyncio.get_running_loop().time()))

    async def main(loop: VirtualLoop, _: Network) -> None:
        a, _ta = spawn(loop, "a", ticker("a"))
        b, _tb = spawn(loop, "b", ticker("b"))
        await asyncio.sleep(2.5)
        a.state = "paused"
        await asyncio.sleep(3)
        loop.resume_process(a)
        await asyncio.sleep(0.1)
        b.state = "killed"
        await asyncio.sleep(3)

    run(main)
    a_times = [t for n, t in log if n == "a"]
    # 1, 2 before the pause; the tick due at 3 runs when resumed at 5.5; then 6.5, 7.5, 8.5
    assert a_times == pytest.approx([1, 2, 5.5, 6.5, 7.5, 8.5])
    b_times = [t for n, t in log if n == "b"]
    assert b_times == pytest.approx([1, 2, 3, 4, 5])
    assert not any(n == "b finally" for n, _ in log)


def test_run_in_executor_runs_inline() -> None:
    async def main(loop: VirtualLoop, _: Network) -> tuple[int, str]:
        value = await loop.run_in_executor(None, lambda: 41 + 1)
        with pytest.raises(ZeroDivisionError):
            await asyncio.to_thread(lambda: 1 / 0)
        return value, str(CURRENT.get())

    value, proc = run(main)
    assert value == 42 and "driver" in proc


def test_parse_distribution_errors_name_the_problem() -> None:
    assert parse_distribution(3).describe() == "constant(value=3)"
    assert parse_distribution({"dist": "uniform", "low": 1, "high": 2}).mean == 1.5
    for bad, msg in (
        (-1, ">= 0"),
        (True, "number or a distribution"),
        ({"dist": "zipf"}, "'dist' must be one of"),
        ({"dist": "uniform", "low": 2, "high": 1}, "below low"),
        ({"dist": "normal", "mean": 1}, "needs sd"),
        ({"dist": "exponential", "mean": 1, "x": 2}, "unknown key"),
    ):
        with pytest.raises(ValueError, match=msg):
            parse_distribution(bad)


# -- the network under the real remoting layer ----------------------------------------------------------


async def echo_server(net: Network, port_holder: list[str]) -> None:
    server = RemotingServer(net.ip_of("server"), 10911)

    async def echo(_conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        return cmd.response(ResponseCode.SUCCESS, cmd.remark)

    server.register(RequestCode.HEART_BEAT, echo)
    await server.start()
    port_holder.append(server.address)
    await asyncio.Event().wait()


def _req(i: int) -> RemotingCommand:
    cmd = RemotingCommand.request(RequestCode.HEART_BEAT)
    cmd.remark = str(i)
    return cmd


def test_requests_cross_the_network_in_order_with_latency() -> None:
    async def main(loop: VirtualLoop, net: Network) -> tuple[list[str], float]:
        addr: list[str] = []
        spawn(loop, "server", echo_server(net, addr))
        await asyncio.sleep(0)
        client = RemotingClient()
        start = loop.time()
        answers = await asyncio.gather(*(client.invoke(addr[0], _req(i), 5) for i in range(20)))
        return [a.remark or "" for a in answers], loop.time() - start

    remarks, took = run(main, latency_ms=5)
    assert remarks == [str(i) for i in range(20)]
    # connect (SYN + SYN-ACK) then one round trip, 5 ms each way
    assert took == pytest.approx(0.020, abs=0.001)


def test_blackhole_holds_frames_until_heal_and_reset_closes_both_ends() -> None:
    async def main(loop: VirtualLoop, net: Network) -> dict[str, Any]:
        addr: list[str] = []
        server_proc, _ = spawn(loop, "server", echo_server(net, addr))
        await asyncio.sleep(0)
        client = RemotingClient()
        closed: list[str] = []
        client.on_connection_closed(closed.append)
        await client.invoke(addr[0], _req(0), 5)
        net.rule("driver", "server").blackhole = True
        out: dict[str, Any] = {}
        with pytest.raises(RemotingTimeoutError):
            await client.invoke(addr[0], _req(1), 2)
        late = asyncio.ensure_future(client.invoke(addr[0], _req(2), 10))
        await asyncio.sleep(1)
        net.heal("driver", "server")
        out["late"] = (await late).remark
        out["after_heal"] = loop.time()
        before = len(closed)  # a timed-out request may close its connection (the client's choice)
        assert net.reset("driver", "server") == 1
        await asyncio.sleep(0.1)
        out["closed"] = len(closed) - before
        server_proc.state = "killed"
        net.process_died(server_proc)
        with pytest.raises(RemotingConnectionError, match="refused"):
            await client.invoke(addr[0], _req(3), 2)
        return out

    out = run(main)
    assert out["late"] == "2"
    assert out["closed"] == 1  # the reset closed the one live connection


def test_loss_delays_frames_by_tcp_retransmissions_in_order() -> None:
    """A lost packet is sent again after Linux's RTO (200 ms, doubling per loss in a row): nothing is lost
    to the peer, answers come in order, and each delay is the round trip plus a sum of RTOs."""

    async def main(loop: VirtualLoop, net: Network) -> tuple[list[str], list[float], float]:
        addr: list[str] = []
        spawn(loop, "server", echo_server(net, addr))
        await asyncio.sleep(0)
        client = RemotingClient()
        await client.invoke(addr[0], _req(-1), 5)  # connected before the loss
        net.rule("driver", "server").loss = 0.5
        took: list[float] = []
        remarks: list[str] = []
        for i in range(40):
            start = loop.time()
            remarks.append((await client.invoke(addr[0], _req(i), 60)).remark or "")
            took.append(loop.time() - start)
        net.heal("driver", "server")
        start = loop.time()
        await client.invoke(addr[0], _req(99), 5)
        return remarks, took, loop.time() - start

    remarks, took, healed = run(main, latency_ms=1)
    assert remarks == [str(i) for i in range(40)]
    rtos = {round(t - 0.002, 6) for t in took}  # minus the 1 ms each way
    assert rtos <= {0.0, 0.2, 0.6, 1.4, 3.0, 6.2, 12.6}  # 0.2 + 0.4 + 0.8 ... in a row
    assert 0.0 in rtos and len(rtos) >= 3  # about half get through at once, some lose more than once
    assert healed == pytest.approx(0.002)


def test_a_killed_process_connections_close_for_the_peer() -> None:
    async def main(loop: VirtualLoop, net: Network) -> tuple[bool, float]:
        addr: list[str] = []
        server_proc, _ = spawn(loop, "server", echo_server(net, addr))
        await asyncio.sleep(0)
        client = RemotingClient()
        conn = await client.connection(addr[0])
        await conn.invoke(_req(0), 5)
        pending = asyncio.ensure_future(conn.invoke(_req(1), 60))
        await asyncio.sleep(0)
        server_proc.state = "killed"
        net.process_died(server_proc)
        t0 = loop.time()
        with pytest.raises(RemotingConnectionError):
            await pending
        return conn.closed, loop.time() - t0

    closed, took = run(main, latency_ms=2)
    assert closed
    assert took == pytest.approx(0.002, abs=0.0005)  # the end of the stream, one latency later


def test_frames_to_a_killed_peer_wait_nowhere_and_later_frames_keep_their_times() -> None:
    """Until the peer's end of the stream arrives, a server keeps writing to a killed process (a broker
    NOTIFYing members killed together): those frames are dropped at the write, not scheduled for a
    process that is gone, and the link's latencies are drawn as before, so a new process on the node
    gets its frames at the same times either way."""

    def arrivals(writes_to_the_dead: int) -> tuple[list[float], int]:
        async def main(loop: VirtualLoop, net: Network) -> tuple[list[float], int]:
            conns: list[Connection] = []
            server = RemotingServer(net.ip_of("server"), 10911)

            async def serve() -> None:
                await server.start()
                await asyncio.Event().wait()

            spawn(loop, "server", serve())
            await asyncio.sleep(0)

            async def member() -> None:
                client = RemotingClient()
                await client.invoke(server.address, _req(0), 5)
                await asyncio.Event().wait()

            victim, _ = spawn(loop, "member", member())
            await asyncio.sleep(0.1)
            conns.extend(server.connections)
            victim.state = "killed"
            net.process_died(victim)
            waiting = len(loop._io_scheduled)  # type: ignore[attr-defined]
            for i in range(writes_to_the_dead):
                conns[0].send_response(_req(i).response())
            waiting_after = len(loop._io_scheduled)  # type: ignore[attr-defined]
            await asyncio.sleep(0.1)
            got: list[float] = []

            async def reborn() -> None:
                client = RemotingClient()
                for i in range(5):
                    await client.invoke(server.address, _req(i), 5)
                    got.append(loop.time())

            await spawn(loop, "member", reborn())[1]
            return got, waiting_after - waiting

        return run(main, seed=3, latency=Distribution("uniform", (0.05, 0.2)))

    quiet, none_waiting = arrivals(0)
    noisy, waiting = arrivals(50)
    assert waiting == 0 and none_waiting == 0
    # the 50 frames' latencies were drawn on the link, as when they were delivered: the later frames'
    # times are the ones they had then (skipping the draws would give the quiet run's times)
    assert len(noisy) == len(quiet) == 5 and noisy != quiet


def test_a_paused_server_queues_bytes_and_answers_on_resume() -> None:
    async def main(loop: VirtualLoop, net: Network) -> tuple[str, float]:
        addr: list[str] = []
        server_proc, _ = spawn(loop, "server", echo_server(net, addr))
        await asyncio.sleep(0)
        client = RemotingClient()
        await client.invoke(addr[0], _req(0), 5)
        server_proc.state = "paused"
        t0 = loop.time()
        answer = asyncio.ensure_future(client.invoke(addr[0], _req(1), 60))
        await asyncio.sleep(10)
        assert not answer.done()
        loop.resume_process(server_proc)
        return (await answer).remark or "", loop.time() - t0

    remark, took = run(main)
    assert remark == "1" and took == pytest.approx(10.001, abs=0.001)


def test_a_sync_request_belongs_to_its_process_and_to_its_connection() -> None:
    """A synchronous handler runs from a callback of the server's process, at the place a task would:
    a kill between the frame's arrival and that callback drops it (no answer, no side effect), and so
    does closing the server's connections (cancel_requests), as for a task that never started."""

    async def main(loop: VirtualLoop, net: Network) -> dict[str, Any]:
        seen: list[tuple[str, object]] = []
        servers: list[RemotingServer] = []

        async def serve() -> None:
            server = RemotingServer(net.ip_of("server"), 10911)

            def record(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
                seen.append((cmd.remark or "", asyncio.current_task()))
                return cmd.response(ResponseCode.SUCCESS, cmd.remark)

            server.register(RequestCode.HEART_BEAT, record)
            await server.start()
            servers.append(server)
            await asyncio.Event().wait()

        server_proc, _ = spawn(loop, "server", serve())
        await asyncio.sleep(0)
        client = RemotingClient()
        out: dict[str, Any] = {"answer": (await client.invoke(servers[0].address, _req(0), 5)).remark}
        (sconn,) = servers[0].connections
        # a frame has arrived and its callback waits in the ready queue; then the connections close
        server_proc.context.run(sconn.data_received, _req(1))
        sconn.cancel_requests()
        await asyncio.sleep(0.1)
        # a frame has arrived and its callback waits in the ready queue; then the process dies
        server_proc.context.run(sconn.data_received, _req(2))
        server_proc.state = "killed"
        net.process_died(server_proc)
        await asyncio.sleep(0.1)
        out["seen"] = seen
        return out

    out = run(main)
    assert out["answer"] == "0"
    assert out["seen"] == [("0", None)]  # answered without a task; 1 and 2 never ran


# -- what each request and callback costs: the cheap paths keep asyncio's semantics ---------------------


def test_a_request_ends_at_its_deadline_and_leaves_no_timer_behind() -> None:
    """A request's timeout is one timer: it fails the call at the deadline (the late answer is dropped
    and the connection serves the next call); an answered or cancelled call cancels it, so once nothing
    else is waited for the loop has nothing left to jump to."""

    async def slow_server(net: Network, addr: list[str]) -> None:
        server = RemotingServer(net.ip_of("server"), 10911)

        async def slow(_conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
            await asyncio.sleep(float(cmd.remark or 0))
            return cmd.response(ResponseCode.SUCCESS, cmd.remark)

        server.register(RequestCode.HEART_BEAT, slow)
        await server.start()
        addr.append(server.address)
        await asyncio.Event().wait()

    def req(delay_s: float) -> RemotingCommand:
        cmd = RemotingCommand.request(RequestCode.HEART_BEAT)
        cmd.remark = str(delay_s)
        return cmd

    times: dict[str, float] = {}

    async def main(loop: VirtualLoop, net: Network) -> None:
        addr: list[str] = []
        spawn(loop, "server", slow_server(net, addr))
        await asyncio.sleep(0)
        client = RemotingClient()
        await client.invoke(addr[0], req(0), 5)
        start = loop.time()
        with pytest.raises(RemotingTimeoutError, match=r"timed out after 1\.000s"):
            await client.invoke_async(addr[0], req(2), 1.0)
        times["timed_out"] = loop.time() - start
        answer = await client.invoke_async(addr[0], req(3), 60)  # the first one's answer comes meanwhile
        times["answer"] = float(answer.remark or 0)
        cancelled = asyncio.ensure_future(client.invoke_async(addr[0], req(1), 500))
        await asyncio.sleep(0.5)
        cancelled.cancel()
        await asyncio.sleep(2)  # the cancelled call's answer comes and is dropped
        times["quiet_from"] = loop.time()
        await asyncio.Event().wait()

    loop = VirtualLoop()
    net = Network(loop, 7, Distribution("constant", (1.0,)))
    try:
        with pytest.raises(SimDeadlock):
            loop.run_until_complete(
                loop.create_task(main(loop, net), context=VirtualProcess("driver").context)
            )
        assert times["timed_out"] == pytest.approx(1.0)
        assert times["answer"] == 3.0
        # neither the answered calls' timers (5 s, 60 s) nor the cancelled one's (500 s) moved the clock
        assert loop.time() == times["quiet_from"]
    finally:
        loop.close()


def test_a_timeout_of_zero_fails_the_request_once_it_is_written() -> None:
    async def main(loop: VirtualLoop, net: Network) -> tuple[float, int]:
        addr: list[str] = []
        spawn(loop, "server", echo_server(net, addr))
        await asyncio.sleep(0)
        client = RemotingClient(close_socket_if_timeout=False)
        await client.invoke(addr[0], _req(0), 5)
        start, frames = loop.time(), net.frames
        with pytest.raises(RemotingTimeoutError):
            await client.invoke(addr[0], _req(1), 0)
        return loop.time() - start, net.frames - frames

    took, frames = run(main)
    assert took == 0 and frames == 1


def test_stop_ends_the_run_after_the_iteration_that_called_it() -> None:
    """asyncio's rule: what was ready when stop() ran still runs; what it scheduled waits for the next
    run_forever."""
    loop = VirtualLoop()
    order: list[str] = []

    def first() -> None:
        order.append("first")
        loop.call_soon(lambda: (order.append("next run"), loop.stop()))
        loop.stop()

    try:
        loop.call_soon(first)
        loop.call_soon(order.append, "same iteration")
        loop.run_forever()
        assert order == ["first", "same iteration"]
        loop.run_forever()
        assert order == ["first", "same iteration", "next run"]
    finally:
        loop.close()


def test_a_callback_that_raises_is_reported_and_the_loop_goes_on() -> None:
    loop = VirtualLoop()
    order: list[str] = []

    def bad() -> None:
        raise ValueError("boom")

    try:
        loop.call_soon(bad)
        loop.call_at(1.0, order.append, "timer")
        loop.call_at(2.0, bad)
        loop.call_at(3.0, loop.stop)
        loop.run_forever()
        assert order == ["timer"]
        assert len(loop.errors) == 2
        assert all(e.startswith("Exception in callback") and "ValueError('boom')" in e for e in loop.errors)
    finally:
        loop.close()


def test_cancelled_timers_never_run_and_are_swept_from_the_heap() -> None:
    loop = VirtualLoop()
    fired: list[int] = []
    try:
        timers = [loop.call_at(1.0 + i / 1000, fired.append, i) for i in range(400)]
        for i, t in enumerate(timers):
            if i % 4:
                t.cancel()
                t.cancel()  # twice counts once
        loop.call_at(0.5, loop.stop)
        loop.run_forever()  # the sweep runs here: 300 of 400 cancelled
        assert len(loop._scheduled) == 100  # type: ignore[attr-defined]
        loop.call_at(5.0, loop.stop)
        loop.run_forever()
        assert fired == list(range(0, 400, 4))
    finally:
        loop.close()


def test_frames_take_the_same_times_with_or_without_a_rule_elsewhere() -> None:
    """A frame on a link without nemesis takes the network's short path; any rule anywhere sends every
    frame the long way. Both give the same arrival times."""

    def arrivals(rule_elsewhere: bool) -> list[float]:
        async def main(loop: VirtualLoop, net: Network) -> list[float]:
            if rule_elsewhere:
                net.rule("x", "y").latency_ms = 0.0  # an idle rule between two other nodes
            addr: list[str] = []
            spawn(loop, "server", echo_server(net, addr))
            await asyncio.sleep(0)
            client = RemotingClient()
            done: list[float] = []

            async def one(i: int) -> None:
                await asyncio.sleep((i // 3) / 20_000)  # sends in threes, closer than the latency spread
                await client.invoke(addr[0], _req(i), 5)
                done.append(loop.time())

            await asyncio.gather(*(one(i) for i in range(60)))
            return done

        return run(main, seed=11, latency=Distribution("uniform", (0.05, 0.2)))

    assert arrivals(False) == arrivals(True)


@pytest.mark.parametrize(
    "dist",
    [
        {"dist": "uniform", "low": 0.05, "high": 0.2},
        {"dist": "normal", "mean": 5, "sd": 2},
        {"dist": "lognormal", "median": 5, "sigma": 0.5},
        {"dist": "exponential", "mean": 3},
        2.5,
    ],
)
def test_a_bound_sampler_draws_what_sample_draws(dist: Any) -> None:
    import random

    d = parse_distribution(dist)
    a, b = random.Random(5), random.Random(5)
    draw = d.sampler()
    assert [draw(a) for _ in range(200)] == [d.sample(b) for _ in range(200)]


def test_the_loop_calls_its_housekeeping_between_iterations() -> None:
    calls: list[float] = []

    async def main(loop: VirtualLoop, _: Network) -> None:
        loop.housekeeping = lambda: calls.append(loop.time())
        for _ in range(3 * HOUSEKEEPING_EVERY):
            await asyncio.sleep(1)
        loop.housekeeping = None

    run(main)
    # a sleep is two iterations (the timer fires and sets the future; the task wakes up in the next)
    assert len(calls) == 6
    assert {b - a for a, b in itertools.pairwise(calls)} == {HOUSEKEEPING_EVERY / 2}


def test_the_paced_collector_collects_cycles_once_enough_objects_came() -> None:
    class Node:
        def __init__(self) -> None:
            self.me = self  # a cycle: only the collector frees it

    was_enabled = gc.isenabled()
    collector = GarbageCollector(growth=0.0, min_growth=5_000)
    collector.start()
    try:
        assert not gc.isenabled()
        first = Node()
        probe = weakref.ref(first)
        del first
        collector.check()
        assert probe() is not None and collector.collections == 0  # too little has come yet
        junk = [Node() for _ in range(6_000)]
        del junk
        collector.check()
        assert probe() is None and collector.collections == 1
    finally:
        collector.stop()
    assert gc.isenabled() == was_enabled
