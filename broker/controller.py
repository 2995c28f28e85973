"""BrokerController: wires the sans-IO managers and the request processors onto a RemotingServer.

The controller owns the broker's state and its timers (channel expiry scan, long-poll hold check,
scheduled retries, name-server registration); the processors in ``broker.processor`` answer requests.
Every broker interval is scaled by ``BrokerConfig.time_scale``.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import os
from collections import defaultdict
from dataclasses import replace
from typing import TYPE_CHECKING, Any, cast

from rmqlab.broker.assignment import MessageRequestModeTable
from rmqlab.broker.consumer_manager import ConsumerIdsChangeListener, ConsumerManager, ProducerManager
from rmqlab.broker.faults import FaultTable
from rmqlab.broker.ha_state import BrokerRole, ReplicaProgress, ReplicationLog
from rmqlab.broker.lock_manager import RebalanceLockManager
from rmqlab.broker.long_polling import HeldPull, PullRequestHoldService
from rmqlab.broker.namesrv import NamesrvProcessor
from rmqlab.broker.offset_manager import ConsumerOffsetManager
from rmqlab.broker.plain_acl import ADMIN_CODES, AclDenied, PlainAccessValidator, is_loopback
from rmqlab.broker.pop_state import PopState
from rmqlab.broker.processor import register_processors
from rmqlab.broker.processor.pop_requests import PopLongPollingService, PopMessageProcessor
from rmqlab.broker.processor.services import ATTR_CLIENT_ID, ATTR_GROUPS, Handler
from rmqlab.broker.replicas_manager import ReplicasManager
from rmqlab.broker.route_info import RouteInfoManager
from rmqlab.broker.schedule import ScheduleMessageService
from rmqlab.broker.server_config import BrokerConfig
from rmqlab.broker.slave import SlaveService
from rmqlab.broker.sqlite_store import SqliteMessageStore
from rmqlab.broker.store import SCHEDULE_GROUP, SCHEDULE_TOPIC, MemoryMessageStore, StoredMessage, StoreError
from rmqlab.broker.topic_config import TopicConfig
from rmqlab.protocol.codes import RequestCode, ResponseCode
from rmqlab.protocol.command import CommandError, RemotingCommand
from rmqlab.protocol.model import MessageQueue, WireError, is_retry_topic, retry_topic

if TYPE_CHECKING:  # prometheus_client is imported only by a broker that serves metrics
    from rmqlab.protocol.metrics import RoleMetrics, Snapshot
from rmqlab.protocol.client_id import local_ip
from rmqlab.protocol.clock import Clock, SystemClock
from rmqlab.protocol.event_log import EventLog
from rmqlab.protocol.remoting import Connection, RemotingClient, RemotingError, RemotingServer, SyncHandler
from rmqlab.protocol.route import QueueData, TopicRouteData

ATTR_WRITE_SEQ = "write_seq"  # last durable write this connection caused
ATTR_HA_SLAVE = "ha_slave"  # the slave address a connection's HA_TRANSFER requests named


class BrokerController:
    """A broker: its managers, store and request processors on a RemotingServer, and its scheduled tasks."""

    def __init__(
        self, config: BrokerConfig | None = None, *, log: EventLog | None = None, clock: Clock | None = None
    ) -> None:
        self.config = config = config or BrokerConfig()
        self.log = log or EventLog.null(config.broker_name, "broker")
        self.clock: Clock = clock or SystemClock()
        self.role = BrokerRole.parse(config.broker_role)
        # RocketMQ 5's controller mode: the controller makes this broker master or slave; until it has
        # said which, the broker takes no writes and does not register with the name server
        self.replicas: ReplicasManager | None = None
        self._master_role = self.role if self.role is not BrokerRole.SLAVE else BrokerRole.ASYNC_MASTER
        self._role_tasks: list[asyncio.Task[None]] = []
        if config.controller_mode:
            controller_addr = config.controller_addr or config.namesrv
            if controller_addr == "embedded":
                raise ValueError("controller mode needs a controller: --namesrv or --controller-addr")
            self.replicas = ReplicasManager(self, controller_addr)
            self.role = BrokerRole.SLAVE
        elif (self.role is BrokerRole.SLAVE) != (config.broker_id != 0):
            raise ValueError(
                f"broker id {config.broker_id} does not fit role {self.role.value}: "
                "a master has broker id 0, a slave 1 or more"
            )
        if self.role is BrokerRole.SLAVE and config.namesrv == "embedded" and not config.ha_master_address:
            raise ValueError("a slave needs a name server (--namesrv) or its master's address")
        # the broker's commit-log order (what slaves copy), the slaves of a master and the run they copy
        self.replication_log = ReplicationLog()
        self.ha_progress = ReplicaProgress(
            config.scaled(config.ha_housekeeping_interval_ms), config.ha_slave_fallbehind_max_bytes
        )
        self.ha_epoch = 0
        self.epoch_start_offsets: list[list[Any]] | None = None
        self._growth_waiters: list[asyncio.Future[None]] = []
        self.slave: SlaveService | None = (
            SlaveService(self) if self.role is BrokerRole.SLAVE and self.replicas is None else None
        )
        self.consumer_manager = ConsumerManager()
        self.producer_manager = ProducerManager()
        self.offset_manager = ConsumerOffsetManager()
        self.lock_manager = RebalanceLockManager(config.lock_max_live_time)
        from rmqlab.broker.topic_config import TopicConfigManager

        self.topic_manager = TopicConfigManager(config.default_topic_queue_nums, config.auto_create_topic)
        self.native_server: RemotingServer | None = None
        self.native_addr: str | None = None
        self.hold_service = PullRequestHoldService()
        self.schedule_service = ScheduleMessageService(config.scaled_delay_levels)
        self.faults = FaultTable()
        # RocketMQ's plain ACL (--acl); without it, admin codes only from loopback unless --admin-from any.
        self.acl = PlainAccessValidator.from_file(config.acl_file) if config.acl_file else None
        self.admin_from_any = config.admin_from == "any"
        self.notify_on_channel_expired = config.notify_on_channel_expired
        self.release_locks_on_close = config.release_locks_on_close
        self.embedded_namesrv = config.namesrv == "embedded"
        self.route_info = RouteInfoManager() if self.embedded_namesrv else None
        self.namesrv_processor = (
            NamesrvProcessor(self.route_info, self.log, self.clock) if self.route_info is not None else None
        )
        self.server = RemotingServer(
            config.host,
            config.port,
            max_frame_bytes=config.max_frame_bytes,
            log=self.log,
            partial_frame_timeout_s=config.partial_frame_timeout_ms / 1000,
        )
        self.store: MemoryMessageStore = MemoryMessageStore(config.broker_name, clock=self.clock)
        self.connections: dict[int, Connection] = {}
        self.consumer_ids_listener = ConsumerIdsChangeListener(
            self.consumer_manager,
            self.connections,
            self.log,
            enabled=config.notify_consumer_ids_changed,
            rocketmq5=config.rocketmq5,
            event_ids_max=config.notify_event_ids_max,
        )
        self._namesrv_client: RemotingClient | None = None
        self._register_event = asyncio.Event()
        self._schedule_event = asyncio.Event()
        self._hold_event = asyncio.Event()
        self._runner: asyncio.Task[None] | None = None
        self._started_ms = 0
        self._stopped = False
        self.pull_events = True  # one pull_served event per answered pull
        self.metrics: RoleMetrics | None = None  # live metrics, with --metrics-port
        # offsets committed since the last flush, when offsets are flushed periodically as RocketMQ does
        self._unflushed_offsets: dict[tuple[str, str, int], int] = {}
        # RocketMQ 5: POP's checkpoints and held pops, the request modes, and the topic routes
        # QUERY_ASSIGNMENT balances over (TopicRouteInfoManager's cache: topic -> (queues, fetched at))
        self.pop_state = PopState()
        self.pop_polling = PopLongPollingService()
        self.pop_processor = PopMessageProcessor(self)
        self.request_modes = MessageRequestModeTable()
        self._subscribe_info: dict[str, tuple[frozenset[MessageQueue] | None, int]] = {}

    # -- life cycle ------------------------------------------------------------------------
    @property
    def port(self) -> int:
        return self.server.port

    @property
    def address(self) -> str:
        """Where this broker listens (host:port)."""
        return self.server.address

    @property
    def broker_addr(self) -> str:
        """The address published in routes: reachable host and the advertised port."""
        host = self.config.host
        if host in ("", "0.0.0.0", "::"):
            host = local_ip()
        return f"{host}:{self.config.advertised_port or self.server.port}"

    async def start(self) -> None:
        # Bind first (the port goes into message ids), accept only once the store is open and every
        # processor is registered: a request must never meet a half-started broker.
        await self.server.start(serve=False)
        cfg = self.config
        if cfg.store_dir:
            self.store = SqliteMessageStore(
                cfg.store_dir,
                cfg.broker_name,
                host=self.broker_addr.rsplit(":", 1)[0],
                port=self.port,
                clock=self.clock,
            )
        else:
            self.store = MemoryMessageStore(
                cfg.broker_name, host=self.broker_addr.rsplit(":", 1)[0], port=self.port, clock=self.clock
            )
        try:
            await self.store.open()
        except BaseException:
            await self.server.close()
            raise
        for tc in self.store.loaded_topics:
            self.topic_manager.put(tc)
        # a restarted master's log holds what its store kept, in store-time order; its new epoch makes
        # its slaves copy from the start (keeping only what they lack)
        loaded = sorted(
            (m for cq in self.store.queues.values() for m in cq.messages),
            key=lambda m: (m.store_timestamp, m.topic, m.queue_id, m.queue_offset),
        )
        for m in loaded:
            m.log_end = self.replication_log.append(m, len(m.body))
        self.ha_epoch = self.clock.now_ms()
        for group, topic, qid, offset in self.store.loaded_offsets:
            if group == SCHEDULE_GROUP:
                self.schedule_service.offset_table[qid] = offset
            else:
                self.offset_manager.commit_offset(group, topic, qid, offset)
        self.store.add_arrival_listener(self._on_message_arrived)
        try:
            self.request_modes = await asyncio.to_thread(self._load_request_modes)
        except BaseException:
            await self.store.close()
            await self.server.close()
            raise

        register_processors(self, self.pop_processor)
        if self.namesrv_processor is not None:
            self.namesrv_processor.register(self.server, self.wrap)
        self.server.on_connection_opened(self._on_connection_opened)
        self.server.on_connection_closed(self._on_connection_closed)
        if isinstance(self.store, SqliteMessageStore):
            self.store.on_rejected = self._on_write_rejected
        await self.server.start_serving()
        self._started_ms = self.clock.monotonic_ms()
        self._runner = asyncio.create_task(self._run_services(), name=f"broker-{cfg.broker_name}")
        self.log.emit(
            "broker_started",
            broker=cfg.broker_name,
            broker_id=cfg.broker_id,
            broker_role=self.role.value,
            cluster=cfg.cluster_name,
            addr=self.address,
            broker_addr=self.broker_addr,
            store_dir=cfg.store_dir,
            namesrv=cfg.namesrv,
            time_scale=cfg.time_scale,
            messages=self.store.message_count(),
        )

    def _on_write_rejected(self, seq: int, reason: str) -> None:
        self.log.warning("store refused a write; the store carries on", seq=seq, reason=reason)

    async def start_native_port(self, port: int) -> str:
        """Open a second port speaking RocketMQ's own remoting protocol (real RocketMQ clients) with the
        same processors; it is published to the name server as ``nativeAddr``. Returns its address."""
        from rmqlab.protocol.native import start_native_port

        route_ports = [self.config.advertised_port] if self.config.advertised_port else []
        self.native_server = await start_native_port(
            self.server, self.config.host, port, log=self.log, route_ports=route_ports
        )
        host = self.broker_addr.rsplit(":", 1)[0]
        self.native_addr = f"{host}:{self.native_server.port}"
        self.log.emit("native_port_started", broker=self.config.broker_name, addr=self.native_addr)
        await self.register_broker_all()
        return self.native_addr

    async def shutdown(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        if self.native_server is not None:
            await self.native_server.close()
        if self._runner is not None:
            self._runner.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._runner
        for req in self.hold_service.pop_all():
            _wake(req, "shutdown")
        self.pop_polling.wake_all()
        if self._namesrv_client is not None:
            with contextlib.suppress(RemotingError, OSError):
                await self._namesrv_client.invoke(
                    self.config.namesrv, self._unregister_broker_request(), timeout_s=1.0
                )
            await self._namesrv_client.close()
        await self._stop_role_tasks()
        if self.replicas is not None:
            await self.replicas.close()
        if self.slave is not None:
            await self.slave.close()
        for fut in self._growth_waiters:
            if not fut.done():
                fut.set_result(None)
        await self.server.close()
        self.consumer_ids_listener.close()
        with contextlib.suppress(StoreError):
            self.flush_consumer_offsets()  # BrokerController#shutdown persists the offsets last
        await self.store.close()
        self.log.emit("broker_stopped", broker=self.config.broker_name, addr=self.address)

    async def _run_services(self) -> None:
        async with asyncio.TaskGroup() as tg:
            tg.create_task(self._scan_loop())
            tg.create_task(self._hold_loop())
            tg.create_task(self._register_loop())
            tg.create_task(self._idle_loop())
            if self.replicas is not None:
                tg.create_task(self.replicas.run())  # the role's own loops start with the role
            elif self.slave is None:
                # a slave delivers no delayed message and revives no POP checkpoint: it only copies
                tg.create_task(self._schedule_loop())
                tg.create_task(self._revive_loop())
            else:
                tg.create_task(self.slave.replicate_loop())
                tg.create_task(self.slave.sync_loop())
            if self.config.flush_consumer_offset_interval_ms > 0:
                tg.create_task(self._offset_flush_loop())
            if self.namesrv_processor is not None:
                tg.create_task(self._namesrv_scan_loop())

    # -- request dispatch ------------------------------------------------------------------------
    def wrap(self, code: int, handler: Handler) -> Handler:
        """Put fault injection in front of a handler and the durability barrier behind it. A synchronous
        handler (a plain function) stays synchronous unless the store is durable (see ``_wrap_sync``)."""
        durable = self.store.durable
        sync_handler: SyncHandler | None = None
        if not inspect.iscoroutinefunction(handler):
            sync_handler = cast(SyncHandler, handler)

            async def call_sync(conn: Connection, cmd: RemotingCommand) -> RemotingCommand | None:
                return cast(RemotingCommand | None, sync_handler(conn, cmd))

            handler = call_sync

        async def wrapped(conn: Connection, cmd: RemotingCommand) -> RemotingCommand | None:
            self._check_access(conn, cmd, code)
            faults = self.faults
            drop = False
            if faults.codes and cmd.code in faults.codes:
                action = await self._apply_fault(conn, cmd)
                if action is not None:
                    if action.error is not None:
                        if action.drop:
                            return None
                        raise CommandError(action.error.code, action.error.remark)
                    drop = action.drop
            try:
                resp = await handler(conn, cmd)
            except StoreError as exc:
                await self._durable_barrier(conn, durable)
                raise CommandError(ResponseCode.SERVICE_NOT_AVAILABLE, str(exc)) from None
            except (WireError, CommandError):
                await self._durable_barrier(conn, durable)
                raise
            if durable:  # (tested here too: the in-memory store's answers skip a coroutine each)
                try:
                    await self._durable_barrier(conn, durable)
                except StoreError as exc:
                    raise CommandError(ResponseCode.SERVICE_NOT_AVAILABLE, str(exc)) from None
            return None if drop else resp

        if self.metrics is not None:
            wrapped = self._timed(code, wrapped)
        if sync_handler is not None and not durable:
            return self._wrap_sync(code, sync_handler, wrapped)
        return wrapped

    def _timed(self, code: int, handler: Handler) -> Handler:
        """rocketmq_rpc_latency of every answer (a held pull counts until it is answered)."""
        metrics = self.metrics
        assert metrics is not None
        monotonic = self.clock.monotonic_ms

        async def timed(conn: Connection, cmd: RemotingCommand) -> RemotingCommand | None:
            t0 = monotonic()
            try:
                resp = await handler(conn, cmd)
            except CommandError as exc:
                metrics.answered(code, int(exc.code), monotonic() - t0)
                raise
            metrics.answered(code, resp.code if resp is not None else -1, monotonic() - t0)
            return resp

        return timed

    def metrics_snapshot(self) -> Snapshot:
        """The state metrics at this moment (run on the loop at each scrape)."""
        from rmqlab.protocol.metrics import Snapshot

        snap = Snapshot()
        written: dict[str, int] = defaultdict(int)
        max_offsets: dict[tuple[str, int], int] = {}
        for (topic, queue_id), cq in list(self.store.queues.items()):
            written[topic] += cq.max_offset
            max_offsets[(topic, queue_id)] = cq.max_offset
        snap.add(
            "rocketmq_messages_in",
            "Messages stored",
            "counter",
            ["topic", "message_type"],
            (([t, "Normal"], float(n)) for t, n in sorted(written.items())),
        )
        lag: dict[tuple[str, str], int] = defaultdict(int)
        for group, topic, queue_id, offset in self.offset_manager.entries():
            lag[(topic, group)] += max(0, max_offsets.get((topic, queue_id), 0) - offset)
        snap.add(
            "rocketmq_consumer_lag_messages",
            "Messages stored and not yet committed by the group",
            "gauge",
            ["topic", "consumer_group"],
            (([t, g], float(n)) for (t, g), n in sorted(lag.items())),
        )
        cm = self.consumer_manager
        snap.add(
            "rocketmq_consumer_connections",
            "Consumer connections of the group",
            "gauge",
            ["consumer_group"],
            (([g], float(len(cm.conn_ids(g)))) for g in sorted(cm.groups)),
        )
        pm = self.producer_manager
        snap.add(
            "rocketmq_producer_connections",
            "Producer connections of the group",
            "gauge",
            ["producer_group"],
            (([g], float(len(c))) for g, c in sorted(pm.groups.items())),
        )
        return snap

    def _wrap_sync(self, code: int, handler: SyncHandler, wrapped: Handler) -> SyncHandler:
        """``wrap`` for a handler that never waits, when the store is not durable (no barrier to wait
        for): answered from one callback. A request whose code has a fault set goes the coroutine way,
        on a task (the fault may hold it for a latency)."""

        def wrapped_sync(conn: Connection, cmd: RemotingCommand) -> Any:
            faults = self.faults
            if faults.codes and cmd.code in faults.codes:
                return wrapped(conn, cmd)
            self._check_access(conn, cmd, code)
            try:
                return handler(conn, cmd)
            except StoreError as exc:
                raise CommandError(ResponseCode.SERVICE_NOT_AVAILABLE, str(exc)) from None

        return wrapped_sync

    def _check_access(self, conn: Connection, cmd: RemotingCommand, code: int) -> None:
        if self.acl is not None and code != RequestCode.GET_ROUTEINFO_BY_TOPIC:
            # (route lookups belong to the name server, which in RocketMQ 4.9 checks no ACL)
            try:
                self.acl.validate(conn.remote_addr, cmd)
            except AclDenied as exc:
                self._refused(conn, cmd, str(exc))
        elif cmd.code in ADMIN_CODES and not self.admin_from_any and not is_loopback(conn.remote_addr):
            self._refused(conn, cmd, f"request code {cmd.code} is accepted from loopback only (--admin-from)")

    def _refused(self, conn: Connection, cmd: RemotingCommand, reason: str) -> None:
        self.log.emit("request_refused", request_code=cmd.code, client_addr=conn.remote_addr, reason=reason)
        raise CommandError(ResponseCode.NO_PERMISSION, reason)

    async def _durable_barrier(self, conn: Connection, durable: bool) -> None:
        # An answer on a connection implies that every offset it committed before is on disk.
        if durable:
            seq = conn.attrs.get(ATTR_WRITE_SEQ, 0)
            if seq > self.store.committed_seq or self.store.is_rejected(seq):
                await self.store.wait_durable(seq)

    def note_write(self, conn: Connection, seq: int) -> None:
        if seq:
            conn.attrs[ATTR_WRITE_SEQ] = seq

    async def _apply_fault(self, conn: Connection, cmd: RemotingCommand) -> Any:
        group = client_id = None
        if self.faults.needs_identity(cmd.code):
            group, client_id = request_identity(conn, cmd)
        action, ended = self.faults.match(cmd.code, group, client_id, self.clock.monotonic_ms())
        for f in ended:
            self.log.emit(
                "fault_cleared", fault_id=f.fault_id, request_code=f.request_code, reason="exhausted"
            )
        if action is not None and action.latency_ms > 0:
            await asyncio.sleep(action.latency_ms / 1000)
        return action

    async def unsupported(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        raise CommandError(ResponseCode.REQUEST_CODE_NOT_SUPPORTED, f"request code {cmd.code} not supported")

    # -- connections ------------------------------------------------------------------------
    def _on_connection_opened(self, conn: Connection) -> None:
        self.connections[conn.id] = conn

    def _on_connection_closed(self, conn: Connection) -> None:
        """ClientHousekeepingService#onChannelClose: the connection leaves every consumer group (whose
        remaining members are told, see ``broker.consumer_manager``), producer group and held pull."""
        self.connections.pop(conn.id, None)
        for group, info in self.consumer_manager.do_channel_close_event(conn.id):
            self.consumer_ids_listener.consumer_unregistered(
                group, info.client_id, "channel_closed", info.client_addr
            )
            self.consumer_ids_listener.notify_group(group, "channel_closed")
            self.forget_group(group)
        self.producer_manager.do_channel_close_event(conn.id)
        for req in self.hold_service.remove_connection(conn.id):
            _wake(req, "closed")
        self.pop_polling.wake_connection(conn.id)
        if self.release_locks_on_close:
            for group, client_id in conn.attrs.get(ATTR_GROUPS, {}).items():
                gi = self.consumer_manager.find(group)
                if gi is not None and gi.has_client(client_id):
                    continue  # the client is still connected over another connection
                for mq in self.lock_manager.release_client(group, client_id):
                    self.emit_lock("lock_released", group, client_id, mq, reason="channel_closed")
        if self.namesrv_processor is not None:
            self.namesrv_processor.on_connection_closed(conn)
        slave_addr = conn.attrs.get(ATTR_HA_SLAVE)
        if slave_addr is not None and conn.id in self.ha_progress.slaves:
            self.ha_progress.remove(conn.id)
            self.log.emit(
                "ha_slave_disconnected",
                broker=self.config.broker_name,
                slave_addr=slave_addr,
                reason="closed",
            )

    async def _idle_loop(self) -> None:
        """Close connections idle (no read, no write) for serverChannelMaxIdleTimeSeconds."""
        loop = asyncio.get_running_loop()
        idle_s = self.config.scaled_s(self.config.server_channel_max_idle_time_ms)
        while True:
            now = loop.time()
            next_check = now + idle_s
            for conn in list(self.connections.values()):
                due = conn.last_activity + idle_s
                if due <= now:
                    if not conn.closed:
                        self.log.warning("closing an idle connection", peer=conn.remote_addr)
                        conn.close()
                else:
                    next_check = min(next_check, due)
            await asyncio.sleep(max(0.001, next_check - loop.time()))

    # -- events ------------------------------------------------------------------------
    def emit_lock(self, event: str, group: str, client_id: str, mq: Any, **extra: Any) -> None:
        self.log.emit(
            event,
            group=group,
            client_id=client_id,
            topic=mq.topic,
            broker=mq.broker_name,
            queue_id=mq.queue_id,
            **extra,
        )

    def commit_offset(self, conn: Connection, group: str, topic: str, queue_id: int, offset: int) -> None:
        prev = self.offset_manager.commit_offset(group, topic, queue_id, offset)
        if self.config.flush_consumer_offset_interval_ms > 0:
            self._unflushed_offsets[(group, topic, queue_id)] = offset
        else:
            self.note_write(conn, self.store.persist_offset(group, topic, queue_id, offset))
        # Only a change is an event: a consumer's persistAll re-sends every queue's offset each 5 s
        # whether it moved or not, and those repeats were half of a run's lines with nothing to tell.
        if offset != prev:
            self.log.emit(
                "offset_committed",
                group=group,
                topic=topic,
                queue_id=queue_id,
                offset=offset,
                broker=self.config.broker_name,
                broker_id=self.config.broker_id,
            )

    def forget_group(self, group: str) -> None:
        """A group that left (no consumer registered any more) takes its retry topic along, unless that
        holds messages: junk group names must not leave a topic each behind. (RocketMQ keeps them; a
        retry that comes due later re-creates the topic, see deliver_due_messages.)"""
        if self.consumer_manager.find(group) is not None:
            return
        topic = retry_topic(group)
        tc = self.topic_manager.select(topic)
        if tc is None or any(self.store.get_max_offset(topic, q) > 0 for q in range(tc.write_queue_nums)):
            return
        self.topic_manager.remove(topic)
        self.store.persist_topic_removal(topic)
        self.log.emit("topic_removed", topic=topic, reason="group_left", group=group)
        self._register_event.set()

    def flush_consumer_offsets(self) -> int:
        """Write the offsets committed since the last flush (ConsumerOffsetManager#persist)."""
        pending, self._unflushed_offsets = self._unflushed_offsets, {}
        for (group, topic, queue_id), offset in pending.items():
            self.store.persist_offset(group, topic, queue_id, offset)
        if pending:
            self.log.emit("offsets_flushed", count=len(pending))
        return len(pending)

    async def _offset_flush_loop(self) -> None:
        cfg = self.config
        loop = asyncio.get_running_loop()
        period = cfg.scaled_s(cfg.flush_consumer_offset_interval_ms)
        due = loop.time() + cfg.scaled_s(cfg.flush_consumer_offset_first_delay_ms)
        while True:  # scheduleAtFixedRate: the period counts from the previous start, not its end
            await asyncio.sleep(max(0.0, due - loop.time()))
            due += period
            try:
                self.flush_consumer_offsets()
            except StoreError as exc:
                self.log.error("offset flush failed", error=str(exc))

    def topic_created(self, tc: TopicConfig, conn: Connection | None = None) -> None:
        seq = self.store.persist_topic(tc)
        if conn is not None:
            self.note_write(conn, seq)
        self.log.emit(
            "topic_created",
            topic=tc.topic_name,
            read_queue_nums=tc.read_queue_nums,
            write_queue_nums=tc.write_queue_nums,
            perm=tc.perm,
        )
        self._register_event.set()  # publish the new topic to the name server now, as RocketMQ does

    # -- long polling ------------------------------------------------------------------------
    def _on_message_arrived(self, msg: StoredMessage) -> None:
        msg.log_end = self.replication_log.append(msg, len(msg.body))
        if self._growth_waiters:
            waiters, self._growth_waiters = self._growth_waiters, []
            for fut in waiters:
                if not fut.done():
                    fut.set_result(None)
        if msg.topic == SCHEDULE_TOPIC:
            self._schedule_event.set()
            return
        if self.pop_polling.table:
            self.pop_polling.notify(msg.topic, msg.queue_id)
        if len(self.hold_service):
            for req in self.hold_service.notify_message_arriving(
                msg.topic, msg.queue_id, msg.queue_offset + 1, msg.tags, self.clock.monotonic_ms()
            ):
                _wake(req, "arrived")

    def hold_pull(self, req: HeldPull) -> None:
        self.hold_service.suspend_pull_request(req)

    async def _hold_loop(self) -> None:
        interval = self.config.scaled_s(self.config.hold_check_interval_ms)
        while True:
            await asyncio.sleep(interval)
            try:
                for req in self.hold_service.check_hold_request(
                    self.clock.monotonic_ms(), self.store.get_max_offset
                ):
                    _wake(req, "checked")
            except Exception as exc:
                self.log.error("hold check failed", error=repr(exc))

    # -- RocketMQ 5: POP revive, request modes, routes for assignment -------------------------------
    async def _revive_loop(self) -> None:
        interval = self.config.scaled_s(self.config.revive_interval_ms)
        while True:
            await asyncio.sleep(interval)
            if not len(self.pop_state):
                continue
            try:
                await self.pop_processor.revive()
            except StoreError as exc:
                self.log.error("pop revive failed", error=str(exc))
            except Exception as exc:
                self.log.error("pop revive failed", error=repr(exc))

    def _request_modes_path(self) -> str | None:
        return (
            os.path.join(self.config.store_dir, "messageRequestMode.json") if self.config.store_dir else None
        )

    def _load_request_modes(self) -> MessageRequestModeTable:
        path = self._request_modes_path()
        if path is None:
            return MessageRequestModeTable()
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except FileNotFoundError:
            return MessageRequestModeTable()
        try:
            return MessageRequestModeTable.decode(text, path)
        except ValueError as exc:
            raise StoreError(str(exc)) from None

    async def persist_request_modes(self) -> None:
        """MessageRequestModeManager#persist: the whole table, replaced atomically (with --store-dir)."""
        path = self._request_modes_path()
        if path is None:
            return
        text = self.request_modes.encode()

        def write() -> None:
            tmp = path + ".tmp"
            with open(tmp, "w", encoding="utf-8") as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)

        try:
            await asyncio.to_thread(write)
        except OSError as exc:
            raise StoreError(f"cannot write {path}: {exc}") from None

    async def topic_subscribe_info(self, topic: str) -> frozenset[MessageQueue] | None:
        """TopicRouteInfoManager#getTopicSubscribeInfo: the readable queues of every broker in the name
        server's route for ``topic``, fetched on first use and again once older than
        loadBalancePollNameServerInterval; None when the name server has no route."""
        now = self.clock.monotonic_ms()
        cached = self._subscribe_info.get(topic)
        if cached is not None and now - cached[1] < self.config.scaled(
            self.config.load_balance_poll_name_server_interval_ms
        ):
            return cached[0]
        body: Any = None
        if self.namesrv_processor is not None:
            await self.register_broker_all()  # the embedded name server sees this broker's latest topics
            assert self.route_info is not None
            body = self.route_info.pickup_topic_route_data(topic)
        else:
            if self._namesrv_client is None:
                self._namesrv_client = RemotingClient(
                    max_frame_bytes=self.config.max_frame_bytes, log=self.log
                )
            req = RemotingCommand.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": topic})
            try:
                resp = await self._namesrv_client.invoke(
                    self.config.namesrv, req, max(1.0, self.config.scaled_s(3_000))
                )
            except (RemotingError, OSError) as exc:
                self.log.warning("route lookup for assignment failed", topic=topic, error=str(exc))
                return cached[0] if cached is not None else None
            body = resp.body if resp.code == ResponseCode.SUCCESS else None
        queues: frozenset[MessageQueue] | None = None
        if body is not None:
            try:
                queues = TopicRouteData.from_wire(body).subscribe_queues(topic)
            except WireError as exc:
                self.log.warning("bad route for assignment", topic=topic, error=str(exc))
        self._subscribe_info[topic] = (queues, now)
        return queues

    # -- housekeeping ------------------------------------------------------------------------
    async def _scan_loop(self) -> None:
        interval = self.config.scaled_s(self.config.scan_not_active_channel_interval_ms)
        while True:
            await asyncio.sleep(interval)
            try:
                self.scan_not_active_channel()
                self.ha_housekeeping(self.clock.monotonic_ms())
                for f in self.faults.sweep(self.clock.monotonic_ms()):
                    self.log.emit(
                        "fault_cleared", fault_id=f.fault_id, request_code=f.request_code, reason="expired"
                    )
            except Exception as exc:
                self.log.error("channel scan failed", error=repr(exc))

    def scan_not_active_channel(self) -> None:
        now = self.clock.monotonic_ms()
        timeout = self.config.channel_expired_timeout
        to_close: set[int] = set()
        notify: set[str] = set()
        for group, info in self.consumer_manager.scan_not_active_channel(now, timeout):
            self.consumer_ids_listener.consumer_unregistered(
                group, info.client_id, "channel_expired", info.client_addr
            )
            to_close.add(info.conn_id)
            notify.add(group)
            self.forget_group(group)
        for _, info in self.producer_manager.scan_not_active_channel(now, timeout):
            to_close.add(info.conn_id)
        for conn_id in to_close:
            conn = self.connections.get(conn_id)
            if conn is not None:
                conn.close()
        if self.notify_on_channel_expired:
            for group in notify:
                self.consumer_ids_listener.notify_group(group, "channel_expired")

    # -- scheduled retries ------------------------------------------------------------------------
    async def _schedule_loop(self) -> None:
        while True:
            try:
                await self.deliver_due_messages()
                nxt = self.schedule_service.next_due_ms(self.store)
            except StoreError as exc:
                self.log.error("scheduled delivery failed", error=str(exc))
                nxt = self.clock.now_ms() + 1000
            except Exception as exc:
                self.log.error("scheduled delivery failed", error=repr(exc))
                nxt = self.clock.now_ms() + 1000
            timeout = None if nxt is None else max(0.0, (nxt - self.clock.now_ms()) / 1000)
            self._schedule_event.clear()
            if timeout is None or timeout > 0:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(timeout):
                        await self._schedule_event.wait()

    async def deliver_due_messages(self) -> int:
        delivered = 0
        while True:
            due = self.schedule_service.due(self.store, self.clock.now_ms())
            if not due:
                return delivered
            for level, msg in due:
                draft = self.schedule_service.real_draft(msg)
                if self.topic_manager.select(draft.topic) is None and is_retry_topic(draft.topic):
                    tc, created = self.topic_manager.create_retry_topic(
                        draft.topic.removeprefix("%RETRY%"), self.config.retry_queue_nums
                    )
                    if created:
                        self.topic_created(tc)
                await self.store.put_message(draft)
                offset = self.schedule_service.mark_delivered(level, msg)
                self.store.persist_offset(SCHEDULE_GROUP, SCHEDULE_TOPIC, level, offset)
                delivered += 1

    # -- name server ------------------------------------------------------------------------
    def topic_config_table(self) -> dict[str, Any]:
        return {t: tc.to_wire() for t, tc in self.topic_manager.table.items()}

    def _register_broker_request(self) -> RemotingCommand:
        cfg = self.config
        ext: dict[str, Any] = {
            "brokerName": cfg.broker_name,
            "brokerAddr": self.broker_addr,
            "clusterName": cfg.cluster_name,
            "brokerId": cfg.broker_id,
        }
        if self.native_addr:
            ext["nativeAddr"] = self.native_addr
        if self.replicas is not None:
            # DataVersion.stateVersion = the master epoch: the name server ignores a deposed master
            ext["stateVersion"] = self.replicas.master_epoch
        return RemotingCommand.request(
            RequestCode.REGISTER_BROKER, ext, {"topicConfigTable": self.topic_config_table()}
        )

    def _unregister_broker_request(self) -> RemotingCommand:
        cfg = self.config
        return RemotingCommand.request(
            RequestCode.UNREGISTER_BROKER,
            {
                "brokerName": cfg.broker_name,
                "brokerAddr": self.broker_addr,
                "clusterName": cfg.cluster_name,
                "brokerId": cfg.broker_id,
            },
        )

    async def register_broker_all(self) -> bool:
        cfg = self.config
        if self.namesrv_processor is not None:
            topics = {
                t: QueueData(cfg.broker_name, tc.read_queue_nums, tc.write_queue_nums, tc.perm)
                for t, tc in self.topic_manager.table.items()
            }
            master = self.namesrv_processor.register_local(
                cfg.cluster_name,
                cfg.broker_name,
                self.broker_addr,
                cfg.broker_id,
                topics,
                None,
                self.native_addr,
            )
            self._set_master_addr(master)
            return True
        if self._namesrv_client is None:
            self._namesrv_client = RemotingClient(max_frame_bytes=cfg.max_frame_bytes, log=self.log)
        timeout = max(1.0, cfg.scaled_s(6_000))  # registerBrokerTimeoutMills
        try:
            resp = await self._namesrv_client.invoke(cfg.namesrv, self._register_broker_request(), timeout)
        except (RemotingError, OSError) as exc:
            self.log.warning("register to name server failed", namesrv=cfg.namesrv, error=str(exc))
            return False
        if resp.code != ResponseCode.SUCCESS:
            self.log.warning(
                "register to name server refused", namesrv=cfg.namesrv, code=resp.code, remark=resp.remark
            )
            return False
        master = resp.ext.get("masterAddr")
        self._set_master_addr(master if isinstance(master, str) and master else None)
        return True

    def _set_master_addr(self, master: str | None) -> None:
        """SlaveSynchronize#setMasterAddr after each registration (None when the master is gone); in
        controller mode the controller names the master instead."""
        if self.slave is None or self.replicas is not None or master == self.slave.master_addr:
            return
        self.slave.master_addr = master
        self.log.emit(
            "master_addr_changed",
            broker=self.config.broker_name,
            broker_id=self.config.broker_id,
            master_addr=master,
        )

    # -- HA: the master's side ------------------------------------------------------------------------
    def ha_report(self, conn: Connection, slave_addr: str, index: int, slave_id: int | None = None) -> None:
        """An HA_TRANSFER said what the slave on ``conn`` holds: the sends waiting for it may answer."""
        now = self.clock.monotonic_ms()
        new = conn.id not in self.ha_progress.slaves
        for fut in self.ha_progress.report(conn.id, self.replication_log.position_of(index), now):
            assert isinstance(fut, asyncio.Future)
            if not fut.done():
                fut.set_result(None)
        if new:
            conn.attrs[ATTR_HA_SLAVE] = slave_addr
            self.log.emit("ha_slave_connected", broker=self.config.broker_name, slave_addr=slave_addr)
        if self.replicas is not None and slave_id is not None:
            self.replicas.slave_reported(slave_id, index >= len(self.replication_log), now)

    def ha_housekeeping(self, now_ms: int) -> None:
        """Close the HA connections of slaves silent past haHousekeepingInterval, as HAConnection does."""
        for conn_id in self.ha_progress.expire_silent(now_ms):
            conn = self.connections.get(conn_id)
            slave_addr = conn.attrs.get(ATTR_HA_SLAVE) if conn is not None else None
            self.log.emit(
                "ha_slave_disconnected",
                broker=self.config.broker_name,
                slave_addr=slave_addr,
                reason="silent",
            )
            if conn is not None:
                conn.close()

    def rebuild_replication_log(self, keep: Any) -> None:
        """The log without the messages ``keep`` refuses (a slave's truncated tail), positions recounted."""
        log = ReplicationLog()
        for m in self.replication_log.entries:
            if keep(m):
                m.log_end = log.append(m, len(m.body))  # type: ignore[attr-defined]
        self.replication_log = log

    async def wait_log_growth(self, length: int, timeout_s: float) -> None:
        """Return once the log is longer than ``length`` or ``timeout_s`` passed (WriteSocketService's
        wait for new data; an empty answer then is the heartbeat)."""
        if len(self.replication_log) > length:
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._growth_waiters.append(fut)
        try:
            async with asyncio.timeout(timeout_s):
                await fut
        except TimeoutError:
            pass
        finally:
            if fut in self._growth_waiters:
                self._growth_waiters.remove(fut)

    async def wait_replica(self, msg: StoredMessage) -> ResponseCode:
        """CommitLog#submitReplicaRequest: on a SYNC_MASTER, SUCCESS once a slave holds ``msg``;
        SLAVE_NOT_AVAILABLE when no slave is connected or it is too far behind; FLUSH_SLAVE_TIMEOUT after
        slaveTimeout."""
        if self.role is not BrokerRole.SYNC_MASTER:
            return ResponseCode.SUCCESS
        if self.replicas is not None and len(self.replicas.sync_state_set) <= 1:
            # controller mode acknowledges once the SyncStateSet has it (allAckInSyncStateSet): a master
            # alone in its set has it already
            return ResponseCode.SUCCESS
        now = self.clock.monotonic_ms()
        self.ha_housekeeping(now)
        if not self.ha_progress.is_slave_ok(msg.log_end, now):
            code = ResponseCode.SLAVE_NOT_AVAILABLE
        else:
            fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            if not self.ha_progress.wait_for(msg.log_end, fut):
                return ResponseCode.SUCCESS
            try:
                async with asyncio.timeout(self.config.scaled_s(self.config.slave_timeout_ms)):
                    await fut
                return ResponseCode.SUCCESS
            except TimeoutError:
                self.ha_progress.cancel(fut)
                code = ResponseCode.FLUSH_SLAVE_TIMEOUT
        self.log.emit(
            "replica_wait_failed",
            broker=self.config.broker_name,
            topic=msg.topic,
            queue_id=msg.queue_id,
            queue_offset=msg.queue_offset,
            msg_id=msg.msg_id,
            code=int(code),
        )
        return code

    async def _register_loop(self) -> None:
        interval = self.config.scaled_s(self.config.register_broker_interval_ms)
        if self.replicas is not None:
            await self.replicas.role_known.wait()
        while True:
            self._register_event.clear()
            try:
                await self.register_broker_all()
            except Exception as exc:
                self.log.error("register broker failed", error=repr(exc))
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(interval):
                    await self._register_event.wait()

    async def _namesrv_scan_loop(self) -> None:
        assert self.namesrv_processor is not None
        interval = self.config.scaled_s(10_000)
        timeout = self.config.scaled(120_000)
        while True:
            await asyncio.sleep(interval)
            try:
                self.namesrv_processor.scan_not_active_broker(timeout)
            except Exception as exc:
                self.log.error("broker scan failed", error=repr(exc))

    # -- controller mode: role changes (ReplicasManager#changeToMaster / changeToSlave) ---------------------
    def log_max_offset(self) -> int:
        return self.replication_log.max_position

    def change_to_master(self, master_epoch: int) -> None:
        """The controller elected this broker: brokerId 0 in the route, writable, a new replication run
        (its slaves copy from the start and keep what they lack), the master's own services."""
        self._cancel_role_tasks()
        old_slave, self.slave = self.slave, None
        if old_slave is not None:
            self._spawn_role(old_slave.close())
        self.role = self._master_role
        self.config = replace(self.config, broker_id=0)
        self.ha_epoch = self.clock.now_ms()
        # the epoch's start (RocketMQ's EpochEntry, per queue): a slave cuts its log back to it
        self.epoch_start_offsets = [
            [topic, qid, cq.max_offset] for (topic, qid), cq in sorted(self.store.queues.items())
        ]
        self._spawn_role(self._schedule_loop())
        self._spawn_role(self._revive_loop())
        self._role_changed(master_epoch, self.broker_addr)
        self._register_event.set()

    def change_to_slave(self, master_addr: str, master_id: int, master_epoch: int) -> None:
        """Another broker is master: this one registers under its brokerControllerId, takes no writes,
        copies the master's messages and syncs its tables (its consumer offsets are the master's after
        the first sync)."""
        assert self.replicas is not None
        self._cancel_role_tasks()
        self.role = BrokerRole.SLAVE
        self.config = replace(self.config, broker_id=self.replicas.controller_id)
        if self.slave is None:
            self.slave = SlaveService(self)
        self.slave.master_addr = master_addr
        self._spawn_role(self.slave.replicate_loop())
        self._spawn_role(self.slave.sync_loop())
        self._role_changed(master_epoch, master_addr)
        self._register_event.set()

    def _role_changed(self, master_epoch: int, master_addr: str) -> None:
        assert self.replicas is not None
        self.log.emit(
            "broker_role_changed",
            broker=self.config.broker_name,
            broker_id=self.config.broker_id,
            controller_id=self.replicas.controller_id,
            broker_role=self.role.value,
            master_epoch=master_epoch,
            master_addr=master_addr,
        )

    def _spawn_role(self, coro: Any) -> None:
        self._role_tasks.append(asyncio.get_running_loop().create_task(coro))

    def _cancel_role_tasks(self) -> None:
        for task in self._role_tasks:
            task.cancel()
        self._role_tasks = [t for t in self._role_tasks if not t.done()]

    async def _stop_role_tasks(self) -> None:
        self._cancel_role_tasks()
        for task in self._role_tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._role_tasks = []

    # -- status ------------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        cfg = self.config
        return {
            "brokerName": cfg.broker_name,
            "brokerId": cfg.broker_id,
            "brokerRole": self.role.value,
            "masterAddr": self.slave.master_addr if self.slave is not None else None,
            "controllerMode": self.replicas is not None,
            "masterEpoch": self.replicas.master_epoch if self.replicas is not None else None,
            "haSlaves": self.ha_progress.connection_count(self.clock.monotonic_ms()),
            "clusterName": cfg.cluster_name,
            "addr": self.address,
            "brokerAddr": self.broker_addr,
            "topics": len(self.topic_manager.table),
            "messages": self.store.message_count(),
            "groups": len(self.consumer_manager.groups),
            "consumers": self.consumer_manager.channel_count(),
            "producerGroups": len(self.producer_manager.groups),
            "connections": len(self.connections),
            "locks": self.lock_manager.lock_count(),
            "heldPulls": len(self.hold_service),
            "heldPops": len(self.pop_polling),
            "popCheckpoints": len(self.pop_state),
            "popInFlight": self.pop_state.in_flight(),
            "scheduledMessages": self.schedule_service.pending(self.store),
            "faults": len(self.faults),
            "notifyEnabled": self.consumer_ids_listener.enabled,
            "notifyOnChannelExpired": self.notify_on_channel_expired,
            "releaseLocksOnChannelClose": self.release_locks_on_close,
            "storeDir": cfg.store_dir,
            "durable": self.store.durable,
            "namesrv": cfg.namesrv,
            "timeScale": cfg.time_scale,
            "uptimeMs": self.clock.monotonic_ms() - self._started_ms,
        }


def _wake(req: HeldPull, why: str) -> None:
    fut = req.waiter
    if fut is not None and not fut.done():
        fut.set_result(why)


def request_identity(conn: Connection, cmd: RemotingCommand) -> tuple[str | None, str | None]:
    """Best-effort (group, client id) of a request, for faults limited to one group or client."""
    ext = cmd.ext
    body = cmd.body if isinstance(cmd.body, dict) else {}
    group: Any = ext.get("consumerGroup") or ext.get("group") or ext.get("producerGroup")
    if group is None:
        group = body.get("consumerGroup")
    if group is None:
        for key in ("consumerDataSet", "producerDataSet"):
            items = body.get(key)
            if isinstance(items, list) and items and isinstance(items[0], dict):
                group = items[0].get("groupName")
                break
    client: Any = ext.get("clientID") or body.get("clientID") or body.get("clientId")
    if client is None:
        groups = conn.attrs.get(ATTR_GROUPS, {})
        client = groups.get(group) if isinstance(group, str) else None
        client = client or conn.attrs.get(ATTR_CLIENT_ID)
    return (group if isinstance(group, str) else None, client if isinstance(client, str) else None)
