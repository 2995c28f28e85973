"""The event log every role writes (EVENTS.md): structlog-rendered JSON lines, written by a background
thread so the event loop never blocks."""

from __future__ import annotations

import json
import json.encoder as json_encoder
import os
import queue
import sys
import threading
from collections.abc import Callable
from typing import Any, Protocol, TextIO

from rmqlab.protocol.clock import Clock, SystemClock


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
