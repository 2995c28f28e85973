"""What a master answers its slaves: HA_TRANSFER (the message copy, RocketMQ's HAConnection) and the
tables SlaveSynchronize fetches every 10 s (GET_ALL_TOPIC_CONFIG, GET_ALL_CONSUMER_OFFSET,
GET_ALL_DELAY_OFFSET, as AdminBrokerProcessor serves them)."""

from __future__ import annotations

from rmqlab.broker.ha_state import BrokerRole, encode_offset_table
from rmqlab.broker.processor.services import BrokerServices, Handler
from rmqlab.protocol.codes import RequestCode, ResponseCode
from rmqlab.protocol.command import CommandError, InvalidParameter, RemotingCommand
from rmqlab.protocol.remoting import Connection


class HAProcessor:
    """The master's side of replication and of the slave's periodic sync."""

    def __init__(self, broker: BrokerServices) -> None:
        self.broker = broker

    def handlers(self) -> dict[int, Handler]:
        return {
            RequestCode.HA_TRANSFER: self.ha_transfer,
            RequestCode.GET_ALL_TOPIC_CONFIG: self.get_all_topic_config,
            RequestCode.GET_ALL_CONSUMER_OFFSET: self.get_all_consumer_offset,
            RequestCode.GET_ALL_DELAY_OFFSET: self.get_all_delay_offset,
        }

    async def ha_transfer(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        b = self.broker
        if b.role is BrokerRole.SLAVE:
            raise CommandError(ResponseCode.SERVICE_NOT_AVAILABLE, "this broker is a slave, not a master")
        slave_epoch = cmd.ext_int("masterEpoch", -1)
        offset = cmd.ext_int("offset", 0)
        suspend_ms = max(0, cmd.ext_int("suspendTimeoutMillis", 0))
        slave_addr = cmd.ext_str("slaveAddr", None) or conn.remote_addr
        log = b.replication_log
        same_run = slave_epoch == b.ha_epoch
        start = offset if same_run else 0
        if not 0 <= start <= len(log):
            raise InvalidParameter("offset", f"{offset} is outside this master's log [0, {len(log)}]")
        # the request reports what the slave holds: HAConnection's ReadSocketService
        b.ha_report(conn, slave_addr, start, cmd.ext_int("slaveBrokerId", None))
        if start == len(log) and suspend_ms > 0:
            await b.wait_log_growth(start, suspend_ms / 1000)
        entries, nxt = log.batch(start, b.config.ha_transfer_batch_bytes)
        body: dict[str, object] = {"messages": [e.wire for e in entries]}  # type: ignore[attr-defined]
        if not same_run and b.epoch_start_offsets is not None:
            body["epochStartOffsets"] = b.epoch_start_offsets
        return cmd.response(
            ext={
                "masterEpoch": b.ha_epoch,
                "offset": start,
                "nextOffset": nxt,
                "masterMaxOffset": log.max_position,
            },
            body=body,
        )

    def get_all_topic_config(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        table = {t: tc.to_wire() for t, tc in self.broker.topic_manager.table.items()}
        return cmd.response(body={"topicConfigTable": table})

    def get_all_consumer_offset(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        return cmd.response(body={"offsetTable": encode_offset_table(self.broker.offset_manager.entries())})

    def get_all_delay_offset(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        return cmd.response(body={"offsetTable": dict(self.broker.schedule_service.offset_table)})
