"""What every role's process shares: event log, clocks, the time scale, CLI flags and the loop runner."""

from __future__ import annotations

import asyncio
import json
import json.encoder as json_encoder
import os
import queue
import signal
import socket
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TextIO

# --------------------------------------------------------------------------------------------------
# Clocks: wall time for event timestamps, monotonic time for durations inside a process.


class Clock(Protocol):
    """Wall time for event timestamps and monotonic time for durations, both in milliseconds."""

    def now_ms(self) -> int: ...

    def monotonic_ms(self) -> int: ...


class SystemClock:
    """The real clocks."""

    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000

    def monotonic_ms(self) -> int:
        return time.monotonic_ns() // 1_000_000


class ManualClock:
    """A clock tests move by hand."""

    def __init__(self, start_ms: int = 1_700_000_000_000) -> None:
        self._now = start_ms
        self._mono = 0

    def now_ms(self) -> int:
        return self._now

    def monotonic_ms(self) -> int:
        return self._mono

    def advance(self, ms: int) -> None:
        self._now += ms
        self._mono += ms


class TimeScale:
    """Multiplies every interval and timeout of a process (0.05 runs the 20 s rebalance every second).

    The broker, name-server and client configurations all scale through it: ``ms`` and ``seconds`` keep
    fractions (client timers), ``whole_ms`` rounds to a whole, positive millisecond (broker timers and
    expiry ages, compared with integer timestamps)."""

    __slots__ = ("factor",)

    def __init__(self, factor: float = 1.0) -> None:
        if not factor > 0:
            raise ValueError(f"time scale must be > 0, got {factor}")
        self.factor = float(factor)

    def ms(self, ms: float) -> float:
        return ms * self.factor

    def seconds(self, ms: float) -> float:
        return ms * self.factor / 1000.0

    def whole_ms(self, ms: float) -> int:
        return max(1, round(ms * self.factor))

    def __repr__(self) -> str:
        return f"TimeScale({self.factor})"


class TimerSet:
    """Callbacks a service schedules on the running loop, all cancelled by one ``cancel_all`` (its stop):
    a callback never runs after that, and nothing can be scheduled any more."""

    def __init__(self) -> None:
        self._handles: set[asyncio.TimerHandle] = set()
        self._closed = False

    def call_later(self, delay_ms: float, fn: Callable[[], object]) -> None:
        """Run ``fn`` after ``delay_ms`` real (already scaled) milliseconds."""
        if self._closed:
            return
        handle: asyncio.TimerHandle

        def fire() -> None:
            self._handles.discard(handle)
            if not self._closed:
                fn()

        handle = asyncio.get_running_loop().call_later(max(0.0, delay_ms) / 1000.0, fire)
        self._handles.add(handle)

    def cancel_all(self) -> None:
        self._closed = True
        for handle in list(self._handles):
            handle.cancel()
        self._handles.clear()

    def __len__(self) -> int:
        return len(self._handles)


# --------------------------------------------------------------------------------------------------
# Event log: structlog-rendered JSON lines, written by a background thread so the loop never blocks.


class _LineWriter:
    """Appends lines to a file from a daemon thread; ``flush`` waits until everything queued is written."""

    _STOP = object()

    def __init__(self, path: str | None, stream: TextIO | None = None) -> None:
        self._q: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._path = path
        self._stream = stream
        if path:
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        self._thread = threading.Thread(target=self._run, name="event-log-writer", daemon=True)
        self._thread.start()

    def put(self, line: str) -> None:
        self._q.put(line)

    def _run(self) -> None:
        # The file is owned by this thread for its whole life.
        fh: TextIO = open(self._path, "a", encoding="utf-8") if self._path else (self._stream or sys.stderr)  # noqa: SIM115
        try:
            while True:
                item = self._q.get()
                batch = [item]
                while True:
                    try:
                        batch.append(self._q.get_nowait())
                    except queue.Empty:
                        break
                stop = False
                for it in batch:
                    if it is self._STOP:
                        stop = True
                    elif isinstance(it, threading.Event):
                        fh.flush()
                        it.set()
                    else:
                        fh.write(it)
                        fh.write("\n")
                fh.flush()
                if stop:
                    return
        finally:
            if self._path:
                fh.close()

    def flush(self, timeout: float = 5.0) -> None:
        ev = threading.Event()
        self._q.put(ev)
        ev.wait(timeout)

    def close(self, timeout: float = 5.0) -> None:
        if self._thread.is_alive():
            self._q.put(self._STOP)
            self._thread.join(timeout)


