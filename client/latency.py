"""Producer queue selection with RocketMQ 4.9's latency fault tolerance (MQFaultStrategy,
LatencyFaultToleranceImpl), sans-IO: the caller passes ``now_ms``.

A send's latency maps through ``latency_max`` to a not-available duration (a failed send counts as the
isolation latency, 30 s in 4.9); while a broker is "not available" its queues are skipped when another
broker is available.
"""

from __future__ import annotations

from dataclasses import dataclass

from rmqlab.client.publish_info import TopicPublishInfo
from rmqlab.protocol.model import MessageQueue


@dataclass(slots=True)
class FaultItem:
    """A broker the producer avoids until ``start_timestamp``."""

    name: str
    current_latency: int
    start_timestamp: int

    def is_available(self, now_ms: int) -> bool:
        return now_ms - self.start_timestamp >= 0


class LatencyFaultTolerance:
    """The producer's table of slow or failed brokers (RocketMQ's LatencyFaultToleranceImpl)."""

    def __init__(self) -> None:
        self.items: dict[str, FaultItem] = {}
        self._which_item_worst = 0

    def update_fault_item(self, name: str, current_latency: int, not_available_ms: int, now_ms: int) -> None:
        item = self.items.get(name)
        if item is None:
            self.items[name] = FaultItem(name, current_latency, now_ms + not_available_ms)
        else:
            item.current_latency = current_latency
            item.start_timestamp = now_ms + not_available_ms

    def is_available(self, name: str, now_ms: int) -> bool:
        item = self.items.get(name)
        return item is None or item.is_available(now_ms)

    def remove(self, name: str) -> None:
        self.items.pop(name, None)

    def pick_one_at_least(self, now_ms: int) -> str | None:
        if not self.items:
            return None
        ordered = sorted(
            self.items.values(),
            key=lambda it: (not it.is_available(now_ms), it.current_latency, it.start_timestamp),
        )
        half = len(ordered) // 2
        if half <= 0:
            return ordered[0].name
        self._which_item_worst += 1
        return ordered[self._which_item_worst % half].name


class MQFaultStrategy:
    """Picks a send queue avoiding brokers that were slow or failed (sendLatencyFaultEnable)."""

    def __init__(
        self,
        *,
        enabled: bool,
        latency_max: tuple[int, ...],
        not_available_duration: tuple[int, ...],
        isolation_latency: int,
        time_scale: float = 1.0,
    ) -> None:
        self.enabled = enabled
        self.time_scale = time_scale
        self.latency_max = latency_max
        self.not_available_duration = not_available_duration
        self.isolation_latency = isolation_latency
        self.tolerance = LatencyFaultTolerance()

    def compute_not_available_duration(self, latency_ms: int) -> int:
        for i in range(len(self.latency_max) - 1, -1, -1):
            if latency_ms >= self.latency_max[i]:
                return self.not_available_duration[i]
        return 0

    def update_fault_item(self, broker_name: str, latency_ms: int, isolation: bool, now_ms: int) -> None:
        """``latency_ms`` is measured (real) time; the tables are in RocketMQ's milliseconds, so the
        latency and the resulting duration both go through the time scale."""
        if self.enabled:
            lab_latency = self.isolation_latency if isolation else round(latency_ms / self.time_scale)
            duration = round(self.compute_not_available_duration(lab_latency) * self.time_scale)
            self.tolerance.update_fault_item(broker_name, lab_latency, duration, now_ms)

    def select_one_message_queue(
        self, info: TopicPublishInfo, last_broker_name: str | None, now_ms: int
    ) -> MessageQueue:
        if not self.enabled:
            return info.select_one(last_broker_name)
        mqs = info.message_queues
        n = len(mqs)
        index = info.next_index()
        for _ in range(n):
            mq = mqs[abs(index) % n]
            index += 1
            if self.tolerance.is_available(mq.broker_name, now_ms):
                return mq
        not_best = self.tolerance.pick_one_at_least(now_ms)
        if not_best is not None:
            write_nums = _write_queue_nums(info, not_best)
            if write_nums > 0:
                return MessageQueue(info.topic, not_best, info.next_index() % write_nums)
            self.tolerance.remove(not_best)
        return info.select_one()


def _write_queue_nums(info: TopicPublishInfo, broker_name: str) -> int:
    if info.route is None:
        return -1
    for qd in info.route.queue_datas:
        if qd.broker_name == broker_name:
            return qd.write_queue_nums
    return -1
