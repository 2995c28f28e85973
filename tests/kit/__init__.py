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
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable


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
