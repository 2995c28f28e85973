"""An asyncio event loop on virtual time, whose callbacks belong to virtual processes.

When nothing is ready the clock jumps to the next timer, so a simulated hour costs only the work done in
it. Every callback is scheduled in a ``contextvars`` context that names its process (``CURRENT``), the
way a thread of an OS process belongs to it: a paused process's callbacks are held until it resumes
(SIGSTOP), a killed one's are dropped (SIGKILL: no ``finally``, no more events). There are no threads
(``run_in_executor`` runs the function inline) and no sockets (the in-memory network of ``sim.network``
serves ``create_connection`` and ``create_server``).
"""

from __future__ import annotations

import asyncio
import collections
import contextvars
import heapq
import itertools
from asyncio import base_events, format_helpers
from collections.abc import Callable, Coroutine
from typing import Any

from rmqlab.protocol.clock import Clock

# BaseEventLoop's thresholds for sweeping cancelled timers out of the heap, and its longest wait.
_MIN_SCHEDULED = base_events._MIN_SCHEDULED_TIMER_HANDLES
_MIN_CANCELLED_FRACTION = base_events._MIN_CANCELLED_TIMER_HANDLES_FRACTION
_MAX_SELECT_TIMEOUT = base_events.MAXIMUM_SELECT_TIMEOUT

_Task = asyncio.Task  # the C task: one lookup fewer for every task made

# Iterations of the loop between two calls of its housekeeping hook (VirtualLoop.housekeeping).
HOUSEKEEPING_EVERY = 1024

# Virtual epoch: 2026-01-01T00:00:00Z, so timestamps look like wall-clock epoch ms and never depend on now.
EPOCH_MS = 1_767_225_600_000


class SimDeadlock(RuntimeError):
    """Nothing is ready and no timer is set: the simulation can never move again."""


class VirtualProcess:
    """One simulated OS process: its callbacks run while it is ``running``."""

    _ids = itertools.count(1)

    def __init__(self, node: str, incarnation: int = 1) -> None:
        self.node = node
        self.incarnation = incarnation
        self.pid = next(self._ids)
        self.state = "running"  # running | paused | killed | exited
        self.held: list[asyncio.Handle] = []
        self.tasks: list[asyncio.Task[Any]] = []
        self.prune_at = 256
        self.context = contextvars.copy_context()
        self.context.run(CURRENT.set, self)

    @property
    def alive(self) -> bool:
        return self.state in ("running", "paused")

    def __repr__(self) -> str:
        return f"<VirtualProcess {self.node}#{self.incarnation} {self.state}>"


CURRENT: contextvars.ContextVar[VirtualProcess | None] = contextvars.ContextVar("sim_process", default=None)


def _report(handle: asyncio.Handle, exc: BaseException) -> None:
    """A callback raised: to the loop's exception handler, as ``asyncio.Handle._run`` reports it."""
    cb = format_helpers._format_callback_source(handle._callback, handle._args)  # type: ignore[attr-defined]
    handle._loop.call_exception_handler(  # type: ignore[attr-defined]
        {"message": f"Exception in callback {cb}", "exception": exc, "handle": handle}
    )


class _ProcessHandle(asyncio.Handle):
    """A callback of one process. Built without ``Handle.__init__``'s debug-mode check (this loop never
    runs in debug mode) and run by ``VirtualLoop._run_once`` itself: these two are on every callback."""

    __slots__ = ("_process",)

    def __init__(
        self,
        callback: Callable[..., Any],
        args: tuple[Any, ...],
        loop: VirtualLoop,
        context: contextvars.Context,
        process: VirtualProcess | None,
    ) -> None:
        self._callback = callback
        self._args = args
        self._cancelled = False
        self._loop = loop
        self._context = context
        self._repr = None
        self._source_traceback = None
        self._process = process

    def _run(self) -> None:
        _run_gated(self)

    def cancel(self) -> None:  # Handle.cancel without its debug-mode check
        if not self._cancelled:
            self._cancelled = True
            self._callback = None  # type: ignore[assignment]
            self._args = None  # type: ignore[assignment]


class _ProcessTimerHandle(asyncio.TimerHandle):
    __slots__ = ("_io", "_process")

    def __init__(
        self,
        when: float,
        callback: Callable[..., Any],
        args: tuple[Any, ...],
        loop: VirtualLoop,
        context: contextvars.Context,
        process: VirtualProcess | None,
        io: bool,
    ) -> None:
        self._callback = callback
        self._args = args
        self._cancelled = False
        self._loop = loop
        self._context = context
        self._repr = None
        self._source_traceback = None
        self._when = when
        self._scheduled = False
        self._process = process
        self._io = io

    def _run(self) -> None:
        _run_gated(self)

    def cancel(self) -> None:  # TimerHandle.cancel without the calls and the debug-mode check
        if not self._cancelled:
            if self._scheduled:  # BaseEventLoop._timer_handle_cancelled
                self._loop._timer_cancelled_count += 1  # type: ignore[attr-defined]
            self._cancelled = True
            self._callback = None  # type: ignore[assignment]
            self._args = None  # type: ignore[assignment]


