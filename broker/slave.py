"""A slave's two services: the copy of its master's messages (RocketMQ's HAClient, over HA_TRANSFER) and
the periodic sync of the master's tables (SlaveSynchronize: topic configs, consumer offsets, delay
offsets every 10 s, the first 3 s after start). The decisions are ``broker.ha_state``'s; this moves the bytes.

Subscription-group configs are not synced: the emulator keeps no subscription-group table (its groups
come from heartbeats, as with RocketMQ's autoCreateSubscriptionGroup), and the settings of one that
matter here (brokerId, whichBrokerWhenConsumeSlowly) are broker settings.
"""

from __future__ import annotations

import asyncio
from typing import Any

from rmqlab.broker.ha_state import ReplicaApplier, decode_offset_table, sync_consumer_offsets
from rmqlab.broker.processor.services import BrokerServices
from rmqlab.broker.route_info import parse_topic_config_table
from rmqlab.broker.store import SCHEDULE_GROUP, SCHEDULE_TOPIC, StoredMessage, StoreError
from rmqlab.broker.topic_config import TopicConfig
from rmqlab.protocol.codes import RequestCode, ResponseCode
from rmqlab.protocol.command import CommandError, RemotingCommand
from rmqlab.protocol.model import Message, WireError
from rmqlab.protocol.remoting import RemotingClient, RemotingError


