"""QUERY_ASSIGNMENT and SET_MESSAGE_REQUEST_MODE: a table of cases worked out by hand from RocketMQ 5's
QueryAssignmentProcessor (doLoadBalance, allocate4Pop, AVG and AVG_BY_CIRCLE), checked on the pure
function and through the wire, and the request mode's errors and durability."""

from __future__ import annotations

import pytest

from rmqlab.broker.assignment import (
    MessageRequestMode,
    MessageRequestModeTable,
    RequestMode,
    do_load_balance,
    effective_mode,
)
from rmqlab.protocol.codes import RequestCode, ResponseCode
from rmqlab.protocol.model import MessageModel, MessageQueue

CIDS3 = ["c1", "c2", "c3"]
CIDS4 = ["c1", "c2", "c3", "c4"]
CIDS6 = ["c1", "c2", "c3", "c4", "c5", "c6"]

# (name, mode, popShareQueueNum, strategy, members, client, expected "broker:queue" list or None).
# The topic has 4 queues on broker-a. Worked by hand:
#  AVG with 4 queues and 3 members: mod = 1, so c1 (index 0) takes 2 queues from 0, c2 takes 1 from
#    1*1+1 = 2, c3 takes 1 from 3.
#  AVG_BY_CIRCLE: member i takes i, i+3, ...: c1 -> 0, 3.
#  POP, k <= 0 or k >= members - 1: every member pops "broker-a:-1".
#  POP, k = 1, 3 members <= 4 queues: own AVG queues plus those of the next member (wrapping).
#  POP, k = 1, 6 members > 4 queues: the queue at index(client) % 4.
CASES = [
    ("pull-avg-c1", "PULL", 0, "AVG", CIDS3, "c1", ["broker-a:0", "broker-a:1"]),
    ("pull-avg-c2", "PULL", 0, "AVG", CIDS3, "c2", ["broker-a:2"]),
    ("pull-avg-c3", "PULL", 0, "AVG", CIDS3, "c3", ["broker-a:3"]),
    ("pull-circle-c1", "PULL", 0, "AVG_BY_CIRCLE", CIDS3, "c1", ["broker-a:0", "broker-a:3"]),
    ("pull-circle-c2", "PULL", 0, "AVG_BY_CIRCLE", CIDS3, "c2", ["broker-a:1"]),
    ("pull-avg-6-members-c5", "PULL", 0, "AVG", CIDS6, "c5", []),
    ("pop-share-default", "POP", -1, "AVG", CIDS3, "c2", ["broker-a:-1"]),
    ("pop-share-0", "POP", 0, "AVG", CIDS3, "c1", ["broker-a:-1"]),
    ("pop-share-equals-members-minus-1", "POP", 2, "AVG", CIDS3, "c3", ["broker-a:-1"]),
    ("pop-share-1-c1", "POP", 1, "AVG", CIDS3, "c1", ["broker-a:0", "broker-a:1", "broker-a:2"]),
    ("pop-share-1-c3-wraps", "POP", 1, "AVG", CIDS3, "c3", ["broker-a:0", "broker-a:1", "broker-a:3"]),
    ("pop-share-1-circle-c2", "POP", 1, "AVG_BY_CIRCLE", CIDS3, "c2", ["broker-a:1", "broker-a:2"]),
    # as many members as queues still shares: c2's own queue and c3's
    ("pop-share-1-members-equal-queues-c2", "POP", 1, "AVG", CIDS4, "c2", ["broker-a:1", "broker-a:2"]),
    ("pop-share-1-more-members-c5", "POP", 1, "AVG", CIDS6, "c5", ["broker-a:0"]),
    ("pop-share-1-more-members-c6", "POP", 1, "AVG", CIDS6, "c6", ["broker-a:1"]),
    ("pop-share-2-more-members-c4", "POP", 2, "AVG", CIDS6, "c4", ["broker-a:3"]),
    ("unknown-strategy", "PULL", 0, "CONSISTENT_HASH", CIDS3, "c1", None),
    ("not-a-member", "PULL", 0, "AVG", CIDS3, "c9", []),
]
QUEUES = [MessageQueue("T", "broker-a", i) for i in range(4)]


