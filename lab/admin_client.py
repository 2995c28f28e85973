"""Admin requests to brokers: fault injection (9000-9002), policies (9003), status (9004), topics
(UPDATE_AND_CREATE_TOPIC), RocketMQ 5's request modes, and route look-ups and (in controller mode) an
operator's master election at a name server. Every backend
of the lab sends them with ``AdminClient``; ``rmq-admin`` (``chaos.admin_main``) is its command line."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rmqlab.protocol.acl_signing import SessionCredentials
from rmqlab.protocol.codes import RequestCode, ResponseCode
from rmqlab.protocol.command import RemotingCommand
from rmqlab.protocol.remoting import RemotingClient

PERM_READ_WRITE = 6


class AdminError(Exception):
    """The broker answered an admin request with an error response."""

    def __init__(self, request: str, code: int, remark: str | None) -> None:
        try:
            name = ResponseCode(code).name
        except ValueError:
            name = str(code)
        super().__init__(f"{request}: broker answered {name} ({code})" + (f": {remark}" if remark else ""))
        self.code = code
        self.remark = remark


class AdminClient:
    """Admin requests to brokers (and route look-ups at a name server) over one RemotingClient."""

    def __init__(
        self,
        client: RemotingClient | None = None,
        timeout_s: float = 5.0,
        credentials: SessionCredentials | None = None,
    ) -> None:
        self._own = client is None
        self.client = client or RemotingClient(connect_timeout_s=timeout_s, credentials=credentials)
        self.timeout_s = timeout_s

    async def close(self) -> None:
        if self._own:
            await self.client.close()

    async def __aenter__(self) -> AdminClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _call(
        self, addr: str, code: int, ext: dict[str, Any] | None = None, body: Any = None
    ) -> RemotingCommand:
        resp = await self.client.invoke(addr, RemotingCommand.request(code, ext, body), self.timeout_s)
        if resp.code != ResponseCode.SUCCESS:
            try:
                name = RequestCode(code).name
            except ValueError:
                name = str(code)
            raise AdminError(name, resp.code, resp.remark)
        return resp

    async def fault_add(
        self,
        addr: str,
        *,
        request_code: int,
        errors: Sequence[dict[str, Any] | tuple[int, str]] = (),
        count: int | None = None,
        group: str | None = None,
        client_id: str | None = None,
        latency_ms: int = 0,
        drop: bool = False,
        duration_ms: int | None = None,
    ) -> int:
        errs = [e if isinstance(e, dict) else {"code": e[0], "remark": e[1]} for e in errors]
        body = {
            "requestCode": int(request_code),
            "group": group,
            "clientId": client_id,
            "errors": errs,
            "latencyMs": int(latency_ms),
            "drop": bool(drop),
            "count": count,
            "durationMs": duration_ms,
        }
        resp = await self._call(addr, RequestCode.ADMIN_FAULT_ADD, body=body)
        fault_id = resp.ext.get("faultId")
        return int(fault_id) if isinstance(fault_id, int) else -1

    async def fault_clear(self, addr: str, fault_id: int | None = None) -> None:
        await self._call(
            addr, RequestCode.ADMIN_FAULT_CLEAR, {"faultId": fault_id} if fault_id is not None else {}
        )

    async def fault_list(self, addr: str) -> list[dict[str, Any]]:
        resp = await self._call(addr, RequestCode.ADMIN_FAULT_LIST)
        body = resp.body if isinstance(resp.body, dict) else {}
        faults = body.get("faults", [])
        return list(faults) if isinstance(faults, list) else []

    async def policy_set(
        self,
        addr: str,
        *,
        notify_on_channel_expired: bool | None = None,
        release_locks_on_close: bool | None = None,
    ) -> None:
        ext: dict[str, Any] = {}
        if notify_on_channel_expired is not None:
            ext["notifyOnChannelExpired"] = notify_on_channel_expired
        if release_locks_on_close is not None:
            ext["releaseLocksOnChannelClose"] = release_locks_on_close
        await self._call(addr, RequestCode.ADMIN_POLICY_SET, ext)

    async def elect_master(self, namesrv: str, broker_name: str, broker_id: int) -> dict[str, Any]:
        """mqadmin electMaster: CONTROLLER_ELECT_MASTER with designateElect at the name server's controller
        (RocketMQ 5, enableControllerInNamesrv); returns the answer's master fields."""
        ext = {"brokerName": broker_name, "brokerId": broker_id, "designateElect": True}
        return dict((await self._call(namesrv, RequestCode.CONTROLLER_ELECT_MASTER, ext)).ext)

    async def status(self, addr: str) -> dict[str, Any]:
        resp = await self._call(addr, RequestCode.ADMIN_BROKER_STATUS)
        return resp.body if isinstance(resp.body, dict) else {"body": resp.body}

    async def topic_create(self, addr: str, topic: str, queues: int, perm: int = PERM_READ_WRITE) -> None:
        ext = {"topic": topic, "readQueueNums": queues, "writeQueueNums": queues, "perm": perm}
        await self._call(addr, RequestCode.UPDATE_AND_CREATE_TOPIC, ext)

    async def set_message_request_mode(
        self, addr: str, topic: str, group: str, mode: str, pop_share_queue_num: int = 0
    ) -> None:
        """SET_MESSAGE_REQUEST_MODE (RocketMQ 5): how the broker assigns ``topic`` to ``group``'s
        consumers that ask it (PULL: queues by the strategy; POP: see popShareQueueNum)."""
        body = {"topic": topic, "consumerGroup": group, "mode": mode, "popShareQueueNum": pop_share_queue_num}
        await self._call(addr, RequestCode.SET_MESSAGE_REQUEST_MODE, body=body)

    async def route(self, namesrv: str, topic: str) -> dict[str, Any] | None:
        """The name server's route for ``topic``, or None when it does not know the topic (yet)."""
        resp = await self.client.invoke(
            namesrv,
            RemotingCommand.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": topic}),
            self.timeout_s,
        )
        if resp.code == ResponseCode.TOPIC_NOT_EXIST:
            return None
        if resp.code != ResponseCode.SUCCESS:
            raise AdminError("GET_ROUTEINFO_BY_TOPIC", resp.code, resp.remark)
        return resp.body if isinstance(resp.body, dict) else None


def route_brokers(route: dict[str, Any] | None) -> set[str]:
    """Broker names that a route answer gives queues for."""
    if not route:
        return set()
    names = set()
    for qd in route.get("queueDatas") or []:
        if isinstance(qd, dict) and isinstance(qd.get("brokerName"), str):
            names.add(qd["brokerName"])
    return names
