"""Topic creation, queue offsets, and the project's admin / fault-injection codes 9000-9004
(RocketMQ's AdminBrokerProcessor plus the lab's own commands)."""

from __future__ import annotations

from rmqlab.broker.faults import parse_fault_spec
from rmqlab.broker.processor.common import ext_name, ext_queue_id
from rmqlab.broker.processor.services import BrokerServices, Handler
from rmqlab.broker.topic_config import MAX_QUEUE_NUMS, VALID_PERMS, TopicConfig, topic_name_problem
from rmqlab.protocol.codes import RequestCode
from rmqlab.protocol.command import InvalidParameter, RemotingCommand
from rmqlab.protocol.remoting import Connection


class AdminBrokerProcessor:
    """Admin requests: topics, queue offsets (min, max, by time), status, faults and what-if policies."""

    def __init__(self, broker: BrokerServices) -> None:
        self.broker = broker

    def handlers(self) -> dict[int, Handler]:
        return {
            RequestCode.UPDATE_AND_CREATE_TOPIC: self.update_and_create_topic,
            RequestCode.GET_MAX_OFFSET: self.get_max_offset,
            RequestCode.GET_MIN_OFFSET: self.get_min_offset,
            RequestCode.SEARCH_OFFSET_BY_TIMESTAMP: self.search_offset_by_timestamp,
            RequestCode.ADMIN_FAULT_ADD: self.fault_add,
            RequestCode.ADMIN_FAULT_CLEAR: self.fault_clear,
            RequestCode.ADMIN_FAULT_LIST: self.fault_list,
            RequestCode.ADMIN_POLICY_SET: self.policy_set,
            RequestCode.ADMIN_BROKER_STATUS: self.broker_status,
        }

    # -- topics and offsets -------------------------------------------------------------------------
    async def update_and_create_topic(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        topic = cmd.ext_str("topic")
        if (problem := topic_name_problem(topic)) is not None:
            raise InvalidParameter("topic", problem)
        nums = {}
        for name in ("readQueueNums", "writeQueueNums"):
            n = cmd.ext_int32(name)
            if not 1 <= n <= MAX_QUEUE_NUMS:
                raise InvalidParameter(name, f"must be in 1..{MAX_QUEUE_NUMS}, got {n}")
            nums[name] = n
        perm = cmd.ext_int32("perm")
        if perm not in VALID_PERMS:
            raise InvalidParameter("perm", f"must be 6 (read+write), 4 (read) or 2 (write), got {perm}")
        tc = TopicConfig(topic, nums["readQueueNums"], nums["writeQueueNums"], perm)
        if self.broker.topic_manager.put(tc):
            self.broker.topic_created(tc, conn)
        return cmd.response()

    async def get_max_offset(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        topic = ext_name(cmd, "topic")
        return cmd.response(ext={"offset": self.broker.store.get_max_offset(topic, ext_queue_id(cmd))})

    async def get_min_offset(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        topic = ext_name(cmd, "topic")
        return cmd.response(ext={"offset": self.broker.store.get_min_offset(topic, ext_queue_id(cmd))})

    async def search_offset_by_timestamp(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        topic = ext_name(cmd, "topic")
        queue_id = ext_queue_id(cmd)
        ts = cmd.ext_int("timestamp")
        return cmd.response(ext={"offset": self.broker.store.search_offset_by_timestamp(topic, queue_id, ts)})

    # -- fault injection and what-if policies ----------------------------------------------------------------
    async def fault_add(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        spec = parse_fault_spec(cmd.body)
        b = self.broker
        fault = b.faults.add(spec, b.clock.monotonic_ms())
        w = fault.to_wire()
        b.log.emit(
            "fault_injected",
            fault_id=fault.fault_id,
            request_code=fault.request_code,
            group=fault.group,
            client_id=fault.client_id,
            errors=w["errors"],
            latency_ms=fault.latency_ms,
            drop=fault.drop,
            count=fault.count,
            duration_ms=fault.duration_ms,
            by=conn.remote_addr,
        )
        return cmd.response(ext={"faultId": fault.fault_id})

    async def fault_clear(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        fault_id = cmd.ext_int("faultId", None)
        b = self.broker
        removed = b.faults.clear(fault_id)
        for f in removed:
            b.log.emit("fault_cleared", fault_id=f.fault_id, request_code=f.request_code, reason="cleared")
        return cmd.response(ext={"cleared": len(removed)})

    async def fault_list(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        b = self.broker
        now = b.clock.monotonic_ms()
        for f in b.faults.sweep(now):
            b.log.emit("fault_cleared", fault_id=f.fault_id, request_code=f.request_code, reason="expired")
        return cmd.response(body={"faults": [f.to_wire(now) for f in b.faults.faults.values()]})

    async def policy_set(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        notify = cmd.ext_bool("notifyOnChannelExpired", None)
        release = cmd.ext_bool("releaseLocksOnChannelClose", None)
        b = self.broker
        changed = False
        if notify is not None and notify != b.notify_on_channel_expired:
            b.notify_on_channel_expired = notify
            changed = True
        if release is not None and release != b.release_locks_on_close:
            b.release_locks_on_close = release
            changed = True
        if changed:
            b.log.emit(
                "policy_changed",
                notify_on_channel_expired=b.notify_on_channel_expired,
                release_locks_on_close=b.release_locks_on_close,
                by=conn.remote_addr,
            )
        return cmd.response(
            ext={
                "notifyOnChannelExpired": b.notify_on_channel_expired,
                "releaseLocksOnChannelClose": b.release_locks_on_close,
            }
        )

    async def broker_status(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        return cmd.response(body=self.broker.status())
