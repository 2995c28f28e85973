"""How a role's process runs its asyncio main: on uvloop when available, with SIGTERM and SIGINT
cancelling it so that it shuts down gracefully."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Awaitable, Callable


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
