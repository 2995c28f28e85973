"""What push and lite-pull consumers share: configuration, client id, the MQClientInstance, the offset
store, subscriptions and the MQConsumerInner hooks the instance calls."""

from __future__ import annotations

import asyncio
from typing import Any

from rmqlab.client.client_config import ConfigError, ConsumerConfig
from rmqlab.client.errors import MQClientError
from rmqlab.client.group_state import GroupState, shorts
from rmqlab.client.instance import InstanceGroupApi, InstanceOffsetApi, MQClientInstance, MQClientManager
from rmqlab.client.offset_store import LocalFileOffsetStore, OffsetStore, RemoteBrokerOffsetStore
from rmqlab.client.ports import GroupApi, PullDispatcher
from rmqlab.client.process_queue import PullRequest
from rmqlab.client.producer import check_topic, shutdown_instance, start_instance
from rmqlab.client.rebalance import RebalanceImpl, emit_queue_event
from rmqlab.protocol.allocate import AllocateMessageQueueStrategy, get_strategy
from rmqlab.protocol.client_id import build_client_id, new_instance_name
from rmqlab.protocol.clock import Clock, SystemClock
from rmqlab.protocol.event_log import EventLog
from rmqlab.protocol.model import (
    ConsumeFromWhere,
    ConsumerData,
    ConsumeType,
    MessageModel,
    MessageQueue,
)
from rmqlab.protocol.route import MASTER_ID, FindBrokerResult, TopicRouteData

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
            self.instance_name = new_instance_name(self.config.instance_name_with_nano_time)
        self.client_id = build_client_id(self.instance_name, self.config.client_ip)
        self.instance: MQClientInstance = MQClientManager.get_or_create(
            self.config, self.client_id, self.log, self.clock
        )
        self.api: GroupApi = InstanceGroupApi(self.instance)
        self.pulls: PullDispatcher = self.instance.pull_service
        # PullAPIWrapper.pullFromWhichNodeTable: the broker id the last pull answer of a queue suggested
        self.pull_from_which_node: dict[MessageQueue, int] = {}
        self.offset_store: OffsetStore
        if self.config.message_model is MessageModel.BROADCASTING:
            # keyed by the client id, so a restarted process with the same id finds its offsets again
            self.offset_store = LocalFileOffsetStore(
                group, self.client_id, self.config.local_offset_store_dir, log=self.log
            )
        else:
            self.offset_store = RemoteBrokerOffsetStore(
                group,
                InstanceOffsetApi(self.api, self.config),
                log=self.log,
                broker_error_as_not_found=self.config.query_offset_error_as_not_found,
                record_commits=self.config.protocol == "native",
            )
        self.state = GroupState(group, self.client_id, self.config, self.strategy, self.consume_type)
        self.rebalance_impl = self._build_rebalance_impl()

    def _build_rebalance_impl(self) -> RebalanceImpl:
        return RebalanceImpl(self.state, self.api, self.pulls, self.offset_store, self.log, clock=self.clock)

    @property
    def running(self) -> bool:
        """The consumer started and has not begun to stop (its GroupState's service state)."""
        return self.state.running

    @running.setter
    def running(self, value: bool) -> None:
        self.state.running = value

    @property
    def paused(self) -> bool:
        """suspend() was called and resume() not yet: no pulls and no rebalance rounds."""
        return self.state.paused

    @paused.setter
    def paused(self, value: bool) -> None:
        self.state.paused = value

    @property
    def consume_orderly(self) -> bool:
        return self.state.consume_orderly

    @property
    def message_model(self) -> MessageModel:
        return self.config.message_model

    def update_pull_from_which_node(self, mq: MessageQueue, broker_id: int) -> None:
        """PullAPIWrapper#updatePullFromWhichNode, from every pull answer's suggestWhichBrokerId."""
        prev = self.pull_from_which_node.get(mq, MASTER_ID)
        self.pull_from_which_node[mq] = broker_id
        if broker_id != prev:
            self.emit_queue_event("pull_node_changed", mq, broker_id=broker_id, prev_broker_id=prev)

    async def find_pull_broker(self, mq: MessageQueue) -> FindBrokerResult | None:
        """pullKernelImpl's target: the suggested broker (the master at first) of the queue's broker name,
        else a fallback as findBrokerAddressInSubscribe has it, after one route lookup when none is known."""
        broker_id = self.pull_from_which_node.get(mq, MASTER_ID)  # recalculatePullFromWhichNode
        found = self.api.find_broker_result_in_subscribe(mq.broker_name, broker_id, False)
        if found is None:
            await self.api.find_broker_address_in_subscribe_or_update(
                mq.topic, mq.broker_name, broker_id, False
            )
            found = self.api.find_broker_result_in_subscribe(mq.broker_name, broker_id, False)
        return found

    def emit_queue_event(self, event: str, mq: MessageQueue, **fields: Any) -> None:
        """Write an event about one of this consumer's message queues (group, client id and the queue)."""
        emit_queue_event(self.log, self.group, self.client_id, event, mq, **fields)

    # -- subscriptions --------------------------------------------------------------------------------
    def subscribe(self, topic: str, expression: str | None = "*") -> None:
        check_topic(topic)
        self.state.subscribe(topic, (expression or "*").strip() or "*", self.clock.now_ms())

    def unsubscribe(self, topic: str) -> None:
        self.state.unsubscribe(topic)

    def _copy_subscription(self) -> None:
        self.state.copy_subscription(self.clock.now_ms())

    # -- MQConsumerInner ------------------------------------------------------------------------------
    def consumer_data(self) -> ConsumerData:
        return ConsumerData(
            self.group,
            self.consume_type,
            self.message_model,
            ConsumeFromWhere(self.config.consume_from_where),
            self.state.subscriptions(),
            False,
        )

    def subscribed_topics(self) -> set[str]:
        return set(self.state.subscription_inner)

    def update_topic_subscribe_info(self, topic: str, route: TopicRouteData) -> None:
        mqs = route.subscribe_queues(topic)
        if self.state.update_topic_subscribe_info(topic, mqs):
            self.log.emit(
                "topic_route", client_id=self.client_id, group=self.group, topic=topic, queues=shorts(mqs)
            )

    def is_subscribe_topic_need_update(self, topic: str) -> bool:
        return self.state.is_subscribe_topic_need_update(topic)

    async def persist_consumer_offset(self) -> None:
        mqs = set(self.state.process_queue_table)
        await self.offset_store.persist_all(mqs)

    async def pull_message(self, request: PullRequest) -> None:
        return None

    # -- lifecycle helpers ----------------------------------------------------------------------------
    async def _start_client(self) -> None:
        if not self.state.subscription_inner:
            raise MQClientError("subscribe at least one topic before start()")
        self._copy_subscription()
        await self.offset_store.load()
        self.instance.register_consumer(self.group, self)  # type: ignore[arg-type]
        await start_instance(self.instance, self.config, self.instance_name, self.clock)
        self.running = True
        # updateTopicSubscribeInfoWhenSubscriptionChanged: a synchronous route fetch for every topic
        for topic in sorted(self.state.subscription_inner):
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
        await shutdown_instance(self.instance)
        self.rebalance_impl.destroy()
