"""Clocks and timers every role shares: wall time for event timestamps, monotonic time for durations, the
time scale that multiplies every interval of a process, and a set of loop timers cancelled together."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Protocol


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
