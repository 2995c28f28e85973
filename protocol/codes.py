"""Request and response codes: Apache RocketMQ's values, plus the project's admin range (9000-9099)."""

from __future__ import annotations

import enum


class RequestCode(enum.IntEnum):
    """RocketMQ's request codes."""

    SEND_MESSAGE = 10
    PULL_MESSAGE = 11
    QUERY_CONSUMER_OFFSET = 14
    UPDATE_CONSUMER_OFFSET = 15
    UPDATE_AND_CREATE_TOPIC = 17
    GET_ALL_TOPIC_CONFIG = 21
    SEARCH_OFFSET_BY_TIMESTAMP = 29
    GET_MAX_OFFSET = 30
    GET_MIN_OFFSET = 31
    HEART_BEAT = 34
    UNREGISTER_CLIENT = 35
    CONSUMER_SEND_MSG_BACK = 36
    GET_CONSUMER_LIST_BY_GROUP = 38
    NOTIFY_CONSUMER_IDS_CHANGED = 40
    LOCK_BATCH_MQ = 41
    UNLOCK_BATCH_MQ = 42
    GET_ALL_CONSUMER_OFFSET = 43
    GET_ALL_DELAY_OFFSET = 45
    REGISTER_BROKER = 103
    UNREGISTER_BROKER = 104
    GET_ROUTEINFO_BY_TOPIC = 105
    GET_CONSUMER_CONNECTION_LIST = 203
    # RocketMQ 5's controller (controller mode, PROTOCOL.md "RocketMQ 5: the controller")
    BROKER_HEARTBEAT = 904
    CONTROLLER_ALTER_SYNC_STATE_SET = 1001
    CONTROLLER_ELECT_MASTER = 1002
    CONTROLLER_REGISTER_BROKER = 1003
    CONTROLLER_GET_REPLICA_INFO = 1004
    NOTIFY_BROKER_ROLE_CHANGED = 1008
    SEND_MESSAGE_V2 = 310
    # RocketMQ 5: server-side assignment and POP (RIP-19)
    QUERY_ASSIGNMENT = 400
    SET_MESSAGE_REQUEST_MODE = 401
    POP_MESSAGE = 200050
    ACK_MESSAGE = 200051
    CHANGE_MESSAGE_INVISIBLETIME = 200053
    BATCH_ACK_MESSAGE = 200151
    # The project's own admin and fault-injection commands (9000-9099, see README).
    ADMIN_FAULT_ADD = 9000
    ADMIN_FAULT_CLEAR = 9001
    ADMIN_FAULT_LIST = 9002
    ADMIN_POLICY_SET = 9003
    ADMIN_BROKER_STATUS = 9004
    # A slave copying its master's messages (RocketMQ's HA connection, not a remoting protocol there);
    # outside the admin range: slaves on other hosts use it
    HA_TRANSFER = 9110


class ResponseCode(enum.IntEnum):
    """RocketMQ's response codes."""

    SUCCESS = 0
    SYSTEM_ERROR = 1
    SYSTEM_BUSY = 2
    REQUEST_CODE_NOT_SUPPORTED = 3
    SLAVE_NOT_AVAILABLE = 11
    FLUSH_SLAVE_TIMEOUT = 12
    MESSAGE_ILLEGAL = 13
    SERVICE_NOT_AVAILABLE = 14
    NO_PERMISSION = 16
    TOPIC_NOT_EXIST = 17
    PULL_NOT_FOUND = 19
    PULL_RETRY_IMMEDIATELY = 20
    PULL_OFFSET_MOVED = 21
    QUERY_NOT_FOUND = 22
    SUBSCRIPTION_NOT_EXIST = 24
    SUBSCRIPTION_NOT_LATEST = 25
    SUBSCRIPTION_GROUP_NOT_EXIST = 26
    INVALID_PARAMETER = 29
    CONSUMER_NOT_ONLINE = 206
    NO_MESSAGE = 208
    POLLING_FULL = 209
    POLLING_TIMEOUT = 210
    FLOW_CONTROL = 215
    # RocketMQ 5's controller
    CONTROLLER_FENCED_MASTER_EPOCH = 2000
    CONTROLLER_FENCED_SYNC_STATE_SET_EPOCH = 2001
    CONTROLLER_INVALID_MASTER = 2002
    CONTROLLER_INVALID_REPLICAS = 2003
    CONTROLLER_MASTER_NOT_AVAILABLE = 2004
    CONTROLLER_BROKER_NOT_ALIVE = 2006
    CONTROLLER_BROKER_METADATA_NOT_EXIST = 2008
    CONTROLLER_BROKER_NEED_TO_BE_REGISTERED = 2010
    CONTROLLER_MASTER_STILL_EXIST = 2011
    CONTROLLER_ELECT_MASTER_FAILED = 2012
    CONTROLLER_ALTER_SYNC_STATE_SET_FAILED = 2013


ADMIN_CODE_RANGE = range(9000, 9100)


class Flag(enum.IntFlag):
    """Bits of a frame's flag field."""

    RESPONSE = 1
    ONEWAY = 2


def code_name(code: int, *, response: bool) -> str:
    """Readable name of a code for logs; unknown codes print as their number."""
    enum_cls: type[enum.IntEnum] = ResponseCode if response else RequestCode
    try:
        return enum_cls(code).name
    except ValueError:
        return str(code)
