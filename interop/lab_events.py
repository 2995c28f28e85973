"""The event file of the real-client drivers in this folder: EVENTS.md lines, as the lab's own roles write
them. The drivers run with their client's interpreter and import nothing from the project, so they share
this module as a sibling file (a script's folder is first on ``sys.path``)."""

from __future__ import annotations

import json
import sys
import threading
import time
from typing import Any


class EventWriter:
    """EVENTS.md lines, one JSON object per line, flushed at once (the process may be killed)."""

    def __init__(self, node: str, path: str | None, role: str = "consumer") -> None:
        self.node = node
        self.role = role
        self._lock = threading.Lock()
        self._out = open(path, "a", encoding="utf-8") if path else sys.stderr  # noqa: SIM115

    def emit(self, event: str, **fields: Any) -> None:
        line = {"ts_ms": fields.pop("ts_ms", None) or now_ms(), "event": event, "node": self.node}
        line["role"] = self.role
        line.update(fields)
        text = json.dumps(line, separators=(",", ":"))
        with self._lock:
            self._out.write(text + "\n")
            self._out.flush()

    def close(self) -> None:
        if self._out is not sys.stderr:
            self._out.close()


def now_ms() -> int:
    return time.time_ns() // 1_000_000
