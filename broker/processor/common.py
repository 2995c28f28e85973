"""Field helpers shared by the processors: typed ext access with the extra checks PROTOCOL.md implies."""

from __future__ import annotations

import asyncio
import re
from typing import Any

from rmqlab.protocol.command import InvalidParameter, RemotingCommand

# Items one request may carry (README "Limits"): enough for any real client, small enough that one
# request cannot hold the event loop for long. Long requests also yield to the loop every
# YIELD_EVERY items so that other connections are served meanwhile.
MAX_GROUPS_PER_HEARTBEAT = 1024
MAX_SUBSCRIPTIONS_PER_GROUP = 1024
MAX_QUEUES_PER_LOCK = 16384
YIELD_EVERY = 256

# RocketMQ's client-side Validators.checkGroup: the topic character set, at most 255 characters.
GROUP_MAX_LENGTH = 255
_GROUP_RE = re.compile(r"[%|a-zA-Z0-9_-]+")


def ext_name(cmd: RemotingCommand, name: str) -> str:
    """A required, non-empty string header (group, topic, client id)."""
    value = cmd.ext_str(name)
    if not value:
        raise InvalidParameter(name, "is empty")
    return value


def ext_queue_id(cmd: RemotingCommand, name: str = "queueId") -> int:
    value = cmd.ext_int32(name)
    if value < 0:
        raise InvalidParameter(name, f"must be >= 0, got {value}")
    return value


def group_name_problem(group: str) -> str | None:
    """Why a consumer or producer group name is not acceptable (RocketMQ's Validators.checkGroup)."""
    if not group:
        return "is empty"
    if len(group) > GROUP_MAX_LENGTH:
        return f"longer than {GROUP_MAX_LENGTH} characters"
    if not _GROUP_RE.fullmatch(group):
        return "may contain only letters, digits, '%', '|', '_' and '-'"
    return None


def check_count(items: Any, limit: int, where: str) -> None:
    """A list in a request is refused when it has more than ``limit`` items."""
    if isinstance(items, list) and len(items) > limit:
        raise InvalidParameter(where, f"{len(items)} items, at most {limit} per request")


async def yield_now() -> None:
    """Let the loop serve other connections in the middle of a long request."""
    await asyncio.sleep(0)