def _short(queues: list[MessageQueue] | None) -> list[str] | None:
    return None if queues is None else [mq.short for mq in queues]


@pytest.mark.parametrize(("name", "mode", "share", "strategy", "cids", "client", "expected"), CASES)
def test_do_load_balance_table(name, mode, share, strategy, cids, client, expected) -> None:
    rm = RequestMode("T", "g", MessageRequestMode(mode), share)
    got = do_load_balance(
        group="g",
        client_id=client,
        message_model=MessageModel.CLUSTERING,
        strategy_name=strategy,
        mode=rm,
        mq_set=set(QUEUES),
        cid_all=list(reversed(cids)),  # sorted inside, as the broker sorts cidAll
    )
    assert _short(got) == expected


def test_do_load_balance_without_route_group_or_balancer() -> None:
    pull = RequestMode("T", "g", MessageRequestMode.PULL, 0)
    common = {"group": "g", "client_id": "c1", "strategy_name": "AVG", "mode": pull}
    assert (
        do_load_balance(message_model=MessageModel.CLUSTERING, mq_set=None, cid_all=CIDS3, **common) is None
    )
    assert (
        do_load_balance(message_model=MessageModel.CLUSTERING, mq_set=QUEUES, cid_all=None, **common) is None
    )
    every = [mq.short for mq in QUEUES]
    got = do_load_balance(message_model=MessageModel.BROADCASTING, mq_set=QUEUES, cid_all=None, **common)
    assert _short(got) == every
    got = do_load_balance(
        message_model=MessageModel.CLUSTERING,
        mq_set=QUEUES,
        cid_all=CIDS3,
        server_load_balancer_enable=False,
        **common,
    )
    assert _short(got) == every
    two_brokers = [*QUEUES, MessageQueue("T", "broker-b", 0)]
    pop = RequestMode("T", "g", MessageRequestMode.POP, -1)
    got = do_load_balance(
        message_model=MessageModel.CLUSTERING, mq_set=two_brokers, cid_all=CIDS3, **{**common, "mode": pop}
    )
    assert _short(got) == ["broker-a:-1", "broker-b:-1"]


def test_effective_mode_defaults() -> None:
    stored = RequestMode("T", "g", MessageRequestMode.POP, 3)
    assert effective_mode(stored, "T", "g", MessageRequestMode.PULL, -1) is stored
    assert effective_mode(None, "T", "g", MessageRequestMode.PULL, -1) == RequestMode("T", "g")
    assert effective_mode(None, "T", "g", MessageRequestMode.POP, -1) == RequestMode(
        "T", "g", MessageRequestMode.POP, -1
    )
    # a %RETRY% topic is always PULL
    assert effective_mode(None, "%RETRY%g", "g", MessageRequestMode.POP, -1).mode is MessageRequestMode.PULL


def test_mode_table_round_trip_and_bad_files() -> None:
    t = MessageRequestModeTable()
    t.set(RequestMode("T", "g", MessageRequestMode.POP, 2))
    t.set(RequestMode("U", "h", MessageRequestMode.PULL, 0))
    back = MessageRequestModeTable.decode(t.encode())
    assert back.table == t.table
    with pytest.raises(ValueError, match=r"^f.json:1: "):
        MessageRequestModeTable.decode("{", "f.json")
    with pytest.raises(ValueError, match="T/g: unknown request mode 'PUSH'"):
        MessageRequestModeTable.decode('{"messageRequestModeMap": {"T": {"g": {"mode": "PUSH"}}}}')


# -- through the wire ---------------------------------------------------------------------------------


async def _query(peer, client: str, strategy: str = "AVG", topic: str = "T", model: str = "CLUSTERING"):
    body = {
        "topic": topic,
        "consumerGroup": "g",
        "clientId": client,
        "strategyName": strategy,
        "messageModel": model,
    }
    resp = await peer.ok(RequestCode.QUERY_ASSIGNMENT, body=body)
    got = resp.body["messageQueueAssignments"]
    if got is None:
        return None, None
    modes = {a["mode"] for a in got}
    return sorted(f"{a['messageQueue']['brokerName']}:{a['messageQueue']['queueId']}" for a in got), modes