class SlaveService:
    """Replication and SlaveSynchronize of one slave broker."""

    def __init__(self, broker: BrokerServices) -> None:
        self.broker = broker
        # SlaveSynchronize.masterAddr: set from every registration's answer (None while there is none)
        self.master_addr: str | None = None
        self.applier = ReplicaApplier()
        self._client = RemotingClient(max_frame_bytes=broker.config.max_frame_bytes, log=broker.log)
        self._ha_addr: str | None = None  # the master the copy is connected to, for events

    @property
    def ha_master_addr(self) -> str | None:
        return self.broker.config.ha_master_address or self.master_addr

    async def close(self) -> None:
        await self._client.close()

    # -- HAClient ---------------------------------------------------------------------------------
    async def replicate_loop(self) -> None:
        b = self.broker
        cfg = b.config
        suspend_ms = cfg.scaled(cfg.ha_send_heartbeat_interval_ms)
        retry_s = cfg.scaled_s(cfg.ha_reconnect_interval_ms)
        while True:
            addr = self.ha_master_addr
            if addr is None:
                self._disconnected(None, "no master known")
                await asyncio.sleep(min(retry_s, 1.0))
                continue
            try:
                await self.transfer_once(addr, suspend_ms)
            except (RemotingError, OSError, WireError) as exc:
                self._disconnected(addr, str(exc) or type(exc).__name__)
                await asyncio.sleep(retry_s)
            except StoreError as exc:
                b.log.error("replica write failed", error=str(exc))
                await asyncio.sleep(retry_s)

    def _disconnected(self, addr: str | None, reason: str) -> None:
        if self._ha_addr is not None:
            self.broker.log.emit(
                "ha_master_disconnected",
                broker=self.broker.config.broker_name,
                broker_id=self.broker.config.broker_id,
                master_addr=self._ha_addr,
                reason=reason,
            )
            self._ha_addr = None

    async def transfer_once(self, addr: str, suspend_ms: int) -> int:
        """One HA_TRANSFER round trip: report what this slave holds, store what comes back (after the
        configured lag). Returns the number of messages stored."""
        b = self.broker
        cfg = b.config
        ext: dict[str, Any] = {
            "masterEpoch": self.applier.epoch if self.applier.epoch is not None else -1,
            "offset": self.applier.position,
            "suspendTimeoutMillis": suspend_ms,
            "slaveAddr": b.broker_addr,
        }
        if cfg.controller_mode:
            # AutoSwitchHAClient's handshake names the slave to the master's SyncStateSet check
            ext["slaveBrokerId"] = cfg.broker_id
        req = RemotingCommand.request(RequestCode.HA_TRANSFER, ext)
        resp = await self._client.invoke(addr, req, suspend_ms / 1000 + max(1.0, cfg.scaled_s(3_000)))
        if resp.code != ResponseCode.SUCCESS:
            raise RemotingError(f"HA_TRANSFER refused by {addr}: {resp.code} {resp.remark}")
        epoch = resp.ext_int("masterEpoch")
        start = resp.ext_int("offset")
        nxt = resp.ext_int("nextOffset")
        if self._ha_addr != addr:
            self._ha_addr = addr
            b.log.emit(
                "ha_master_connected",
                broker=cfg.broker_name,
                broker_id=cfg.broker_id,
                master_addr=addr,
            )
        new_run = self.applier.start(epoch)
        if new_run and start != 0:
            raise WireError(f"HA_TRANSFER: a new master run must start at 0, got {start}")
        body = resp.body if isinstance(resp.body, dict) else {}
        if new_run and "epochStartOffsets" in body:
            await self._truncate_to_epoch_start(body["epochStartOffsets"], addr)
        raw = body.get("messages", [])
        msgs = [
            _stored(Message.from_wire(m, f"body.messages[{i}]"), cfg.broker_name) for i, m in enumerate(raw)
        ]
        if msgs and cfg.ha_replication_lag_ms > 0:
            await asyncio.sleep(cfg.scaled_s(cfg.ha_replication_lag_ms))
        stored = 0
        for m in msgs:
            verdict = await b.store.put_replica(m, ReplicaApplier.keep)
            if verdict:
                stored += 1
            elif verdict is None:
                b.log.emit(
                    "replica_gap",
                    broker=cfg.broker_name,
                    topic=m.topic,
                    queue_id=m.queue_id,
                    queue_offset=m.queue_offset,
                    slave_max_offset=b.store.get_max_offset(m.topic, m.queue_id),
                )
        self.applier.position = nxt
        return stored

    async def _truncate_to_epoch_start(self, raw: object, addr: str) -> None:
        """Controller mode: cut every queue back to where the master's epoch began (what both logs
        share), so that what this broker held beyond it (a deposed master's unreplicated tail) is not
        kept under offsets the new master gives other messages."""
        if not isinstance(raw, list) or not all(
            isinstance(r, list)
            and len(r) == 3
            and isinstance(r[0], str)
            and type(r[1]) is int
            and type(r[2]) is int
            for r in raw
        ):
            raise WireError("body.epochStartOffsets: expected [topic, queueId, offset] rows")
        b = self.broker
        start = {(t, q): off for t, q, off in raw}
        removed: set[int] = set()
        for key in sorted(b.store.queues):
            end = start.get(key, 0)
            before = b.store.get_max_offset(*key)
            cut = await b.store.truncate_tail(key[0], key[1], end)
            if cut:
                removed.update(id(m) for m in cut)
                b.log.emit(
                    "replica_truncated",
                    broker=b.config.broker_name,
                    broker_id=b.config.broker_id,
                    topic=key[0],
                    queue_id=key[1],
                    prev_max_offset=before,
                    max_offset=b.store.get_max_offset(*key),
                    master_addr=addr,
                )
        if removed:
            b.rebuild_replication_log(lambda m: id(m) not in removed)

    # -- SlaveSynchronize -----------------------------------------------------------------------------
    async def sync_loop(self) -> None:
        cfg = self.broker.config
        await asyncio.sleep(cfg.scaled_s(cfg.slave_sync_first_delay_ms))
        while True:
            try:
                await self.sync_all()
            except Exception as exc:  # one failed round must not end the schedule
                self.broker.log.error("slave sync failed", error=repr(exc))
            await asyncio.sleep(cfg.scaled_s(cfg.slave_sync_interval_ms))

    async def sync_all(self) -> None:
        """syncAll: each table on its own, a failure of one leaves the others to run."""
        addr = self.master_addr
        b = self.broker
        if addr is None or addr == b.broker_addr:
            return
        for step in (self._sync_topic_config, self._sync_consumer_offset, self._sync_delay_offset):
            try:
                await step(addr)
            except (RemotingError, OSError, WireError, CommandError, ValueError) as exc:
                b.log.warning("slave sync step failed", step=step.__name__, master_addr=addr, error=str(exc))

    async def _fetch(self, addr: str, code: RequestCode) -> Any:
        cfg = self.broker.config
        resp = await self._client.invoke(
            addr, RemotingCommand.request(code, {}), max(1.0, cfg.scaled_s(3_000))
        )
        if resp.code != ResponseCode.SUCCESS or not isinstance(resp.body, dict):
            raise RemotingError(f"{code.name} refused by {addr}: {resp.code} {resp.remark}")
        return resp.body

    async def _sync_topic_config(self, addr: str) -> None:
        b = self.broker
        body = await self._fetch(addr, RequestCode.GET_ALL_TOPIC_CONFIG)
        table = {
            t: TopicConfig(t, qd.read_queue_nums, qd.write_queue_nums, qd.perm)
            for t, qd in parse_topic_config_table(body).items()
        }
        mgr = b.topic_manager
        if {t: tc.to_wire() for t, tc in mgr.table.items()} == {t: tc.to_wire() for t, tc in table.items()}:
            return  # (RocketMQ compares the tables' dataVersion)
        for t in list(mgr.table):
            if t not in table:
                mgr.remove(t)
                b.store.persist_topic_removal(t)
        for tc in table.values():
            mgr.put(tc)
            b.store.persist_topic(tc)
        b.log.emit("topic_config_synced", broker=b.config.broker_name, master_addr=addr, topics=len(table))

    async def _sync_consumer_offset(self, addr: str) -> None:
        b = self.broker
        body = await self._fetch(addr, RequestCode.GET_ALL_CONSUMER_OFFSET)
        master = decode_offset_table(body.get("offsetTable"))
        for group, topic, qid, prev, offset in sync_consumer_offsets(b.offset_manager.offset_table, master):
            if offset >= 0:
                b.store.persist_offset(group, topic, qid, offset)
            b.log.emit(
                "offset_synced",
                broker=b.config.broker_name,
                broker_id=b.config.broker_id,
                group=group,
                topic=topic,
                queue_id=qid,
                offset=offset,
                prev_offset=prev,
                master_addr=addr,
            )

    async def _sync_delay_offset(self, addr: str) -> None:
        b = self.broker
        body = await self._fetch(addr, RequestCode.GET_ALL_DELAY_OFFSET)
        raw = body.get("offsetTable")
        if not isinstance(raw, dict) or not all(type(k) is int and type(v) is int for k, v in raw.items()):
            raise ValueError("body.offsetTable: expected a map of int to int")
        table = b.schedule_service.offset_table
        if table != raw:
            table.clear()
            table.update(raw)
            for level, offset in raw.items():
                b.store.persist_offset(SCHEDULE_GROUP, SCHEDULE_TOPIC, level, offset)


def _stored(m: Message, broker_name: str) -> StoredMessage:
    return StoredMessage(
        m.msg_id,
        m.topic,
        m.queue_id,
        m.queue_offset,
        m.body,
        m.tags,
        m.keys,
        m.born_timestamp,
        m.store_timestamp,
        m.reconsume_times,
        dict(m.properties),
        broker_name,
    )
