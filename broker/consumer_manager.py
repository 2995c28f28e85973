"""Consumer membership: the broker's side of a consumer joining or leaving, in one file.

``ConsumerManager`` / ``ConsumerGroupInfo`` (RocketMQ's) are sans-IO: registrations are keyed by
connection id, as RocketMQ keys them by Netty channel, and every method takes the time as an argument.
``ConsumerIdsChangeListener`` at the bottom is the small shell around them (RocketMQ's
DefaultConsumerIdsChangeListener with Broker2Client#notifyConsumerIdsChanged): it writes
``consumer_unregistered`` and sends NOTIFY_CONSUMER_IDS_CHANGED to the members left in a group.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from rmqlab.protocol.codes import RequestCode
from rmqlab.protocol.command import RemotingCommand
from rmqlab.protocol.event_log import EventLog
from rmqlab.protocol.model import ConsumeFromWhere, ConsumeType, MessageModel, SubscriptionData
from rmqlab.protocol.remoting import Connection, RemotingError

NOTIFY_SEND_TIMEOUT_S = 0.01  # Broker2Client: invokeOneway(channel, request, 10)


@dataclass(slots=True)
class ClientChannelInfo:
    """One registered client of a group: its connection, client id, address and last heartbeat."""

    conn_id: int
    client_id: str
    client_addr: str
    last_update_ms: int  # monotonic: the liveness clock that expiry reads
    last_update_wall_ms: int  # for GET_CONSUMER_CONNECTION_LIST's lastUpdateTimestamp


@dataclass(frozen=True, slots=True)
class SubscriptionInconsistency:
    """A heartbeat rewrote the group's topic set while another live member last sent a different one."""

    group: str
    client_id: str
    topics: list[str]  # what this heartbeat named (now the group's table)
    previous_topics: list[str]  # the group's table before it
    other_client_id: str  # a live member that disagrees
    other_topics: list[str]


@dataclass(slots=True)
class RegisterResult:
    """What a heartbeat changed in a group: new client, changed subscriptions."""

    changed: bool  # a new channel or a change in the topic set: notify the group
    new_channel: bool
    topics_changed: bool
    inconsistency: SubscriptionInconsistency | None = None
    replaced_client_id: str | None = None  # the connection re-registered under another client id


