"""The name server: REGISTER_BROKER / UNREGISTER_BROKER / GET_ROUTEINFO_BY_TOPIC over a RouteInfoManager.

``NamesrvProcessor`` answers the requests and is shared by the standalone name server
(``NamesrvController``, ``rmq-namesrv``) and by a broker running with ``--namesrv embedded``.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rmqlab.protocol.metrics import Snapshot
from rmqlab.broker.replicas_controller import ControllerManager
from rmqlab.broker.route_info import RouteInfoManager, parse_topic_config_table
from rmqlab.broker.server_config import NamesrvConfig
from rmqlab.protocol.clock import Clock, SystemClock
from rmqlab.protocol.codes import RequestCode, ResponseCode
from rmqlab.protocol.command import CommandError, InvalidParameter, RemotingCommand
from rmqlab.protocol.event_log import EventLog
from rmqlab.protocol.remoting import Connection, RemotingServer


class NamesrvProcessor:
    """The name server's requests: broker registration, routes, and broker expiry."""

    def __init__(self, route_info: RouteInfoManager, log: EventLog, clock: Clock) -> None:
        self.route_info = route_info
        self.log = log
        self.clock = clock

    def register(self, server: RemotingServer, wrap: Any = None) -> None:
        w = wrap or (lambda code, h: h)
        server.register(RequestCode.REGISTER_BROKER, w(RequestCode.REGISTER_BROKER, self.register_broker))
        server.register(
            RequestCode.UNREGISTER_BROKER, w(RequestCode.UNREGISTER_BROKER, self.unregister_broker)
        )
        server.register(
            RequestCode.GET_ROUTEINFO_BY_TOPIC,
            w(RequestCode.GET_ROUTEINFO_BY_TOPIC, self.get_route_info_by_topic),
        )

    async def register_broker(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        name = _non_empty(cmd, "brokerName")
        addr = _non_empty(cmd, "brokerAddr")
        cluster = _non_empty(cmd, "clusterName")
        broker_id = cmd.ext_int("brokerId")
        topics = parse_topic_config_table(cmd.body)
        native_addr = cmd.ext_str("nativeAddr", default=None)
        state_version = cmd.ext_int("stateVersion", 0)
        master = self.register_local(
            cluster, name, addr, broker_id, topics, conn.id, native_addr, state_version
        )
        # RegisterBrokerResponseHeader: a slave learns its master (HA and SlaveSynchronize) from here
        ext = {"masterAddr": master, "haServerAddr": master} if master is not None else {}
        return cmd.response(ext=ext)

    def register_local(
        self,
        cluster: str,
        name: str,
        addr: str,
        broker_id: int,
        topics: dict[str, Any],
        conn_id: int | None,
        native_addr: str | None = None,
        state_version: int = 0,
    ) -> str | None:
        """Register a broker; returns its master's address when it is a slave and the master is known."""
        if self.route_info.stale_registration(name, addr, broker_id, state_version):
            self.log.emit(
                "broker_registration_ignored",
                broker=name,
                broker_addr=addr,
                broker_id=broker_id,
                state_version=state_version,
            )
            return None
        prev_master = self.route_info.master_addr(name)
        first = self.route_info.register_broker(
            cluster,
            name,
            addr,
            broker_id,
            topics,
            self.clock.monotonic_ms(),
            conn_id,
            native_addr,
            state_version,
        )
        if first:
            self.log.emit(
                "broker_registered", cluster=cluster, broker=name, broker_addr=addr, broker_id=broker_id
            )
        master = self.route_info.master_addr(name)
        if broker_id == 0 and master != prev_master:
            self.log.emit(
                "route_master_changed",
                broker=name,
                master_addr=master,
                prev_master_addr=prev_master,
                state_version=state_version,
            )
        return self.route_info.master_addr(name) if broker_id != 0 else None

    async def unregister_broker(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        addr = _non_empty(cmd, "brokerAddr")
        if self.route_info.unregister_broker(addr):
            self.log.emit(
                "broker_unregistered", broker=cmd.ext.get("brokerName"), broker_addr=addr, reason="unregister"
            )
        return cmd.response()

    def get_route_info_by_topic(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        topic = _non_empty(cmd, "topic")
        route = self.route_info.pickup_topic_route_data(topic)
        if route is None:
            raise CommandError(
                ResponseCode.TOPIC_NOT_EXIST, f"No topic route info in name server for the topic: {topic}"
            )
        return cmd.response(body=route)

    def scan_not_active_broker(self, timeout_ms: int) -> None:
        for b in self.route_info.scan_not_active_broker(self.clock.monotonic_ms(), timeout_ms):
            self.log.emit(
                "broker_unregistered", broker=b.broker_name, broker_addr=b.broker_addr, reason="expired"
            )

    def on_connection_closed(self, conn: Connection) -> None:
        for b in self.route_info.on_connection_closed(conn.id):
            self.log.emit(
                "broker_unregistered",
                broker=b.broker_name,
                broker_addr=b.broker_addr,
                reason="channel_closed",
            )


def _non_empty(cmd: RemotingCommand, name: str) -> str:
    value = cmd.ext_str(name)
    if not value:
        raise InvalidParameter(name, "is empty")
    return value


class NamesrvController:
    """A standalone name server."""

    def __init__(
        self, config: NamesrvConfig, *, log: EventLog | None = None, clock: Clock | None = None
    ) -> None:
        self.config = config
        self.log = log or EventLog.null("namesrv", "namesrv")
        self.clock = clock or SystemClock()
        self.route_info = RouteInfoManager()
        self.processor = NamesrvProcessor(self.route_info, self.log, self.clock)
        self.server = RemotingServer(
            config.host, config.port, max_frame_bytes=config.max_frame_bytes, log=self.log
        )
        self.processor.register(self.server)
        self.server.on_connection_closed(self.processor.on_connection_closed)
        # enableControllerInNamesrv: RocketMQ 5's controller in the same process and port
        self.controller: ControllerManager | None = None
        if config.enable_controller_in_namesrv:
            self.controller = ControllerManager(self.log, self.clock, config.time_scale)
            self.controller.register(self.server)
            self.server.on_connection_closed(self.controller.on_connection_closed)
        self._runner: asyncio.Task[None] | None = None
        self._controller_runner: asyncio.Task[None] | None = None

    @property
    def address(self) -> str:
        return self.server.address

    def metrics_snapshot(self) -> Snapshot:
        """The state metrics at this moment (run on the loop at each scrape)."""
        from rmqlab.protocol.metrics import Snapshot

        snap = Snapshot()
        snap.add(
            "active_broker_num",
            "Brokers registered and alive",
            "gauge",
            [],
            [([], float(len(self.route_info.broker_live_table)))],
        )
        return snap

    async def start(self) -> None:
        await self.server.start()
        self._runner = asyncio.create_task(self._scan_loop(), name="namesrv-scan")
        if self.controller is not None:
            self._controller_runner = asyncio.create_task(self.controller.run(), name="controller-scan")
        self.log.emit(
            "namesrv_started",
            addr=self.address,
            time_scale=self.config.time_scale,
            controller=self.controller is not None,
        )

    async def _scan_loop(self) -> None:
        interval = self.config.scaled(self.config.scan_not_active_broker_interval_ms) / 1000
        timeout = self.config.scaled(self.config.broker_channel_expired_ms)
        while True:
            await asyncio.sleep(interval)
            try:
                self.processor.scan_not_active_broker(timeout)
            except Exception as exc:  # a bug in one scan must not stop the next
                self.log.error("broker scan failed", error=repr(exc))

    async def shutdown(self) -> None:
        for task in (self._runner, self._controller_runner):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        self._runner = self._controller_runner = None
        if self.controller is not None:
            await self.controller.close()
        await self.server.close()
        self.log.emit("namesrv_stopped", addr=self.address)