class LineSink(Protocol):
    """Where an EventLog's rendered lines go: a file written by a thread (processes), or a buffer the
    simulator writes in virtual time."""

    def put(self, line: str) -> None: ...

    def flush(self) -> None: ...

    def close(self) -> None: ...

    # A sink may also define put_record(line, record): then it gets each JSON line with the record it
    # was rendered from (the simulator counts events from the record instead of parsing the line back).


class _QueueLogger:
    """structlog 'logger' whose output goes to a LineSink."""

    def __init__(self, writer: LineSink | None) -> None:
        self._writer = writer

    def msg(self, line: str) -> None:
        if self._writer is not None:
            self._writer.put(line)

    info = warning = error = debug = critical = exception = log = msg


# One encoder for every line: json.dumps with arguments builds a new JSONEncoder per call. Its encode
# still builds the C scanner on every call; the same scanner made once writes the same text (compact
# separators, ensure_ascii=False, default=str, NaN allowed) at about two thirds of the cost. It skips
# the circular-reference check, which an event's plain fields never need.
_json = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, default=str)
_scan = (
    json_encoder.c_make_encoder(None, str, json_encoder.encode_basestring, None, ":", ",", False, False, True)
    if json_encoder.c_make_encoder is not None
    else None
)


def _encode_json(obj: Any) -> str:
    return _json.encode(obj) if _scan is None else "".join(_scan(obj, 0))


class EventLog:
    """Structured events per EVENTS.md: one JSON object per line with ts_ms, event, node and role.

    ``emit`` is for events the pipeline may read; ``info``/``warning``/``error`` write ``event="log"``
    lines for humans. Without a path, output is readable console text on stderr.
    """

    def __init__(
        self,
        node: str,
        role: str,
        path: str | None = None,
        *,
        clock: Clock | None = None,
        console: bool | None = None,
        stream: TextIO | None = None,
        sink: LineSink | None = None,
        _discard: bool = False,
    ) -> None:
        self.node = node
        self.role = role
        self.path = path
        self.clock: Clock = clock or SystemClock()
        self._writer: LineSink | None = None
        self._put_record: Callable[[str, dict[str, Any]], None] | None = None
        if sink is not None:
            self._writer = sink
            self._put_record = getattr(sink, "put_record", None)
        elif not _discard:
            self._writer = _LineWriter(path, stream)
        self._closed = False
        # Called with (event, fields) after each emitted event: what a process derives from its own
        # events (its live metrics) without a hook in the code that writes them.
        self.listeners: list[Callable[[str, dict[str, Any]], None]] = []

        as_console = console if console is not None else (path is None)
        # JSON lines are rendered here directly: events are the emulator's output, and at thousands of
        # consumers structlog's processor chain costs more than the line itself. The key order is the
        # one structlog gave them (fields, event, ts_ms, node, role). A discarding log renders nothing.
        self._json = not as_console or self._writer is None
        self._log: Any = None
        if not self._json:
            # structlog only renders console text; imported here, since a process (or a simulation)
            # that writes JSON lines has no use for its import time
            import structlog

            def stamp(_: Any, __: str, ev: dict[str, Any]) -> dict[str, Any]:
                ev.setdefault("ts_ms", self.clock.now_ms())
                ev["node"] = self.node
                ev["role"] = self.role
                return ev

            self._log = structlog.wrap_logger(
                _QueueLogger(self._writer),
                processors=[stamp, structlog.dev.ConsoleRenderer(colors=False, sort_keys=False)],
                cache_logger_on_first_use=True,
            )

    @classmethod
    def null(cls, node: str = "test", role: str = "test") -> EventLog:
        return cls(node, role, None, _discard=True)

    def emit(self, event: str, **fields: Any) -> None:
        if not self._closed:
            if self._json:
                self._line(event, fields)
            else:
                self._log.msg(event, **fields)
            for listener in self.listeners:
                listener(event, fields)

    def _line(self, event: str, ev: dict[str, Any]) -> None:
        writer = self._writer
        if writer is None:
            return
        ev["event"] = event
        if "ts_ms" not in ev:
            ev["ts_ms"] = self.clock.now_ms()
        ev["node"] = self.node
        ev["role"] = self.role
        if self._put_record is None:
            writer.put(_encode_json(ev))
        else:
            self._put_record(_encode_json(ev), ev)

    def _text(self, level: str, msg: str, kv: dict[str, Any]) -> None:
        """Every log line passes here, so a recording subclass overrides this and ``emit`` only."""
        if not self._closed:
            if self._json:
                self._line("log", {"level": level, "msg": msg, **kv})
            else:
                self._log.msg("log", level=level, msg=msg, **kv)

    def debug(self, msg: str, **kv: Any) -> None:
        self._text("debug", msg, kv)

    def info(self, msg: str, **kv: Any) -> None:
        self._text("info", msg, kv)

    def warning(self, msg: str, **kv: Any) -> None:
        self._text("warning", msg, kv)

    def error(self, msg: str, **kv: Any) -> None:
        self._text("error", msg, kv)

    def flush(self) -> None:
        if self._writer is not None:
            self._writer.flush()

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            if self._writer is not None:
                self._writer.close()


