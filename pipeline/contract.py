"""The event-log contract (EVENTS.md) as data: required fields, types, verdict rules.

Shared by the Spark pipeline and the plain-Python reference so both read the same table.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from enum import StrEnum
from typing import Any, Final


class FieldType(StrEnum):
    """The type of an event field in the contract."""

    INT = "int"
    STR = "str"
    BOOL = "bool"
    STR_LIST = "str_list"


INT, STR, BOOL, STR_LIST = FieldType.INT, FieldType.STR, FieldType.BOOL, FieldType.STR_LIST

INT64_MIN: Final = -(2**63)
INT64_MAX: Final = 2**63 - 1

# Fields every line carries.
COMMON_FIELDS: Final[dict[str, FieldType]] = {"ts_ms": INT, "event": STR, "node": STR, "role": STR}

# Required fields per event on top of the common ones.
EVENT_FIELDS: Final[dict[str, dict[str, FieldType]]] = {
    "message_sent": {"msg_id": STR, "topic": STR, "broker": STR, "queue_id": INT, "queue_offset": INT},
    "message_consumed": {
        "group": STR,
        "client_id": STR,
        "msg_id": STR,
        "topic": STR,
        "broker": STR,
        "queue_id": INT,
        "queue_offset": INT,
        "started_ms": INT,
        "mode": STR,
    },
    "topic_route": {"client_id": STR, "topic": STR, "queues": STR_LIST},
    "rebalance": {
        "group": STR,
        "client_id": STR,
        "topic": STR,
        "strategy": STR,
        "allocated": STR_LIST,
        "changed": BOOL,
    },
    "mq_added": {
        "group": STR,
        "client_id": STR,
        "topic": STR,
        "broker": STR,
        "queue_id": INT,
        "next_offset": INT,
    },
    "mq_removed": {
        "group": STR,
        "client_id": STR,
        "topic": STR,
        "broker": STR,
        "queue_id": INT,
        "reason": STR,
    },
    "consumer_started": {"group": STR, "client_id": STR},
    "consumer_stopped": {"group": STR, "client_id": STR},
    "nemesis": {"action": STR, "target": STR, "target_role": STR},
    "consumer_registered": {"group": STR, "client_id": STR},
    "consumer_unregistered": {"group": STR, "client_id": STR, "reason": STR},
    "offset_committed": {"group": STR, "topic": STR, "queue_id": INT, "offset": INT},
    # a slave's periodic sync replaced its copy of a committed offset (EVENTS.md, master and slaves)
    "offset_synced": {
        "group": STR,
        "topic": STR,
        "broker": STR,
        "queue_id": INT,
        "offset": INT,
        "prev_offset": INT,
    },
    # RocketMQ 5's server-side assignment (EVENTS.md, proposed section): a group with such lines is
    # analysed as server-assigned.
    "assignment": {"group": STR, "client_id": STR, "topic": STR, "pull": STR_LIST, "pop": STR_LIST},
}

# Fields read where a line has them with their type, and ignored otherwise (never malformed for them):
# an `offset_committed` names its broker (master or slave) by `broker` (EVENTS.md, master and slaves).
OPTIONAL_FIELDS: Final[dict[str, dict[str, FieldType]]] = {"offset_committed": {"broker": STR}}

# `nemesis` also requires `group` when it targets a consumer.
NEMESIS_GROUP_ROLE: Final = "consumer"

# A `rebalance` names its member set by `cid_all` (a list of client ids) or, for large groups, by
# `cid_all_digest`; one of the two must be well-formed, and `cid_all` wins when both are.
MEMBERS_EVENT: Final = "rebalance"
CID_ALL: Final = "cid_all"
CID_ALL_DIGEST: Final = "cid_all_digest"
DIGEST_PATTERN: Final = "^[0-9a-f]{64}$"
_DIGEST_RE: Final = re.compile(r"[0-9a-f]{64}")

# Every field the pipeline keeps, with its type (the union of the table above).
ALL_FIELDS: Final[dict[str, FieldType]] = {**COMMON_FIELDS}
for _fields in EVENT_FIELDS.values():
    ALL_FIELDS.update(_fields)
ALL_FIELDS.update({CID_ALL: STR_LIST, CID_ALL_DIGEST: STR})

# Consumer events whose `group` names a group and whose `client_id`/`node` tie a client to a node.
CONSUMER_GROUP_EVENTS: Final = (
    "message_consumed",
    "rebalance",
    "mq_added",
    "mq_removed",
    "consumer_started",
    "consumer_stopped",
)
CLIENT_NODE_EVENTS: Final = (*CONSUMER_GROUP_EVENTS, "topic_route")

ORDERLY: Final = "ORDERLY"
SERVER_ASSIGNMENT: Final = "assignment"
RETRY_PREFIX: Final = "%RETRY%"
CLIENT_MODE, SERVER_PULL_MODE, SERVER_POP_MODE = "client", "server-pull", "server-pop"


def server_mode(pop_assigned: bool) -> str:
    """The mode of a group with `assignment` lines: `server-pop` when one of a non-%RETRY% topic listed
    a POP queue."""
    return SERVER_POP_MODE if pop_assigned else SERVER_PULL_MODE


CLOSING_ACTIONS: Final = ("kill", "stop")
UNPAUSING_ACTIONS: Final = ("resume", "kill", "stop")


def queue_key(broker: str, queue_id: int) -> str:
    """A queue of a topic written as in `topic_route`/`rebalance` lists: `broker:queue_id`."""
    return f"{broker}:{queue_id}"


def members_digest(client_ids: Iterable[str]) -> str:
    """EVENTS.md's `cid_all_digest` of a set of client ids: SHA-256 of the distinct ids, sorted by code
    point and joined by newlines, UTF-8, lowercase hex."""
    return hashlib.sha256("\n".join(sorted(set(client_ids))).encode("utf-8")).hexdigest()


def is_digest(value: Any) -> bool:
    return type(value) is str and _DIGEST_RE.fullmatch(value) is not None


def rebalance_members(record: dict[str, Any]) -> str | None:
    """The member set of a `rebalance` line as a digest (from `cid_all` when it is a list of strings,
    else from a well-formed `cid_all_digest`), or None when neither field is usable (malformed)."""
    cid_all = record.get(CID_ALL)
    if has_type(cid_all, STR_LIST):
        return members_digest(cid_all)
    digest = record.get(CID_ALL_DIGEST)
    return digest if is_digest(digest) else None


def required_fields(record: dict[str, Any]) -> dict[str, FieldType]:
    """Required fields of a parsed line (common ones plus its event's), given its `event` value."""
    fields = dict(COMMON_FIELDS)
    event = record.get("event")
    if isinstance(event, str):
        fields.update(EVENT_FIELDS.get(event, {}))
        if event == "nemesis" and record.get("target_role") == NEMESIS_GROUP_ROLE:
            fields["group"] = STR
    return fields


def has_type(value: Any, ftype: FieldType) -> bool:
    """True when a decoded JSON value has the contract type (null is never of any type)."""
    if ftype is INT:
        return type(value) is int and INT64_MIN <= value <= INT64_MAX
    if ftype is STR:
        return type(value) is str
    if ftype is BOOL:
        return type(value) is bool
    return type(value) is list and all(type(item) is str for item in value)


# The checks of the verdict, as failing_checks names them (the most severe first).
CHECKS: Final = ("lost", "orderly", "not-converged")


def failing_checks(
    *,
    lost: int,
    orderly: bool,
    concurrent_consume_ms: int,
    order_violations: int,
    convergence: list[dict],
    server_assigned: bool = False,
) -> list[str]:
    """The checks of CHECKS one group fails. A group whose queues the broker assigns never converges in
    the client's sense: its convergence entries are shown but do not decide."""
    failed = []
    if lost > 0:
        failed.append("lost")
    if orderly and (concurrent_consume_ms > 0 or order_violations > 0):
        failed.append("orderly")
    if not server_assigned and any(not entry["converged"] for entry in convergence):
        failed.append("not-converged")
    return failed


def verdict(
    *,
    lost: int,
    orderly: bool,
    concurrent_consume_ms: int,
    order_violations: int,
    convergence: list[dict],
    server_assigned: bool = False,
) -> str:
    """The EVENTS.md verdict of one group: "fail" when it fails any check."""
    failed = failing_checks(
        lost=lost,
        orderly=orderly,
        concurrent_consume_ms=concurrent_consume_ms,
        order_violations=order_violations,
        convergence=convergence,
        server_assigned=server_assigned,
    )
    return "fail" if failed else "ok"


def cause_text(event: str, client_id: str | None, node: str | None, target: str | None) -> str:
    """Free text naming one change (`cause` of a convergence entry)."""
    if event == "consumer_started":
        return f"start {client_id} on {node}"
    if event == "consumer_stopped":
        return f"stop {client_id} on {node}"
    return f"kill {target}"


def join_causes(causes: list[str]) -> str:
    """Changes of the same millisecond give one entry: their causes, sorted and de-duplicated."""
    return "; ".join(sorted(set(causes)))


# The committed offset of a queue as the lines show it (EVENTS.md, "Offset regressions"): a broker's
# `offset_committed` (a write to its offset table) and a consumer's `mq_added` (where a new owner
# resumes: the table's value, read). Field of the offset on each.
OFFSET_OBSERVATIONS: Final = {"offset_committed": "offset", "mq_added": "next_offset"}


# A slave's own table moving back (EVENTS.md, "Offset regressions"): an `offset_synced` whose `offset`
# (0 or more: -1 is an entry that went away) is below its `prev_offset`.
SLAVE_OFFSET_SYNC: Final = "offset_synced"


def offset_queue_broker(event: str, node: str, broker: Any) -> str:
    """The broker of the queue an offset line names: its `broker` (for `offset_committed` the broker
    name, which a slave shares with its master), or for an `offset_committed` without one (a string)
    the writing broker's node (a master's node is its broker name)."""
    if event == "offset_committed" and type(broker) is not str:
        return node
    return str(broker)


GROUP_METRICS: Final = (
    "sent",
    "consumed_unique",
    "lost",
    "duplicates",
    "duplicated_messages",
    "overlap_ms",
    "orphan_ms",
    "idle_member_ms",
    "stalled_ms",
    "concurrent_consume_ms",
    "order_violations",
)
