"""Client configuration: RocketMQ's ClientConfig / DefaultMQPushConsumer / DefaultMQProducer defaults.

Every interval is stored in RocketMQ's milliseconds and read through ``ms()`` / ``seconds()``, which apply
the time scale, so a whole process runs faster or slower without changing the ratios between timers.
Times sent on the wire (``suspendTimeoutMillis``) are scaled too, because they are this process's timers
that the broker merely executes (PROTOCOL.md: a process's time scale applies to its own timers).

The 4.9 behaviour is the default; the ``*_5x`` style switches select the RocketMQ 5.x variants.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import time
import tomllib
from dataclasses import dataclass, fields
from typing import Any, ClassVar, Self

from rmqlab.client.versions import UnknownVersion, settings_for_version
from rmqlab.protocol.clock import TimeScale
from rmqlab.protocol.model import ConsumeFromWhere, MessageModel

# What ClientConfig.protocol takes (the clients' --protocol).
PROTOCOLS = ("msgpack", "native")


class ConfigError(ValueError):
    """A configuration value is unknown or out of RocketMQ's allowed range."""


@functools.lru_cache(maxsize=64)
def _local_time_ms(yyyymmddhhmmss: str) -> int:
    # Every new queue's computePullFromWhere asks for it: parsed once per string, not per queue.
    return int(time.mktime(time.strptime(yyyymmddhhmmss, "%Y%m%d%H%M%S")) * 1000)


def _default_consume_timestamp() -> str:
    # DefaultMQPushConsumer: half an hour ago as yyyyMMddHHmmss, local time (UtilAll.timeMillisToHumanString3)
    return time.strftime("%Y%m%d%H%M%S", time.localtime(time.time() - 30 * 60))


