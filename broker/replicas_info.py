"""RocketMQ 5's controller state, sans-IO: who is master of each broker set, its SyncStateSet and epochs.

What the controller's ``ReplicasInfoManager`` (the state machine), ``DefaultBrokerHeartbeatManager`` (the
replicas' liveness) and ``DefaultElectPolicy`` (whom to elect) decide, as plain objects; the clock is
passed in. ``broker.replicas_controller`` moves the requests and owns the timers.

Brokers are known to the controller by their brokerControllerId (``FIRST_BROKER_CONTROLLER_ID`` = 1 on):
the route names the master brokerId 0 and a slave by its controller id.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from rmqlab.protocol.codes import ResponseCode

FIRST_BROKER_CONTROLLER_ID = 1
# BrokerConfig.controllerHeartBeatTimeoutMills: what a broker's heartbeat says it may stay silent
DEFAULT_HEARTBEAT_TIMEOUT_MS = 10_000


class ControllerRefused(Exception):
    """A controller request refused with one of RocketMQ's controller codes (ResponseCode 2000-2016)."""

    def __init__(self, code: ResponseCode, remark: str) -> None:
        super().__init__(remark)
        self.code = code
        self.remark = remark


@dataclass(slots=True)
class ReplicaLive:
    """BrokerLiveInfo: a replica's last heartbeat and what it said about its log."""

    broker_id: int
    broker_addr: str
    last_heartbeat_ms: int
    heartbeat_timeout_ms: int
    epoch: int = -1
    max_offset: int = -1
    election_priority: int = 2**31 - 1
    conn_id: int | None = None

    def alive(self, now_ms: int) -> bool:
        return self.last_heartbeat_ms + self.heartbeat_timeout_ms >= now_ms


@dataclass(slots=True)
class BrokerSet:
    """One brokerName's replicas (BrokerReplicaInfo) and its SyncStateInfo."""

    cluster: str
    broker_name: str
    addrs: dict[int, str] = field(default_factory=dict)  # brokerControllerId -> address
    master_id: int | None = None
    master_epoch: int = 0
    sync_state_set: set[int] = field(default_factory=set)
    sync_state_set_epoch: int = 0

    @property
    def master_addr(self) -> str | None:
        return self.addrs.get(self.master_id) if self.master_id is not None else None

    @property
    def first_time_for_elect(self) -> bool:
        """SyncStateInfo#isFirstTimeForElect: no master was ever elected for this set."""
        return self.master_epoch == 0


@dataclass(frozen=True, slots=True)
class Election:
    """The outcome of an election: the set's master afterwards and whether it changed."""

    broker_name: str
    master_id: int | None
    master_addr: str | None
    master_epoch: int
    sync_state_set: frozenset[int]
    sync_state_set_epoch: int
    old_master_id: int | None
    changed: bool  # a new master (or, when ``master_id`` is None, the old one went with no successor)
    reason: str


def elect_policy(
    sync_state_set: Iterable[int],
    all_replicas: Iterable[int] | None,
    old_master: int | None,
    prefer: int | None,
    valid: Callable[[int], bool],
    live: Callable[[int], ReplicaLive | None],
) -> int | None:
    """DefaultElectPolicy#elect: try the SyncStateSet, then (unclean election only) every replica. Among
    the valid (alive) ones: the old master if still valid and nothing else is preferred; else the
    preferred one or nobody; else the best by (epoch desc, max offset desc, election priority asc)."""
    for brokers in (sync_state_set, all_replicas):
        if brokers is None:
            continue
        chosen = _try_elect({b for b in brokers if valid(b)}, old_master, prefer, live)
        if chosen is not None:
            return chosen
    return None


def _try_elect(
    brokers: set[int], old_master: int | None, prefer: int | None, live: Callable[[int], ReplicaLive | None]
) -> int | None:
    if not brokers:
        return None
    if old_master in brokers and (prefer is None or prefer == old_master):
        return old_master
    if prefer is not None:
        return prefer if prefer in brokers else None
    infos = [info for b in brokers if (info := live(b)) is not None]
    if infos:
        best = min(infos, key=lambda i: (-i.epoch, -i.max_offset, i.election_priority, i.broker_id))
        return best.broker_id
    return min(brokers)