async def _set_mode(peer, mode: str, share: int, topic: str = "T"):
    body = {"topic": topic, "consumerGroup": "g", "mode": mode, "popShareQueueNum": share}
    return await peer.call(RequestCode.SET_MESSAGE_REQUEST_MODE, body=body)


async def test_query_assignment_table_through_the_wire(make_broker, make_peer) -> None:
    broker = await make_broker(time_scale=0.01)
    peers = {}
    for cid in CIDS6:
        peers[cid] = make_peer(broker.address)
    admin = make_peer(broker.address)
    await admin.send("T")  # creates T with 4 queues
    for cids in (CIDS3, CIDS4, CIDS6):
        for cid in CIDS6:
            if cid in cids:
                await peers[cid].heartbeat(cid)
            else:
                await peers[cid].call(RequestCode.UNREGISTER_CLIENT, {"clientID": cid, "consumerGroup": "g"})
        for name, mode, share, strategy, case_cids, client, expected in CASES:
            if case_cids != cids:
                continue
            resp = await _set_mode(admin, mode, share)
            assert resp.code == ResponseCode.SUCCESS, resp.remark
            got, modes = await _query(peers.get(client, admin), client, strategy)
            assert got == (sorted(expected) if expected is not None else None), name
            if got:
                assert modes == {mode}, name


async def test_query_assignment_defaults_and_errors(make_broker, make_peer) -> None:
    broker = await make_broker(time_scale=0.01, default_message_request_mode="POP")
    p = make_peer(broker.address)
    await p.send("T")
    await p.heartbeat("c1", topics=["T", "%RETRY%g"])
    # the broker's default mode POP with the default share number -1: pop every queue
    assert await _query(p, "c1") == (["broker-a:-1"], {"POP"})
    assert await _query(p, "c1", model="BROADCASTING") == ([f"broker-a:{i}" for i in range(4)], {"POP"})
    # retry topics are PULL whatever the default
    await p.send("%RETRY%g")
    assert await _query(p, "c1", topic="%RETRY%g") == (["broker-a:0"], {"PULL"})
    assert await _query(p, "c1", topic="NoSuchTopic") == (None, None)
    resp = await _set_mode(p, "PUSH", 0)
    assert resp.code == ResponseCode.INVALID_PARAMETER and "unknown request mode 'PUSH'" in resp.remark
    resp = await _set_mode(p, "POP", 0, topic="%RETRY%g")
    assert resp.code == ResponseCode.NO_PERMISSION
    resp = await _set_mode(p, "POP", 0, topic="NoSuchTopic")
    assert resp.code == ResponseCode.TOPIC_NOT_EXIST
    body = {"topic": "T", "consumerGroup": "g", "clientId": "c1", "strategyName": "AVG", "messageModel": "X"}
    resp = await p.call(RequestCode.QUERY_ASSIGNMENT, body=body)
    assert resp.code == ResponseCode.INVALID_PARAMETER and "messageModel" in resp.remark
    resp = await p.call(RequestCode.QUERY_ASSIGNMENT, body={"topic": "T"})
    assert resp.code == ResponseCode.INVALID_PARAMETER and "consumerGroup" in resp.remark


async def test_request_mode_survives_a_restart(make_broker, make_peer, tmp_path) -> None:
    broker = await make_broker(time_scale=0.01, store_dir=str(tmp_path))
    p = make_peer(broker.address)
    await p.send("T")
    resp = await _set_mode(p, "POP", 1)
    assert resp.code == ResponseCode.SUCCESS
    await broker.shutdown()
    again = await make_broker(time_scale=0.01, store_dir=str(tmp_path))
    assert again.request_modes.get("T", "g") == RequestMode("T", "g", MessageRequestMode.POP, 1)
    (tmp_path / "messageRequestMode.json").write_text("{broken")
    await again.shutdown()
    from rmqlab.broker.store import StoreError

    with pytest.raises(StoreError, match=r"messageRequestMode\.json:1"):
        await make_broker(time_scale=0.01, store_dir=str(tmp_path))