@dataclass(slots=True)
class ConsumerGroupInfo:
    """A consumer group's channels and subscriptions (RocketMQ's ConsumerGroupInfo)."""

    group_name: str
    consume_type: ConsumeType = ConsumeType.CONSUME_PASSIVELY
    message_model: MessageModel = MessageModel.CLUSTERING
    consume_from_where: ConsumeFromWhere = ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET
    channels: dict[int, ClientChannelInfo] = field(default_factory=dict)
    subscription_table: dict[str, SubscriptionData] = field(default_factory=dict)
    # Topic set of each channel's last heartbeat: shows members that disagree (the seed scenario).
    channel_topics: dict[int, frozenset[str]] = field(default_factory=dict)
    last_update_ms: int = 0
    # the client ids in channel order, rebuilt only when a channel comes, goes or changes its id: every
    # member asks for the list after every NOTIFY, so a group of n costs n lists per change, not n builds
    _client_ids: tuple[str, ...] | None = field(default=None, repr=False, compare=False)

    def update_channel(
        self,
        info: ClientChannelInfo,
        consume_type: ConsumeType,
        message_model: MessageModel,
        consume_from_where: ConsumeFromWhere,
    ) -> tuple[bool, str | None]:
        """Register or refresh a channel. Returns (new channel, client id it replaced)."""
        # The latest heartbeat's group-level settings win, as in RocketMQ.
        self.consume_type = consume_type
        self.message_model = message_model
        self.consume_from_where = consume_from_where
        self.last_update_ms = info.last_update_ms
        old = self.channels.get(info.conn_id)
        if old is None:
            self.channels[info.conn_id] = info
            self._client_ids = None
            return True, None
        replaced = None
        if old.client_id != info.client_id:
            # RocketMQ logs an error and replaces the entry, but does not count it as a new channel.
            replaced = old.client_id
            self.channels[info.conn_id] = info
            self._client_ids = None
        else:
            old.last_update_ms = info.last_update_ms
            old.last_update_wall_ms = info.last_update_wall_ms
            old.client_addr = info.client_addr
        return False, replaced

    def update_subscription(self, subs: list[SubscriptionData]) -> bool:
        """RocketMQ's overwrite: add missing topics, replace newer versions, drop unnamed topics.

        Returns True when the topic set changed (a newer version alone is not a change).
        """
        updated = False
        named: set[str] = set()
        for sub in subs:
            named.add(sub.topic)
            old = self.subscription_table.get(sub.topic)
            if old is None:
                self.subscription_table[sub.topic] = sub
                updated = True
            elif sub.sub_version > old.sub_version:
                self.subscription_table[sub.topic] = sub
        for topic in [t for t in self.subscription_table if t not in named]:
            del self.subscription_table[topic]
            updated = True
        return updated

    def find_subscription(self, topic: str) -> SubscriptionData | None:
        return self.subscription_table.get(topic)

    def all_client_ids(self) -> list[str]:
        return list(self.client_ids())

    def client_ids(self) -> tuple[str, ...]:
        """getAllClientId, shared and immutable until the channels change."""
        ids = self._client_ids
        if ids is None:
            ids = self._client_ids = tuple(c.client_id for c in self.channels.values())
        return ids

    def has_client(self, client_id: str) -> bool:
        return any(c.client_id == client_id for c in self.channels.values())

    def remove_channel(self, conn_id: int) -> ClientChannelInfo | None:
        self.channel_topics.pop(conn_id, None)
        removed = self.channels.pop(conn_id, None)
        if removed is not None:
            self._client_ids = None
        return removed


class ConsumerManager:
    """Every consumer group's registrations, from heartbeats, unregistrations, closes and expiry."""

    def __init__(self) -> None:
        self.groups: dict[str, ConsumerGroupInfo] = {}

    def find(self, group: str) -> ConsumerGroupInfo | None:
        return self.groups.get(group)

    def register_consumer(
        self,
        group: str,
        info: ClientChannelInfo,
        consume_type: ConsumeType,
        message_model: MessageModel,
        consume_from_where: ConsumeFromWhere,
        subs: list[SubscriptionData],
    ) -> RegisterResult:
        gi = self.groups.get(group)
        if gi is None:
            gi = ConsumerGroupInfo(group, consume_type, message_model, consume_from_where)
            self.groups[group] = gi
        new_channel, replaced = gi.update_channel(info, consume_type, message_model, consume_from_where)

        new_topics = frozenset(s.topic for s in subs)
        old_topics = sorted(gi.subscription_table)
        topics_changed = gi.update_subscription(subs)
        gi.channel_topics[info.conn_id] = new_topics
        inconsistency = None
        if topics_changed:
            for conn_id, topics in gi.channel_topics.items():
                if conn_id != info.conn_id and topics != new_topics and conn_id in gi.channels:
                    inconsistency = SubscriptionInconsistency(
                        group,
                        info.client_id,
                        sorted(new_topics),
                        old_topics,
                        gi.channels[conn_id].client_id,
                        sorted(topics),
                    )
                    break
        return RegisterResult(
            new_channel or topics_changed, new_channel, topics_changed, inconsistency, replaced
        )

    def unregister_consumer(self, group: str, conn_id: int) -> ClientChannelInfo | None:
        """Remove the connection's registration in the group (and the group when it empties)."""
        gi = self.groups.get(group)
        if gi is None:
            return None
        removed = gi.remove_channel(conn_id)
        if not gi.channels:
            del self.groups[group]
        return removed

    def do_channel_close_event(self, conn_id: int) -> list[tuple[str, ClientChannelInfo]]:
        """A connection closed: remove it from every group. Returns (group, removed) pairs."""
        removed: list[tuple[str, ClientChannelInfo]] = []
        for group, gi in list(self.groups.items()):
            info = gi.remove_channel(conn_id)
            if info is not None:
                removed.append((group, info))
                if not gi.channels:
                    del self.groups[group]
        return removed

    def scan_not_active_channel(
        self, now_ms: int, channel_expired_timeout_ms: int
    ) -> list[tuple[str, ClientChannelInfo]]:
        """Remove registrations not refreshed within the timeout; the caller closes their connections."""
        expired: list[tuple[str, ClientChannelInfo]] = []
        for group, gi in list(self.groups.items()):
            for conn_id, info in list(gi.channels.items()):
                if now_ms - info.last_update_ms > channel_expired_timeout_ms:
                    del gi.channels[conn_id]
                    gi._client_ids = None
                    expired.append((group, info))
            if not gi.channels:
                del self.groups[group]
        return expired

    def conn_ids(self, group: str) -> list[int]:
        gi = self.groups.get(group)
        return list(gi.channels) if gi is not None else []

    def client_id_of(self, group: str, conn_id: int) -> str | None:
        gi = self.groups.get(group)
        if gi is None:
            return None
        info = gi.channels.get(conn_id)
        return info.client_id if info is not None else None

    def channel_count(self) -> int:
        return sum(len(g.channels) for g in self.groups.values())


