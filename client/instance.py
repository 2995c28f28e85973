"""MQClientInstance: one per client id, shared by the consumers and producers of that id.

It owns the connections (one RemotingClient), the route and broker-address tables, the scheduled tasks
of RocketMQ's MQClientInstance (route refresh every 30 s, heartbeats every 30 s, offset persistence every
5 s), and runs the RebalanceService (``client.rebalance``, which answers NOTIFY_CONSUMER_IDS_CHANGED) and
the PullMessageService (``client.pull_service``). Everything runs under one TaskGroup so shutdown
cancels it as a unit.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import os
import random
import time
from collections.abc import Awaitable, Coroutine
from typing import Any, Protocol

from rmqlab.client.api import MQClientAPI
from rmqlab.client.client_config import ClientConfig, ConsumerConfig
from rmqlab.client.errors import MQClientError
from rmqlab.client.ports import GroupApi
from rmqlab.client.publish_info import TopicPublishInfo
from rmqlab.client.pull_service import PullMessageService
from rmqlab.client.rebalance import RebalanceService, RegisteredConsumer
from rmqlab.client.scheduler import SingleThreadScheduler
from rmqlab.protocol.acl_signing import SessionCredentials
from rmqlab.protocol.client_id import build_client_id
from rmqlab.protocol.clock import Clock, SystemClock
from rmqlab.protocol.event_log import EventLog
from rmqlab.protocol.model import ConsumerData, HeartbeatData, MessageQueue, ProducerData
from rmqlab.protocol.native import native_client_codec_factory
from rmqlab.protocol.native.message_ext import UniqIdGenerator
from rmqlab.protocol.remoting import RemotingClient
from rmqlab.protocol.route import MASTER_ID, FindBrokerResult, TopicRouteData, find_broker_in_subscribe


def _wall_ms() -> float:
    return time.time() * 1000.0


class ConsumerInner(RegisteredConsumer, Protocol):
    """What MQClientInstance needs from a registered consumer (RocketMQ's MQConsumerInner); its rebalance
    and pull hooks are ``RegisteredConsumer``'s."""

    group: str

    def consumer_data(self) -> ConsumerData: ...

    def subscribed_topics(self) -> set[str]: ...

    def update_topic_subscribe_info(self, topic: str, route: TopicRouteData) -> None: ...

    def is_subscribe_topic_need_update(self, topic: str) -> bool: ...

    async def persist_consumer_offset(self) -> None: ...


class ProducerInner(Protocol):
    """What MQClientInstance needs from a registered producer (RocketMQ's MQProducerInner)."""

    group: str

    def publish_topics(self) -> set[str]: ...

    def update_topic_publish_info(self, topic: str, info: TopicPublishInfo) -> None: ...

    def is_publish_topic_need_update(self, topic: str) -> bool: ...


class MQClientInstance:
    """The shared client runtime of one client id."""

    def __init__(
        self,
        config: ClientConfig,
        *,
        client_id: str | None = None,
        log: EventLog | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.config = config
        self.client_id = client_id or build_client_id(config.instance_name, config.client_ip)
        self.log = log or EventLog.null()
        self.clock = clock or SystemClock()
        # scaled like every other timer, with a floor so a slow loopback connect is not cut short
        connect_s = max(0.2, config.seconds(config.connect_timeout_millis))
        codec_factory = None
        if config.protocol == "native":
            # RocketMQ's own remoting protocol; messages sent get a UNIQ_KEY as the Java producer gives
            salt = random.Random(config.random_seed).getrandbits(32)
            uniq_ids = UniqIdGenerator(self.client_id.partition("@")[0], os.getpid(), salt, _wall_ms)
            codec_factory = native_client_codec_factory(uniq_ids)
        self.remoting = RemotingClient(
            codec_factory=codec_factory,
            log=self.log,
            connect_timeout_s=connect_s,
            close_socket_if_timeout=config.client_close_socket_if_timeout,
            credentials=SessionCredentials.resolve(config.access_key, config.secret_key, environ={}),
        )
        self.api = MQClientAPI(self.remoting)
        self.consumer_table: dict[str, ConsumerInner] = {}
        self.producer_table: dict[str, ProducerInner] = {}
        self.topic_route_table: dict[str, TopicRouteData] = {}
        self.broker_addr_table: dict[str, dict[int, str]] = {}
        self.rebalance_service = RebalanceService(
            config, self.clock, self.log, self.client_id, self.consumer_table, self.remoting
        )
        self.scheduler = SingleThreadScheduler("MQClientFactoryScheduledThread", self.log)
        self.pull_service = PullMessageService(self.consumer_table, self.log)
        self._heartbeat_lock = asyncio.Lock()
        self._route_lock = asyncio.Lock()
        self._tg: asyncio.TaskGroup | None = None
        self._runner: asyncio.Task[None] | None = None
        self._started = False
        self._random = random.Random(config.random_seed)
        # defaultMQProducer (CLIENT_INNER_PRODUCER), started with the instance: client.producer.start_instance
        self.inner_producer: Any = None
        self.inner_producer_lock = asyncio.Lock()
        if config.heartbeat_on_connect:
            self.remoting.on_connection_opened(self._on_channel_active)

    # -- lifecycle ------------------------------------------------------------------------------------
    @property
    def started(self) -> bool:
        return self._started

    async def start(self) -> None:
        if self._started:
            return
        ready = asyncio.get_running_loop().create_future()
        self._runner = asyncio.create_task(self._run(ready), name=f"mq-client-{self.client_id}")
        await ready
        self._started = True

    async def _run(self, ready: asyncio.Future[None]) -> None:
        cfg = self.config
        s = cfg.seconds
        # startScheduledTask: one thread, fixed rates, each task awaited before the next one starts
        self.scheduler.schedule_at_fixed_rate(
            self.update_topic_route_info_from_name_server_all,
            s(cfg.poll_name_server_first_delay),
            s(cfg.poll_name_server_interval),
            "update topic routes",
        )
        self.scheduler.schedule_at_fixed_rate(
            self._heartbeat_task, s(cfg.heartbeat_first_delay), s(cfg.heartbeat_broker_interval), "heartbeat"
        )
        self.scheduler.schedule_at_fixed_rate(
            self.persist_all_consumer_offset,
            s(cfg.persist_consumer_offset_first_delay),
            s(cfg.persist_consumer_offset_interval),
            "persist consumer offsets",
        )
        async with asyncio.TaskGroup() as tg:
            self._tg = tg
            tg.create_task(self._guarded(self.scheduler.run(), "scheduled tasks"))
            tg.create_task(self._guarded(self.pull_service.run(), "pull service"))
            tg.create_task(self._guarded(self.pull_service.scheduler.run(), "pull service tasks"))
            tg.create_task(self._guarded(self.rebalance_service.run(), "rebalance service"))
            ready.set_result(None)

    async def _guarded(self, coro: Awaitable[Any], what: str) -> None:
        try:
            await coro
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self.log.error("client task failed", task=what, error=repr(exc))

    def spawn(self, coro: Coroutine[Any, Any, Any], what: str = "task") -> asyncio.Task[None] | None:
        """Run ``coro`` under the instance's TaskGroup; errors are logged, never propagated."""
        if self._tg is None or self._runner is None or self._runner.done():
            coro.close()
            return None
        guarded = self._guarded(coro, what)
        try:
            task = self._tg.create_task(guarded)
        except RuntimeError:  # the TaskGroup is shutting down
            guarded.close()
            coro.close()
            return None
        # a task cancelled before its first step never starts ``coro``: close it so it is not reported
        task.add_done_callback(lambda _t: coro.close())
        return task

    def spawn_self_guarded(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any] | None:
        """``spawn`` for a coroutine that catches and logs every exception itself (the pull's answer,
        once per pull): the task runs it as it is, with no guarding coroutine around it. A task
        cancelled before its first step closes its coroutine itself."""
        if self._tg is None or self._runner is None or self._runner.done():
            coro.close()
            return None
        try:
            return self._tg.create_task(coro)
        except RuntimeError:  # the TaskGroup is shutting down
            coro.close()
            return None

    async def shutdown(self) -> None:
        """Stop every task and close the connections (after the last consumer/producer left)."""
        self.pull_service.stop()
        self.scheduler.stop()
        if self._runner is not None:
            self._runner.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._runner
        await self.remoting.close()
        self._started = False
        MQClientManager.remove(self.client_id)

    # -- registration ---------------------------------------------------------------------------------
    def register_consumer(self, group: str, consumer: ConsumerInner) -> None:
        if group in self.consumer_table:
            raise MQClientError(f"the consumer group[{group}] has been created before, specify another name")
        self.consumer_table[group] = consumer

    def unregister_consumer_local(self, group: str) -> None:
        self.consumer_table.pop(group, None)

    def register_producer(self, group: str, producer: ProducerInner) -> None:
        if group in self.producer_table:
            raise MQClientError(f"the producer group[{group}] has been created before, specify another name")
        self.producer_table[group] = producer

    def unregister_producer_local(self, group: str) -> None:
        self.producer_table.pop(group, None)

    async def unregister_client(
        self, *, producer_group: str | None = None, consumer_group: str | None = None
    ) -> None:
        """UNREGISTER_CLIENT to every broker address we know, one after another (sync, 3 s each)."""
        timeout = self.config.seconds(self.config.mq_client_api_timeout)
        for broker_name, addrs in sorted(self.broker_addr_table.items()):
            for bid, addr in sorted(addrs.items()):
                try:
                    await self.api.unregister_client(
                        addr,
                        self.client_id,
                        producer_group=producer_group,
                        consumer_group=consumer_group,
                        timeout_s=timeout,
                    )
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    self.log.warning(
                        "unregister client failed", broker=broker_name, broker_id=bid, error=repr(exc)
                    )

    # -- rebalance -----------------------------------------------------------------------------------
    def rebalance_immediately(self) -> None:
        self.rebalance_service.wakeup()

    def rebalance_later(self, delay_ms: float) -> None:
        async def later() -> None:
            await asyncio.sleep(self.config.seconds(delay_ms))
            self.rebalance_service.wakeup()

        self.spawn(later(), "rebalance later")

    async def persist_all_consumer_offset(self) -> None:
        for consumer in list(self.consumer_table.values()):
            await consumer.persist_consumer_offset()

    # -- routes ---------------------------------------------------------------------------------------
    async def update_topic_route_info_from_name_server_all(self) -> None:
        topics: set[str] = set()
        for consumer in self.consumer_table.values():
            topics |= consumer.subscribed_topics()
        for producer in self.producer_table.values():
            topics |= producer.publish_topics()
        for topic in sorted(topics):
            await self.update_topic_route_info_from_name_server(topic)

    async def update_topic_route_info_from_name_server(self, topic: str) -> bool:
        """Fetch the topic's route; on a change update broker addresses and every consumer's and
        producer's view. False when the name server does not know the topic or cannot be reached."""
        async with self._route_lock:
            timeout = self.config.seconds(self.config.mq_client_api_timeout)
            try:
                route = await self.api.get_topic_route(self.config.namesrv_addr, topic, timeout)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.log.warning("route update failed", topic=topic, error=repr(exc))
                return False
            if route is None:
                return False
            old = self.topic_route_table.get(topic)
            changed = old != route
            if not changed:  # isNeedUpdateTopicRouteInfo: a consumer or producer still lacks the topic
                changed = any(
                    c.is_subscribe_topic_need_update(topic) for c in self.consumer_table.values()
                ) or any(p.is_publish_topic_need_update(topic) for p in self.producer_table.values())
            if changed:
                for bd in route.broker_datas:
                    self.broker_addr_table[bd.broker_name] = dict(bd.broker_addrs)
                self.topic_route_table[topic] = route
                # every producer, the consumers' inner one included, as MQClientInstance does: a
                # producer without the topic would make every later poll of it a change
                # (isNeedUpdateTopicRouteInfo asks isPublishTopicNeedUpdate of each producer)
                for producer in self.producer_table.values():
                    producer.update_topic_publish_info(
                        topic, TopicPublishInfo(topic, route.publish_queues(topic), route)
                    )
                for consumer in self.consumer_table.values():
                    if topic in consumer.subscribed_topics():
                        consumer.update_topic_subscribe_info(topic, route)
            return True

    def clean_offline_broker(self) -> None:
        live: set[str] = set()
        for route in self.topic_route_table.values():
            for bd in route.broker_datas:
                live.update(addr for _, addr in bd.broker_addrs)
        for name in list(self.broker_addr_table):
            addrs = {bid: a for bid, a in self.broker_addr_table[name].items() if a in live}
            if addrs:
                self.broker_addr_table[name] = addrs
            else:
                del self.broker_addr_table[name]

    def find_broker_result_in_subscribe(
        self, broker_name: str, broker_id: int = MASTER_ID, only_this_broker: bool = False
    ) -> FindBrokerResult | None:
        return find_broker_in_subscribe(self.broker_addr_table.get(broker_name), broker_id, only_this_broker)

    def find_broker_address_in_subscribe(
        self, broker_name: str, broker_id: int = MASTER_ID, only_this_broker: bool = False
    ) -> str | None:
        found = find_broker_in_subscribe(self.broker_addr_table.get(broker_name), broker_id, only_this_broker)
        return found.broker_addr if found is not None else None

    def find_broker_address_in_publish(self, broker_name: str) -> str | None:
        addrs = self.broker_addr_table.get(broker_name)
        return addrs.get(MASTER_ID) if addrs else None

    async def find_broker_address_in_subscribe_or_update(
        self, topic: str, broker_name: str, broker_id: int = MASTER_ID, only_this_broker: bool = False
    ) -> str | None:
        addr = self.find_broker_address_in_subscribe(broker_name, broker_id, only_this_broker)
        if addr is None:
            await self.update_topic_route_info_from_name_server(topic)
            addr = self.find_broker_address_in_subscribe(broker_name, broker_id, only_this_broker)
        return addr

    async def find_broker_address_in_publish_or_update(self, topic: str, broker_name: str) -> str | None:
        """The broker's master address, fetching ``topic``'s route from the name server once when it is
        not known yet (as sendKernelImpl and sendMessageBack do before giving up)."""
        addr = self.find_broker_address_in_publish(broker_name)
        if addr is None:
            await self.update_topic_route_info_from_name_server(topic)
            addr = self.find_broker_address_in_publish(broker_name)
        return addr

    def _find_broker_addr_by_topic(self, topic: str) -> str | None:
        route = self.topic_route_table.get(topic)
        if route is None or not route.broker_datas:
            return None
        bd = self._random.choice(route.broker_datas)
        return bd.select_addr()

    async def find_consumer_id_list(self, topic: str, group: str) -> list[str] | None:
        """GET_CONSUMER_LIST_BY_GROUP on a random broker of the topic; None on any failure."""
        addr = self._find_broker_addr_by_topic(topic)
        if addr is None:
            await self.update_topic_route_info_from_name_server(topic)
            addr = self._find_broker_addr_by_topic(topic)
        if addr is None:
            return None
        try:
            return await self.api.get_consumer_id_list(
                addr, group, self.config.seconds(self.config.mq_client_api_timeout)
            )
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self.log.warning(
                "get consumer id list failed", topic=topic, group=group, broker_addr=addr, error=repr(exc)
            )
            return None

    # -- heartbeats -----------------------------------------------------------------------------------
    def _on_channel_active(self, addr: str) -> None:
        """5.2's channel event listener: a new connection to a known broker gets a heartbeat at once
        and, when it went through, an immediate rebalance (runs on its own, as Netty's event thread)."""
        for broker_name, addrs in sorted(self.broker_addr_table.items()):
            for known in addrs.values():
                if known == addr:
                    self.spawn(self._heartbeat_on_connect(broker_name, addr), "heartbeat on connect")
                    return

    async def _heartbeat_on_connect(self, broker_name: str, addr: str) -> None:
        hb = self.prepare_heartbeat_data()
        if not hb.consumer_data_set and not hb.producer_data_set:
            return
        try:
            await self.api.send_heartbeat(addr, hb, self.config.seconds(self.config.mq_client_api_timeout))
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self.log.warning(
                "heartbeat on connect failed", broker=broker_name, broker_addr=addr, error=repr(exc)
            )
            return
        self.log.emit(
            "heartbeat_sent",
            client_id=self.client_id,
            brokers=[broker_name],
            failed=[],
            groups=[c.group_name for c in hb.consumer_data_set]
            + [p.group_name for p in hb.producer_data_set],
            cause="connect",
        )
        self.rebalance_immediately()

    async def _heartbeat_task(self) -> None:
        self.clean_offline_broker()
        await self.send_heartbeat_to_all_broker_with_lock()

    def prepare_heartbeat_data(self) -> HeartbeatData:
        return HeartbeatData(
            self.client_id,
            [ProducerData(g) for g in sorted(self.producer_table)],
            [c.consumer_data() for _, c in sorted(self.consumer_table.items())],
        )

    async def send_heartbeat_to_all_broker_with_lock(self) -> bool:
        """Heartbeat every broker; skipped (False) while another heartbeat round is running."""
        if self._heartbeat_lock.locked():
            return False
        async with self._heartbeat_lock:
            return await self._send_heartbeat_to_all_broker()

    async def _send_heartbeat_to_all_broker(self) -> bool:
        hb = self.prepare_heartbeat_data()
        if not hb.consumer_data_set and not hb.producer_data_set:
            return False
        if not self.broker_addr_table:
            return False
        timeout = self.config.seconds(self.config.mq_client_api_timeout)
        sent: list[str] = []
        failed: list[str] = []
        for broker_name, addrs in sorted(self.broker_addr_table.items()):
            for bid, addr in sorted(addrs.items()):
                # producers only: masters only; with consumers: every address
                if not hb.consumer_data_set and bid != MASTER_ID:
                    continue
                try:
                    await self.api.send_heartbeat(addr, hb, timeout)
                    sent.append(broker_name)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    failed.append(broker_name)
                    self.log.warning(
                        "heartbeat failed", broker=broker_name, broker_addr=addr, error=repr(exc)
                    )
        self.log.emit(
            "heartbeat_sent",
            client_id=self.client_id,
            brokers=sent,
            failed=failed,
            groups=[c.group_name for c in hb.consumer_data_set]
            + [p.group_name for p in hb.producer_data_set],
        )
        return bool(sent)


# The client table of the process a task belongs to, when it is not the OS process's: the simulator runs
# many processes in one, and two of them may carry the same client id (containers sharing an IP and pid).
_PROCESS_INSTANCES: contextvars.ContextVar[dict[str, MQClientInstance] | None] = contextvars.ContextVar(
    "process_client_instances", default=None
)


class MQClientManager:
    """One MQClientInstance per client id in a process (RocketMQ's MQClientManager)."""

    _instances: dict[str, MQClientInstance] = {}

    @classmethod
    def _table(cls) -> dict[str, MQClientInstance]:
        own = _PROCESS_INSTANCES.get()
        return cls._instances if own is None else own

    @classmethod
    def own_process(cls) -> None:
        """The current task and the tasks it starts form a process of their own, with its own table."""
        _PROCESS_INSTANCES.set({})

    @classmethod
    def get_or_create(
        cls, config: ClientConfig, client_id: str, log: EventLog | None = None, clock: Clock | None = None
    ) -> MQClientInstance:
        table = cls._table()
        inst = table.get(client_id)
        if inst is None:
            inst = MQClientInstance(config, client_id=client_id, log=log, clock=clock)
            table[client_id] = inst
        return inst

    @classmethod
    def remove(cls, client_id: str) -> None:
        cls._table().pop(client_id, None)


class InstanceGroupApi:
    """``client.ports.GroupApi`` over an MQClientInstance: address lookups in its tables, broker calls
    through its MQClientAPI, heartbeats, rebalance wakeups and tasks under its TaskGroup."""

    def __init__(self, instance: MQClientInstance) -> None:
        self._instance = instance
        self._api = instance.api
        self.find_broker_address_in_subscribe = instance.find_broker_address_in_subscribe
        self.find_broker_result_in_subscribe = instance.find_broker_result_in_subscribe
        self.find_broker_address_in_subscribe_or_update = instance.find_broker_address_in_subscribe_or_update
        self.find_broker_address_in_publish_or_update = instance.find_broker_address_in_publish_or_update
        self.find_consumer_id_list = instance.find_consumer_id_list
        self.send_heartbeat_to_all_broker_with_lock = instance.send_heartbeat_to_all_broker_with_lock
        self.rebalance_immediately = instance.rebalance_immediately
        self.rebalance_later = instance.rebalance_later
        self.spawn = instance.spawn
        self.spawn_self_guarded = instance.spawn_self_guarded
        self.schedule = instance.scheduler.schedule
        self.lock_batch_mq = self._api.lock_batch_mq
        self.unlock_batch_mq = self._api.unlock_batch_mq
        self.get_max_offset = self._api.get_max_offset
        self.search_offset = self._api.search_offset
        self.query_consumer_offset = self._api.query_consumer_offset
        self.update_consumer_offset_oneway = self._api.update_consumer_offset_oneway
        self.pull_message = self._api.pull_message
        self.consumer_send_msg_back = self._api.consumer_send_msg_back


class InstanceOffsetApi:
    """RemoteBrokerOffsetStore's broker calls, sent to the master of the queue's broker."""

    def __init__(self, api: GroupApi, config: ConsumerConfig) -> None:
        self.api = api
        self.config = config

    async def _addr(self, mq: MessageQueue) -> str:
        """RemoteBrokerOffsetStore: the master; when none is known, the route again, then the master or
        else any of the broker's addresses (a slave while the master is down)."""
        addr = self.api.find_broker_address_in_subscribe(mq.broker_name, MASTER_ID, True)
        if addr is None:
            addr = await self.api.find_broker_address_in_subscribe_or_update(
                mq.topic, mq.broker_name, MASTER_ID, True
            )
            if addr is None:
                addr = self.api.find_broker_address_in_subscribe(mq.broker_name, MASTER_ID, False)
        if addr is None:
            raise MQClientError(f"the broker[{mq.broker_name}] not exist")
        return addr

    async def query_consumer_offset(self, mq: MessageQueue, group: str) -> int:
        addr = await self._addr(mq)
        return await self.api.query_consumer_offset(
            addr, group, mq, self.config.seconds(self.config.query_offset_timeout)
        )

    def update_consumer_offset_oneway(
        self, mq: MessageQueue, group: str, offset: int
    ) -> Awaitable[None] | None:
        """None once sent without waiting (the broker's address known, the write taken), otherwise what
        is left to await: see ``OffsetBrokerApi``."""
        addr = self.api.find_broker_address_in_subscribe(mq.broker_name, MASTER_ID, True)
        if addr is None:
            return self._update_consumer_offset_after_lookup(mq, group, offset)
        return self.api.update_consumer_offset_oneway(addr, group, mq, offset)

    async def _update_consumer_offset_after_lookup(self, mq: MessageQueue, group: str, offset: int) -> None:
        addr = await self._addr(mq)
        pending = self.api.update_consumer_offset_oneway(addr, group, mq, offset)
        if pending is not None:
            await pending
