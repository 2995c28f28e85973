"""POP's shared vocabulary (RocketMQ 5, RIP-19): the receipt (``extraInfo``) format, the pop retry topic's
name and the header strings of a POP answer, as RocketMQ's ``ExtraInfoUtil`` and ``KeyBuilder`` write them.

The broker writes receipts, clients and the gRPC endpoint read them back; all of them use this module so
that the format exists once. A receipt is eight fields separated by one space::

    <ckQueueOffset> <popTime> <invisibleTime> <reviveQid> <retry> <brokerName> <queueId> <queueOffset>

``retry`` is ``0`` for a message popped from the topic itself and ``1`` for one popped from the pop retry
topic ``%RETRY%<group>_<topic>``; ``reviveQid`` 999 marks an orderly pop.
"""

from __future__ import annotations

from dataclasses import dataclass

PROPERTY_POP_CK = "POP_CK"  # MessageConst.PROPERTY_POP_CK: the receipt, on every popped message
PROPERTY_FIRST_POP_TIME = "1ST_POP_TIME"  # MessageConst.PROPERTY_FIRST_POP_TIME
POP_ORDER_REVIVE_QUEUE = 999  # KeyBuilder.POP_ORDER_REVIVE_QUEUE
NORMAL_TOPIC = "0"
RETRY_TOPIC = "1"
POP_RETRY_SEPARATOR_V1 = "_"
RETRY_PREFIX = "%RETRY%"


def pop_retry_topic(topic: str, group: str) -> str:
    """KeyBuilder.buildPopRetryTopicV1: where revived messages of (group, topic) go."""
    return f"{RETRY_PREFIX}{group}{POP_RETRY_SEPARATOR_V1}{topic}"


def real_topic(topic: str, group: str, retry: str) -> str:
    """ExtraInfoUtil.getRealTopic: the topic a receipt's message was popped from."""
    if retry == NORMAL_TOPIC:
        return topic
    if retry == RETRY_TOPIC:
        return pop_retry_topic(topic, group)
    raise ValueError(f"retry flag must be {NORMAL_TOPIC!r} or {RETRY_TOPIC!r}, got {retry!r}")


def retry_flag(topic: str) -> str:
    """ExtraInfoUtil.getRetry: ``1`` for a %RETRY% topic, else ``0``."""
    return RETRY_TOPIC if topic.startswith(RETRY_PREFIX) else NORMAL_TOPIC


@dataclass(frozen=True, slots=True)
class ExtraInfo:
    """One popped message's receipt: which checkpoint it belongs to and where the message is."""

    ck_queue_offset: int  # the checkpoint's start offset
    pop_time: int  # epoch ms of the pop (or of the last invisible-time change)
    invisible_time: int  # ms
    revive_qid: int
    retry: str  # "0" or "1"
    broker_name: str
    queue_id: int
    queue_offset: int

    @property
    def is_order(self) -> bool:
        return self.revive_qid == POP_ORDER_REVIVE_QUEUE

    @property
    def revive_time(self) -> int:
        """When the message becomes visible again unless acked (popTime + invisibleTime)."""
        return self.pop_time + self.invisible_time

    def build(self) -> str:
        return " ".join(
            (
                str(self.ck_queue_offset),
                str(self.pop_time),
                str(self.invisible_time),
                str(self.revive_qid),
                self.retry,
                self.broker_name,
                str(self.queue_id),
                str(self.queue_offset),
            )
        )

    @classmethod
    def parse(cls, text: str) -> ExtraInfo:
        """The receipt in ``text``; ValueError saying what is wrong with it otherwise."""
        parts = text.split(" ")
        if len(parts) != 8:
            raise ValueError(
                "a receipt has 8 space-separated fields (ckOffset popTime invisibleTime reviveQid retry "
                f"brokerName queueId offset), got {len(parts)}"
            )
        names = (
            "ckQueueOffset",
            "popTime",
            "invisibleTime",
            "reviveQid",
            None,
            None,
            "queueId",
            "queueOffset",
        )
        numbers: dict[str, int] = {}
        for name, part in zip(names, parts, strict=True):
            if name is None:
                continue
            try:
                numbers[name] = int(part)
            except ValueError:
                raise ValueError(f"receipt field {name} is not a number: {part!r}") from None
        if parts[4] not in (NORMAL_TOPIC, RETRY_TOPIC):
            raise ValueError(f"receipt field retry must be 0 or 1, got {parts[4]!r}")
        if not parts[5]:
            raise ValueError("receipt field brokerName is empty")
        return cls(
            numbers["ckQueueOffset"],
            numbers["popTime"],
            numbers["invisibleTime"],
            numbers["reviveQid"],
            parts[4],
            parts[5],
            numbers["queueId"],
            numbers["queueOffset"],
        )


def offset_info(topic: str, queue_id: int, values: list[int] | int) -> str:
    """One entry of PopMessageResponseHeader's startOffsetInfo / msgOffsetInfo / orderCountInfo:
    ``<retry> <queueId> <value[,value...]>``; entries are joined with ``;``."""
    text = ",".join(str(v) for v in values) if isinstance(values, list) else str(values)
    return f"{retry_flag(topic)} {queue_id} {text}"


def bitset_indices(data: bytes) -> list[int]:
    """java.util.BitSet#toByteArray's bits (little-endian), as the set indices: BatchAck's ``b`` field."""
    return [8 * i + j for i, byte in enumerate(data) for j in range(8) if byte >> j & 1]
