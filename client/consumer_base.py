"""What push and lite-pull consumers share: configuration, client id, the MQClientInstance, the offset
store, subscriptions and the MQConsumerInner hooks the instance calls."""

from __future__ import annotations

import asyncio
from typing import Any

from client.allocate import AllocateMessageQueueStrategy, get_strategy
from client.config import ConfigError, ConsumerConfig
from client.errors import MQClientError
from client.instance import MQClientInstance, MQClientManager
from client.offset_store import LocalFileOffsetStore, OffsetStore, RemoteBrokerOffsetStore
from client.process_queue import PullRequest
from client.producer import check_topic
from client.rebalance import RebalanceImpl, shorts
from client.route import MASTER_ID, TopicRouteData
from protocol.model import (
    ConsumeFromWhere,
    ConsumerData,
    ConsumeType,
    MessageModel,
    MessageQueue,
    SubscriptionData,
    retry_topic,
)
from protocol.runtime import Clock, EventLog, SystemClock, build_client_id, new_instance_name


class _BrokerOffsetApi:
    """Routes RemoteBrokerOffsetStore's calls to the master of the queue's broker."""

    def __init__(self, consumer: ConsumerBase) -> None:
        self.consumer = consumer

    async def _addr(self, mq: MessageQueue, only_master: bool) -> str:
        inst = self.consumer.instance
        addr = await inst.find_broker_address_in_subscribe_or_update(
            mq.topic, mq.broker_name, MASTER_ID, only_master
        )
        if addr is None:
            raise MQClientError(f"the broker[{mq.broker_name}] not exist")
        return addr

    async def query_consumer_offset(self, mq: MessageQueue, group: str) -> int:
        cfg = self.consumer.config
        addr = await self._addr(mq, True)
        return await self.consumer.instance.api.query_consumer_offset(
            addr, group, mq, cfg.seconds(cfg.query_offset_timeout)
        )

    async def update_consumer_offset_oneway(self, mq: MessageQueue, group: str, offset: int) -> None:
        addr = await self._addr(mq, False)
        await self.consumer.instance.api.update_consumer_offset_oneway(addr, group, mq, offset)


DEFAULT_INSTANCE_NAME = "DEFAULT"


def normalize_enums(options: dict[str, Any]) -> dict[str, Any]:
    """Accept "clustering"/"broadcasting" and "first"/"last"/"timestamp" (or RocketMQ's names) as strings."""
    out = dict(options)
    mm = out.get("message_model")
    if isinstance(mm, str) and not isinstance(mm, MessageModel):
        try:
            out["message_model"] = MessageModel(mm.strip().upper())
        except ValueError:
            raise ConfigError(f"unknown message_model {mm!r} (CLUSTERING or BROADCASTING)") from None
    cfw = out.get("consume_from_where")
    if isinstance(cfw, str) and not isinstance(cfw, ConsumeFromWhere):
        out["consume_from_where"] = _parse_from_where(cfw)
    return out


def _coerce_config(
    namesrv: str | None, config: ConsumerConfig | None, options: dict[str, Any]
) -> ConsumerConfig:
    base: dict[str, Any] = {}
    if namesrv is not None:
        base["namesrv_addr"] = namesrv
    options = normalize_enums(options)
    if config is not None:
        cfg = config.replace(**base, **options)
        cfg.validate()
        return cfg
    return ConsumerConfig.from_mapping(base, **options)


def _parse_from_where(value: str) -> ConsumeFromWhere:
    v = value.strip().upper()
    short = {
        "FIRST": "CONSUME_FROM_FIRST_OFFSET",
        "LAST": "CONSUME_FROM_LAST_OFFSET",
        "TIMESTAMP": "CONSUME_FROM_TIMESTAMP",
    }
    try:
        return ConsumeFromWhere(short.get(v, v))
    except ValueError:
        raise ConfigError(f"unknown consume_from_where {value!r} (first, last, timestamp)") from None


