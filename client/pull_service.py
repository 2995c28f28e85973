"""RocketMQ's PullMessageService: the client's one pull "thread", fed by the rebalance (a new queue's first
PullRequest) and by the pulls themselves (the next one, now or later).

It serves the ``pulls`` port of ``client.ports`` (PullDispatcher) and runs each request's consumer
``pull_message``, looked up by group in the client's consumer table at the time the request is taken.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Mapping
from typing import Any, Protocol

from rmqlab.client.ports import EventSink
from rmqlab.client.process_queue import PullRequest
from rmqlab.client.scheduler import SingleThreadScheduler
from rmqlab.protocol.clock import TimerSet


class PullingConsumer(Protocol):
    """A consumer registered in the client, as the PullMessageService sees it."""

    async def pull_message(self, request: PullRequest) -> None: ...


class PullMessageService:
    """RocketMQ's PullMessageService thread: PullRequests taken one at a time, each ``pull_message``
    awaited to its end. What blocks that thread in Java (connecting to a broker, a route lookup, the
    orderly first pull's QUERY_CONSUMER_OFFSET) is awaited here in line, so it holds up the pulls of
    every other queue; only the wait for the pull's answer runs apart (invokeAsync). Delayed tasks run
    on the service's own single-threaded scheduler."""

    def __init__(self, consumers: Mapping[str, PullingConsumer], events: EventSink) -> None:
        self.consumers = consumers
        self.log = events
        self._queue: asyncio.Queue[PullRequest] = asyncio.Queue()
        self._timers = TimerSet()
        self._stopped = False
        self.scheduler = SingleThreadScheduler("PullMessageServiceScheduledThread", events)

    def execute_pull_request_immediately(self, request: PullRequest) -> None:
        if not self._stopped:
            self._queue.put_nowait(request)

    def execute_pull_request_later(self, request: PullRequest, delay_ms: float) -> None:
        """``delay_ms`` is already scaled."""
        if delay_ms <= 0:
            self.execute_pull_request_immediately(request)
            return
        self._timers.call_later(delay_ms, lambda: self.execute_pull_request_immediately(request))

    def execute_task_later(self, fn: Callable[[], Coroutine[Any, Any, None]], delay_ms: float) -> None:
        """``delay_ms`` is already scaled."""
        if not self._stopped:
            self.scheduler.schedule(fn, max(0.0, delay_ms) / 1000.0, "pull service task")

    def stop(self) -> None:
        self._stopped = True
        self.scheduler.stop()
        self._timers.cancel_all()

    async def run(self) -> None:
        while True:
            request = await self._queue.get()
            consumer = self.consumers.get(request.consumer_group)
            if consumer is None:
                continue  # group unregistered: the request dies, as in RocketMQ
            try:
                await consumer.pull_message(request)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a bug in one pull must not stop the service
                self.log.error("pull_message failed", error=repr(exc), mq=request.message_queue.short)
