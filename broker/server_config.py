"""Broker and name-server configuration: one frozen dataclass per role with RocketMQ's defaults.

Every interval and timeout is given in RocketMQ's milliseconds and read through ``scaled``
(``protocol.clock.TimeScale``, as the client configuration does) so that a single ``time_scale`` speeds
the whole process up without changing the ratios between its timers.
"""

from __future__ import annotations

from dataclasses import dataclass

from rmqlab.protocol.clock import TimeScale
from rmqlab.protocol.command import DEFAULT_MAX_FRAME_BYTES

# RocketMQ's messageDelayLevel: "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h".
DELAY_LEVELS_MS: tuple[int, ...] = (
    1_000,
    5_000,
    10_000,
    30_000,
    60_000,
    120_000,
    180_000,
    240_000,
    300_000,
    360_000,
    420_000,
    480_000,
    540_000,
    600_000,
    1_200_000,
    1_800_000,
    3_600_000,
    7_200_000,
)


@dataclass(frozen=True, slots=True)
class BrokerConfig:
    """The broker's settings with RocketMQ's defaults; intervals in unscaled milliseconds."""

    broker_name: str = "broker-a"
    cluster_name: str = "DefaultCluster"
    broker_id: int = 0  # 0: the master; 1..N: a slave of the master with the same broker_name
    host: str = "127.0.0.1"
    port: int = 10911
    # Port published in the route (REGISTER_BROKER brokerAddr) when it differs from the listening port,
    # e.g. a fault relay in front of the broker. None: the listening port.
    advertised_port: int | None = None
    time_scale: float = 1.0
    store_dir: str | None = None
    namesrv: str = "embedded"
    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES
    auto_create_topic: bool = True
    default_topic_queue_nums: int = 4  # defaultTopicQueueNums
    max_message_size: int = 4 * 1024 * 1024  # maxMessageSize
    notify_consumer_ids_changed: bool = True  # notifyConsumerIdsChangedEnable; --disable-notify
    # A notify_sent event names the notified client ids up to this many; a larger group's event gives
    # only their number (client_count, always present): at thousands of members the lists were most of
    # the broker's log. None: always the list.
    notify_event_ids_max: int | None = 64
    # RocketMQ 5's broker rules instead of 4.9's: no NOTIFY for broadcasting groups (5.3.1), the retry/DLQ
    # rule of handleRetryAndDLQ (past max, or at once while the group holds locks), and
    # QUERY_CONSUMER_OFFSET answers QUERY_NOT_FOUND for a fresh, empty queue
    rocketmq5: bool = False
    # RocketMQ 5's server-side assignment (QueryAssignmentProcessor): the mode of a (topic, group) with no
    # stored one (defaultMessageRequestMode), its pop share number (defaultPopShareQueueNum), whether the
    # broker balances at all (serverLoadBalancerEnable), and how often the cached routes are refreshed
    # (loadBalancePollNameServerInterval).
    default_message_request_mode: str = "PULL"
    default_pop_share_queue_num: int = -1
    server_load_balancer_enable: bool = True
    load_balance_poll_name_server_interval_ms: int = 30_000
    revive_interval_ms: int = 1_000  # reviveInterval: how often POP checkpoints are checked for revive
    # What-if policies, off by default (RocketMQ's behaviour).
    notify_on_channel_expired: bool = False
    release_locks_on_close: bool = False
    # RocketMQ's intervals (ms, unscaled).
    channel_expired_timeout_ms: int = 120_000
    scan_not_active_channel_interval_ms: int = 10_000
    # NettyServerConfig.serverChannelMaxIdleTimeSeconds: a connection without a read or a write for this
    # long is closed (the Netty idle handler), which drops its registrations like any close
    server_channel_max_idle_time_ms: int = 120_000
    lock_max_live_time_ms: int = 60_000
    register_broker_interval_ms: int = 30_000
    hold_check_interval_ms: int = 5_000  # PullRequestHoldService's wait when long polling is on
    # 0: every committed offset is durable before the connection's next answer (PROTOCOL.md). > 0:
    # RocketMQ's flushConsumerOffsetInterval (5000): offsets stay in memory and are written at this
    # fixed rate, the first time 10 s after start, so a kill -9 rolls them back.
    flush_consumer_offset_interval_ms: int = 0
    flush_consumer_offset_first_delay_ms: int = 10_000
    # Pull limits (maxTransferCountOnMessageInMemory / maxTransferBytesOnMessageInMemory) and the most
    # consume-queue entries one pull scans when a tag filter skips messages (maxFilterMessageCount).
    max_transfer_count: int = 32
    max_transfer_bytes: int = 256 * 1024
    max_filter_scan: int = 16_000
    retry_queue_nums: int = 1
    default_max_reconsume_times: int = 16
    delay_levels_ms: tuple[int, ...] = DELAY_LEVELS_MS
    # Master-slave HA (RocketMQ 4.x; broker/ha_state.py). brokerRole: ASYNC_MASTER, SYNC_MASTER or SLAVE (a
    # slave has broker_id >= 1). A slave copies its master's messages in order over HA_TRANSFER and its
    # consumer offsets, topic configs and delay offsets every 10 s (SlaveSynchronize, first after 3 s).
    broker_role: str = "ASYNC_MASTER"
    # messageStoreConfig.haMasterAddress: where a slave copies messages from; None: the masterAddr the
    # name server answers its registration with (the only source of SlaveSynchronize's master, as in
    # RocketMQ).
    ha_master_address: str | None = None
    # How long a slave holds each received batch before storing it: the replication lag of an
    # ASYNC_MASTER's slave (0: as fast as the transfer goes). A SYNC_MASTER's sends wait for it too.
    ha_replication_lag_ms: int = 0
    slave_timeout_ms: int = 3_000  # slaveTimeout: a SYNC_MASTER send waits this long (FLUSH_SLAVE_TIMEOUT)
    ha_send_heartbeat_interval_ms: int = 5_000  # haSendHeartbeatInterval: an idle transfer is answered
    ha_housekeeping_interval_ms: int = 20_000  # haHousekeepingInterval: a silent slave is disconnected
    ha_transfer_batch_bytes: int = 32 * 1024  # haTransferBatchSize
    ha_slave_fallbehind_max_bytes: int = 256 * 1024 * 1024  # haSlaveFallbehindMax
    ha_reconnect_interval_ms: int = 5_000  # HAClient waits this long after a failed transfer
    slave_sync_interval_ms: int = 10_000
    slave_sync_first_delay_ms: int = 3_000
    slave_read_enable: bool = False  # slaveReadEnable: pull answers may suggest the group's slave
    # The bytes behind the commit log's end beyond which a pull "reads from disk" and, with
    # slaveReadEnable, is told to pull from the slave: RocketMQ's accessMessageInMemoryMaxRatio (40) % of
    # the machine's RAM; here a setting (default: 40 % of 16 GiB).
    access_message_in_memory_max_bytes: int = 16 * 1024 * 1024 * 1024 * 40 // 100
    # SubscriptionGroupConfig's brokerId and whichBrokerWhenConsumeSlowly, one value for every group
    group_broker_id: int = 0
    which_broker_when_consume_slowly: int = 1
    offset_check_in_slave: bool = False  # offsetCheckInSlave
    # RocketMQ 5's controller mode (enableControllerMode; broker/replicas_manager.py): the controller, not
    # the configuration, makes this broker master or slave. broker_id then tells its brokerControllerId
    # (broker_id + 1) and whether it may ask to be the first master of its set (0) or waits for one;
    # broker_role is the role it takes as master.
    controller_mode: bool = False
    controller_addr: str | None = None  # controllerAddr; None: the name server (enableControllerInNamesrv)
    broker_heartbeat_interval_ms: int = 1_000  # brokerHeartbeatInterval
    controller_heartbeat_timeout_ms: int = 10_000  # controllerHeartBeatTimeoutMills
    sync_broker_metadata_period_ms: int = 5_000  # syncBrokerMetadataPeriod
    check_sync_state_set_period_ms: int = 5_000  # checkSyncStateSetPeriod
    ha_max_time_slave_not_catchup_ms: int = 15_000  # haMaxTimeSlaveNotCatchup
    # Hardening (not RocketMQ's; unscaled): a frame must arrive whole within this long of its first byte.
    partial_frame_timeout_ms: int = 10_000
    # Who may use the admin and fault codes (9000-9099) when ACL is off: "loopback" or "any".
    admin_from: str = "loopback"
    # plain_acl.yml: with it, every request is checked as RocketMQ's PlainAccessValidator does.
    acl_file: str | None = None

    def scaled(self, ms: int) -> int:
        return TimeScale(self.time_scale).whole_ms(ms)

    def scaled_s(self, ms: int) -> float:
        return self.scaled(ms) / 1000.0

    @property
    def channel_expired_timeout(self) -> int:
        return self.scaled(self.channel_expired_timeout_ms)

    @property
    def lock_max_live_time(self) -> int:
        return self.scaled(self.lock_max_live_time_ms)

    @property
    def scaled_delay_levels(self) -> tuple[int, ...]:
        return tuple(self.scaled(ms) for ms in self.delay_levels_ms)


@dataclass(frozen=True, slots=True)
class NamesrvConfig:
    """The name server's settings with RocketMQ's defaults; intervals in unscaled milliseconds."""

    host: str = "127.0.0.1"
    port: int = 9876
    time_scale: float = 1.0
    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES
    broker_channel_expired_ms: int = 120_000  # BROKER_CHANNEL_EXPIRED_TIME
    scan_not_active_broker_interval_ms: int = 10_000
    # RocketMQ 5's enableControllerInNamesrv: the controller (broker.replicas_controller) runs here
    enable_controller_in_namesrv: bool = False

    def scaled(self, ms: int) -> int:
        return TimeScale(self.time_scale).whole_ms(ms)