def _run_gated(handle: Any) -> None:
    """Run a callback if its process runs; hold it while paused; drop it once killed or exited (the
    process's memory is gone)."""
    proc: VirtualProcess | None = handle._process
    if proc is None or proc.state == "running":
        try:
            handle._context.run(handle._callback, *handle._args)
        except (SystemExit, KeyboardInterrupt):
            raise
        except BaseException as exc:
            _report(handle, exc)
    elif proc.state == "paused":
        proc.held.append(handle)


class VirtualLoop(asyncio.BaseEventLoop):
    """The simulation's event loop. ``network`` (sim.network.Network) answers connects and listens."""

    def __init__(self) -> None:
        super().__init__()
        self._now = 0.0
        self.network: Any = None
        self._timer_seq = itertools.count()
        # The network's deliveries wait in a heap of their own: thousands of frames a second each pay
        # a push and a pop, which on the one heap of every timer (request timeouts and their cancelled
        # leftovers included) cost a path through all of it. Both heaps share the sequence, so taking
        # the smaller (when, sequence) head gives the one heap's order exactly.
        # Frames of one link are due in the order they were sent (TCP), so a link's deliveries wait in
        # a FIFO of their own and only its head is in this heap: at a thousand members a broker's
        # NOTIFY to each puts a thousand frames in flight per change, and a heap of every frame in
        # flight cost a pop through hundreds of thousands of entries. Entries are (when, sequence,
        # handle, fifo or None); the merge of the heads gives every frame's order exactly.
        self._io_scheduled: list[tuple[float, int, asyncio.TimerHandle, Any]] = []
        self.set_exception_handler(self._on_exception)
        self.errors: list[str] = []
        # called every HOUSEKEEPING_EVERY iterations, between callbacks, never by a process: work that
        # belongs to the simulator and not to the run (sim.cluster paces the garbage collector with it)
        self.housekeeping: Callable[[], None] | None = None

    # -- time ------------------------------------------------------------------------------------
    def time(self) -> float:
        return self._now

    # -- scheduling: every handle remembers the process it belongs to ----------------------------
    def call_soon(
        self, callback: Callable[..., Any], *args: Any, context: contextvars.Context | None = None
    ) -> asyncio.Handle:  # type: ignore[override]
        if self._closed:  # type: ignore[attr-defined]
            raise RuntimeError("Event loop is closed")
        if context is None:
            context = contextvars.copy_context()
        handle = _ProcessHandle(callback, args, self, context, context.get(CURRENT))
        self._ready.append(handle)  # type: ignore[attr-defined]
        return handle

    def call_at(
        self,
        when: float,
        callback: Callable[..., Any],
        *args: Any,
        context: contextvars.Context | None = None,
    ) -> asyncio.TimerHandle:  # type: ignore[override]
        return self._call_at(when, callback, args, context, False)

    def _call_at(
        self,
        when: float,
        callback: Callable[..., Any],
        args: tuple[Any, ...],
        context: contextvars.Context | None,
        io: bool,
    ) -> asyncio.TimerHandle:
        if self._closed:  # type: ignore[attr-defined]
            raise RuntimeError("Event loop is closed")
        if context is None:
            context = contextvars.copy_context()
        timer = _ProcessTimerHandle(when, callback, args, self, context, context.get(CURRENT), io)
        # (when, sequence, handle): the heap compares in C, and timers due at the same virtual instant
        # fire in the order they were set. By `when` alone (asyncio's order) a tie went whichever way
        # the heap's shape said, so a cancelled timer elsewhere could reorder two events of a run.
        if io:
            heapq.heappush(self._io_scheduled, (when, next(self._timer_seq), timer, None))
        else:
            heapq.heappush(self._scheduled, (when, next(self._timer_seq), timer))  # type: ignore[attr-defined]
        timer._scheduled = True
        return timer

    def call_soon_threadsafe(
        self, callback: Callable[..., Any], *args: Any, context: contextvars.Context | None = None
    ) -> asyncio.Handle:  # type: ignore[override]
        return self.call_soon(callback, *args, context=context)

    def create_task(
        self,
        coro: Coroutine[Any, Any, Any],
        *,
        name: str | None = None,
        context: contextvars.Context | None = None,
    ) -> asyncio.Task[Any]:  # type: ignore[override]
        if self._task_factory is not None:  # type: ignore[attr-defined]
            task = super().create_task(coro, name=name, context=context)
        else:  # BaseEventLoop.create_task without its debug-mode and renaming steps
            if self._closed:  # type: ignore[attr-defined]
                raise RuntimeError("Event loop is closed")
            task = _Task(coro, loop=self, name=name, context=context)
        proc = CURRENT.get() if context is None else context.get(CURRENT)
        if proc is not None:
            tasks = proc.tasks
            tasks.append(task)
            if len(tasks) > proc.prune_at:  # keep only live tasks; a killed process's stay referenced
                proc.tasks = [t for t in tasks if not t.done()]
                proc.prune_at = 2 * len(proc.tasks) + 256
        return task

    def resume_process(self, proc: VirtualProcess) -> None:
        """Release what a paused process held as a real loop sees it after SIGCONT: what was ready
        before, then the bytes that arrived (the selector reports them), then the overdue timers; each
        kind in the order it came."""

        def kind(h: asyncio.Handle) -> int:
            if not isinstance(h, asyncio.TimerHandle):
                return 0
            return 1 if getattr(h, "_io", False) else 2

        proc.state = "running"
        held, proc.held = proc.held, []
        self._ready.extend(sorted(held, key=kind))  # type: ignore[attr-defined]

    def call_io_at(
        self, when: float, callback: Callable[..., Any], *args: Any, context: contextvars.Context
    ) -> asyncio.TimerHandle:
        """A delivery from the network: like call_at, but a resumed process sees it before its timers."""
        return self._call_at(when, callback, args, context, True)

    def deliver_at(
        self,
        when: float,
        callback: Callable[[Any], Any],
        arg: Any,
        proc: VirtualProcess,
        fifo: collections.deque[Any] | None = None,
    ) -> None:
        """``call_io_at(when, callback, arg, context=proc.context)`` in one call: every frame of the
        network takes this path. ``fifo`` is the link's queue of deliveries (see ``_io_scheduled``);
        one due before the link's last waits in the heap on its own, so the order stays exact."""
        if self._closed:  # type: ignore[attr-defined]
            raise RuntimeError("Event loop is closed")
        timer = _ProcessTimerHandle(when, callback, (arg,), self, proc.context, proc, True)
        timer._scheduled = True
        if fifo is None:
            heapq.heappush(self._io_scheduled, (when, next(self._timer_seq), timer, None))
        elif not fifo:
            entry = (when, next(self._timer_seq), timer, fifo)
            fifo.append(entry)
            heapq.heappush(self._io_scheduled, entry)
        elif when >= fifo[-1][0]:
            fifo.append((when, next(self._timer_seq), timer, fifo))
        else:
            heapq.heappush(self._io_scheduled, (when, next(self._timer_seq), timer, None))

    def _pop_io(self) -> asyncio.TimerHandle:
        """The io heap's head, replaced by the next delivery of its link if there is one."""
        io = self._io_scheduled
        entry = io[0]
        fifo = entry[3]
        if fifo is None:
            heapq.heappop(io)
        else:
            fifo.popleft()
            if fifo:
                heapq.heapreplace(io, fifo[0])
            else:
                heapq.heappop(io)
        return entry[2]

    def _run_once(self) -> None:
        """BaseEventLoop._run_once over the (when, sequence, handle) heap, the wait replaced by a jump of
        the clock: the same steps in the same order (debug-mode timing of slow callbacks left out).

        One call runs iterations until the loop is told to stop, which is when ``run_forever`` (the
        caller) would stop calling: the same iterations without a call and the lookups per iteration."""
        scheduled: list[tuple[float, int, asyncio.TimerHandle]] = self._scheduled  # type: ignore[attr-defined]
        io = self._io_scheduled
        ready = self._ready  # type: ignore[attr-defined]
        popleft = ready.popleft
        append = ready.append
        heappop = heapq.heappop
        pop_io = self._pop_io
        resolution = self._clock_resolution
        ticks = HOUSEKEEPING_EVERY
        while True:
            ticks -= 1
            if not ticks:
                ticks = HOUSEKEEPING_EVERY
                if self.housekeeping is not None:
                    self.housekeeping()
            count = len(scheduled)
            if count > _MIN_SCHEDULED and self._timer_cancelled_count / count > _MIN_CANCELLED_FRACTION:  # type: ignore[attr-defined]
                kept = []
                for entry in scheduled:
                    if entry[2]._cancelled:  # type: ignore[attr-defined]
                        entry[2]._scheduled = False  # type: ignore[attr-defined]
                    else:
                        kept.append(entry)
                heapq.heapify(kept)
                self._scheduled = scheduled = kept
                self._timer_cancelled_count = 0
            else:
                while scheduled and scheduled[0][2]._cancelled:  # type: ignore[attr-defined]
                    self._timer_cancelled_count -= 1
                    heappop(scheduled)[2]._scheduled = False  # type: ignore[attr-defined]
            while io and io[0][2]._cancelled:  # type: ignore[attr-defined]
                self._timer_cancelled_count -= 1
                self._pop_io()._scheduled = False  # type: ignore[attr-defined]
            if not ready and not self._stopping:  # type: ignore[attr-defined]
                if scheduled and io:
                    first = scheduled[0] if scheduled[0] < io[0] else io[0]
                elif scheduled or io:
                    first = scheduled[0] if scheduled else io[0]
                else:
                    raise SimDeadlock("no callback is ready and no timer is set")
                timeout = min(max(0, first[0] - self._now), _MAX_SELECT_TIMEOUT)
                if timeout > 0:
                    self._now += timeout
            end_time = self._now + resolution
            # everything due, from both heaps, in (when, sequence) order
            while True:
                if scheduled and scheduled[0][0] < end_time:
                    # (when, sequence) decides: sequences are unique, so the handles are never compared
                    handle = pop_io() if io and io[0] < scheduled[0] else heappop(scheduled)[2]
                elif io and io[0][0] < end_time:
                    handle = pop_io()
                else:
                    break
                handle._scheduled = False  # type: ignore[attr-defined]
                append(handle)
            for _ in range(len(ready)):
                handle = popleft()
                if handle._cancelled:
                    continue
                # _run_gated, inline: this is every callback of the simulation
                proc = handle._process
                if proc is None or proc.state == "running":
                    try:
                        handle._context.run(handle._callback, *handle._args)
                    except (SystemExit, KeyboardInterrupt):
                        raise
                    except BaseException as exc:
                        _report(handle, exc)
                elif proc.state == "paused":
                    proc.held.append(handle)
            if self._stopping:  # type: ignore[attr-defined]
                return

    # -- no threads, no OS ------------------------------------------------------------------------
    def _process_events(self, event_list: list[Any]) -> None:
        pass

    def _write_to_self(self) -> None:
        pass

    def run_in_executor(self, executor: Any, func: Callable[..., Any], *args: Any) -> asyncio.Future[Any]:  # type: ignore[override]
        """Run inline: a thread would interleave freely, and the simulated file system is the run
        directory, written in virtual time."""
        fut: asyncio.Future[Any] = self.create_future()
        try:
            fut.set_result(func(*args))
        except BaseException as exc:  # handed to the awaiting caller, as a thread's would be
            fut.set_exception(exc)
        return fut

    async def create_connection(
        self,
        protocol_factory: Callable[[], asyncio.BaseProtocol],
        host: str | None = None,
        port: int | None = None,
        **kw: Any,
    ) -> tuple[asyncio.Transport, asyncio.BaseProtocol]:  # type: ignore[override]
        if self.network is None:
            raise OSError("the simulation has no network")
        return await self.network.connect(protocol_factory, str(host), int(port or 0))

    async def create_server(
        self,
        protocol_factory: Callable[[], asyncio.BaseProtocol],
        host: Any = None,
        port: int | None = None,
        **kw: Any,
    ) -> Any:  # type: ignore[override]
        if self.network is None:
            raise OSError("the simulation has no network")
        serving = bool(kw.get("start_serving", True))
        return self.network.listen(protocol_factory, str(host), int(port or 0), serving)

    def _on_exception(self, loop: asyncio.AbstractEventLoop, ctx: dict[str, Any]) -> None:
        msg = str(ctx.get("message", ""))
        if msg.startswith("Task was destroyed but it is pending"):
            return  # a killed process's tasks: they never run again, by design
        exc = ctx.get("exception")
        self.errors.append(f"{msg}: {exc!r}" if exc is not None else msg)


class VirtualClock(Clock):
    """The Clock seam on the loop's virtual time: epoch ms for events, monotonic ms for durations."""

    def __init__(self, loop: VirtualLoop, epoch_ms: int = EPOCH_MS) -> None:
        self._loop = loop
        self._epoch_ms = epoch_ms

    def now_ms(self) -> int:
        return self._epoch_ms + int(self._loop.time() * 1000)

    def monotonic_ms(self) -> int:
        return int(self._loop.time() * 1000)