class ProducerManager:
    """Producer groups per connection; kept only for status and UNREGISTER_CLIENT."""

    def __init__(self) -> None:
        self.groups: dict[str, dict[int, ClientChannelInfo]] = {}

    def register_producer(self, group: str, info: ClientChannelInfo) -> bool:
        chans = self.groups.setdefault(group, {})
        new = info.conn_id not in chans
        chans[info.conn_id] = info
        return new

    def unregister_producer(self, group: str, conn_id: int) -> bool:
        chans = self.groups.get(group)
        if chans is None or chans.pop(conn_id, None) is None:
            return False
        if not chans:
            del self.groups[group]
        return True

    def do_channel_close_event(self, conn_id: int) -> None:
        for group, chans in list(self.groups.items()):
            chans.pop(conn_id, None)
            if not chans:
                del self.groups[group]

    def scan_not_active_channel(self, now_ms: int, timeout_ms: int) -> list[tuple[str, ClientChannelInfo]]:
        expired: list[tuple[str, ClientChannelInfo]] = []
        for group, chans in list(self.groups.items()):
            for conn_id, info in list(chans.items()):
                if now_ms - info.last_update_ms > timeout_ms:
                    del chans[conn_id]
                    expired.append((group, info))
            if not chans:
                del self.groups[group]
        return expired


