"""PullRequestHoldService, ScheduleMessageService, FaultTable and RouteInfoManager, without sockets."""

from __future__ import annotations

import pytest

from rmqlab.broker.faults import FaultTable, parse_fault_spec
from rmqlab.broker.long_polling import HeldPull, PullRequestHoldService
from rmqlab.broker.route_info import RouteInfoManager, parse_topic_config_table
from rmqlab.broker.schedule import ScheduleMessageService
from rmqlab.broker.store import SCHEDULE_TOPIC, MemoryMessageStore
from rmqlab.protocol.clock import ManualClock
from rmqlab.protocol.command import InvalidParameter
from rmqlab.protocol.model import MessageQueue
from rmqlab.protocol.route import QueueData, TopicRouteData

# -- long polling ---------------------------------------------------------------------------------


def test_hold_woken_by_matching_arrival_on_its_queue_only():
    hs = PullRequestHoldService()
    a = HeldPull("T", 0, 5, [], 1000, conn_id=1)
    b = HeldPull("T", 0, 5, ["x"], 1000, conn_id=2)
    c = HeldPull("T", 1, 0, [], 1000, conn_id=3)
    for r in (a, b, c):
        hs.suspend_pull_request(r)
    assert len(hs) == 3
    assert hs.notify_message_arriving("T", 0, 5, None, 0) == []  # max not past the asked offset
    assert hs.notify_message_arriving("T", 0, 6, "y", 0) == [a]  # b filters on x
    assert hs.notify_message_arriving("U", 0, 6, "x", 0) == []
    assert hs.notify_message_arriving("T", 0, 7, "x", 0) == [b]
    assert len(hs) == 1
    assert hs.remove_connection(3) == [c] and len(hs) == 0


def test_a_closed_connection_takes_its_held_pulls_in_the_tables_order():
    hs = PullRequestHoldService()
    q1 = HeldPull("T", 1, 0, [], 1000, conn_id=7)
    other = HeldPull("T", 0, 0, [], 1000, conn_id=8)
    q0 = HeldPull("T", 0, 0, [], 1000, conn_id=7)
    q2 = HeldPull("T", 2, 0, [], 1000, conn_id=7)
    for r in (other, q1, q0, q2):  # queue 0 entered the table first, by another connection's pull
        hs.suspend_pull_request(r)
    assert hs.notify_message_arriving("T", 2, 1, None, 0) == [q2]  # answered before the close
    again = HeldPull("T", 2, 1, [], 1000, conn_id=7)
    hs.suspend_pull_request(again)  # queue 2 is back, now last in the table
    assert hs.remove_connection(7) == [q0, q1, again]
    assert hs.remove_connection(7) == [] and hs.remove_connection(99) == []
    assert len(hs) == 1 and hs.remove_connection(8) == [other] and len(hs) == 0


def test_an_arrival_also_wakes_pulls_past_their_suspend_time():
    hs = PullRequestHoldService()
    a = HeldPull("T", 0, 5, ["x"], 1000)
    hs.suspend_pull_request(a)
    assert hs.notify_message_arriving("T", 0, 6, "y", 999) == []
    assert hs.notify_message_arriving("T", 0, 7, "y", 1000) == [a] and len(hs) == 0


def test_hold_check_wakes_grown_queues_whatever_the_tags_and_timed_out_pulls():
    """checkHoldRequest calls notifyMessageArriving without a tag code, which every filter matches."""
    hs = PullRequestHoldService()
    tagged = HeldPull("T", 0, 3, ["x"], 10_000)
    waiting = HeldPull("T", 1, 3, [], 10_000)
    late = HeldPull("T", 2, 3, [], 100)
    for r in (tagged, waiting, late):
        hs.suspend_pull_request(r)
    max_offsets = {("T", 0): 3, ("T", 1): 3, ("T", 2): 3}

    def max_offset(topic: str, queue_id: int) -> int:
        return max_offsets[(topic, queue_id)]

    assert hs.check_hold_request(99, max_offset) == []
    assert hs.check_hold_request(100, max_offset) == [late]
    max_offsets[("T", 0)] = 4  # one message with another tag
    assert hs.check_hold_request(101, max_offset) == [tagged]
    assert hs.remove(waiting) and not hs.remove(waiting) and len(hs) == 0


# -- scheduled (retry) messages -------------------------------------------------------------------


