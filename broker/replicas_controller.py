"""RocketMQ 5's controller inside the name server (``enableControllerInNamesrv``): the requests of
``ControllerRequestProcessor`` over ``broker.replicas_info``'s state, the scan for replicas whose
heartbeats stopped (``scanNotActiveBrokerInterval``, 5 s) and the election that follows when one of them
is a master, with NOTIFY_BROKER_ROLE_CHANGED to the set's replicas (``notifyBrokerRoleChanged``).

One controller, no DLedger/Raft group: its state lives as long as the name server process.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from rmqlab.broker.replicas_info import (
    DEFAULT_HEARTBEAT_TIMEOUT_MS,
    BrokerSet,
    ControllerRefused,
    Election,
    ReplicasInfoManager,
)
from rmqlab.protocol.clock import Clock, TimeScale
from rmqlab.protocol.codes import RequestCode, ResponseCode
from rmqlab.protocol.command import CommandError, InvalidParameter, RemotingCommand
from rmqlab.protocol.event_log import EventLog
from rmqlab.protocol.remoting import Connection, RemotingError, RemotingServer

# ControllerConfig.scanNotActiveBrokerInterval (the heartbeat manager's scan, first after 2 s)
SCAN_NOT_ACTIVE_BROKER_INTERVAL_MS = 5_000


class ControllerManager:
    """The controller's requests, scan and notifications; ``time_scale`` scales the scan and the
    heartbeat timeouts the brokers send (they are RocketMQ milliseconds)."""

    def __init__(
        self, log: EventLog, clock: Clock, time_scale: float, *, enable_elect_unclean_master: bool = False
    ) -> None:
        self.log = log
        self.clock = clock
        self.scale = TimeScale(time_scale)
        self.replicas = ReplicasInfoManager(enable_elect_unclean_master=enable_elect_unclean_master)
        self._conns: dict[tuple[str, int], Connection] = {}
        self._tasks: set[asyncio.Task[None]] = set()  # elections started by a closed connection

    def register(self, server: RemotingServer) -> None:
        server.register(RequestCode.CONTROLLER_REGISTER_BROKER, self.register_broker)
        server.register(RequestCode.BROKER_HEARTBEAT, self.broker_heartbeat)
        server.register(RequestCode.CONTROLLER_ELECT_MASTER, self.elect_master)
        server.register(RequestCode.CONTROLLER_GET_REPLICA_INFO, self.get_replica_info)
        server.register(RequestCode.CONTROLLER_ALTER_SYNC_STATE_SET, self.alter_sync_state_set)

    # -- requests ---------------------------------------------------------------------------------------
    def register_broker(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        name = _non_empty(cmd, "brokerName")
        addr = _non_empty(cmd, "brokerAddress")
        broker_id = cmd.ext_int("brokerId")
        try:
            bs = self.replicas.register_broker(_non_empty(cmd, "clusterName"), name, broker_id, addr)
        except ValueError as exc:
            raise InvalidParameter("brokerId", str(exc)) from None
        self._heartbeat(conn, name, broker_id, addr, DEFAULT_HEARTBEAT_TIMEOUT_MS, -1, -1)
        return cmd.response(ext=_master_ext(bs), body=_sync_state_body(bs))

    def broker_heartbeat(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        name = _non_empty(cmd, "brokerName")
        broker_id = cmd.ext_int("brokerId")
        self._heartbeat(
            conn,
            name,
            broker_id,
            _non_empty(cmd, "brokerAddr"),
            cmd.ext_int("heartbeatTimeoutMills", DEFAULT_HEARTBEAT_TIMEOUT_MS),
            cmd.ext_int("epoch", -1),
            cmd.ext_int("maxOffset", -1),
        )
        return cmd.response()

    def _heartbeat(
        self,
        conn: Connection,
        name: str,
        broker_id: int,
        addr: str,
        timeout_ms: int,
        epoch: int,
        max_offset: int,
    ) -> None:
        self.replicas.heartbeat(
            name,
            broker_id,
            addr,
            self.clock.monotonic_ms(),
            timeout_ms=self.scale.whole_ms(timeout_ms),
            epoch=epoch,
            max_offset=max_offset,
            conn_id=conn.id,
        )
        self._conns[(name, broker_id)] = conn

    async def elect_master(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        """A broker with no master asks to be it (designateElect false), or an operator's electMaster
        names the replica (designateElect true)."""
        name = _non_empty(cmd, "brokerName")
        broker_id = cmd.ext_int("brokerId", None)
        designate = bool(cmd.ext_bool("designateElect", False))
        try:
            election = self.replicas.elect_master(
                name, broker_id, self.clock.monotonic_ms(), designate=designate
            )
        except ControllerRefused as exc:
            bs = self.replicas.sets.get(name)
            ext = _master_ext(bs) if bs is not None else {}
            return cmd.response(code=int(exc.code), remark=exc.remark, ext=ext)
        await self._elected(election, "designated" if designate else "requested")
        bs = self.replicas.sets[name]
        return cmd.response(ext=_master_ext(bs), body=_sync_state_body(bs))

    def get_replica_info(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        name = _non_empty(cmd, "brokerName")
        bs = self.replicas.sets.get(name)
        if bs is None:
            raise CommandError(
                ResponseCode.CONTROLLER_BROKER_METADATA_NOT_EXIST, f"broker set {name} is not registered"
            )
        return cmd.response(ext=_master_ext(bs), body=_sync_state_body(bs))

    def alter_sync_state_set(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        name = _non_empty(cmd, "brokerName")
        body = cmd.body if isinstance(cmd.body, dict) else {}
        raw = body.get("syncStateSet")
        if not isinstance(raw, list) or not all(type(b) is int for b in raw):
            raise InvalidParameter("body.syncStateSet", "expected a list of broker ids")
        epoch = body.get("syncStateSetEpoch")
        if type(epoch) is not int:
            raise InvalidParameter("body.syncStateSetEpoch", "expected an int")
        try:
            new_epoch = self.replicas.alter_sync_state_set(
                name,
                cmd.ext_int("masterBrokerId"),
                cmd.ext_int("masterEpoch"),
                raw,
                epoch,
                self.clock.monotonic_ms(),
            )
        except ControllerRefused as exc:
            return cmd.response(code=int(exc.code), remark=exc.remark)
        bs = self.replicas.sets[name]
        self.log.emit(
            "sync_state_set_changed",
            broker=name,
            master_id=bs.master_id,
            master_epoch=bs.master_epoch,
            sync_state_set=sorted(bs.sync_state_set),
            sync_state_set_epoch=new_epoch,
        )
        return cmd.response(ext={"newSyncStateSetEpoch": new_epoch})

    # -- liveness and elections --------------------------------------------------------------------------
    async def run(self) -> None:
        """The heartbeat manager's scan: replicas silent past their heartbeat timeout are inactive, and a
        set whose master is inactive gets an election (scanInactiveMasterAndTriggerReelect)."""
        interval = self.scale.whole_ms(SCAN_NOT_ACTIVE_BROKER_INTERVAL_MS) / 1000
        while True:
            await asyncio.sleep(interval)
            try:
                now = self.clock.monotonic_ms()
                for name, broker_id in self.replicas.scan_not_active(now):
                    self._inactive(name, broker_id, "heartbeat_timeout")
                    conn = self._conns.pop((name, broker_id), None)
                    if conn is not None:
                        conn.close()  # RemotingHelper.closeChannel
                for name in self.replicas.inactive_masters(now):
                    await self._reelect(name)
            except Exception as exc:  # one failed scan must not stop the next
                self.log.error("controller scan failed", error=repr(exc))

    def on_connection_closed(self, conn: Connection) -> None:
        """onBrokerChannelClose: a replica's connection closed, it is inactive now; a master's goes to an
        election at once."""
        for name, broker_id in self.replicas.on_connection_closed(conn.id):
            self._conns.pop((name, broker_id), None)
            self._inactive(name, broker_id, "channel_closed")
            bs = self.replicas.sets.get(name)
            if bs is not None and bs.master_id == broker_id:
                task = asyncio.get_running_loop().create_task(self._reelect(name))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def _inactive(self, name: str, broker_id: int, reason: str) -> None:
        self.log.emit("controller_broker_inactive", broker=name, broker_id=broker_id, reason=reason)

    async def _reelect(self, name: str) -> None:
        try:
            election = self.replicas.elect_master(name, None, self.clock.monotonic_ms())
        except ControllerRefused as exc:
            self.log.warning("election failed", broker=name, code=int(exc.code), remark=exc.remark)
            return
        await self._elected(election, "master_inactive")

    async def _elected(self, e: Election, trigger: str) -> None:
        self.log.emit(
            "master_elected",
            broker=e.broker_name,
            master_id=e.master_id,
            master_addr=e.master_addr,
            old_master_id=e.old_master_id,
            master_epoch=e.master_epoch,
            sync_state_set=sorted(e.sync_state_set),
            sync_state_set_epoch=e.sync_state_set_epoch,
            trigger=trigger,
            reason=e.reason,
        )
        if e.master_id is not None:
            await self._notify(self.replicas.sets[e.broker_name])

    async def _notify(self, bs: BrokerSet) -> None:
        """NOTIFY_BROKER_ROLE_CHANGED to every live replica of the set, over its heartbeat connection."""
        for broker_id in sorted(bs.addrs):
            conn = self._conns.get((bs.broker_name, broker_id))
            if conn is None:
                continue
            cmd = RemotingCommand.request(
                RequestCode.NOTIFY_BROKER_ROLE_CHANGED, _master_ext(bs), _sync_state_body(bs)
            )
            with contextlib.suppress(RemotingError, OSError):
                await conn.invoke_oneway(cmd, timeout_s=max(0.5, self.scale.whole_ms(3_000) / 1000))


def _master_ext(bs: BrokerSet) -> dict[str, Any]:
    """The master fields of RegisterBrokerToControllerResponseHeader / GetReplicaInfoResponseHeader /
    ElectMasterResponseHeader / NotifyBrokerRoleChangedRequestHeader."""
    ext: dict[str, Any] = {"masterEpoch": bs.master_epoch, "syncStateSetEpoch": bs.sync_state_set_epoch}
    if bs.master_id is not None:
        ext["masterBrokerId"] = bs.master_id
        ext["masterAddress"] = bs.master_addr
    return ext


def _sync_state_body(bs: BrokerSet) -> dict[str, Any]:
    return {"syncStateSet": sorted(bs.sync_state_set), "syncStateSetEpoch": bs.sync_state_set_epoch}


def _non_empty(cmd: RemotingCommand, name: str) -> str:
    value = cmd.ext_str(name)
    if not value:
        raise InvalidParameter(name, "is empty")
    return value
