"""The narrow interfaces a consumer group's services are built from, instead of a pointer to their owner.

``ConsumerBase`` wires them: ``GroupApi`` is served by ``client.instance.InstanceGroupApi`` (the shared
MQClientInstance's tables and connections), ``PullDispatcher`` by the instance's PullMessageService,
``GroupOffsets`` by the group's offset store and ``EventSink`` by the process's EventLog. Tests pass small
fakes of these and nothing else.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Coroutine, Iterable
from typing import Any, Protocol

from rmqlab.client.api import PullResult
from rmqlab.client.offset_store import ReadOffsetType
from rmqlab.client.process_queue import PullRequest
from rmqlab.protocol.model import Message, MessageQueue
from rmqlab.protocol.route import FindBrokerResult


class GroupApi(Protocol):
    """What a consumer group asks of its client: broker addresses, the broker calls of rebalancing,
    pulling and sending back, the heartbeat, and a rebalance round later."""

    def find_broker_address_in_subscribe(
        self, broker_name: str, broker_id: int = ..., only_this_broker: bool = ...
    ) -> str | None: ...

    def find_broker_result_in_subscribe(
        self, broker_name: str, broker_id: int = ..., only_this_broker: bool = ...
    ) -> FindBrokerResult | None: ...

    async def find_broker_address_in_subscribe_or_update(
        self, topic: str, broker_name: str, broker_id: int = ..., only_this_broker: bool = ...
    ) -> str | None: ...

    async def find_broker_address_in_publish_or_update(self, topic: str, broker_name: str) -> str | None: ...

    async def find_consumer_id_list(self, topic: str, group: str) -> list[str] | None: ...

    async def lock_batch_mq(
        self, addr: str, group: str, client_id: str, mqs: Iterable[MessageQueue], timeout_s: float
    ) -> set[MessageQueue]: ...

    async def unlock_batch_mq(
        self,
        addr: str,
        group: str,
        client_id: str,
        mqs: Iterable[MessageQueue],
        timeout_s: float,
        *,
        oneway: bool,
    ) -> None: ...

    async def get_max_offset(self, addr: str, mq: MessageQueue, timeout_s: float) -> int: ...

    async def search_offset(
        self, addr: str, mq: MessageQueue, timestamp_ms: int, timeout_s: float
    ) -> int: ...

    async def query_consumer_offset(
        self, addr: str, group: str, mq: MessageQueue, timeout_s: float
    ) -> int: ...

    def update_consumer_offset_oneway(
        self, addr: str, group: str, mq: MessageQueue, offset: int
    ) -> Awaitable[None] | None: ...

    async def pull_message(
        self,
        addr: str,
        *,
        group: str,
        mq: MessageQueue,
        queue_offset: int,
        max_msg_nums: int,
        sys_flag: int,
        commit_offset: int,
        suspend_timeout_ms: int,
        subscription: str | None,
        sub_version: int,
        timeout_s: float,
        asynchronous: bool = ...,
    ) -> PullResult: ...

    async def consumer_send_msg_back(
        self,
        addr: str,
        msg: Message,
        group: str,
        delay_level: int,
        max_reconsume_times: int,
        timeout_s: float,
    ) -> None: ...

    async def send_heartbeat_to_all_broker_with_lock(self) -> bool: ...

    def rebalance_immediately(self) -> None: ...

    def rebalance_later(self, delay_ms: float) -> None: ...

    def spawn(self, coro: Coroutine[Any, Any, Any], what: str = ...) -> Any: ...

    def spawn_self_guarded(self, coro: Coroutine[Any, Any, Any]) -> Any:
        """``spawn`` for a coroutine that catches and logs its own exceptions."""

    def schedule(self, fn: Callable[[], Awaitable[Any]], delay_s: float, what: str = ...) -> None:
        """Run ``fn`` once on MQClientInstance's scheduled thread, ``delay_s`` (scaled) from now."""


class PullDispatcher(Protocol):
    """PullMessageService as the rebalance and the pull callbacks see it (delays already scaled)."""

    def execute_pull_request_immediately(self, request: PullRequest) -> None: ...

    def execute_pull_request_later(self, request: PullRequest, delay_ms: float) -> None: ...

    def execute_task_later(self, fn: Callable[[], Coroutine[Any, Any, None]], delay_ms: float) -> None: ...


class GroupOffsets(Protocol):
    """The offset store calls rebalancing makes."""

    async def read_offset(self, mq: MessageQueue, read_type: ReadOffsetType) -> int: ...

    async def persist(self, mq: MessageQueue) -> None: ...

    def remove_offset(self, mq: MessageQueue) -> None: ...


class EventSink(Protocol):
    """Where events (EVENTS.md) and log lines go: ``protocol.event_log.EventLog`` or a test recorder."""

    def emit(self, event: str, **fields: Any) -> None: ...

    def info(self, msg: str, **kv: Any) -> None: ...

    def warning(self, msg: str, **kv: Any) -> None: ...

    def error(self, msg: str, **kv: Any) -> None: ...


RetrySender = Callable[[str, bytes, str | None, str | None, dict[str, str]], Awaitable[None]]
"""A send through the client's internal producer (CLIENT_INNER_PRODUCER): (topic, body, tags, keys,
properties); DefaultMQPushConsumerImpl#sendMessageBack's fallback and the orderly send-back."""

MessageQueueListener = Callable[[str, set[MessageQueue], set[MessageQueue]], Awaitable[None]]
"""RocketMQ's MessageQueueListener: (topic, every queue, this client's queues) after a change."""
