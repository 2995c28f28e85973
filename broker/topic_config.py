"""Topic configuration (RocketMQ's TopicConfigManager), sans-IO.

Topics are created by UPDATE_AND_CREATE_TOPIC, on first send (unless auto-creation is off), and for
each consumer group its retry topic ``%RETRY%<group>`` on heartbeat and ``%DLQ%<group>`` on the first
dead letter.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from rmqlab.protocol.model import dlq_topic, retry_topic

PERM_INHERIT = 1
PERM_WRITE = 2
PERM_READ = 4
PERM_READ_WRITE = PERM_READ | PERM_WRITE
VALID_PERMS = (PERM_WRITE, PERM_READ, PERM_READ_WRITE)

MAX_QUEUE_NUMS = 1024
_TOPIC_RE = re.compile(r"^[%|a-zA-Z0-9_-]+$")
TOPIC_MAX_LENGTH = 127


def topic_name_problem(topic: str) -> str | None:
    """Why a topic name is not acceptable (RocketMQ's TopicValidator rules), or None."""
    if not topic:
        return "is empty"
    if len(topic) > TOPIC_MAX_LENGTH:
        return f"longer than {TOPIC_MAX_LENGTH} characters"
    if not _TOPIC_RE.fullmatch(topic):
        return "may contain only letters, digits, '%', '|', '_' and '-'"
    return None


@dataclass(frozen=True, slots=True)
class TopicConfig:
    """A topic's queue counts and permission."""

    topic_name: str
    read_queue_nums: int = 4
    write_queue_nums: int = 4
    perm: int = PERM_READ_WRITE

    @property
    def readable(self) -> bool:
        return bool(self.perm & PERM_READ)

    @property
    def writeable(self) -> bool:
        return bool(self.perm & PERM_WRITE)

    @property
    def queue_nums(self) -> int:
        return max(self.read_queue_nums, self.write_queue_nums)

    def to_wire(self) -> dict[str, Any]:
        return {
            "readQueueNums": self.read_queue_nums,
            "writeQueueNums": self.write_queue_nums,
            "perm": self.perm,
        }


AUTO_CREATE_TOPIC_KEY = "TBW102"


class TopicConfigManager:
    """The broker's topics, created by admin requests or on first use."""

    def __init__(self, default_queue_nums: int = 4, auto_create: bool = True) -> None:
        self.default_queue_nums = default_queue_nums
        self.auto_create = auto_create
        self.table: dict[str, TopicConfig] = {}
        self.data_version = 0  # bumped on every change; the name-server registration watches it
        if auto_create:
            # RocketMQ's auto-create key topic: producers (real ones included) look its route up to
            # find a broker that will create an unknown topic on first send.
            self.put(
                TopicConfig(AUTO_CREATE_TOPIC_KEY, default_queue_nums, default_queue_nums, PERM_READ_WRITE)
            )

    def select(self, topic: str) -> TopicConfig | None:
        return self.table.get(topic)

    def put(self, tc: TopicConfig) -> bool:
        """Create or replace; returns True when something changed."""
        if self.table.get(tc.topic_name) == tc:
            return False
        self.table[tc.topic_name] = tc
        self.data_version += 1
        return True

    def remove(self, topic: str) -> bool:
        if self.table.pop(topic, None) is None:
            return False
        self.data_version += 1
        return True

    def create_in_send(self, topic: str) -> tuple[TopicConfig | None, bool]:
        """The topic's config, auto-created for a send when allowed. Returns (config, created)."""
        tc = self.table.get(topic)
        if tc is not None:
            return tc, False
        if not self.auto_create:
            return None, False
        tc = TopicConfig(topic, self.default_queue_nums, self.default_queue_nums, PERM_READ_WRITE)
        self.put(tc)
        return tc, True

    def create_retry_topic(self, group: str, queue_nums: int = 1) -> tuple[TopicConfig, bool]:
        return self._create_system(retry_topic(group), queue_nums)

    def create_dlq_topic(self, group: str) -> tuple[TopicConfig, bool]:
        return self._create_system(dlq_topic(group), 1)

    def _create_system(self, topic: str, queue_nums: int) -> tuple[TopicConfig, bool]:
        tc = self.table.get(topic)
        if tc is not None:
            return tc, False
        tc = TopicConfig(topic, queue_nums, queue_nums, PERM_READ_WRITE)
        self.put(tc)
        return tc, True
