"""The name server's route table (RocketMQ's RouteInfoManager), sans-IO.

Brokers register their topic configs every 30 s; a broker is forgotten when its registrations stop for
120 s or when the connection it registered over closes. Routes are answered per topic. The tables hold
``protocol.route``'s frozen BrokerData and QueueData, replaced (never changed) when a registration or an
unregistration changes them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rmqlab.protocol.command import InvalidParameter, field_int
from rmqlab.protocol.route import BrokerData, QueueData, TopicRouteData


@dataclass(slots=True)
class BrokerLiveInfo:
    """A registered broker's last registration time and connection, for expiry."""

    broker_addr: str
    broker_name: str
    cluster: str
    broker_id: int
    last_update_ms: int
    conn_id: int | None
    # DataVersion.stateVersion of its registrations: the master epoch in controller mode, else 0
    state_version: int = 0


def parse_topic_config_table(body: Any) -> dict[str, QueueData]:
    """REGISTER_BROKER's body -> topic -> queue data (broker name filled in by the caller)."""
    if body is None:
        return {}
    if not isinstance(body, dict):
        raise InvalidParameter("body", "expected a map")
    table = body.get("topicConfigTable", {})
    if table is None:
        return {}
    if not isinstance(table, dict):
        raise InvalidParameter("body.topicConfigTable", "expected a map")
    out: dict[str, QueueData] = {}
    for topic, tc in table.items():
        where = f"body.topicConfigTable.{topic}"
        if not isinstance(topic, str) or not topic:
            raise InvalidParameter("body.topicConfigTable", "topic names must be non-empty strings")
        out[topic] = QueueData(
            "",
            field_int(tc, "readQueueNums", where),
            field_int(tc, "writeQueueNums", where),
            field_int(tc, "perm", where, 6),
        )
    return out


class RouteInfoManager:
    """The name server's tables: topics, brokers, clusters and live brokers."""

    def __init__(self) -> None:
        self.cluster_addr_table: dict[str, set[str]] = {}
        self.broker_addr_table: dict[str, BrokerData] = {}
        self.topic_queue_table: dict[str, dict[str, QueueData]] = {}
        self.broker_live_table: dict[str, BrokerLiveInfo] = {}

    def register_broker(
        self,
        cluster: str,
        broker_name: str,
        broker_addr: str,
        broker_id: int,
        topics: dict[str, QueueData],
        now_ms: int,
        conn_id: int | None = None,
        native_addr: str | None = None,
        state_version: int = 0,
    ) -> bool:
        """Register or refresh a broker; returns True for a broker address not known before."""
        self.cluster_addr_table.setdefault(cluster, set()).add(broker_name)
        bd = self.broker_addr_table.get(broker_name)
        if bd is None:
            bd = BrokerData(cluster, broker_name)
        # An address re-registered under another id (a restart with a new role) replaces the old one.
        addrs = {bid: addr for bid, addr in bd.broker_addrs if addr != broker_addr or bid == broker_id}
        addrs[broker_id] = broker_addr
        native = dict(bd.native_addrs)
        if native_addr:
            native[broker_id] = native_addr
        else:
            native.pop(broker_id, None)
        self.broker_addr_table[broker_name] = BrokerData(
            bd.cluster, broker_name, tuple(sorted(addrs.items())), tuple(sorted(native.items()))
        )
        first = broker_addr not in self.broker_live_table
        self.broker_live_table[broker_addr] = BrokerLiveInfo(
            broker_addr, broker_name, cluster, broker_id, now_ms, conn_id, state_version
        )
        if broker_id == 0:
            # The master's registration carries its full topic table: it replaces what we had.
            for topic, queues in list(self.topic_queue_table.items()):
                if topic not in topics and broker_name in queues:
                    del queues[broker_name]
                    if not queues:
                        del self.topic_queue_table[topic]
            for topic, qd in topics.items():
                self.topic_queue_table.setdefault(topic, {})[broker_name] = QueueData(
                    broker_name, qd.read_queue_nums, qd.write_queue_nums, qd.perm
                )
        return first

    def stale_registration(
        self, broker_name: str, broker_addr: str, broker_id: int, state_version: int
    ) -> bool:
        """RouteInfoManager#registerBroker (5.x): a registration for an id held by another live address
        whose stateVersion (master epoch) is newer is ignored, and the registering address forgotten (a
        master deposed by the controller registering again before it learns it)."""
        bd = self.broker_addr_table.get(broker_name)
        old_addr = dict(bd.broker_addrs).get(broker_id) if bd is not None else None
        if old_addr is None or old_addr == broker_addr:
            return False
        old = self.broker_live_table.get(old_addr)
        if old is None or old.state_version <= state_version:
            return False
        self.unregister_broker(broker_addr)
        return True

    def master_addr(self, broker_name: str) -> str | None:
        """The address registered with brokerId 0 under ``broker_name``, if any."""
        bd = self.broker_addr_table.get(broker_name)
        if bd is None:
            return None
        return dict(bd.broker_addrs).get(0)

    def unregister_broker(self, broker_addr: str) -> bool:
        live = self.broker_live_table.pop(broker_addr, None)
        removed = False
        for name, bd in list(self.broker_addr_table.items()):
            gone = {bid for bid, addr in bd.broker_addrs if addr == broker_addr}
            if gone:
                removed = True
                bd = self.broker_addr_table[name] = BrokerData(
                    bd.cluster,
                    name,
                    tuple(a for a in bd.broker_addrs if a[0] not in gone),
                    tuple(a for a in bd.native_addrs if a[0] not in gone),
                )
            if not bd.broker_addrs:
                del self.broker_addr_table[name]
                self._remove_broker_name(name, bd.cluster)
        return removed or live is not None

    def _remove_broker_name(self, broker_name: str, cluster: str) -> None:
        names = self.cluster_addr_table.get(cluster)
        if names is not None:
            names.discard(broker_name)
            if not names:
                del self.cluster_addr_table[cluster]
        for topic, queues in list(self.topic_queue_table.items()):
            if queues.pop(broker_name, None) is not None and not queues:
                del self.topic_queue_table[topic]

    def scan_not_active_broker(self, now_ms: int, timeout_ms: int) -> list[BrokerLiveInfo]:
        expired = [b for b in self.broker_live_table.values() if now_ms - b.last_update_ms > timeout_ms]
        for b in expired:
            self.unregister_broker(b.broker_addr)
        return expired

    def on_connection_closed(self, conn_id: int) -> list[BrokerLiveInfo]:
        gone = [b for b in self.broker_live_table.values() if b.conn_id == conn_id]
        for b in gone:
            self.unregister_broker(b.broker_addr)
        return gone

    def pickup_topic_route_data(self, topic: str) -> dict[str, Any] | None:
        queues = self.topic_queue_table.get(topic)
        if not queues:
            return None
        brokers = [self.broker_addr_table[n] for n in sorted(queues) if n in self.broker_addr_table]
        if not brokers:
            return None
        return TopicRouteData(tuple(brokers), tuple(queues[b.broker_name] for b in brokers)).to_wire()
