"""The project's testing kit, importable as ``kit`` from every test folder.

- ``kit.broker``: RecordingLog (an EventLog that keeps events) and Peer (a raw msgpack-wire client).
- ``kit.cluster``: in-process clusters of brokers and consumers, crash(), allocation checks.
- ``kit.chaos``: the stand-in role process, event collection, process probes, `rmq-chaos run`.
- ``kit.docker``: the container tests' pieces (rmq-chaos on the docker backend, what a run left behind).
- ``kit.native_wire``: RocketMQ native frames built from the Java layouts, independent of protocol.native.
- ``kit.interop``: processes for the real-client interop tests.
- ``kit.lab_fakes``: a fake-clock event loop and a fake Backend, to watch the lab's Runner decide.
- ``kit.handmade``, ``kit.pipeline_cases``, ``kit.pipeline``: hand-made event logs with their expected
  analysis, and the Spark summary of a run.
- ``wait_until``: poll a condition spread over several components. ``protocol.clock.ManualClock`` is the
  hand-moved clock.
- ``exhaustive``: the whole suite's long real-process runs take representatives of a set (the whole
  suite must stay within its time); ``RMQ_EXHAUSTIVE=1`` runs every member.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Sequence
from typing import TypeVar

T = TypeVar("T")


async def wait_until(
    pred: Callable[[], object], within: float = 5.0, what: str = "condition", step: float = 0.02
) -> None:
    """Poll a predicate over state spread across several components (no single event to wait on)."""
    try:
        async with asyncio.timeout(within):
            while not pred():  # noqa: ASYNC110
                await asyncio.sleep(step)
    except TimeoutError:
        raise AssertionError(f"timed out after {within}s waiting for {what}") from None


def exhaustive(every: Sequence[T], representatives: Sequence[T]) -> list[T]:
    """``every`` under ``RMQ_EXHAUSTIVE=1``, else ``representatives`` (which must be among ``every``)."""
    missing = [r for r in representatives if r not in every]
    if missing:
        raise ValueError(f"representatives {missing} are not among {list(every)}")
    return list(every if os.environ.get("RMQ_EXHAUSTIVE") == "1" else representatives)
