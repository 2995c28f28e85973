"""The v5 ``MessagingService`` over our brokers: each gRPC call becomes the broker requests that RocketMQ 5's
proxy in cluster mode sends over remoting (route from the name server, heartbeat, send, POP, ACK, change
invisible time, send back to the DLQ).

Every v5 client gets its own remoting connections to the brokers (a ``ClientSession``), so each appears in
its group as a member of its own, as the broker keys registrations by connection: a client that says
goodbye, or stops heartbeating for ``client_expire_ms``, has its connections closed and leaves its group.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from rmqlab.client.api import MQClientAPI
from rmqlab.client.errors import MQBrokerError
from rmqlab.client.publish_info import TopicPublishInfo
from rmqlab.protocol.codes import RequestCode, ResponseCode
from rmqlab.protocol.command import RemotingCommand
from rmqlab.protocol.event_log import EventLog
from rmqlab.protocol.model import ConsumerData, ConsumeType, HeartbeatData, Message, ProducerData
from rmqlab.protocol.pop_receipt import PROPERTY_POP_CK, ExtraInfo, real_topic
from rmqlab.protocol.remoting import RemotingClient, RemotingError
from rmqlab.protocol.route import PERM_READ, TopicRouteData
from rmqlab.proxy import convert
from rmqlab.proxy.convert import Delivery, ProxyError
from rmqlab.proxy.proxy_config import ProxyConfig
from rmqlab.proxy.renewal import RENEW_PERIOD_MS, HeldReceipt, ReceiptHandles
from rmqlab.proxy.v5 import Code, MessagingServiceServicer, pb, svc

CLIENT_ID_KEY = "x-mq-client-id"
CLIENT_VERSION_KEY = "x-mq-client-version"
NACK_INVISIBLE_MS = 1000  # ReceiveMessageResponseStreamWriter.NACK_INVISIBLE_TIME
PROXY_PRODUCER_GROUP = "PROXY_SEND_GROUP"  # the group our SEND_MESSAGE names for v5 producers
Handler = Callable[..., Awaitable[Any]]


@dataclass(slots=True)
class ClientSession:
    """One v5 client as the proxy knows it: its settings, its connections to brokers, its last call."""

    client_id: str
    remoting: RemotingClient
    last_seen_ms: int
    settings: Any = None
    group: str | None = None
    heartbeat_addrs: set[str] = field(default_factory=set)

    @property
    def api(self) -> MQClientAPI:
        return MQClientAPI(self.remoting)


def _meta(context: Any) -> dict[str, str]:
    return {k: v for k, v in (context.invocation_metadata() or ()) if isinstance(v, str)}


def _retry_delay_ms(reconsume_times: int) -> int:
    """The group's retry policy (CustomizedRetryPolicy over the delay levels) for a renewal stopped at 3 h."""
    delays = convert.RETRY_DELAYS_S
    return delays[min(max(reconsume_times, 0), len(delays) - 1)] * 1000


def answers(response: Any) -> Callable[[Handler], Handler]:
    """A unary call's errors as its response's status: a ProxyError's code, anything unexpected
    INTERNAL_SERVER_ERROR (logged), as the Java proxy's ResponseBuilder answers a throwable."""

    def wrap(fn: Handler) -> Handler:
        @functools.wraps(fn)
        async def call(self: MessagingService, request: Any, context: Any) -> Any:
            try:
                return await fn(self, request, context)
            except ProxyError as exc:
                return response(status=exc.status())
            except Exception as exc:
                self.log.error("call failed", call=fn.__name__, error=repr(exc))
                return response(status=pb.Status(code=Code.INTERNAL_SERVER_ERROR, message=repr(exc)))

        return call

    return wrap


