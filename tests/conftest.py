"""Test-wide setup: run asyncio tests on uvloop when it is installed (as the roles do)."""

from __future__ import annotations

from typing import Any

try:
    import uvloop
except ImportError:  # uvloop is optional at run time
    uvloop = None  # type: ignore[assignment]


def pytest_asyncio_loop_factories(config: Any, item: Any) -> dict[str, Any]:
    if uvloop is not None:
        return {"uvloop": uvloop.new_event_loop}
    import asyncio

    return {"asyncio": asyncio.new_event_loop}