async def test_schedule_delivers_in_level_order_when_due():
    clock = ManualClock(1_000_000)
    store = MemoryMessageStore(clock=clock)
    ss = ScheduleMessageService([1000, 5000])
    assert ss.clamp_level(0) == 1 and ss.clamp_level(9) == 2
    d1 = ss.schedule_draft(
        1,
        "%RETRY%g",
        0,
        b"a",
        tags="t",
        keys=None,
        born_timestamp=5,
        reconsume_times=1,
        properties={"ORIGIN_MESSAGE_ID": "X"},
    )
    d2 = ss.schedule_draft(
        2, "%RETRY%g", 0, b"b", tags=None, keys=None, born_timestamp=5, reconsume_times=2, properties={}
    )
    assert d1.topic == SCHEDULE_TOPIC and d1.queue_id == 0 and d2.queue_id == 1
    m1 = await store.put_message(d1)
    await store.put_message(d2)
    assert ss.next_due_ms(store) == 1_001_000
    assert ss.due(store, 1_000_999) == []
    due = ss.due(store, 1_001_000)
    assert [(lvl, m.msg_id) for lvl, m in due] == [(1, m1.msg_id)]
    real = ss.real_draft(m1)
    assert (real.topic, real.queue_id, real.reconsume_times, real.body) == ("%RETRY%g", 0, 1, b"a")
    assert real.properties == {"ORIGIN_MESSAGE_ID": "X"}
    assert ss.mark_delivered(1, m1) == 1
    assert ss.due(store, 1_001_000) == [] and ss.pending(store) == 1
    assert ss.next_due_ms(store) == 1_005_000
    assert len(ss.due(store, 2_000_000)) == 1


# -- faults -----------------------------------------------------------------------------------------


def spec(**kw):
    body = {"requestCode": 34}
    body.update(kw)
    return parse_fault_spec(body)


def test_fault_errors_in_turn_then_exhausted():
    ft = FaultTable()
    f = ft.add(spec(errors=[{"code": 2, "remark": "busy"}, {"code": 1, "remark": "boom"}]), 0)
    assert ft.codes == {34}
    a, ended = ft.match(34, None, None, 0)
    assert a.error.code == 2 and ended == []
    assert ft.match(38, None, None, 0) == (None, [])
    a, ended = ft.match(34, None, None, 0)
    assert a.error.code == 1 and ended == [f]
    assert ft.match(34, None, None, 0) == (None, []) and ft.codes == set()


def test_fault_duration_repeats_last_error_and_filters_identity():
    ft = FaultTable()
    ft.add(spec(errors=[{"code": 2}], durationMs=100, group="g", clientId="c"), 0)
    assert ft.needs_identity(34)
    assert ft.match(34, "other", "c", 10)[0] is None
    assert ft.match(34, "g", "x", 10)[0] is None
    for t in (10, 50, 99):
        a, _ = ft.match(34, "g", "c", t)
        assert a.error.code == 2 and a.error.remark == "injected fault"
    a, ended = ft.match(34, "g", "c", 100)
    assert a is None and len(ended) == 1


def test_fault_latency_drop_count_and_clear():
    ft = FaultTable()
    f1 = ft.add(spec(latencyMs=50, count=2), 0)
    f2 = ft.add(spec(requestCode=11, drop=True), 0)
    a, _ = ft.match(34, None, None, 0)
    assert (a.fault_id, a.latency_ms, a.error, a.drop) == (f1.fault_id, 50, None, False)
    ft.match(34, None, None, 0)
    assert ft.match(34, None, None, 0)[0] is None
    for _ in range(5):  # no count, no duration, no errors: until cleared
        assert ft.match(11, None, None, 10**9)[0].drop
    assert ft.clear(f2.fault_id) == [f2] and ft.clear(99) == [] and len(ft) == 0


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (None, "body"),
        ({}, "body.requestCode"),
        ({"requestCode": "34"}, "body.requestCode"),
        ({"requestCode": 9000, "drop": True}, "body.requestCode"),
        ({"requestCode": 34}, "body"),
        ({"requestCode": 34, "errors": [{"remark": "x"}]}, "body.errors[0].code"),
        ({"requestCode": 34, "errors": ["x"]}, "body.errors[0]"),
        ({"requestCode": 34, "latencyMs": -1}, "body.latencyMs"),
        ({"requestCode": 34, "drop": True, "count": 0}, "body.count"),
        ({"requestCode": 34, "drop": True, "durationMs": 0}, "body.durationMs"),
        ({"requestCode": 34, "drop": 1}, "body.drop"),
    ],
)
def test_fault_spec_validation_names_the_field(body, field):
    with pytest.raises(InvalidParameter) as ei:
        parse_fault_spec(body)
    assert ei.value.field == field


