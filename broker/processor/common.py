"""Field helpers shared by the processors: typed ext access with the extra checks PROTOCOL.md implies."""

from __future__ import annotations

from protocol.command import InvalidParameter, RemotingCommand


def ext_name(cmd: RemotingCommand, name: str) -> str:
    """A required, non-empty string header (group, topic, client id)."""
    value = cmd.ext_str(name)
    if not value:
        raise InvalidParameter(name, "is empty")
    return value


def ext_queue_id(cmd: RemotingCommand, name: str = "queueId") -> int:
    value = cmd.ext_int(name)
    if value < 0:
        raise InvalidParameter(name, f"must be >= 0, got {value}")
    return value