class ConsumerBase:
    """State and MQConsumerInner hooks common to PushConsumer and LitePullConsumer."""

    consume_type = ConsumeType.CONSUME_PASSIVELY
    rebalance_class: type[RebalanceImpl] = RebalanceImpl

    def __init__(
        self,
        group: str,
        *,
        namesrv: str | None = None,
        strategy: str | AllocateMessageQueueStrategy = "AVG",
        strategy_options: dict[str, Any] | None = None,
        config: ConsumerConfig | None = None,
        log: EventLog | None = None,
        clock: Clock | None = None,
        **options: Any,
    ) -> None:
        if not isinstance(group, str) or not group.strip():
            raise MQClientError("consumer group must be a non-empty string")
        if group.startswith("%"):
            raise MQClientError(
                f"consumer group {group!r} must not start with '%' (reserved for system topics)"
            )
        self.group = group
        self.config = _coerce_config(namesrv, config, dict(options))
        if isinstance(strategy, str):
            self.strategy: AllocateMessageQueueStrategy = get_strategy(strategy, **(strategy_options or {}))
        else:
            self.strategy = strategy
        self.log = log or EventLog.null()
        self.clock = clock or SystemClock()
        # ClientConfig.instanceName is "DEFAULT" unless set; start() changes it to pid#nanos only for
        # CLUSTERING (changeInstanceNameToPID), so a broadcasting client is ip@DEFAULT across restarts
        self.instance_name = self.config.instance_name or DEFAULT_INSTANCE_NAME
        if self.instance_name == DEFAULT_INSTANCE_NAME and self.message_model is MessageModel.CLUSTERING:
            self.instance_name = new_instance_name()
        self.client_id = build_client_id(self.instance_name)
        self.instance: MQClientInstance = MQClientManager.get_or_create(
            self.config, self.client_id, self.log, self.clock
        )
        self.offset_store: OffsetStore
        if self.config.message_model is MessageModel.BROADCASTING:
            # keyed by the client id, so a restarted process with the same id finds its offsets again
            self.offset_store = LocalFileOffsetStore(
                group, self.client_id, self.config.local_offset_store_dir, log=self.log
            )
        else:
            self.offset_store = RemoteBrokerOffsetStore(
                group,
                _BrokerOffsetApi(self),
                log=self.log,
                broker_error_as_not_found=self.config.query_offset_error_as_not_found,
            )
        self.rebalance_impl = self.rebalance_class(self)
        self.pull_threshold_for_queue = self.config.pull_threshold_for_queue
        self.pull_threshold_size_for_queue = self.config.pull_threshold_size_for_queue
        self.consume_orderly = False
        self.running = False
        self.paused = False
        self._subscriptions: dict[str, str] = {}

    @property
    def message_model(self) -> MessageModel:
        return self.config.message_model

    def emit_queue_event(self, event: str, mq: MessageQueue, **fields: Any) -> None:
        """Write an event about one of this consumer's message queues (group, client id and the queue)."""
        self.log.emit(
            event,
            group=self.group,
            client_id=self.client_id,
            topic=mq.topic,
            broker=mq.broker_name,
            queue_id=mq.queue_id,
            **fields,
        )

    # -- subscriptions --------------------------------------------------------------------------------
    def subscribe(self, topic: str, expression: str | None = "*") -> None:
        check_topic(topic)
        expr = (expression or "*").strip() or "*"
        self._subscriptions[topic] = expr
        sub = SubscriptionData.build(topic, expr, self.clock.now_ms())
        self.rebalance_impl.subscription_inner[topic] = sub

    def unsubscribe(self, topic: str) -> None:
        self._subscriptions.pop(topic, None)
        self.rebalance_impl.subscription_inner.pop(topic, None)

    def _copy_subscription(self) -> None:
        """CLUSTERING always subscribes the group's retry topic (copySubscription)."""
        if self.message_model is MessageModel.CLUSTERING:
            rt = retry_topic(self.group)
            if rt not in self.rebalance_impl.subscription_inner:
                self.rebalance_impl.subscription_inner[rt] = SubscriptionData.build(
                    rt, "*", self.clock.now_ms()
                )

    # -- MQConsumerInner ------------------------------------------------------------------------------
    def consumer_data(self) -> ConsumerData:
        return ConsumerData(
            self.group,
            self.consume_type,
            self.message_model,
            ConsumeFromWhere(self.config.consume_from_where),
            [
                SubscriptionData(
                    s.topic,
                    s.sub_string,
                    list(s.tags_set),
                    list(s.code_set),
                    s.sub_version,
                    s.expression_type,
                )
                for _, s in sorted(self.rebalance_impl.subscription_inner.items())
            ],
            False,
        )

    def subscribed_topics(self) -> set[str]:
        return set(self.rebalance_impl.subscription_inner)

    def update_topic_subscribe_info(self, topic: str, route: TopicRouteData) -> None:
        mqs = route.subscribe_queues(topic)
        table = self.rebalance_impl.topic_subscribe_info_table
        if table.get(topic) != mqs:
            table[topic] = mqs
            self.log.emit(
                "topic_route", client_id=self.client_id, group=self.group, topic=topic, queues=shorts(mqs)
            )

    def is_subscribe_topic_need_update(self, topic: str) -> bool:
        return (
            topic in self.rebalance_impl.subscription_inner
            and topic not in self.rebalance_impl.topic_subscribe_info_table
        )

    async def do_rebalance(self) -> bool:
        if self.paused or not self.running:
            return False
        return await self.rebalance_impl.do_rebalance(self.consume_orderly)

    async def persist_consumer_offset(self) -> None:
        mqs = set(self.rebalance_impl.process_queue_table)
        await self.offset_store.persist_all(mqs)

    async def pull_message(self, request: PullRequest) -> None:
        return None

    # -- lifecycle helpers ----------------------------------------------------------------------------
    async def _start_client(self) -> None:
        if not self.rebalance_impl.subscription_inner:
            raise MQClientError("subscribe at least one topic before start()")
        self._copy_subscription()
        await self.offset_store.load()
        self.instance.register_consumer(self.group, self)  # type: ignore[arg-type]
        await self.instance.start()
        self.running = True
        # updateTopicSubscribeInfoWhenSubscriptionChanged: a synchronous route fetch for every topic
        for topic in sorted(self.rebalance_impl.subscription_inner):
            await self.instance.update_topic_route_info_from_name_server(topic)
        sent = await self.instance.send_heartbeat_to_all_broker_with_lock()
        # 4.9 rebalances at once whatever the heartbeat did; 5.x only after one went out
        if sent or not self.config.rebalance_at_start_needs_heartbeat:
            self.instance.rebalance_immediately()
        self.log.emit("consumer_started", group=self.group, client_id=self.client_id)

    async def _stop_client(self) -> None:
        self.running = False
        try:
            # one-way writes cannot block for long, unless a paused broker stopped reading altogether
            async with asyncio.timeout(self.config.seconds(2 * self.config.mq_client_api_timeout)):
                await self.persist_consumer_offset()
        except TimeoutError:
            self.log.warning("persisting offsets at shutdown timed out", group=self.group)
        self.instance.unregister_consumer_local(self.group)
        await self.instance.unregister_client(consumer_group=self.group)
        if not self.instance.consumer_table and not self.instance.producer_table:
            await self.instance.shutdown()
        self.rebalance_impl.destroy()
