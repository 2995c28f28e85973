"""Producer: RocketMQ's DefaultMQProducer (synchronous sends, as sendDefaultImpl in SYNC mode).

Round-robin queue selection, up to ``retry_times_when_send_failed`` retries avoiding the broker that just
failed, the latency fault strategy when enabled, and a ``message_sent`` event for every acknowledged send.
"""

from __future__ import annotations

import asyncio
import dataclasses
import re
from typing import Any

from rmqlab.client.api import SendResult
from rmqlab.client.client_config import ClientConfig, ProducerConfig
from rmqlab.client.errors import MQBrokerError, MQClientError
from rmqlab.client.instance import MQClientInstance, MQClientManager
from rmqlab.client.latency import MQFaultStrategy
from rmqlab.client.publish_info import TopicPublishInfo
from rmqlab.protocol.client_id import build_client_id, new_instance_name
from rmqlab.protocol.clock import Clock, SystemClock
from rmqlab.protocol.codes import ResponseCode
from rmqlab.protocol.event_log import EventLog
from rmqlab.protocol.model import MessageQueue
from rmqlab.protocol.remoting import RemotingError, RemotingTimeoutError
from rmqlab.protocol.route import TopicRouteData

DEFAULT_PRODUCER_GROUP = "DEFAULT_PRODUCER"
TOPIC_MAX_LENGTH = 127
_TOPIC_PATTERN = re.compile(r"^[%|a-zA-Z0-9_-]+$")
# DefaultMQProducer.retryResponseCodes (4.9)
RETRY_RESPONSE_CODES = frozenset(
    {
        ResponseCode.TOPIC_NOT_EXIST,
        ResponseCode.SERVICE_NOT_AVAILABLE,
        ResponseCode.SYSTEM_ERROR,
        ResponseCode.NO_PERMISSION,
        204,  # NO_BUYER_ID
        205,  # NOT_IN_CURRENT_UNIT
    }
)


def check_topic(topic: Any) -> None:
    if not isinstance(topic, str) or not topic.strip():
        raise MQClientError("the specified topic is blank")
    if len(topic) > TOPIC_MAX_LENGTH:
        raise MQClientError(f"the specified topic is longer than topic max length {TOPIC_MAX_LENGTH}")
    if not _TOPIC_PATTERN.match(topic):
        raise MQClientError(
            f"the specified topic[{topic}] contains illegal characters, allowing only ^[%|a-zA-Z0-9_-]+$"
        )


CLIENT_INNER_PRODUCER_GROUP = "CLIENT_INNER_PRODUCER"  # MixAll.CLIENT_INNER_PRODUCER_GROUP