# -- name server routes ---------------------------------------------------------------------------


def topics(**kw: int) -> dict[str, QueueData]:
    return {t: QueueData("", n, n, 6) for t, n in kw.items()}


def test_route_info_register_route_and_expiry():
    ri = RouteInfoManager()
    assert ri.register_broker("C", "broker-a", "h:1", 0, topics(T=4, U=2), 0, conn_id=1)
    assert ri.register_broker("C", "broker-b", "h:2", 0, topics(T=8), 0, conn_id=2)
    assert not ri.register_broker("C", "broker-a", "h:1", 0, topics(T=4, U=2), 50_000, conn_id=1)
    route = ri.pickup_topic_route_data("T")
    assert [b["brokerName"] for b in route["brokerDatas"]] == ["broker-a", "broker-b"]
    assert route["brokerDatas"][0] == {"cluster": "C", "brokerName": "broker-a", "brokerAddrs": {"0": "h:1"}}
    assert [q["readQueueNums"] for q in route["queueDatas"]] == [4, 8]
    assert ri.pickup_topic_route_data("nope") is None
    expired = ri.scan_not_active_broker(120_001, 120_000)
    assert [b.broker_addr for b in expired] == ["h:2"]
    assert [b["brokerName"] for b in ri.pickup_topic_route_data("T")["brokerDatas"]] == ["broker-a"]
    # a registration without U drops broker-a's U
    ri.register_broker("C", "broker-a", "h:1", 0, topics(T=4), 130_000, conn_id=1)
    assert ri.pickup_topic_route_data("U") is None
    assert [b.broker_addr for b in ri.on_connection_closed(1)] == ["h:1"]
    assert ri.pickup_topic_route_data("T") is None and ri.cluster_addr_table == {}


def test_parse_topic_config_table():
    t = parse_topic_config_table({"topicConfigTable": {"T": {"readQueueNums": 2, "writeQueueNums": 3}}})
    assert (t["T"].read_queue_nums, t["T"].write_queue_nums, t["T"].perm) == (2, 3, 6)
    with pytest.raises(InvalidParameter) as ei:
        parse_topic_config_table({"topicConfigTable": {"T": {"readQueueNums": "2"}}})
    assert ei.value.field == "body.topicConfigTable.T.readQueueNums"


def test_the_name_servers_answer_reads_back_as_its_tables() -> None:
    ri = RouteInfoManager()
    qd = {"T": QueueData("", 2, 2, 6)}
    ri.register_broker("C", "broker-b", "h:2", 0, qd, 0, conn_id=2, native_addr="h:8")
    ri.register_broker("C", "broker-a", "h:1", 0, qd, 0, conn_id=1)
    ri.register_broker("C", "broker-a", "h:3", 1, {}, 0, conn_id=3)
    wire = ri.pickup_topic_route_data("T")
    assert wire is not None
    r = TopicRouteData.from_wire(wire)
    assert r.broker_datas == (ri.broker_addr_table["broker-a"], ri.broker_addr_table["broker-b"])
    assert r.broker_datas[1].native_addrs == ((0, "h:8"),)
    assert r.queue_datas == (QueueData("broker-a", 2, 2, 6), QueueData("broker-b", 2, 2, 6))
    assert r.subscribe_queues("T") == {
        MessageQueue("T", b, i) for b in ("broker-a", "broker-b") for i in range(2)
    }
    # an address that comes back under another id replaces its old entry; unregistering removes it
    ri.register_broker("C", "broker-a", "h:3", 0, qd, 1, conn_id=4)
    assert ri.broker_addr_table["broker-a"].broker_addrs == ((0, "h:3"),)
    assert ri.broker_addr_table["broker-a"].master_addr() == "h:3"
    assert ri.unregister_broker("h:3")
    assert "broker-a" not in ri.broker_addr_table
    assert ri.unregister_broker("h:2") and ri.pickup_topic_route_data("T") is None
