"""Live metrics in Prometheus text, with RocketMQ 5's metric names and labels where RocketMQ has one.

``--metrics-port`` on rmq-broker, rmq-namesrv and rmq-consumer serves them over HTTP (``/metrics``)
from a thread of prometheus_client's; everything it reports about a role's state is read on the role's
event loop (a scrape asks the loop for a snapshot), so no table is walked while the loop changes it.

RocketMQ 5's broker metrics (BrokerMetricsConstant) used here: ``rocketmq_messages_in_total``,
``rocketmq_messages_out_total``, ``rocketmq_throughput_out_total``, ``rocketmq_consumer_connections``,
``rocketmq_producer_connections``, ``rocketmq_consumer_lag_messages``, ``rocketmq_rpc_latency``; the
name server's ``active_broker_num``; the v5 clients' ``rocketmq_process_time``. RocketMQ has no metric
for a consumer's rebalances: ``rmqlab_consumer_rebalances_total`` is the lab's own.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

CLUSTER = "DefaultCluster"
# RocketMQ 5's bucket bounds, in milliseconds.
RPC_LATENCY_MS = (1, 3, 5, 10, 100, 1000, 3000)
PROCESS_TIME_MS = (1, 5, 10, 100, 10_000, 60_000)
SNAPSHOT_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class NodeLabels:
    """The labels RocketMQ puts on every server metric."""

    node_type: str  # broker, nameserver
    node_id: str
    cluster: str = CLUSTER

    def names(self) -> list[str]:
        return ["cluster", "node_type", "node_id"]

    def values(self) -> list[str]:
        return [self.cluster, self.node_type, self.node_id]


@dataclass
class Snapshot:
    """What a role's state says at one moment: (metric name, help, kind, label names, [(values, v)])."""

    families: list[tuple[str, str, str, list[str], list[tuple[list[str], float]]]] = field(
        default_factory=list
    )

    def add(
        self, name: str, help_text: str, kind: str, labels: list[str], rows: Iterable[tuple[list[str], float]]
    ) -> None:
        self.families.append((name, help_text, kind, labels, list(rows)))


class LoopStateCollector(Collector):
    """Collects a role's state by running ``snapshot`` on its event loop at each scrape."""

    def __init__(
        self, loop: asyncio.AbstractEventLoop, snapshot: Callable[[], Snapshot], node: NodeLabels
    ) -> None:
        self.loop = loop
        self.snapshot = snapshot
        self.node = node

    def collect(self) -> Iterator[Metric]:
        try:
            snap = self._on_loop()
        except (TimeoutError, concurrent.futures.TimeoutError, RuntimeError):
            return  # the loop is busy or gone: this scrape has no state metrics
        base, values = self.node.names(), self.node.values()
        for name, help_text, kind, labels, rows in snap.families:
            family: Any = (
                CounterMetricFamily(name, help_text, labels=base + labels)
                if kind == "counter"
                else GaugeMetricFamily(name, help_text, labels=base + labels)
            )
            for label_values, value in rows:
                family.add_metric(values + label_values, value)
            yield family

    def _on_loop(self) -> Snapshot:
        async def take() -> Snapshot:
            return self.snapshot()

        return asyncio.run_coroutine_threadsafe(take(), self.loop).result(SNAPSHOT_TIMEOUT_S)


class RoleMetrics:
    """One process's registry: the state collector and the counters its code increments."""

    def __init__(self, node: NodeLabels) -> None:
        self.node = node
        self.registry = CollectorRegistry()
        labels = node.names()
        self.messages_out = Counter(
            "rocketmq_messages_out",
            "Messages pulled from the broker",
            [*labels, "topic", "consumer_group"],
            registry=self.registry,
        )
        self.throughput_out = Counter(
            "rocketmq_throughput_out",
            "Bytes of message bodies pulled from the broker",
            [*labels, "topic", "consumer_group"],
            registry=self.registry,
        )
        self.rpc_latency = Histogram(
            "rocketmq_rpc_latency",
            "Time to answer a request, in milliseconds",
            [*labels, "protocol_type", "request_code", "response_code"],
            buckets=RPC_LATENCY_MS,
            registry=self.registry,
        )
        self.server: Any = None

    def watch(self, loop: asyncio.AbstractEventLoop, snapshot: Callable[[], Snapshot]) -> None:
        self.registry.register(LoopStateCollector(loop, snapshot, self.node))

    def pulled(self, topic: str, group: str, count: int, size: int) -> None:
        values = self.node.values()
        self.messages_out.labels(*values, topic, group).inc(count)
        self.throughput_out.labels(*values, topic, group).inc(size)

    def answered(
        self, request_code: int, response_code: int, elapsed_ms: float, protocol: str = "remoting"
    ) -> None:
        self.rpc_latency.labels(*self.node.values(), protocol, str(request_code), str(response_code)).observe(
            elapsed_ms
        )

    def serve(self, port: int, host: str = "127.0.0.1") -> int:
        self.server = MetricsServer(self.registry, port, host)
        return self.server.port

    def close(self) -> None:
        if self.server is not None:
            self.server.close()
            self.server = None


class MetricsServer:
    """/metrics of one registry over HTTP on ``port`` (0 picks one), from a thread of its own."""

    def __init__(self, registry: CollectorRegistry, port: int, host: str = "127.0.0.1") -> None:
        self._server, self._thread = start_http_server(port, addr=host, registry=registry)
        self.port = int(self._server.server_port)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


class ConsumerMetrics:
    """A consumer process's metrics, from its own events (EVENTS.md): what it consumed and how long its
    listener took, and its rebalances."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.process_time = Histogram(
            "rocketmq_process_time",
            "Time the listener took for a message, in milliseconds",
            ["topic", "consumer_group", "client_id", "invocation_status"],
            buckets=PROCESS_TIME_MS,
            registry=registry,
        )
        self.rebalances = Counter(
            "rmqlab_consumer_rebalances",
            "Rebalance rounds that reached allocation, by whether they changed it",
            ["consumer_group", "topic", "client_id", "changed"],
            registry=registry,
        )

    def on_event(self, event: str, fields: dict[str, Any]) -> None:
        if event == "message_consumed":
            started, done = fields.get("started_ms"), fields.get("ts_ms")
            if isinstance(started, int) and isinstance(done, int):
                self.process_time.labels(
                    str(fields.get("topic")),
                    str(fields.get("group")),
                    str(fields.get("client_id")),
                    "success",
                ).observe(max(0, done - started))
        elif event == "rebalance":
            self.rebalances.labels(
                str(fields.get("group")),
                str(fields.get("topic")),
                str(fields.get("client_id")),
                "true" if fields.get("changed") else "false",
            ).inc()
