"""Client exceptions, in RocketMQ's shape (MQClientException, MQBrokerException)."""

from __future__ import annotations

from rmqlab.protocol.codes import ResponseCode


class MQClientError(Exception):
    """A client-side failure (bad state, no route, bad argument)."""


class MQBrokerError(Exception):
    """The broker answered a request with an error code."""

    def __init__(self, code: int, remark: str | None, addr: str = "") -> None:
        self.code = int(code)
        self.remark = remark or ""
        self.addr = addr
        super().__init__(f"{self.code_name} ({self.code}) from {addr or '?'}: {self.remark}")

    @property
    def code_name(self) -> str:
        try:
            return ResponseCode(self.code).name
        except ValueError:
            return str(self.code)


class OffsetNotFoundError(MQBrokerError):
    """QUERY_CONSUMER_OFFSET answered QUERY_NOT_FOUND: the group never committed this queue."""

    def __init__(self, remark: str | None = None, addr: str = "") -> None:
        super().__init__(ResponseCode.QUERY_NOT_FOUND, remark, addr)