class Producer:
    """Sends messages; ``await send(topic, body, tags=None, keys=None)`` returns a SendResult."""

    def __init__(
        self,
        group: str = DEFAULT_PRODUCER_GROUP,
        *,
        namesrv: str | None = None,
        config: ProducerConfig | None = None,
        log: EventLog | None = None,
        clock: Clock | None = None,
        **options: Any,
    ) -> None:
        if not isinstance(group, str) or not group.strip():
            raise MQClientError("producer group must be a non-empty string")
        self.group = group
        base: dict[str, Any] = {} if namesrv is None else {"namesrv_addr": namesrv}
        if config is not None:
            self.config = config.replace(**base, **options)
            self.config.validate()
        else:
            self.config = ProducerConfig.from_mapping(base, **options)
        self.log = log or EventLog.null()
        self.clock = clock or SystemClock()
        self.instance_name = self.config.instance_name or new_instance_name()
        self.client_id = build_client_id(self.instance_name, self.config.client_ip)
        self.instance: MQClientInstance = MQClientManager.get_or_create(
            self.config, self.client_id, self.log, self.clock
        )
        self.publish_table: dict[str, TopicPublishInfo] = {}
        self.fault = MQFaultStrategy(
            enabled=self.config.send_latency_fault_enable,
            latency_max=self.config.latency_max,
            not_available_duration=self.config.not_available_duration,
            isolation_latency=self.config.isolation_latency,
            time_scale=self.config.time_scale,
        )
        self.running = False

    # -- ProducerInner --------------------------------------------------------------------------------
    def publish_topics(self) -> set[str]:
        return set(self.publish_table)

    def is_publish_topic_need_update(self, topic: str) -> bool:
        info = self.publish_table.get(topic)
        return info is None or not info.ok()

    def update_topic_publish_info(self, topic: str, info: TopicPublishInfo) -> None:
        old = self.publish_table.get(topic)
        if old is not None:
            info.send_which_queue = old.send_which_queue
        self.publish_table[topic] = info

    # -- lifecycle ------------------------------------------------------------------------------------
    async def start(self) -> None:
        if self.running:
            raise MQClientError("the producer is already running")
        self.instance.register_producer(self.group, self)  # type: ignore[arg-type]
        if self.group == CLIENT_INNER_PRODUCER_GROUP:
            await self.instance.start()  # start(false): the instance is starting it
        else:
            await start_instance(self.instance, self.config, self.instance_name, self.clock)
        self.running = True
        await self.instance.send_heartbeat_to_all_broker_with_lock()

    async def shutdown(self) -> None:
        if not self.running:
            return
        self.running = False
        self.instance.unregister_producer_local(self.group)
        await self.instance.unregister_client(producer_group=self.group)
        await shutdown_instance(self.instance)

    async def __aenter__(self) -> Producer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.shutdown()

    # -- routes ---------------------------------------------------------------------------------------
    async def _find_publish_info(self, topic: str) -> TopicPublishInfo:
        info = self.publish_table.get(topic)
        if info is None or not info.ok():
            self.publish_table.setdefault(topic, TopicPublishInfo(topic, []))
            await self.instance.update_topic_route_info_from_name_server(topic)
            info = self.publish_table.get(topic)
        if info is not None and info.ok():
            return info
        # unknown topic: send through the brokers that can auto-create it (the TBW102 route)
        default = await self._default_route()
        if default is not None:
            info = TopicPublishInfo(topic, default.publish_queues(topic), default)
            if info.ok():
                self.update_topic_publish_info(topic, info)
                return self.publish_table[topic]
        raise MQClientError(f"no route info of this topic: {topic} (name server {self.config.namesrv_addr})")

    async def _default_route(self) -> TopicRouteData | None:
        cfg = self.config
        try:
            route = await self.instance.api.get_topic_route(
                cfg.namesrv_addr, cfg.create_topic_key, cfg.seconds(cfg.mq_client_api_timeout)
            )
        except RemotingError as exc:
            raise MQClientError(f"name server {cfg.namesrv_addr} unreachable: {exc}") from exc
        if route is None:
            return None
        for bd in route.broker_datas:
            self.instance.broker_addr_table[bd.broker_name] = dict(bd.broker_addrs)
        queues = tuple(
            dataclasses.replace(
                qd,
                read_queue_nums=min(cfg.default_topic_queue_nums, qd.read_queue_nums),
                write_queue_nums=min(cfg.default_topic_queue_nums, qd.read_queue_nums),
            )
            for qd in route.queue_datas
        )
        return TopicRouteData(route.broker_datas, queues)

    # -- send -----------------------------------------------------------------------------------------
    async def send(
        self,
        topic: str,
        body: bytes,
        tags: str | None = None,
        keys: str | None = None,
        properties: dict[str, str] | None = None,
    ) -> SendResult:
        if not self.running:
            raise MQClientError("the producer is not running; call start() first")
        check_topic(topic)
        if not isinstance(body, bytes | bytearray | memoryview):
            raise MQClientError(f"message body must be bytes, got {type(body).__name__}")
        body = bytes(body)
        if not body:
            raise MQClientError("the message body length is zero")
        if len(body) > self.config.max_message_size:
            raise MQClientError(f"the message body size over max value, MAX: {self.config.max_message_size}")
        cfg = self.config
        timeout_ms = cfg.ms(cfg.send_msg_timeout)
        begin_first = self.clock.monotonic_ms()
        info = await self._find_publish_info(topic)
        times_total = 1 + cfg.retry_times_when_send_failed
        mq: MessageQueue | None = None
        brokers_sent: list[str] = []
        last_exc: Exception | None = None
        call_timeout = False
        times = 0
        for times in range(times_total):
            last_broker = mq.broker_name if mq is not None else None
            mq = self.fault.select_one_message_queue(info, last_broker, self.clock.monotonic_ms())
            brokers_sent.append(mq.broker_name)
            begin = self.clock.monotonic_ms()
            cost = begin - begin_first
            if timeout_ms < cost:
                call_timeout = True
                break
            try:
                result = await self._send_kernel(
                    mq, body, tags, keys, properties, (timeout_ms - cost) / 1000.0
                )
            except (RemotingError, MQClientError) as exc:
                self.fault.update_fault_item(
                    mq.broker_name, self.clock.monotonic_ms() - begin, True, self.clock.monotonic_ms()
                )
                last_exc = exc
                self._emit_failure(topic, mq, exc, times)
                continue
            except MQBrokerError as exc:
                self.fault.update_fault_item(
                    mq.broker_name, self.clock.monotonic_ms() - begin, True, self.clock.monotonic_ms()
                )
                last_exc = exc
                self._emit_failure(topic, mq, exc, times)
                if exc.code in RETRY_RESPONSE_CODES:
                    continue
                raise
            end = self.clock.monotonic_ms()
            self.fault.update_fault_item(mq.broker_name, end - begin, False, end)
            self.log.emit(
                "message_sent",
                group=self.group,
                client_id=self.client_id,
                msg_id=result.msg_id,
                topic=topic,
                broker=result.broker_name,
                queue_id=result.queue_id,
                queue_offset=result.queue_offset,
                send_status=result.send_status,
            )
            return result
        if call_timeout:
            raise MQClientError(
                f"sendDefaultImpl call timeout after {self.clock.monotonic_ms() - begin_first} ms"
            )
        raise MQClientError(
            f"Send [{times + 1}] times, still failed, cost [{self.clock.monotonic_ms() - begin_first}]ms, "
            f"Topic: {topic}, BrokersSent: {brokers_sent}: {last_exc}"
        ) from last_exc

    def _emit_failure(self, topic: str, mq: MessageQueue, exc: Exception, attempt: int) -> None:
        code = exc.code_name if isinstance(exc, MQBrokerError) else type(exc).__name__
        self.log.emit(
            "send_failed",
            group=self.group,
            client_id=self.client_id,
            topic=topic,
            broker=mq.broker_name,
            queue_id=mq.queue_id,
            code=code,
            attempt=attempt,
            error=str(exc),
        )

    async def _send_kernel(
        self,
        mq: MessageQueue,
        body: bytes,
        tags: str | None,
        keys: str | None,
        properties: dict[str, str] | None,
        timeout_s: float,
    ) -> SendResult:
        addr = await self.instance.find_broker_address_in_publish_or_update(mq.topic, mq.broker_name)
        if addr is None:
            raise MQClientError(f"the broker[{mq.broker_name}] not exist")
        try:
            async with asyncio.timeout(max(timeout_s, 0.001) + 0.5):  # also bounds a slow connect
                return await self.instance.api.send_message(
                    addr,
                    producer_group=self.group,
                    mq=mq,
                    body=body,
                    tags=tags,
                    keys=keys,
                    properties=properties,
                    born_timestamp=self.clock.now_ms(),
                    timeout_s=max(timeout_s, 0.001),
                )
        except RemotingTimeoutError:
            raise
        except TimeoutError as exc:
            raise RemotingTimeoutError(f"send to {addr} timed out") from exc


