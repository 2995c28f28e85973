"""What the request processors need from the broker, as one interface, so that they do not import the
``BrokerController`` that registers them: the managers, the store, the clock and event log, and the
broker-wide actions a request can cause (commit an offset, hold a pull ...), and the
``ConsumerIdsChangeListener`` that tells a group its members changed."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from rmqlab.broker.assignment import MessageRequestModeTable
from rmqlab.broker.consumer_manager import ConsumerIdsChangeListener, ConsumerManager, ProducerManager
from rmqlab.broker.faults import FaultTable
from rmqlab.broker.ha_state import BrokerRole, ReplicationLog
from rmqlab.broker.lock_manager import RebalanceLockManager
from rmqlab.broker.long_polling import HeldPull, PullRequestHoldService
from rmqlab.broker.offset_manager import ConsumerOffsetManager
from rmqlab.broker.pop_state import PopState
from rmqlab.broker.schedule import ScheduleMessageService
from rmqlab.broker.server_config import BrokerConfig
from rmqlab.broker.store import MemoryMessageStore
from rmqlab.broker.topic_config import TopicConfig, TopicConfigManager
from rmqlab.protocol.clock import Clock
from rmqlab.protocol.codes import ResponseCode
from rmqlab.protocol.command import RemotingCommand
from rmqlab.protocol.event_log import EventLog
from rmqlab.protocol.model import MessageQueue
from rmqlab.protocol.remoting import Connection, RemotingServer

Handler = Callable[[Connection, RemotingCommand], Awaitable[RemotingCommand | None]]

# Connection.attrs keys owned by the broker.
ATTR_CLIENT_ID = "client_id"  # clientID of the connection's last heartbeat
ATTR_GROUPS = "consumer_groups"  # group -> client id registered over this connection


class BrokerServices(Protocol):
    """The part of ``broker.controller.BrokerController`` the processors use."""

    config: BrokerConfig
    log: EventLog
    clock: Clock
    server: RemotingServer
    store: MemoryMessageStore
    consumer_manager: ConsumerManager
    consumer_ids_listener: ConsumerIdsChangeListener
    producer_manager: ProducerManager
    offset_manager: ConsumerOffsetManager
    lock_manager: RebalanceLockManager
    topic_manager: TopicConfigManager
    hold_service: PullRequestHoldService
    schedule_service: ScheduleMessageService
    faults: FaultTable
    notify_on_channel_expired: bool
    release_locks_on_close: bool
    pull_events: bool
    metrics: Any  # protocol.metrics.RoleMetrics, with --metrics-port; else None
    pop_state: PopState
    pop_polling: Any  # broker.processor.pop.PopLongPollingService
    request_modes: MessageRequestModeTable
    # master-slave HA (broker.ha): this broker's role, its commit-log order and the run slaves copy from
    role: BrokerRole
    replication_log: ReplicationLog
    ha_epoch: int
    # controller mode: each queue's end when this broker became master (its epoch's start), else None
    epoch_start_offsets: list[list[Any]] | None

    @property
    def broker_addr(self) -> str: ...

    def wrap(self, code: int, handler: Handler) -> Handler: ...

    async def unsupported(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand: ...

    def emit_lock(self, event: str, group: str, client_id: str, mq: Any, **extra: Any) -> None: ...

    def commit_offset(self, conn: Connection, group: str, topic: str, queue_id: int, offset: int) -> None: ...

    def topic_created(self, tc: TopicConfig, conn: Connection | None = None) -> None: ...

    def forget_group(self, group: str) -> None: ...

    def hold_pull(self, req: HeldPull) -> None: ...

    def status(self) -> dict[str, Any]: ...

    async def topic_subscribe_info(self, topic: str) -> frozenset[MessageQueue] | None: ...

    async def persist_request_modes(self) -> None: ...

    def ha_report(
        self, conn: Connection, slave_addr: str, index: int, slave_id: int | None = None
    ) -> None: ...

    async def wait_log_growth(self, length: int, timeout_s: float) -> None: ...

    def rebuild_replication_log(self, keep: Any) -> None: ...

    async def wait_replica(self, msg: Any) -> ResponseCode: ...