class ReplicasInfoManager:
    """The controller's tables: each broker set's replicas and SyncStateInfo, and the replicas' heartbeats
    (RocketMQ keeps the latter in the heartbeat manager; one object here)."""

    def __init__(self, *, enable_elect_unclean_master: bool = False) -> None:
        self.enable_elect_unclean_master = enable_elect_unclean_master
        self.sets: dict[str, BrokerSet] = {}
        self.live: dict[tuple[str, int], ReplicaLive] = {}

    # -- registration and heartbeats ----------------------------------------------------------------
    def register_broker(self, cluster: str, broker_name: str, broker_id: int, broker_addr: str) -> BrokerSet:
        """CONTROLLER_REGISTER_BROKER (with applyBrokerId folded in): the replica joins its set (or takes
        a new address); the answer is the set's master as the controller knows it."""
        if broker_id < FIRST_BROKER_CONTROLLER_ID:
            raise ValueError(f"brokerId {broker_id}: controller ids start at {FIRST_BROKER_CONTROLLER_ID}")
        bs = self.sets.get(broker_name)
        if bs is None:
            bs = self.sets[broker_name] = BrokerSet(cluster, broker_name)
        bs.addrs[broker_id] = broker_addr
        return bs

    def heartbeat(
        self,
        broker_name: str,
        broker_id: int,
        broker_addr: str,
        now_ms: int,
        *,
        timeout_ms: int = DEFAULT_HEARTBEAT_TIMEOUT_MS,
        epoch: int = -1,
        max_offset: int = -1,
        election_priority: int | None = None,
        conn_id: int | None = None,
    ) -> None:
        """DefaultBrokerHeartbeatManager#onBrokerHeartbeat: the (epoch, max offset) kept is the newest."""
        prev = self.live.get((broker_name, broker_id))
        priority = election_priority if election_priority is not None else 2**31 - 1
        if prev is None or prev.broker_addr != broker_addr:
            self.live[(broker_name, broker_id)] = ReplicaLive(
                broker_id, broker_addr, now_ms, timeout_ms, epoch, max_offset, priority, conn_id
            )
            return
        prev.last_heartbeat_ms = now_ms
        prev.heartbeat_timeout_ms = timeout_ms
        prev.election_priority = priority
        prev.conn_id = conn_id if conn_id is not None else prev.conn_id
        if epoch > prev.epoch or (epoch == prev.epoch and max_offset > prev.max_offset):
            prev.epoch = epoch
            prev.max_offset = max_offset

    def is_alive(self, broker_name: str, broker_id: int, now_ms: int) -> bool:
        info = self.live.get((broker_name, broker_id))
        return info is not None and info.alive(now_ms)

    def scan_not_active(self, now_ms: int) -> list[tuple[str, int]]:
        """scanNotActiveBroker: forget the replicas whose heartbeats stopped; returns (brokerName, id)."""
        gone = [key for key, info in self.live.items() if not info.alive(now_ms)]
        for key in gone:
            del self.live[key]
        return gone

    def on_connection_closed(self, conn_id: int) -> list[tuple[str, int]]:
        """onBrokerChannelClose: the replica that heartbeated over this connection is inactive at once."""
        gone = [key for key, info in self.live.items() if info.conn_id == conn_id]
        for key in gone:
            del self.live[key]
        return gone

    def inactive_masters(self, now_ms: int) -> list[str]:
        """scanInactiveMasterAndTriggerReelect: the sets whose master is not alive."""
        return [
            name
            for name, bs in self.sets.items()
            if bs.master_id is not None and not self.is_alive(name, bs.master_id, now_ms)
        ]

    # -- the state machine ----------------------------------------------------------------------------
    def elect_master(
        self, broker_name: str, broker_id: int | None, now_ms: int, *, designate: bool = False
    ) -> Election:
        """ReplicasInfoManager#electMaster. ``broker_id``: the replica asking (None: the controller, when
        a master went away); ``designate``: an operator's electMaster for that replica. The first election
        of a set takes the asking replica; later ones go by the elect policy. A new master bumps the master
        epoch and the SyncStateSet epoch and leaves the SyncStateSet as just itself. Raises
        ControllerRefused when the set is unknown, the old master stays or nobody can be elected (the
        controller's own call then records that the set has no master)."""
        bs = self.sets.get(broker_name)
        if bs is None:
            raise ControllerRefused(
                ResponseCode.CONTROLLER_BROKER_NEED_TO_BE_REGISTERED, "Broker hasn't been registered"
            )
        old = bs.master_id
        new: int | None = None
        if bs.first_time_for_elect and broker_id is not None:
            new = broker_id
        if new is None:
            new = elect_policy(
                bs.sync_state_set,
                set(bs.addrs) if self.enable_elect_unclean_master else None,
                old,
                broker_id if designate else None,
                lambda b: self.is_alive(broker_name, b, now_ms),
                lambda b: self.live.get((broker_name, b)),
            )
        if new is not None and new == old:
            raise ControllerRefused(
                ResponseCode.CONTROLLER_MASTER_STILL_EXIST,
                f"The old master {old} is still alive, not need to elect new master for broker {broker_name}",
            )
        if new is not None:
            bs.master_id = new
            bs.master_epoch += 1
            bs.sync_state_set = {new}
            bs.sync_state_set_epoch += 1
            return self._election(bs, old, True, "elected")
        if broker_id is None:
            # ElectMasterEvent(false): the master is down and nobody could take over
            if old is not None:
                bs.master_id = None
                return self._election(bs, old, True, "no_candidate")
            raise ControllerRefused(
                ResponseCode.CONTROLLER_MASTER_NOT_AVAILABLE,
                "Old master has down and failed to elect a new broker master",
            )
        raise ControllerRefused(ResponseCode.CONTROLLER_ELECT_MASTER_FAILED, "Failed to elect a new master")

    @staticmethod
    def _election(bs: BrokerSet, old: int | None, changed: bool, reason: str) -> Election:
        return Election(
            bs.broker_name,
            bs.master_id,
            bs.master_addr,
            bs.master_epoch,
            frozenset(bs.sync_state_set),
            bs.sync_state_set_epoch,
            old,
            changed,
            reason,
        )

    def alter_sync_state_set(
        self,
        broker_name: str,
        master_id: int,
        master_epoch: int,
        new_set: Iterable[int],
        sync_state_set_epoch: int,
        now_ms: int,
    ) -> int:
        """ReplicasInfoManager#alterSyncStateSet, asked by the master: checked against the current master,
        the epochs and the replicas' liveness; returns the new SyncStateSet epoch."""
        bs = self.sets.get(broker_name)
        if bs is None:
            raise ControllerRefused(
                ResponseCode.CONTROLLER_ALTER_SYNC_STATE_SET_FAILED, "Broker metadata is not existed"
            )
        wanted = set(new_set)
        if wanted == bs.sync_state_set:
            raise ControllerRefused(
                ResponseCode.CONTROLLER_ALTER_SYNC_STATE_SET_FAILED,
                "The newSyncStateSet is equal with oldSyncStateSet, no needed to update syncStateSet",
            )
        if bs.master_id is None or bs.master_id != master_id:
            raise ControllerRefused(
                ResponseCode.CONTROLLER_INVALID_MASTER,
                f"the current master is {bs.master_id}, not {master_id}",
            )
        if master_epoch != bs.master_epoch:
            raise ControllerRefused(
                ResponseCode.CONTROLLER_FENCED_MASTER_EPOCH,
                f"the current master epoch is {bs.master_epoch}, not {master_epoch}",
            )
        if sync_state_set_epoch != bs.sync_state_set_epoch:
            raise ControllerRefused(
                ResponseCode.CONTROLLER_FENCED_SYNC_STATE_SET_EPOCH,
                f"the current syncStateSet epoch is {bs.sync_state_set_epoch}, not {sync_state_set_epoch}",
            )
        for replica in sorted(wanted):
            if replica not in bs.addrs:
                raise ControllerRefused(
                    ResponseCode.CONTROLLER_INVALID_REPLICAS, f"the replica {replica} does not exist"
                )
            if not self.is_alive(broker_name, replica, now_ms):
                raise ControllerRefused(
                    ResponseCode.CONTROLLER_BROKER_NOT_ALIVE, f"the replica {replica} is not alive"
                )
        if master_id not in wanted:
            raise ControllerRefused(
                ResponseCode.CONTROLLER_ALTER_SYNC_STATE_SET_FAILED,
                f"the newSyncStateSet does not contain the master {master_id}",
            )
        bs.sync_state_set = wanted
        bs.sync_state_set_epoch += 1
        return bs.sync_state_set_epoch