@dataclass(frozen=True, slots=True, kw_only=True)
class ClientConfig:
    """Settings shared by consumers and producers (RocketMQ's ClientConfig)."""

    # keys from_mapping takes besides the fields (a setting that stands for several)
    MAPPING_KEYS: ClassVar[tuple[str, ...]] = ()
    namesrv_addr: str = "127.0.0.1:9876"
    instance_name: str | None = None  # None: "pid#monotonic_ns" so that every process (and object) differs
    client_ip: str | None = None  # None: the first non-loopback IPv4
    # Seeds the client's random choices (which broker answers GET_CONSUMER_LIST_BY_GROUP); None: the OS's
    # entropy, as RocketMQ's. A simulation sets it so that a seed replays the same run.
    random_seed: int | None = None
    time_scale: float = 1.0
    poll_name_server_interval: int = 30_000
    heartbeat_broker_interval: int = 30_000
    persist_consumer_offset_interval: int = 5_000
    mq_client_api_timeout: int = 3_000
    mq_admin_timeout: int = 6_000  # MQAdminImpl.timeoutMillis: GET_MAX_OFFSET, SEARCH_OFFSET_BY_TIMESTAMP
    connect_timeout_millis: int = 3_000  # NettyClientConfig.connectTimeoutMillis
    # NettyClientConfig.clientCloseSocketIfTimeout: a timed-out synchronous call closes its connection
    client_close_socket_if_timeout: bool = True
    # >=4.9.0 (changeInstanceNameToPID): the default instance name is pid#nanoTime; before, the pid alone,
    # so that two containers with host networking (same IP, pid 1) had one client id (ISSUE #667, #2760)
    instance_name_with_nano_time: bool = True
    # >=5.2 (enableHeartbeatChannelEventListener): a new broker connection gets a heartbeat, then a rebalance
    heartbeat_on_connect: bool = False
    # effective value: DefaultMQPushConsumerImpl's own default is 3000, but its constructor copies the
    # consumer's ClientConfig value (1000) over it, in 4.9.8 as in 5.x
    pull_time_delay_mills_when_exception: int = 1_000
    # first runs of MQClientInstance.startScheduledTask
    poll_name_server_first_delay: int = 10
    heartbeat_first_delay: int = 1_000
    persist_consumer_offset_first_delay: int = 10_000
    # The wire to brokers and name servers: "msgpack" (PROTOCOL.md, the lab's servers) or "native"
    # (RocketMQ's own remoting protocol: Apache's broker and name server, or our servers' native ports).
    protocol: str = "msgpack"
    # ACL session credentials (AclClientRPCHook): with them every request is signed.
    access_key: str | None = None
    secret_key: str | None = None

    @property
    def scale(self) -> TimeScale:
        return TimeScale(self.time_scale)

    def ms(self, value_ms: float) -> float:
        """A RocketMQ interval in this process's (scaled) milliseconds."""
        # TimeScale's arithmetic without making one per call (every pull and request converts a timeout);
        # anything but a positive float goes through TimeScale, which converts it or refuses it
        factor = self.time_scale
        if type(factor) is not float or not factor > 0:
            return self.scale.ms(value_ms)
        return value_ms * factor

    def seconds(self, value_ms: float) -> float:
        """A RocketMQ interval in this process's (scaled) seconds, for asyncio timers."""
        factor = self.time_scale
        if type(factor) is not float or not factor > 0:
            return self.scale.seconds(value_ms)
        return value_ms * factor / 1000.0

    def replace(self, **changes: Any) -> Self:
        return dataclasses.replace(self, **changes)

    def validate(self) -> None:
        if not (isinstance(self.time_scale, int | float) and self.time_scale > 0):
            raise ConfigError(f"time_scale must be > 0, got {self.time_scale!r}")
        if not self.namesrv_addr or ":" not in self.namesrv_addr:
            raise ConfigError(f"namesrv_addr must be host:port, got {self.namesrv_addr!r}")
        if bool(self.access_key) != bool(self.secret_key):
            raise ConfigError("access_key and secret_key go together: give both or neither")
        if self.protocol not in PROTOCOLS:
            raise ConfigError(f"protocol must be one of {', '.join(PROTOCOLS)}, got {self.protocol!r}")
        if self.protocol == "native" and self.access_key:
            # our requests are signed over the msgpack content; RocketMQ's signature covers the native
            # header strings, which this client does not compute
            raise ConfigError("protocol native does not sign requests: access_key/secret_key need msgpack")
        for f in fields(self):
            v = getattr(self, f.name)
            if f.type in ("int",) and (isinstance(v, bool) or not isinstance(v, int)):
                raise ConfigError(f"{f.name} must be an int, got {v!r}")

    @classmethod
    def from_mapping(cls, data: dict[str, Any], **extra: Any) -> Self:
        """Build from a mapping (TOML table, parsed env); unknown keys are an error that names them."""
        known = {f.name for f in fields(cls)}
        merged = {**data, **extra}
        unknown = sorted(set(merged) - known)
        if unknown:
            raise ConfigError(f"unknown {cls.__name__} setting(s): {', '.join(unknown)}")
        cfg = cls(**merged)
        cfg.validate()
        return cfg

    @classmethod
    def from_env(cls, prefix: str = "RMQ_", environ: dict[str, str] | None = None) -> dict[str, Any]:
        """Settings from environment variables ``<prefix><FIELD>`` (e.g. RMQ_PULL_BATCH_SIZE=16)."""
        env = os.environ if environ is None else environ
        out: dict[str, Any] = {}
        for f in fields(cls):
            raw = env.get(prefix + f.name.upper())
            if raw is None:
                continue
            out[f.name] = _parse_scalar(f.name, f.type, raw)
        return out

    @classmethod
    def load_toml(cls, path: str, table: str | None = None) -> dict[str, Any]:
        with open(path, "rb") as fh:
            doc = tomllib.load(fh)
        if table is not None:
            doc = doc.get(table, {})
            if not isinstance(doc, dict):
                raise ConfigError(f"[{table}] in {path} is not a table")
        return doc


def _parse_scalar(name: str, typ: Any, raw: str) -> Any:
    t = str(typ)
    try:
        if t.startswith("bool"):
            low = raw.strip().lower()
            if low in ("1", "true", "yes", "on"):
                return True
            if low in ("0", "false", "no", "off"):
                return False
            raise ValueError(raw)
        if t.startswith("int"):
            return int(raw)
        if t.startswith("float"):
            return float(raw)
    except ValueError:
        raise ConfigError(f"{name}: cannot parse {raw!r} as {t}") from None
    return raw


def _check_range(name: str, value: int, lo: int, hi: int, *, allow: tuple[int, ...] = ()) -> None:
    if value in allow:
        return
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise ConfigError(f"{name} out of range [{lo}, {hi}]: {value!r}")


