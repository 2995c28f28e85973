"""Server-side assignment (RocketMQ 5's QueryAssignmentProcessor and MessageRequestModeManager), sans-IO.

``do_load_balance`` answers QUERY_ASSIGNMENT from the topic's queue set, the group's members and the
(topic, group) request mode; ``allocate4pop`` is 5.x's POP variant. ``MessageRequestModeTable`` keeps the
modes SET_MESSAGE_REQUEST_MODE stores, with the JSON form the broker persists (RocketMQ's
``config/messageRequestMode.json``).
"""

from __future__ import annotations

import enum
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from rmqlab.protocol.allocate import (
    AllocateMessageQueueAveragely,
    AllocateMessageQueueAveragelyByCircle,
    AllocateMessageQueueStrategy,
    sort_cid_all,
    sort_mq_all,
)
from rmqlab.protocol.model import MessageModel, MessageQueue, is_retry_topic

# The only strategies QueryAssignmentProcessor registers.
STRATEGIES: dict[str, AllocateMessageQueueStrategy] = {
    s.name: s for s in (AllocateMessageQueueAveragely(), AllocateMessageQueueAveragelyByCircle())
}
ALL_QUEUES = -1  # queueId of an assignment meaning "pop from every queue of this broker"


class MessageRequestMode(enum.StrEnum):
    PULL = "PULL"
    POP = "POP"


@dataclass(frozen=True, slots=True)
class RequestMode:
    """SetMessageRequestModeRequestBody: a (topic, group)'s mode and its pop share number."""

    topic: str
    consumer_group: str
    mode: MessageRequestMode = MessageRequestMode.PULL
    pop_share_queue_num: int = 0

    def to_wire(self) -> dict[str, Any]:
        return {
            "topic": self.topic,
            "consumerGroup": self.consumer_group,
            "mode": self.mode.value,
            "popShareQueueNum": self.pop_share_queue_num,
        }


def parse_mode(value: Any) -> MessageRequestMode:
    """A mode name; ValueError naming the accepted ones otherwise."""
    if isinstance(value, str) and value in MessageRequestMode.__members__:
        return MessageRequestMode(value)
    raise ValueError(f"unknown request mode {value!r}: PULL or POP")


def effective_mode(
    stored: RequestMode | None,
    topic: str,
    group: str,
    default_mode: MessageRequestMode,
    default_pop_share_queue_num: int,
) -> RequestMode:
    """The mode QUERY_ASSIGNMENT uses: the stored one, else PULL for a %RETRY% topic, else the broker's
    default (with the default pop share number when that default is POP)."""
    if stored is not None:
        return stored
    mode = MessageRequestMode.PULL if is_retry_topic(topic) else default_mode
    share = default_pop_share_queue_num if mode is MessageRequestMode.POP else 0
    return RequestMode(topic, group, mode, share)


def allocate4pop(
    strategy: AllocateMessageQueueStrategy,
    group: str,
    client_id: str,
    mq_all: Sequence[MessageQueue],
    cid_all: Sequence[str],
    pop_share_queue_num: int,
) -> list[MessageQueue]:
    """QueryAssignmentProcessor#allocate4Pop; ``mq_all`` and ``cid_all`` sorted."""
    if pop_share_queue_num <= 0 or pop_share_queue_num >= len(cid_all) - 1:
        # every client pops every queue: one assignment per queue, its id replaced by -1 (duplicates
        # collapse in the answer, which is a set)
        return [MessageQueue(mq.topic, mq.broker_name, ALL_QUEUES) for mq in mq_all]
    if len(cid_all) <= len(mq_all):
        # its own queues and those of the next popShareQueueNum members, wrapping around
        result = list(strategy.allocate(group, client_id, mq_all, cid_all))
        if client_id in cid_all:
            index = list(cid_all).index(client_id)
            for _ in range(pop_share_queue_num):
                index = (index + 1) % len(cid_all)
                result += strategy.allocate(group, cid_all[index], mq_all, cid_all)
        return result
    # more members than queues: every member gets one queue
    if client_id not in cid_all:
        return []
    return [mq_all[list(cid_all).index(client_id) % len(mq_all)]]


def do_load_balance(
    *,
    group: str,
    client_id: str,
    message_model: MessageModel,
    strategy_name: str,
    mode: RequestMode,
    mq_set: Iterable[MessageQueue] | None,
    cid_all: Iterable[str] | None,
    server_load_balancer_enable: bool = True,
) -> list[MessageQueue] | None:
    """QueryAssignmentProcessor#doLoadBalance: the queues of ``client_id``, sorted and without repeats;
    None when there is no valid answer (no route, unknown group, unknown strategy)."""
    if mq_set is None:
        return None
    if message_model is MessageModel.BROADCASTING or not server_load_balancer_enable:
        return sorted(set(mq_set))
    if cid_all is None:
        return None
    strategy = STRATEGIES.get(strategy_name)
    if strategy is None:
        return None
    mq_all = sort_mq_all(mq_set)
    cids = sort_cid_all(cid_all)
    if not mq_all or client_id not in cids:
        return []
    if mode.mode is MessageRequestMode.POP:
        result = allocate4pop(strategy, group, client_id, mq_all, cids, mode.pop_share_queue_num)
    else:
        result = list(strategy.allocate(group, client_id, mq_all, cids))
    return sorted(set(result))


class MessageRequestModeTable:
    """The stored modes by (topic, group), as MessageRequestModeManager keeps them."""

    def __init__(self) -> None:
        self.table: dict[tuple[str, str], RequestMode] = {}

    def get(self, topic: str, group: str) -> RequestMode | None:
        return self.table.get((topic, group))

    def set(self, mode: RequestMode) -> None:
        self.table[(mode.topic, mode.consumer_group)] = mode

    def encode(self) -> str:
        """messageRequestMode.json: topic -> group -> body."""
        out: dict[str, dict[str, Any]] = {}
        for (topic, group), mode in sorted(self.table.items()):
            out.setdefault(topic, {})[group] = mode.to_wire()
        return json.dumps({"messageRequestModeMap": out}, indent=2, sort_keys=True)

    @classmethod
    def decode(cls, text: str, where: str = "messageRequestMode.json") -> MessageRequestModeTable:
        """The table in ``text``; ValueError saying ``where: problem`` otherwise."""
        table = cls()
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{where}:{exc.lineno}: {exc.msg}") from None
        modes = data.get("messageRequestModeMap") if isinstance(data, dict) else None
        if not isinstance(modes, dict):
            raise ValueError(f"{where}: no messageRequestModeMap object")
        for topic, groups in modes.items():
            if not isinstance(groups, dict):
                raise ValueError(f"{where}: {topic}: not an object of groups")
            for group, body in groups.items():
                try:
                    mode = parse_mode(body.get("mode") if isinstance(body, dict) else None)
                    share = body.get("popShareQueueNum", 0)
                    if not isinstance(share, int) or isinstance(share, bool):
                        raise ValueError(f"popShareQueueNum is not an int: {share!r}")
                except ValueError as exc:
                    raise ValueError(f"{where}: {topic}/{group}: {exc}") from None
                table.set(RequestMode(topic, group, mode, share))
        return table