class ConsumerIdsChangeListener:
    """What the broker does when a group's members change: the ``consumer_unregistered`` event, and
    NOTIFY_CONSUMER_IDS_CHANGED one-way to every connection still registered in the group (when
    notifyConsumerIdsChangedEnable, as RocketMQ's DefaultConsumerIdsChangeListener)."""

    def __init__(
        self,
        manager: ConsumerManager,
        connections: Mapping[int, Connection],
        log: EventLog,
        *,
        enabled: bool,
        rocketmq5: bool,
        event_ids_max: int | None = None,
    ) -> None:
        self.manager = manager
        self.connections = connections
        self.log = log
        self.enabled = enabled
        self.rocketmq5 = rocketmq5
        self.event_ids_max = event_ids_max
        self._tasks: dict[asyncio.Task[None], None] = {}  # start order, not memory order
        self._closes = 0  # close() calls so far: a fan-out scheduled before one is dropped

    def consumer_unregistered(
        self, group: str, client_id: str, reason: str, client_addr: str, **extra: Any
    ) -> None:
        """A consumer left the group's channel table (channel closed or expired, unregister, replaced)."""
        self.log.emit(
            "consumer_unregistered",
            group=group,
            client_id=client_id,
            reason=reason,
            client_addr=client_addr,
            **extra,
        )

    def notify_group(self, group: str, cause: str) -> None:
        """NOTIFY_CONSUMER_IDS_CHANGED, one-way, to every connection of the group."""
        if not self.enabled:
            return
        gi = self.manager.find(group)
        if gi is None or not gi.channels:
            return
        if self.rocketmq5 and gi.message_model is MessageModel.BROADCASTING:
            return  # ConsumerManager (5.3.1): broadcasting consumers do not rebalance against each other
        get = self.connections.get  # one pass over the group: at a thousand members this runs per change
        targets = [
            (c, info.client_id)
            for cid, info in gi.channels.items()
            if (c := get(cid)) is not None and not c.closed
        ]
        if not targets:
            return
        # One callback where a task's first step would be (the same place in the loop's ready queue):
        # the frames go out from there, and only a member whose write buffer is full costs a task.
        asyncio.get_running_loop().call_soon(self._send_notify, self._closes, group, targets)
        if self.event_ids_max is None or len(targets) <= self.event_ids_max:
            ids = {"client_ids": [cid for _, cid in targets]}
        else:
            ids = {}
        self.log.emit("notify_sent", group=group, cause=cause, client_count=len(targets), **ids)

    def _send_notify(self, closes: int, group: str, targets: list[tuple[Connection, str]]) -> None:
        # Broker2Client#notifyConsumerIdsChanged: invokeOneway with 10 ms, one channel after another,
        # so a member that stopped reading costs the others no more than that. A write that has room
        # needs no wait, so the loop runs here; from a member whose buffer is full on, it runs on a task.
        if closes != self._closes:
            return  # close() came first: dropped, as a task cancelled before its first step
        code = int(RequestCode.NOTIFY_CONSUMER_IDS_CHANGED)
        for i, (conn, _) in enumerate(targets):
            # one command per channel (the write stamps its opaque on it); built directly, since at
            # thousands of members this loop runs millions of times
            cmd = RemotingCommand(code, ext={"consumerGroup": group})
            try:
                if not conn.send_oneway(cmd):
                    rest = self._finish_notify(group, targets, i, cmd)
                    task = asyncio.get_running_loop().create_task(rest)
                    self._tasks[task] = None
                    task.add_done_callback(lambda t: self._tasks.pop(t, None))
                    return
            except (RemotingError, TimeoutError, OSError) as exc:
                self._notify_failed(group, conn, exc)

    async def _finish_notify(
        self, group: str, targets: list[tuple[Connection, str]], waiting: int, cmd: RemotingCommand
    ) -> None:
        """The fan-out from ``targets[waiting]``, whose NOTIFY (``cmd``) is written into a full buffer."""
        conn = targets[waiting][0]
        try:
            await conn.wait_oneway_written(cmd, NOTIFY_SEND_TIMEOUT_S)
        except (RemotingError, TimeoutError, OSError) as exc:
            self._notify_failed(group, conn, exc)
        code = int(RequestCode.NOTIFY_CONSUMER_IDS_CHANGED)
        for conn, _ in targets[waiting + 1 :]:
            try:
                cmd = RemotingCommand(code, ext={"consumerGroup": group})
                await conn.invoke_oneway(cmd, timeout_s=NOTIFY_SEND_TIMEOUT_S)
            except (RemotingError, TimeoutError, OSError) as exc:
                self._notify_failed(group, conn, exc)

    def _notify_failed(self, group: str, conn: Connection, exc: BaseException) -> None:
        self.log.warning("notify failed", group=group, peer=conn.remote_addr, error=repr(exc))

    def close(self) -> None:
        """Cancel the notifications still being sent (broker shutdown)."""
        self._closes += 1
        for t in list(self._tasks):
            t.cancel()