class MessagingService(MessagingServiceServicer):  # type: ignore[misc]
    """The gRPC servicer; one per proxy process."""

    def __init__(self, config: ProxyConfig, log: EventLog) -> None:
        self.config = config
        self.log = log
        self.sessions: dict[str, ClientSession] = {}
        self._namesrv = RemotingClient(log=log)
        self._own = RemotingClient(log=log)  # the proxy's own requests: renewals of held receipts
        self.handles = ReceiptHandles()
        self._routes: dict[str, tuple[TopicRouteData, int]] = {}  # topic -> (route, fetched at, monotonic)
        self._refreshing: set[str] = set()
        self._assigned: dict[tuple[str, str, str], list[str]] = {}  # last QueryAssignment answer
        self._background: set[asyncio.Task[None]] = set()  # nacks that outlive their call
        self._renewing = asyncio.Lock()  # one scan at a time: a receipt is renewed once per scan
        self._publish: dict[str, TopicPublishInfo] = {}
        self.endpoints = pb.Endpoints(
            scheme=pb.IPv4, addresses=[pb.Address(host=config.host, port=config.port)]
        )

    # -- plumbing ------------------------------------------------------------------------------------
    def _timeout_s(self) -> float:
        return self.config.broker_timeout_ms / 1000

    def _now_ms(self) -> int:
        return time.monotonic_ns() // 1_000_000

    def _session(self, context: Any, *, create: bool = True, life_sign: bool = False) -> ClientSession:
        """The calling client's session. Only a heartbeat or settings on the telemetry stream are signs of
        life (``life_sign``), as in RocketMQ 5's proxy, where they alone register the client's channel
        anew (ClientActivity): a client that only receives, acks or sends is still dropped at the expiry."""
        client_id = _meta(context).get(CLIENT_ID_KEY, "")
        if not client_id:
            raise ProxyError(Code.CLIENT_ID_REQUIRED, f"the {CLIENT_ID_KEY} header is missing")
        session = self.sessions.get(client_id)
        if session is None:
            if not create:
                raise ProxyError(Code.UNRECOGNIZED_CLIENT_TYPE, "no settings received from this client yet")
            session = ClientSession(client_id, RemotingClient(log=self.log), self._now_ms())
            self.sessions[client_id] = session
        elif life_sign:
            session.last_seen_ms = self._now_ms()
        return session

    async def _route(self, topic: str) -> TopicRouteData:
        """TopicRouteService's cache: a known topic's route is answered from memory and refreshed in the
        background once it is older than ``route_refresh_ms``; an unknown topic is asked every time."""
        cached = self._routes.get(topic)
        if cached is None:
            route = await self._fetch_route(topic)
            self._routes[topic] = (route, self._now_ms())
            return route
        route, fetched_ms = cached
        stale = self._now_ms() - fetched_ms >= self.config.scaled(self.config.route_refresh_ms) * 1000
        if stale and topic not in self._refreshing:
            self._refreshing.add(topic)
            self._spawn(self._refresh_route(topic))
        return route

    async def _refresh_route(self, topic: str) -> None:
        try:
            self._routes[topic] = (await self._fetch_route(topic), self._now_ms())
        except ProxyError as exc:
            if exc.code == Code.TOPIC_NOT_FOUND:
                self._routes.pop(topic, None)
            # otherwise the name server is away: keep the last route, try again on the next call
        finally:
            self._refreshing.discard(topic)

    async def _fetch_route(self, topic: str) -> TopicRouteData:
        try:
            route = await MQClientAPI(self._namesrv).get_topic_route(
                self.config.namesrv, topic, self._timeout_s()
            )
        except MQBrokerError as exc:
            raise ProxyError(convert.broker_status(exc.code, exc.remark).code, exc.remark) from None
        except (RemotingError, OSError) as exc:
            raise ProxyError(
                Code.INTERNAL_SERVER_ERROR, f"name server {self.config.namesrv}: {exc}"
            ) from None
        if route is None:
            raise ProxyError(Code.TOPIC_NOT_FOUND, f"topic {topic!r} does not exist")
        return route

    async def _broker_addr(self, topic: str, broker_name: str) -> str:
        route = await self._route(topic)
        bd = route.broker(broker_name)
        addr = bd.master_addr() if bd is not None else None
        if addr is None:
            raise ProxyError(Code.BAD_REQUEST, f"broker {broker_name!r} is not in the route of {topic!r}")
        return addr

    async def _invoke(
        self, remoting: RemotingClient, addr: str, cmd: RemotingCommand, timeout_s: float
    ) -> RemotingCommand:
        try:
            return await remoting.invoke(addr, cmd, timeout_s)
        except TimeoutError:
            raise ProxyError(Code.PROXY_TIMEOUT, f"broker {addr} did not answer in time") from None
        except (RemotingError, OSError) as exc:
            raise ProxyError(Code.INTERNAL_SERVER_ERROR, f"broker {addr}: {exc}") from None

    async def close(self) -> None:
        # clearAllHandle: held messages visible again 1 s later (bounded: a broker may be gone)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(2 * self._timeout_s()):
                await self.renew_once(clear_all=True)
                await asyncio.gather(*self._background, return_exceptions=True)
        for session in list(self.sessions.values()):
            await session.remoting.close()
        self.sessions.clear()
        await self._namesrv.close()
        await self._own.close()

    async def expire_idle(self) -> None:
        """Drops clients silent for ``client_expire_ms`` (the proxy's channel expiry), every scan."""
        while True:
            await asyncio.sleep(self.config.scaled(self.config.scan_interval_ms))
            limit = self._now_ms() - self.config.scaled(self.config.client_expire_ms) * 1000
            for cid, session in list(self.sessions.items()):
                if session.last_seen_ms < limit:
                    self.sessions.pop(cid, None)
                    self.log.emit("proxy_client_expired", client_id=cid, group=session.group)
                    await session.remoting.close()
                    await self.renew_once()

    # -- held receipts (push consumers) ---------------------------------------------------------------
    def _hold(self, client_id: str, group: str, topic: str, msg_id: str, receipt: str, msg: Message) -> None:
        try:
            info = ExtraInfo.parse(receipt)
        except ValueError:
            return  # answered as it is; the client's ack will get INVALID_RECEIPT_HANDLE
        self.handles.add(
            HeldReceipt(
                client_id,
                group,
                topic,
                msg_id,
                receipt,
                receipt,
                info.revive_time,
                info.pop_time,
                msg.reconsume_times,
            )
        )

    async def renew_held(self) -> None:
        """scheduleRenewTask every RENEW_PERIOD_MS (scaled)."""
        while True:
            await asyncio.sleep(self.config.scaled(RENEW_PERIOD_MS))
            await self.renew_once()

    async def renew_once(self, *, clear_all: bool = False) -> None:
        async with self._renewing:
            await self._renew(clear_all)

    async def _renew(self, clear_all: bool) -> None:
        now = int(time.time() * 1000)
        online = (lambda _cid, _group: False) if clear_all else (lambda cid, _group: cid in self.sessions)
        for r in self.handles.due(now, online, _retry_delay_ms):
            try:
                status, new_handle = await self._change_invisible(
                    self._own, r.held.group, r.held.topic, r.held.current, r.invisible_ms
                )
            except ProxyError as exc:
                status, new_handle = exc.status(), ""
            ok = status.code == Code.OK
            self.log.emit(
                "proxy_receipt_renewal",
                kind=r.kind,
                client_id=r.held.client_id,
                group=r.held.group,
                msg_id=r.held.msg_id,
                invisible_ms=r.invisible_ms,
                ok=ok,
            )
            if r.kind != "RENEW":
                continue
            if ok:
                self.handles.renewed(r.held, new_handle, now + r.invisible_ms)
            else:
                self.handles.renew_failed(r.held, retry=status.code != Code.INVALID_RECEIPT_HANDLE)

    # -- route ---------------------------------------------------------------------------------------
    def _endpoints_of(self, request: Any) -> Any:
        """RouteActivity answers every broker with the endpoints the client reached the proxy by (they
        come with the request); the proxy's own listening address when a request has none."""
        if request.HasField("endpoints") and request.endpoints.addresses:
            return request.endpoints
        return self.endpoints

    @answers(svc.QueryRouteResponse)
    async def QueryRoute(self, request: Any, context: Any) -> Any:
        topic = convert.validate_topic(request.topic, request.HasField("topic"))
        route = await self._route(topic)
        queues = convert.route_message_queues(route, topic, self._endpoints_of(request))
        return svc.QueryRouteResponse(status=convert.ok_status(), message_queues=queues)

    @answers(svc.QueryAssignmentResponse)
    async def QueryAssignment(self, request: Any, context: Any) -> Any:
        """RouteActivity#queryAssignment: from the route, one "any queue" assignment per broker (the
        proxy's consumers pop, so the brokers' own QUERY_ASSIGNMENT is not asked)."""
        topic = convert.validate_topic(request.topic, request.HasField("topic"))
        group = convert.validate_group(request.group, request.HasField("group"))
        route = await self._route(topic)
        found = convert.assignments(route, topic, self._endpoints_of(request))
        # EVENTS.md's `assignment`, for the client: what it pops from, written when the answer changes.
        client_id = _meta(context).get(CLIENT_ID_KEY, "")
        pop = sorted(f"{a.message_queue.broker.name}:{a.message_queue.id}" for a in found)
        key = (client_id, group, topic)
        if self._assigned.get(key) != pop:
            self.log.emit(
                "assignment",
                group=group,
                client_id=client_id,
                topic=topic,
                strategy="PROXY",
                pull=[],
                pop=pop,
                changed=key in self._assigned,
            )
            self._assigned[key] = pop
        return svc.QueryAssignmentResponse(status=convert.ok_status(), assignments=found)

    # -- client --------------------------------------------------------------------------------------
    async def _register(self, session: ClientSession) -> None:
        """Heartbeats the client to every broker of its topics over its own connections (what the Java
        proxy's registerConsumer/registerProducer make the brokers see)."""
        settings = session.settings
        if settings.client_type in convert.CONSUMER_TYPES:
            group = convert.validate_group(
                settings.subscription.group, settings.subscription.HasField("group")
            )
            subs = convert.subscriptions(settings)
            consume_type = (
                ConsumeType.CONSUME_PASSIVELY
                if settings.client_type == pb.PUSH_CONSUMER
                else ConsumeType.CONSUME_ACTIVELY
            )
            hb = HeartbeatData(
                session.client_id,
                consumer_data_set=[ConsumerData(group, consume_type, subscription_data_set=subs)],
            )
            topics = [s.topic for s in subs]
            session.group = group
        elif settings.client_type == pb.PRODUCER:
            topics = [convert.validate_topic(t) for t in settings.publishing.topics]
            hb = HeartbeatData(session.client_id, producer_data_set=[ProducerData(PROXY_PRODUCER_GROUP)])
        else:
            raise ProxyError(
                Code.UNRECOGNIZED_CLIENT_TYPE, f"client type {settings.client_type} is not served"
            )
        addrs: set[str] = set()
        for topic in topics:
            with contextlib.suppress(ProxyError):  # a topic without a route yet: heartbeat the others
                route = await self._route(topic)
                addrs.update(a for bd in route.broker_datas if (a := bd.master_addr()) is not None)
        for addr in sorted(addrs):
            try:
                await session.api.send_heartbeat(addr, hb, self._timeout_s())
            except MQBrokerError as exc:
                raise ProxyError(convert.broker_status(exc.code, exc.remark).code, exc.remark) from None
            except (RemotingError, OSError) as exc:
                self.log.warning(
                    "heartbeat to a broker failed", client_id=session.client_id, broker=addr, error=str(exc)
                )
        session.heartbeat_addrs = addrs

    @answers(svc.HeartbeatResponse)
    async def Heartbeat(self, request: Any, context: Any) -> Any:
        session = self._session(context, create=False, life_sign=True)
        if session.settings is None:
            raise ProxyError(Code.UNRECOGNIZED_CLIENT_TYPE, "no settings received from this client yet")
        if session.settings.client_type in convert.CONSUMER_TYPES:
            convert.validate_group(request.group, request.HasField("group"))
        await self._register(session)
        return svc.HeartbeatResponse(status=convert.ok_status())

    async def Telemetry(self, request_iterator: Any, context: Any) -> AsyncIterator[Any]:
        try:
            session = self._session(context)
        except ProxyError as exc:
            yield svc.TelemetryCommand(status=exc.status())
            return
        async for command in request_iterator:
            if command.WhichOneof("command") != "settings":
                continue  # answers to commands the proxy never sends
            try:
                settings = command.settings
                if settings.client_type not in convert.CONSUMER_TYPES and settings.client_type != pb.PRODUCER:
                    raise ProxyError(
                        Code.UNRECOGNIZED_CLIENT_TYPE, f"client type {settings.client_type} is not served"
                    )
                session = self._session(context, life_sign=True)  # anew, if it expired meanwhile
                session.settings = settings
                await self._register(session)
                answer = convert.answer_settings(settings)
                self.log.emit(
                    "proxy_client_settings",
                    client_id=session.client_id,
                    client_type=pb.ClientType.Name(settings.client_type),
                    group=session.group,
                )
                yield svc.TelemetryCommand(status=convert.ok_status(), settings=answer)
            except ProxyError as exc:
                yield svc.TelemetryCommand(status=exc.status())

    @answers(svc.NotifyClientTerminationResponse)
    async def NotifyClientTermination(self, request: Any, context: Any) -> Any:
        session = self._session(context, create=False)
        self.sessions.pop(session.client_id, None)
        group = request.group.name if request.HasField("group") else session.group
        for addr in sorted(session.heartbeat_addrs):
            with contextlib.suppress(MQBrokerError, RemotingError, OSError):
                if group:
                    await session.api.unregister_client(
                        addr, session.client_id, consumer_group=group, timeout_s=self._timeout_s()
                    )
                else:
                    await session.api.unregister_client(
                        addr,
                        session.client_id,
                        producer_group=PROXY_PRODUCER_GROUP,
                        timeout_s=self._timeout_s(),
                    )
        await session.remoting.close()
        self.log.emit("proxy_client_terminated", client_id=session.client_id, group=group)
        await self.renew_once()  # CLIENT_UNREGISTER: its held receipts become visible 1 s later
        return svc.NotifyClientTerminationResponse(status=convert.ok_status())

    # -- produce -------------------------------------------------------------------------------------
    @answers(svc.SendMessageResponse)
    async def SendMessage(self, request: Any, context: Any) -> Any:
        session = self._session(context)
        if not request.messages:
            raise ProxyError(Code.BAD_REQUEST, "no message to send")
        sends = [convert.incoming_message(m) for m in request.messages]
        topic = convert.send_topic(sends)
        route = await self._route(topic)
        info = self._publish.get(topic)
        queues = route.publish_queues(topic)
        if info is None or info.message_queues != queues:
            info = TopicPublishInfo(topic, queues, route, info.send_which_queue if info else 0)
            self._publish[topic] = info
        if not info.ok():
            raise ProxyError(Code.FORBIDDEN, f"topic {topic!r} has no writable queue")
        mq = info.select_one()
        addr = route.broker(mq.broker_name).master_addr()  # type: ignore[union-attr]
        entries = []
        born = int(time.time() * 1000)
        for m in sends:
            try:
                result = await session.api.send_message(
                    addr,  # type: ignore[arg-type]
                    producer_group=PROXY_PRODUCER_GROUP,
                    mq=mq,
                    body=m.body,
                    tags=m.tags,
                    keys=m.keys,
                    properties=m.properties,
                    born_timestamp=born,
                    timeout_s=self._timeout_s(),
                )
                # The proxy is the producer the broker sees: only it knows the queue the message went to.
                self.log.emit(
                    "message_sent",
                    msg_id=m.message_id,
                    topic=topic,
                    broker=result.broker_name,
                    queue_id=result.queue_id,
                    queue_offset=result.queue_offset,
                    client_id=session.client_id,
                )
                entries.append(
                    svc.SendResultEntry(
                        status=convert.ok_status(), message_id=m.message_id, offset=result.queue_offset
                    )
                )
            except MQBrokerError as exc:
                entries.append(
                    svc.SendResultEntry(
                        status=convert.broker_status(exc.code, exc.remark), message_id=m.message_id
                    )
                )
            except (RemotingError, OSError) as exc:
                status = pb.Status(code=Code.INTERNAL_SERVER_ERROR, message=f"broker {addr}: {exc}")
                entries.append(svc.SendResultEntry(status=status, message_id=m.message_id))
        return svc.SendMessageResponse(
            status=convert.merged_status([e.status for e in entries]), entries=entries
        )

    # -- consume -------------------------------------------------------------------------------------
    def _consumer(self, context: Any, group_res: Any, has_group: bool) -> tuple[ClientSession, str]:
        session = self._session(context)
        group = convert.validate_group(group_res, has_group)
        return session, group

    async def ReceiveMessage(self, request: Any, context: Any) -> AsyncIterator[Any]:
        """ReceiveMessageActivity: one POP_MESSAGE with long polling; the stream carries a status, the
        messages, then the delivery time. The pop outlives a client that goes away: messages that could
        not be written are handed back 1 s later (processThrowableWhenWriteMessage)."""
        client_id = _meta(context).get(CLIENT_ID_KEY, "")
        pop = asyncio.ensure_future(self._receive_answer(request, context))
        try:
            responses = await asyncio.shield(pop)
        except asyncio.CancelledError:

            def popped(t: asyncio.Future[list[Any]]) -> None:
                if not t.cancelled():
                    self._spawn(self._nack_unwritten(request, client_id, t.result()))

            pop.add_done_callback(popped)
            raise
        written = 0
        try:
            for response in responses:
                yield response
                written += 1
            # ReceiveMessageResponseStreamWriter#onComplete: every stream ends with the delivery time,
            # which the clients' receive-latency metric reads.
            yield svc.ReceiveMessageResponse(delivery_timestamp=convert.to_timestamp(int(time.time() * 1000)))
        finally:
            if written < len(responses):
                self._spawn(self._nack_unwritten(request, client_id, responses[written:]))

    async def _receive_answer(self, request: Any, context: Any) -> list[Any]:
        try:
            return await self._receive(request, context)
        except ProxyError as exc:
            return [svc.ReceiveMessageResponse(status=exc.status())]
        except Exception as exc:
            self.log.error("call failed", call="ReceiveMessage", error=repr(exc))
            status = pb.Status(code=Code.INTERNAL_SERVER_ERROR, message=repr(exc))
            return [svc.ReceiveMessageResponse(status=status)]

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _nack_unwritten(self, request: Any, client_id: str, responses: list[Any]) -> None:
        """Messages popped for a receive whose client is gone: visible again NACK_INVISIBLE_MS later."""
        group, topic = request.group.name, request.message_queue.topic.name
        for r in responses:
            if r.WhichOneof("content") != "message":
                continue
            sp = r.message.system_properties
            self.handles.remove(client_id, group, sp.message_id, sp.receipt_handle)
            try:
                status, _ = await self._change_invisible(
                    self._own, group, topic, sp.receipt_handle, NACK_INVISIBLE_MS
                )
            except ProxyError as exc:
                status = exc.status()
            self.log.emit(
                "proxy_receipt_renewal",
                kind="NACK_UNWRITTEN",
                client_id=client_id,
                group=group,
                msg_id=sp.message_id,
                invisible_ms=NACK_INVISIBLE_MS,
                ok=status.code == Code.OK,
            )

    async def _receive(self, request: Any, context: Any) -> list[Any]:
        session, group = self._consumer(context, request.group, request.HasField("group"))
        if not request.HasField("message_queue"):
            raise ProxyError(Code.BAD_REQUEST, "message_queue is missing")
        topic = convert.validate_topic(request.message_queue.topic, request.message_queue.HasField("topic"))
        remaining = context.time_remaining()
        remaining_ms = int(remaining * 1000) if remaining is not None else 2**31
        request_timeout_ms = (
            convert.duration_ms(session.settings.request_timeout)
            if session.settings is not None and session.settings.HasField("request_timeout")
            else self.config.broker_timeout_ms
        )
        polling_ms = convert.polling_time_ms(
            convert.duration_ms(request.long_polling_timeout)
            if request.HasField("long_polling_timeout")
            else None,
            remaining_ms,
            request_timeout_ms,
            _meta(context).get(CLIENT_VERSION_KEY),
            self.config.min_long_polling_ms,
            self.config.max_long_polling_ms,
        )
        if request.auto_renew:
            invisible_ms = self.config.default_invisible_ms
        else:
            invisible_ms = convert.validate_invisible_ms(
                convert.duration_ms(request.invisible_duration),
                self.config.min_invisible_ms,
                self.config.max_invisible_ms,
            )
        sub = convert.expression_sub_string(request.filter_expression, request.HasField("filter_expression"))
        if request.batch_size <= 0:
            raise ProxyError(Code.BAD_REQUEST, f"batch_size must be positive, got {request.batch_size}")
        route = await self._route(topic)
        broker_name = request.message_queue.broker.name
        bd = route.broker(broker_name) if broker_name else None
        if bd is None:  # ReceiveMessageQueueSelector: any readable broker of the route
            readable = [
                qd.broker_name
                for qd in route.queue_datas
                if qd.perm & PERM_READ and route.broker(qd.broker_name)
            ]
            if not readable:
                raise ProxyError(Code.FORBIDDEN, f"topic {topic!r} has no readable queue")
            bd = route.broker(readable[0])
        addr = bd.master_addr() if bd is not None else None
        if addr is None:
            raise ProxyError(Code.INTERNAL_SERVER_ERROR, f"broker {broker_name!r} has no master")
        max_attempts = (
            session.settings.backoff_policy.max_attempts
            if session.settings is not None and session.settings.HasField("backoff_policy")
            else convert.RETRY_MAX_TIMES + 1
        )
        ext = {
            "consumerGroup": group,
            "topic": topic,
            "queueId": -1,
            "maxMsgNums": request.batch_size,
            "invisibleTime": invisible_ms,
            "pollTime": polling_ms,
            "bornTime": int(time.time() * 1000),
            "initMode": 1,  # ConsumeInitMode.MAX
            "expType": "TAG",
            "exp": sub,
            "order": False,
        }
        cmd = RemotingCommand.request(RequestCode.POP_MESSAGE, ext)
        resp = await self._invoke(session.remoting, addr, cmd, polling_ms / 1000 + self._timeout_s())
        if resp.code in (ResponseCode.PULL_NOT_FOUND, ResponseCode.NO_MESSAGE, ResponseCode.POLLING_TIMEOUT):
            return [
                svc.ReceiveMessageResponse(
                    status=pb.Status(code=Code.MESSAGE_NOT_FOUND, message="no new message")
                )
            ]
        if resp.code == ResponseCode.POLLING_FULL:
            return [
                svc.ReceiveMessageResponse(
                    status=pb.Status(code=Code.TOO_MANY_REQUESTS, message="polling full")
                )
            ]
        if resp.code != ResponseCode.SUCCESS:
            return [svc.ReceiveMessageResponse(status=convert.broker_status(resp.code, resp.remark))]
        raw = resp.body.get("messages") if isinstance(resp.body, dict) else None
        messages = [Message.from_wire(m) for m in raw or []]
        delivered = []
        for msg in messages:
            receipt = msg.properties.get(PROPERTY_POP_CK, "")
            if msg.reconsume_times + 1 > max_attempts:
                # PopMessageResultFilterImpl: past the client's max attempts the proxy moves it to the DLQ
                await self._to_dlq(session, addr, group, topic, receipt, msg.msg_id)
                continue
            out = convert.outgoing_message(topic, msg, Delivery(receipt, invisible_ms, addr))
            delivered.append(out)
            if request.auto_renew:
                self._hold(session.client_id, group, topic, out.system_properties.message_id, receipt, msg)
        if not delivered:
            return [
                svc.ReceiveMessageResponse(
                    status=pb.Status(code=Code.MESSAGE_NOT_FOUND, message="no match message")
                )
            ]
        return [
            svc.ReceiveMessageResponse(status=convert.ok_status()),
            *(svc.ReceiveMessageResponse(message=m) for m in delivered),
        ]

    def _receipt(self, handle: str) -> ExtraInfo:
        """ReceiptHandle.decode and its expiry check (INVALID_RECEIPT_HANDLE for either)."""

        if not handle:
            raise ProxyError(Code.INVALID_RECEIPT_HANDLE, "receipt handle is missing")
        try:
            info = ExtraInfo.parse(handle)
        except ValueError as exc:
            raise ProxyError(Code.INVALID_RECEIPT_HANDLE, f"receipt handle is malformed: {exc}") from None
        if info.revive_time <= int(time.time() * 1000):
            raise ProxyError(Code.INVALID_RECEIPT_HANDLE, "receipt handle has expired")
        return info

    async def _ack(self, session: ClientSession, group: str, topic: str, msg_id: str, handle: str) -> Any:
        held = self.handles.remove(session.client_id, group, msg_id, handle)
        if held is not None:  # renewed meanwhile: the broker knows the newest receipt only
            handle = held.current
        info = self._receipt(handle)
        addr = await self._broker_addr(topic, info.broker_name)
        ext = {
            "consumerGroup": group,
            "topic": real_topic(topic, group, info.retry),
            "queueId": info.queue_id,
            "extraInfo": handle,
            "offset": info.queue_offset,
        }
        resp = await self._invoke(
            session.remoting, addr, RemotingCommand.request(RequestCode.ACK_MESSAGE, ext), self._timeout_s()
        )
        if resp.code != ResponseCode.SUCCESS:
            return convert.receipt_status(resp.code, resp.remark)
        return convert.ok_status()

    @answers(svc.AckMessageResponse)
    async def AckMessage(self, request: Any, context: Any) -> Any:
        session, group = self._consumer(context, request.group, request.HasField("group"))
        topic = convert.validate_topic(request.topic, request.HasField("topic"))
        if not request.entries:
            raise ProxyError(Code.BAD_REQUEST, "no entry to acknowledge")
        results = []
        for entry in request.entries:
            try:
                status = await self._ack(session, group, topic, entry.message_id, entry.receipt_handle)
            except ProxyError as exc:
                status = exc.status()
            results.append(
                svc.AckMessageResultEntry(
                    message_id=entry.message_id, receipt_handle=entry.receipt_handle, status=status
                )
            )
        return svc.AckMessageResponse(
            status=convert.merged_status([r.status for r in results]), entries=results
        )

    @answers(svc.ChangeInvisibleDurationResponse)
    async def ChangeInvisibleDuration(self, request: Any, context: Any) -> Any:
        session, group = self._consumer(context, request.group, request.HasField("group"))
        topic = convert.validate_topic(request.topic, request.HasField("topic"))
        if not request.HasField("invisible_duration"):
            raise ProxyError(Code.ILLEGAL_INVISIBLE_TIME, "invisible_duration is missing")
        invisible_ms = convert.validate_invisible_ms(
            convert.duration_ms(request.invisible_duration), 0, self.config.max_invisible_ms
        )
        handle = request.receipt_handle
        held = self.handles.remove(session.client_id, group, request.message_id, handle)
        if held is not None:  # the client takes the message back from the renewal
            handle = held.current
        status, new_handle = await self._change_invisible(
            session.remoting, group, topic, handle, invisible_ms
        )
        return svc.ChangeInvisibleDurationResponse(status=status, receipt_handle=new_handle)

    async def _change_invisible(
        self, remoting: RemotingClient, group: str, topic: str, handle: str, invisible_ms: int
    ) -> tuple[Any, str]:
        """CHANGE_MESSAGE_INVISIBLETIME: the status and the new receipt ("" unless OK)."""
        info = self._receipt(handle)
        addr = await self._broker_addr(topic, info.broker_name)
        ext = {
            "consumerGroup": group,
            "topic": real_topic(topic, group, info.retry),
            "queueId": info.queue_id,
            "extraInfo": handle,
            "offset": info.queue_offset,
            "invisibleTime": invisible_ms,
        }
        cmd = RemotingCommand.request(RequestCode.CHANGE_MESSAGE_INVISIBLETIME, ext)
        resp = await self._invoke(remoting, addr, cmd, self._timeout_s())
        if resp.code != ResponseCode.SUCCESS:
            return convert.receipt_status(resp.code, resp.remark), ""
        new_handle = resp.ext.get("extraInfo")
        if not isinstance(new_handle, str) or not new_handle:
            raise ProxyError(Code.INTERNAL_SERVER_ERROR, f"broker {addr} answered without the new receipt")
        return convert.ok_status(), new_handle

    async def _to_dlq(
        self, session: ClientSession, addr: str, group: str, topic: str, handle: str, msg_id: str
    ) -> Any:
        """ProducerProcessor.forwardMessageToDeadLetterQueue: CONSUMER_SEND_MSG_BACK with delay level -1,
        then the ack that ends the pop."""
        info = self._receipt(handle)
        ext = {
            "group": group,
            "originTopic": real_topic(topic, group, info.retry),
            "queueId": info.queue_id,
            "offset": info.queue_offset,
            "originMsgId": msg_id,
            "delayLevel": -1,
            "maxReconsumeTimes": 0,
        }
        cmd = RemotingCommand.request(RequestCode.CONSUMER_SEND_MSG_BACK, ext)
        resp = await self._invoke(session.remoting, addr, cmd, self._timeout_s())
        if resp.code != ResponseCode.SUCCESS:
            return convert.broker_status(resp.code, resp.remark)
        return await self._ack(session, group, topic, msg_id, handle)

    @answers(svc.ForwardMessageToDeadLetterQueueResponse)
    async def ForwardMessageToDeadLetterQueue(self, request: Any, context: Any) -> Any:
        session, group = self._consumer(context, request.group, request.HasField("group"))
        topic = convert.validate_topic(request.topic, request.HasField("topic"))
        handle = request.receipt_handle
        held = self.handles.remove(session.client_id, group, request.message_id, handle)
        if held is not None:
            handle = held.current
        info = self._receipt(handle)
        addr = await self._broker_addr(topic, info.broker_name)
        status = await self._to_dlq(session, addr, group, topic, handle, request.message_id)
        return svc.ForwardMessageToDeadLetterQueueResponse(status=status)