async def start_instance(
    instance: MQClientInstance, config: ClientConfig, instance_name: str, clock: Clock
) -> None:
    """MQClientInstance#start, as a consumer's or producer's start calls it: the instance's services, then
    its defaultMQProducer (group CLIENT_INNER_PRODUCER on the same client id, started without starting
    the instance again). From then on every heartbeat of the client names that group, and a consumer's
    send-back fallback finds the producer running."""
    await instance.start()
    await inner_producer(instance, config, instance_name, clock)


async def inner_producer(
    instance: MQClientInstance, config: ClientConfig, instance_name: str, clock: Clock
) -> Producer:
    """The instance's defaultMQProducer (``start_instance`` starts it; started here if it is not)."""
    async with instance.inner_producer_lock:
        if instance.inner_producer is None:
            producer = Producer(
                CLIENT_INNER_PRODUCER_GROUP,
                config=ProducerConfig(
                    namesrv_addr=config.namesrv_addr,
                    instance_name=instance_name,
                    client_ip=config.client_ip,
                    time_scale=config.time_scale,
                    client_close_socket_if_timeout=config.client_close_socket_if_timeout,
                ),
                clock=clock,
            )
            await producer.start()
            instance.inner_producer = producer
        return instance.inner_producer  # type: ignore[no-any-return]


async def shutdown_instance(instance: MQClientInstance) -> None:
    """MQClientInstance#shutdown, as a consumer's or producer's shutdown calls it once it unregistered:
    nothing while a consumer or a producer other than the internal one is registered; otherwise the
    internal producer leaves first (UNREGISTER_CLIENT for CLIENT_INNER_PRODUCER), then the instance."""
    if instance.consumer_table or set(instance.producer_table) - {CLIENT_INNER_PRODUCER_GROUP}:
        return
    inner, instance.inner_producer = instance.inner_producer, None
    if inner is not None and inner.running:
        await inner.shutdown()  # which comes back here with nothing registered and stops the instance
        return
    await instance.shutdown()
