"""A broker in RocketMQ 5's controller mode (``broker/controller/ReplicasManager``): it registers with the
controller, heartbeats to it (``brokerHeartbeatInterval``, 1 s), asks it who the master is every
``syncBrokerMetadataPeriod`` (5 s) and when told (NOTIFY_BROKER_ROLE_CHANGED), and becomes master or
slave as it answers; as master it reports its SyncStateSet (``checkSyncStateSetPeriod``, 5 s): itself and
the slaves that caught up within ``haMaxTimeSlaveNotCatchup`` (15 s). The role change itself is the
broker's (``RoleHost``).
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any, Protocol

from rmqlab.broker.replicas_info import FIRST_BROKER_CONTROLLER_ID
from rmqlab.broker.server_config import BrokerConfig
from rmqlab.protocol.clock import Clock
from rmqlab.protocol.codes import RequestCode, ResponseCode
from rmqlab.protocol.command import RemotingCommand
from rmqlab.protocol.event_log import EventLog
from rmqlab.protocol.model import WireError
from rmqlab.protocol.remoting import Connection, RemotingClient, RemotingError


class RoleHost(Protocol):
    """What the replicas manager needs of its broker."""

    config: BrokerConfig
    log: EventLog
    clock: Clock
    broker_addr: str

    def log_max_offset(self) -> int: ...

    def change_to_master(self, master_epoch: int) -> None: ...

    def change_to_slave(self, master_addr: str, master_id: int, master_epoch: int) -> None: ...


class ReplicasManager:
    """The broker's side of the controller: registration, heartbeats, role changes, SyncStateSet."""

    def __init__(self, broker: RoleHost, controller_addr: str) -> None:
        self.broker = broker
        cfg = broker.config
        self.controller_addr = controller_addr
        self.controller_id = cfg.broker_id + FIRST_BROKER_CONTROLLER_ID  # brokerControllerId
        # a broker configured as master may be its set's first master; one configured as slave waits
        self.may_elect_first = cfg.broker_id == 0
        self.master_id: int | None = None
        self.master_addr: str | None = None
        self.master_epoch = 0
        self.sync_state_set: frozenset[int] = frozenset()
        self.sync_state_set_epoch = 0
        self.role_known = asyncio.Event()  # set once the controller named a master: registrations may go
        # master side: slave controller id -> when it last held everything this master wrote
        self._caught_up_ms: dict[int, int] = {}
        self._client = RemotingClient(max_frame_bytes=cfg.max_frame_bytes, log=broker.log)
        self._client.register(RequestCode.NOTIFY_BROKER_ROLE_CHANGED, self._on_notify)
        self._lock = asyncio.Lock()

    @property
    def is_master(self) -> bool:
        return self.master_id == self.controller_id

    async def close(self) -> None:
        await self._client.close()

    def _timeout_s(self) -> float:
        return max(1.0, self.broker.config.scaled_s(3_000))

    async def _invoke(self, code: RequestCode, ext: dict[str, Any], body: Any = None) -> RemotingCommand:
        return await self._client.invoke(
            self.controller_addr, RemotingCommand.request(code, ext, body), self._timeout_s()
        )

    # -- the loops ----------------------------------------------------------------------------------------
    async def run(self) -> None:
        cfg = self.broker.config
        async with asyncio.TaskGroup() as tg:
            tg.create_task(self._every(cfg.broker_heartbeat_interval_ms, self.send_heartbeat))
            tg.create_task(self._every(cfg.sync_broker_metadata_period_ms, self.sync_metadata, first=True))
            tg.create_task(self._every(cfg.check_sync_state_set_period_ms, self.check_sync_state_set))

    async def _every(self, period_ms: int, step: Any, *, first: bool = False) -> None:
        cfg = self.broker.config
        # until the role is known the metadata sync retries every heartbeat interval
        while True:
            if not first:
                await asyncio.sleep(cfg.scaled_s(period_ms))
            first = False
            try:
                await step()
            except (RemotingError, OSError, WireError) as exc:
                self.broker.log.warning("controller request failed", step=step.__name__, error=str(exc))
            if step == self.sync_metadata and not self.role_known.is_set():
                await asyncio.sleep(cfg.scaled_s(cfg.broker_heartbeat_interval_ms))
                first = True

    async def send_heartbeat(self) -> None:
        b = self.broker
        cfg = b.config
        await self._invoke(
            RequestCode.BROKER_HEARTBEAT,
            {
                "clusterName": cfg.cluster_name,
                "brokerName": cfg.broker_name,
                "brokerAddr": b.broker_addr,
                "brokerId": self.controller_id,
                "epoch": self.master_epoch,
                "maxOffset": b.log_max_offset(),
                "heartbeatTimeoutMills": cfg.controller_heartbeat_timeout_ms,
            },
        )

    async def sync_metadata(self) -> None:
        """register() at start, then schedulingSyncBrokerMetadata: the controller's view of the set; no
        master yet (or the master gone with no successor): ask to be elected."""
        b = self.broker
        cfg = b.config
        if not self.role_known.is_set() and self.master_epoch == 0:
            resp = await self._invoke(
                RequestCode.CONTROLLER_REGISTER_BROKER,
                {
                    "clusterName": cfg.cluster_name,
                    "brokerName": cfg.broker_name,
                    "brokerAddress": b.broker_addr,
                    "brokerId": self.controller_id,
                },
            )
        else:
            resp = await self._invoke(
                RequestCode.CONTROLLER_GET_REPLICA_INFO, {"brokerName": cfg.broker_name}
            )
        if resp.code != ResponseCode.SUCCESS:
            b.log.warning("controller refused", code=resp.code, remark=resp.remark)
            return
        if "masterBrokerId" not in resp.ext:
            epoch = resp.ext_int("masterEpoch", 0)
            if epoch > 0 or self.may_elect_first:
                await self.elect_self()
            return
        await self.apply(resp)

    async def elect_self(self) -> None:
        cfg = self.broker.config
        resp = await self._invoke(
            RequestCode.CONTROLLER_ELECT_MASTER,
            {
                "clusterName": cfg.cluster_name,
                "brokerName": cfg.broker_name,
                "brokerId": self.controller_id,
                "designateElect": False,
            },
        )
        if "masterBrokerId" in resp.ext:
            await self.apply(resp)

    def _on_notify(self, conn: Connection, cmd: RemotingCommand) -> None:
        """NOTIFY_BROKER_ROLE_CHANGED (one-way): apply it on a task of its own."""
        task = asyncio.get_running_loop().create_task(self.apply(cmd))
        task.add_done_callback(lambda t: t.cancelled() or t.exception())

    async def apply(self, cmd: RemotingCommand) -> None:
        """Take the role the controller's answer names when its master epoch is news to this broker."""
        async with self._lock:
            master_id = cmd.ext_int("masterBrokerId")
            master_addr = cmd.ext_str("masterAddress")
            epoch = cmd.ext_int("masterEpoch")
            body = cmd.body if isinstance(cmd.body, dict) else {}
            sss = body.get("syncStateSet")
            if isinstance(sss, list) and all(type(x) is int for x in sss):
                sse = body.get("syncStateSetEpoch")
                if type(sse) is int and sse >= self.sync_state_set_epoch:
                    self.sync_state_set, self.sync_state_set_epoch = frozenset(sss), sse
            if epoch < self.master_epoch or (epoch == self.master_epoch and self.role_known.is_set()):
                return
            self.master_id, self.master_addr, self.master_epoch = master_id, master_addr, epoch
            if master_id == self.controller_id:
                self._caught_up_ms.clear()
                self.broker.change_to_master(epoch)
            else:
                self.broker.change_to_slave(master_addr, master_id, epoch)
            self.role_known.set()

    # -- the master's SyncStateSet --------------------------------------------------------------------------
    def slave_reported(self, slave_id: int, holds_all: bool, now_ms: int) -> None:
        """An HA_TRANSFER of a slave: whether it holds everything this master wrote (lastCatchupTimeMs)."""
        if holds_all:
            self._caught_up_ms[slave_id] = now_ms
        else:
            self._caught_up_ms.setdefault(slave_id, -(10**15))

    def in_sync(self, now_ms: int) -> frozenset[int]:
        """This master and the slaves that caught up within haMaxTimeSlaveNotCatchup."""
        limit = self.broker.config.scaled(self.broker.config.ha_max_time_slave_not_catchup_ms)
        slaves = {sid for sid, t in self._caught_up_ms.items() if now_ms - t <= limit}
        return frozenset({self.controller_id, *slaves})

    async def check_sync_state_set(self) -> None:
        if not self.is_master:
            return
        b = self.broker
        wanted = self.in_sync(b.clock.monotonic_ms())
        if wanted == self.sync_state_set:
            return
        resp = await self._invoke(
            RequestCode.CONTROLLER_ALTER_SYNC_STATE_SET,
            {
                "brokerName": b.config.broker_name,
                "masterBrokerId": self.controller_id,
                "masterEpoch": self.master_epoch,
            },
            {"syncStateSet": sorted(wanted), "syncStateSetEpoch": self.sync_state_set_epoch},
        )
        if resp.code == ResponseCode.SUCCESS:
            self.sync_state_set = wanted
            self.sync_state_set_epoch = resp.ext_int("newSyncStateSetEpoch")
            b.log.emit(
                "sync_state_set_altered",
                broker=b.config.broker_name,
                broker_id=self.controller_id,
                master_epoch=self.master_epoch,
                sync_state_set=sorted(wanted),
                sync_state_set_epoch=self.sync_state_set_epoch,
            )
        else:
            b.log.warning("alter SyncStateSet refused", code=resp.code, remark=resp.remark)
            with contextlib.suppress(RemotingError, OSError, WireError):
                await self.sync_metadata()
