"""The producer's view of a topic: TopicPublishInfo (topicRouteData2TopicPublishInfo's queues, from
``protocol.route``) with its round-robin index."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from rmqlab.protocol.model import MessageQueue
from rmqlab.protocol.route import TopicRouteData


@dataclass(slots=True)
class TopicPublishInfo:
    """The producer's view of a topic: writable queues and the round-robin position."""

    topic: str
    message_queues: Sequence[MessageQueue]  # shared with equal routes' publish_queues: never changed
    route: TopicRouteData | None = None
    send_which_queue: int = field(default=0)

    def ok(self) -> bool:
        return bool(self.message_queues)

    def next_index(self) -> int:
        self.send_which_queue = (self.send_which_queue + 1) & 0x7FFFFFFF
        return self.send_which_queue

    def select_one(self, last_broker_name: str | None = None) -> MessageQueue:
        """TopicPublishInfo.selectOneMessageQueue(lastBrokerName): round robin, avoiding the broker of the
        previous failed attempt when another one exists."""
        n = len(self.message_queues)
        if last_broker_name is not None:
            for _ in range(n):
                mq = self.message_queues[self.next_index() % n]
                if mq.broker_name != last_broker_name:
                    return mq
        return self.message_queues[self.next_index() % n]