def run_async_main(main: Callable[[], Awaitable[int | None]]) -> int:
    """Run ``main`` on uvloop when available; SIGTERM/SIGINT cancel it so it can shut down gracefully."""
    loop_factory: Callable[[], asyncio.AbstractEventLoop] | None = None
    try:
        import uvloop

        loop_factory = uvloop.new_event_loop
    except ImportError:  # uvloop is optional at run time
        loop_factory = None

    async def wrapper() -> int:
        task = asyncio.current_task()
        assert task is not None
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                loop.add_signal_handler(sig, task.cancel)
            except (NotImplementedError, RuntimeError):
                pass
        try:
            rc = await main()
        except asyncio.CancelledError:
            return 0
        return int(rc or 0)

    with asyncio.Runner(loop_factory=loop_factory) as runner:
        try:
            return runner.run(wrapper())
        except KeyboardInterrupt:
            return 130


# --------------------------------------------------------------------------------------------------
# Client identity (RocketMQ's format: ip@instanceName).


def new_instance_name(with_nano_time: bool = True) -> str:
    """``pid#monotonic-ns``: unique per process even when every container's pid is 1 (RocketMQ >= 4.9.0);
    without ``with_nano_time`` the pid alone, as before 4.9.0."""
    if not with_nano_time:
        return str(os.getpid())
    return f"{os.getpid()}#{time.monotonic_ns()}{time.time_ns() % 1_000_000:06d}"


_local_ip: str | None = None


def local_ip() -> str:
    global _local_ip
    if _local_ip is None:
        ip = "127.0.0.1"
        try:
            for info in socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET):
                cand = str(info[4][0])
                if not cand.startswith("127."):
                    ip = cand
                    break
        except OSError:
            pass
        _local_ip = ip
    return _local_ip


def build_client_id(instance_name: str | None = None, client_ip: str | None = None) -> str:
    """RocketMQ's ``clientIP@instanceName`` (ClientConfig.buildMQClientId); the IP defaults to this host's."""
    return f"{client_ip or local_ip()}@{instance_name or new_instance_name()}"
