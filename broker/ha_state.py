"""Master-slave high availability of RocketMQ 4.x, sans-IO.

What ``store/ha/HAService``, ``CommitLog#submitReplicaRequest``, ``broker/slave/SlaveSynchronize`` and
``PullMessageProcessor`` decide, as plain objects and functions: the master's commit-log order that slaves
copy (``ReplicationLog``), the slaves' progress and the SYNC_MASTER sends waiting for it
(``ReplicaProgress``), what a slave keeps of a batch (``ReplicaApplier``), the broker a pull answer
suggests (``suggest_which_broker_id``) and the consumer-offset copy of the slave's periodic sync
(``sync_consumer_offsets``). The controller moves the bytes and owns the clocks.

Positions are counted in bytes of message bodies, RocketMQ's physical commit-log offsets without the
message headers: ``haSlaveFallbehindMax`` and the in-memory threshold compare byte distances.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

MASTER_ID = 0


class BrokerRole(enum.Enum):
    """MessageStoreConfig.brokerRole."""

    ASYNC_MASTER = "ASYNC_MASTER"
    SYNC_MASTER = "SYNC_MASTER"
    SLAVE = "SLAVE"

    @classmethod
    def parse(cls, text: str) -> BrokerRole:
        try:
            return cls(text.upper())
        except ValueError:
            names = ", ".join(r.value for r in cls)
            raise ValueError(f"broker role must be one of {names}, got {text!r}") from None


class ReplicationLog:
    """The broker's messages in the order it stored them (its commit log), with the byte position after
    each; slaves copy it from a position on. ``entries[i]`` ends at ``ends[i]``."""

    def __init__(self) -> None:
        self.entries: list[object] = []
        self.ends: list[int] = []

    def __len__(self) -> int:
        return len(self.entries)

    @property
    def max_position(self) -> int:
        """Bytes written so far (the commit log's max physical offset)."""
        return self.ends[-1] if self.ends else 0

    def append(self, entry: object, size: int) -> int:
        """Add a message of ``size`` bytes; returns its end position."""
        end = self.max_position + max(0, size)
        self.entries.append(entry)
        self.ends.append(end)
        return end

    def position_of(self, index: int) -> int:
        """The byte position after the first ``index`` entries."""
        if index <= 0:
            return 0
        return self.ends[min(index, len(self.ends)) - 1]

    def batch(self, start: int, max_bytes: int) -> tuple[list[object], int]:
        """Entries from ``start`` on, at most ``max_bytes`` of them (always one when any is left), as
        HAConnection's WriteSocketService sends haTransferBatchSize at a time; returns them and the index
        after the last."""
        start = max(0, start)
        if start >= len(self.entries):
            return [], start
        base = self.position_of(start)
        end = start
        while end < len(self.entries) and (end == start or self.ends[end] - base <= max_bytes):
            end += 1
        return self.entries[start:end], end


@dataclass(slots=True)
class _Waiter:
    target: int  # byte position the slave must have
    token: object


@dataclass(slots=True)
class _Slave:
    acked: int  # bytes the slave reported it holds
    last_report_ms: int


@dataclass(slots=True)
class ReplicaProgress:
    """The master's side of HAService: the connected slaves, how far the furthest one is
    (push2SlaveMaxOffset) and the sends of a SYNC_MASTER waiting for it (GroupTransferService)."""

    housekeeping_ms: int = 20_000  # haHousekeepingInterval: a slave silent this long is gone
    fallbehind_max: int = 256 * 1024 * 1024  # haSlaveFallbehindMax
    slaves: dict[int, _Slave] = field(default_factory=dict)
    waiters: list[_Waiter] = field(default_factory=list)
    push2slave_max: int = 0

    def report(self, slave: int, acked: int, now_ms: int) -> list[object]:
        """A slave says it holds ``acked`` bytes; returns the tokens of the waiting sends now acknowledged."""
        self.slaves[slave] = _Slave(acked, now_ms)
        if acked > self.push2slave_max:
            self.push2slave_max = acked
        return self._release()

    def remove(self, slave: int) -> None:
        self.slaves.pop(slave, None)

    def expire_silent(self, now_ms: int) -> list[int]:
        """Drop the slaves silent longer than haHousekeepingInterval (HAConnection closes them); returns
        their ids."""
        gone = [sid for sid, s in self.slaves.items() if now_ms - s.last_report_ms > self.housekeeping_ms]
        for sid in gone:
            del self.slaves[sid]
        return gone

    def connection_count(self, now_ms: int) -> int:
        self.expire_silent(now_ms)
        return len(self.slaves)

    def is_slave_ok(self, master_put_where: int, now_ms: int) -> bool:
        """HAService#isSlaveOK: a slave is connected and not too far behind."""
        return (
            self.connection_count(now_ms) > 0 and master_put_where - self.push2slave_max < self.fallbehind_max
        )

    def wait_for(self, target: int, token: object) -> bool:
        """Register a send that needs a slave at ``target``; False when one is already there. The caller
        gives up after slaveTimeout (FLUSH_SLAVE_TIMEOUT) and cancels its token."""
        if self.push2slave_max >= target:
            return False
        self.waiters.append(_Waiter(target, token))
        return True

    def cancel(self, token: object) -> None:
        self.waiters = [w for w in self.waiters if w.token is not token]

    def _release(self) -> list[object]:
        done = [w for w in self.waiters if w.target <= self.push2slave_max]
        if done:
            self.waiters = [w for w in self.waiters if w.target > self.push2slave_max]
        return [w.token for w in done]


@dataclass(slots=True)
class ReplicaApplier:
    """The slave's side: where it is in its master's log (``position`` entries of the run ``epoch``) and
    which received messages it stores. A message is kept only when it is the next one of its queue, so a
    batch sent again (a master restarted on its store, a reconnect) is applied once."""

    epoch: int | None = None
    position: int = 0

    def start(self, master_epoch: int) -> bool:
        """Adopt the master run ``master_epoch``; True when it is a new one (copy from its log's start)."""
        if master_epoch != self.epoch:
            self.epoch = master_epoch
            self.position = 0
            return True
        return False

    @staticmethod
    def keep(queue_max: int, queue_offset: int) -> bool | None:
        """True: store it (the queue's next one); False: already held; None: a gap (the slave's queue is
        behind the message: the master lost or never had what lies between)."""
        if queue_offset == queue_max:
            return True
        if queue_offset < queue_max:
            return False
        return None


def suggest_which_broker_id(
    *,
    slave_read_enable: bool,
    suggest_pulling_from_slave: bool,
    which_broker_when_consume_slowly: int = 1,
    group_broker_id: int = MASTER_ID,
) -> int:
    """PullMessageProcessor#processRequest's suggestWhichBrokerId (4.9.8): without slaveReadEnable always
    the master; with it, the group's slow-consumer broker when the pull read far behind the commit log's
    end, else the group's broker (the master unless the group names another)."""
    if not slave_read_enable:
        return MASTER_ID
    return which_broker_when_consume_slowly if suggest_pulling_from_slave else group_broker_id


def suggest_pulling_from_slave(max_position: int, pulled_end: int, in_memory_max_bytes: int) -> bool:
    """DefaultMessageStore#getMessage: the distance from the last message read to the commit log's end is
    more than the share of memory kept for messages (40 % of RAM in RocketMQ; configured here)."""
    return max_position - pulled_end > in_memory_max_bytes


def slave_offset_moved(offset_check_in_slave: bool) -> bool:
    """A slave answering PULL_OFFSET_MOVED: without offsetCheckInSlave it answers PULL_RETRY_IMMEDIATELY
    instead (and suggests the group's broker), so a consumer never moves its offset on a slave's word."""
    return not offset_check_in_slave


def sync_consumer_offsets(
    local: dict[tuple[str, str], dict[int, int]],
    master: Mapping[tuple[str, str], Mapping[int, int]],
) -> list[tuple[str, str, int, int, int]]:
    """SlaveSynchronize#syncConsumerOffset: ``offsetTable.putAll(master's)``. Each (topic, group) the
    master has replaces the slave's whole entry, newer or not (apache/rocketmq#1094); entries only the
    slave has stay. Returns (group, topic, queue, old, new) for every offset that changed, -1 for none."""
    changed: list[tuple[str, str, int, int, int]] = []
    for key, queues in master.items():
        topic, group = key
        old = local.get(key, {})
        new = dict(queues)
        for qid in sorted(set(old) | set(new)):
            before, after = old.get(qid, -1), new.get(qid, -1)
            if before != after:
                changed.append((group, topic, qid, before, after))
        local[key] = new
    return changed


def encode_offset_table(entries: Iterable[tuple[str, str, int, int]]) -> dict[str, dict[int, int]]:
    """(group, topic, queue, offset) rows as GET_ALL_CONSUMER_OFFSET's ``offsetTable`` ("topic@group")."""
    table: dict[str, dict[int, int]] = {}
    for group, topic, qid, off in entries:
        table.setdefault(f"{topic}@{group}", {})[qid] = off
    return table


def decode_offset_table(
    raw: object, where: str = "body.offsetTable"
) -> dict[tuple[str, str], dict[int, int]]:
    """GET_ALL_CONSUMER_OFFSET's ``offsetTable`` -> (topic, group) -> queue -> offset; ValueError naming the
    field when it is malformed."""
    if not isinstance(raw, dict):
        raise ValueError(f"{where}: expected a map")
    out: dict[tuple[str, str], dict[int, int]] = {}
    for key, queues in raw.items():
        if not isinstance(key, str) or "@" not in key:
            raise ValueError(f"{where}: key {key!r} is not 'topic@group'")
        topic, _, group = key.partition("@")
        if not isinstance(queues, dict):
            raise ValueError(f"{where}.{key}: expected a map")
        row: dict[int, int] = {}
        for qid, off in queues.items():
            if type(qid) is not int or type(off) is not int:
                raise ValueError(f"{where}.{key}: queue ids and offsets must be ints")
            row[qid] = off
        out[(topic, group)] = row
    return out