@dataclass(frozen=True, slots=True, kw_only=True)
class ConsumerConfig(ClientConfig):
    """DefaultMQPushConsumer / DefaultLitePullConsumer settings with RocketMQ's defaults."""

    MAPPING_KEYS: ClassVar[tuple[str, ...]] = ("client_version",)  # a release's behaviour switches
    message_model: MessageModel = MessageModel.CLUSTERING
    consume_from_where: ConsumeFromWhere = ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET
    consume_timestamp: str = dataclasses.field(default_factory=_default_consume_timestamp)
    consume_thread_min: int = 20
    consume_thread_max: int = 20
    consume_concurrently_max_span: int = 2_000
    pull_threshold_for_queue: int = 1_000
    pull_threshold_size_for_queue: int = 100  # MiB
    pull_threshold_for_topic: int = -1
    pull_threshold_size_for_topic: int = -1  # MiB
    pull_interval: int = 0
    consume_message_batch_max_size: int = 1
    pull_batch_size: int = 32
    post_subscription_when_pull: bool = False
    max_reconsume_times: int = -1  # -1: 16 concurrently, unlimited orderly
    suspend_current_queue_time_millis: int = 1_000
    consume_timeout: int = 15  # minutes
    await_termination_millis_when_shutdown: int = 0
    # RebalanceService / ProcessQueue / orderly constants (JVM system properties in RocketMQ)
    rebalance_wait_interval: int = 20_000
    rebalance_min_interval: int = 1_000
    pull_max_idle_time: int = 120_000
    lock_max_live_time: int = 30_000
    lock_interval: int = 20_000
    lock_first_delay: int = 1_000
    unlock_delay_time_mills: int = 20_000
    max_time_consume_continuously: int = 60_000
    # DefaultMQPushConsumerImpl constants
    broker_suspend_max_time_millis: int = 15_000
    consumer_timeout_millis_when_suspend: int = 30_000
    pull_time_delay_mills_when_cache_flow_control: int = 50
    pull_time_delay_mills_when_broker_flow_control: int = 20
    pull_time_delay_mills_when_suspend: int = 1_000
    offset_illegal_fix_delay: int = 10_000  # 4.9: executeTaskLater(10000) after OFFSET_ILLEGAL
    send_msg_back_timeout: int = 5_000
    lock_batch_timeout: int = 1_000
    query_offset_timeout: int = 5_000
    consume_resubmit_delay: int = 5_000  # local resubmit when a send-back failed
    # lite pull
    lite_pull_batch_size: int = 10
    poll_timeout_millis: int = 5_000
    auto_commit: bool = True
    auto_commit_interval_millis: int = 5_000
    pull_threshold_for_all: int = 10_000
    # local offset store (broadcasting); None: ~/.rocketmq_offsets
    local_offset_store_dir: str | None = None
    # Event volume in large groups (EVENTS.md): above this many members a ``rebalance`` event carries
    # ``cid_all_digest`` instead of ``cid_all`` (None: always the list), and with the second switch a
    # rebalance equal to the previous one for its topic (same members, same allocation) is left out.
    rebalance_event_digest_over: int | None = None
    omit_repeated_rebalance_events: bool = False
    # 4.9.x changes (on = 4.9.8; client.versions gives each release's values)
    lock_new_process_queue: bool = True  # >=4.9.5: a new ProcessQueue is created locked (ISSUE #2621)
    # RocketMQ 5.x behaviour switches (all off = 4.9)
    rebalance_retry_when_unbalanced: bool = False  # >=5.2: 1 s retry while a round is not balanced
    pull_request_dispatch_delay: int = 0  # >=5.0: 500 ms before a new queue's first pull
    orderly_unlock_5x: bool = False  # >=5.2: tryLock 500 ms + force unlock 20 s after the last lock
    rebalance_later_on_lock_failure: bool = False  # >=5.0: rebalanceLater(500) when an orderly lock failed
    offset_illegal_5x: bool = False  # >=5.2: fix the offset at once and wake the rebalance
    lock_in_broadcasting: bool = True  # <5.3.2: broadcasting orderly consumers also lock their queues
    query_offset_error_as_not_found: bool = True  # 4.9: any broker error on QUERY_CONSUMER_OFFSET reads as -1
    rebalance_at_start_needs_heartbeat: bool = False  # >=5.2: start rebalances only if a heartbeat went out
    lock_all_skips_dropped: bool = False  # >=5.0: lockAll/unlockAll leave out dropped process queues
    send_back_only_cached: bool = False  # >=5.1: failed messages no longer cached are not sent back
    mark_dropped_before_release: bool = False  # >=5.0: drop every leaving queue before releasing one
    message_queue_changed_without_route: bool = False  # >=5.0: messageQueueChanged({}, {}) without route
    # RocketMQ 5 server-side assignment (DefaultMQPushConsumer.clientRebalance, 5.x only): false asks the
    # broker (QUERY_ASSIGNMENT) and takes POP queues as the broker assigns them
    client_rebalance: bool = True
    pop_invisible_time: int = 60_000  # popInvisibleTime; outside [5 s, 300 s] it is taken as 60 s
    pop_batch_nums: int = 32  # popBatchNums
    pop_threshold_for_queue: int = 96  # popThresholdForQueue: popped messages not yet acked, per queue

    def validate(self) -> None:
        ClientConfig.validate(self)
        _check_range("consume_thread_min", self.consume_thread_min, 1, 1000)
        _check_range("consume_thread_max", self.consume_thread_max, 1, 1000)
        if self.consume_thread_min > self.consume_thread_max:
            raise ConfigError("consume_thread_min must be <= consume_thread_max")
        _check_range("consume_concurrently_max_span", self.consume_concurrently_max_span, 1, 65535)
        _check_range("pull_threshold_for_queue", self.pull_threshold_for_queue, 1, 65535)
        _check_range("pull_threshold_size_for_queue", self.pull_threshold_size_for_queue, 1, 1024)
        _check_range("pull_threshold_for_topic", self.pull_threshold_for_topic, 1, 6553500, allow=(-1,))
        _check_range(
            "pull_threshold_size_for_topic", self.pull_threshold_size_for_topic, 1, 102400, allow=(-1,)
        )
        _check_range("pull_interval", self.pull_interval, 0, 65535)
        _check_range("consume_message_batch_max_size", self.consume_message_batch_max_size, 1, 1024)
        _check_range("pull_batch_size", self.pull_batch_size, 1, 1024)
        _check_range("lite_pull_batch_size", self.lite_pull_batch_size, 1, 1024)
        _check_range("pop_batch_nums", self.pop_batch_nums, 1, 32)
        _check_range("pop_threshold_for_queue", self.pop_threshold_for_queue, 1, 65535)
        _check_range("pop_invisible_time", self.pop_invisible_time, 1, 2**31 - 1)
        if len(self.consume_timestamp) != 14 or not self.consume_timestamp.isdigit():
            raise ConfigError(f"consume_timestamp must be yyyyMMddHHmmss, got {self.consume_timestamp!r}")
        try:
            MessageModel(self.message_model)
            ConsumeFromWhere(self.consume_from_where)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None

    @classmethod
    def from_mapping(cls, data: dict[str, Any], **extra: Any) -> Self:
        """As ClientConfig's, and ``client_version = "4.9.4"`` stands for the behaviour switches of that
        release (client.versions); switches named beside it win."""
        merged = {**data, **extra}
        version = merged.pop("client_version", None)
        if version is not None:
            try:
                merged = {**settings_for_version(str(version)), **merged}
            except UnknownVersion as e:
                raise ConfigError(str(e)) from None
        # ClientConfig's own: zero-argument super() does not reach it from a slots dataclass
        return ClientConfig.from_mapping.__func__(cls, merged)  # type: ignore[attr-defined,no-any-return]

    def max_reconsume_times_concurrently(self) -> int:
        return 16 if self.max_reconsume_times == -1 else self.max_reconsume_times

    def max_reconsume_times_orderly(self) -> int:
        return 2**31 - 1 if self.max_reconsume_times == -1 else self.max_reconsume_times

    def consume_timestamp_ms(self) -> int:
        return _local_time_ms(self.consume_timestamp)

    @classmethod
    def rocketmq5(cls) -> dict[str, Any]:
        """The settings that select RocketMQ >=5.2 client behaviour instead of 4.9's."""
        return {
            "rebalance_retry_when_unbalanced": True,
            "pull_request_dispatch_delay": 500,
            "orderly_unlock_5x": True,
            "rebalance_later_on_lock_failure": True,
            "offset_illegal_5x": True,
            "lock_in_broadcasting": False,
            "query_offset_error_as_not_found": False,
            "rebalance_at_start_needs_heartbeat": True,
            "lock_all_skips_dropped": True,
            "send_back_only_cached": True,
            "mark_dropped_before_release": True,
            "message_queue_changed_without_route": True,
            "heartbeat_on_connect": True,
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class ProducerConfig(ClientConfig):
    """DefaultMQProducer settings with RocketMQ's defaults."""

    send_msg_timeout: int = 3_000
    retry_times_when_send_failed: int = 2
    retry_another_broker_when_not_store_ok: bool = False
    max_message_size: int = 4 * 1024 * 1024
    default_topic_queue_nums: int = 4
    create_topic_key: str = "TBW102"
    send_latency_fault_enable: bool = False
    # MQFaultStrategy tables; RocketMQ 4.9's values (5.x: 50,100,550,1800,3000,5000,15000 /
    # 0,0,2000,5000,6000,10000,30000)
    latency_max: tuple[int, ...] = (50, 100, 550, 1000, 2000, 3000, 15000)
    not_available_duration: tuple[int, ...] = (0, 0, 30000, 60000, 120000, 180000, 600000)
    isolation_latency: int = 30_000  # latency assumed for a failed send (5.x: 10000)

    def validate(self) -> None:
        ClientConfig.validate(self)
        _check_range("retry_times_when_send_failed", self.retry_times_when_send_failed, 0, 1000)
        _check_range("send_msg_timeout", self.send_msg_timeout, 1, 2**31 - 1)
        if len(self.latency_max) != len(self.not_available_duration):
            raise ConfigError("latency_max and not_available_duration must have the same length")
