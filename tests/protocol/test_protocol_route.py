"""The route types every role shares: a route written with ``to_wire`` reads back equal with ``from_wire``,
and reading a body is as lenient and as strict as the client's reading was."""

from __future__ import annotations

import pytest

from rmqlab.protocol.command import InvalidParameter
from rmqlab.protocol.route import BrokerData, QueueData, TopicRouteData


def route() -> TopicRouteData:
    return TopicRouteData(
        (
            BrokerData("C", "broker-a", ((0, "h:1"), (1, "h:2")), native_addrs=((0, "h:9"),)),
            BrokerData("C", "broker-b", ((1, "h:3"),)),
        ),
        (QueueData("broker-a", 4, 2, 6), QueueData("broker-b", 2, 2, 4)),
    )


def test_wire_round_trip() -> None:
    r = route()
    wire = r.to_wire()
    assert wire["brokerDatas"][0] == {
        "cluster": "C",
        "brokerName": "broker-a",
        "brokerAddrs": {"0": "h:1", "1": "h:2"},
        "nativeAddrs": {"0": "h:9"},
    }
    assert "nativeAddrs" not in wire["brokerDatas"][1]
    assert wire["queueDatas"][1] == {
        "brokerName": "broker-b",
        "readQueueNums": 2,
        "writeQueueNums": 2,
        "perm": 4,
    }
    back = TopicRouteData.from_wire(wire)
    assert back == r
    assert back.broker_datas[0].native_addrs == ((0, "h:9"),)
    assert back.to_wire() == wire
    for bd in r.broker_datas:
        assert BrokerData.from_wire(bd.to_wire()) == bd
    for qd in r.queue_datas:
        assert QueueData.from_wire(qd.to_wire()) == qd


def test_native_addresses_do_not_make_another_route() -> None:
    """Our clients compare routes to see a change; they never use the native ports."""
    plain = BrokerData("C", "b", ((0, "h:1"),))
    assert BrokerData("C", "b", ((0, "h:1"),), native_addrs=((0, "h:2"),)) == plain
    assert BrokerData("C", "b", ((0, "h:2"),)) != plain


def test_from_wire_sorts_and_skips_what_it_cannot_read() -> None:
    body = {
        "brokerDatas": [
            {"brokerName": "z", "brokerAddrs": {"1": "z:1", "x": "bad", "0": "", "2": 5}},
            {"brokerName": "a", "cluster": "C", "brokerAddrs": {"0": "a:1"}, "nativeAddrs": "junk"},
        ],
        "queueDatas": [{"brokerName": "z", "readQueueNums": 1, "writeQueueNums": 1}],
    }
    r = TopicRouteData.from_wire(body)
    assert [b.broker_name for b in r.broker_datas] == ["a", "z"]
    a, z = r.broker_datas
    assert (a.cluster, a.native_addrs, a.master_addr()) == ("C", (), "a:1")
    assert (z.cluster, z.broker_addrs, z.master_addr(), z.select_addr()) == ("", ((1, "z:1"),), None, "z:1")
    assert r.queue_datas == (QueueData("z", 1, 1, 6),)  # perm defaults to read | write
    assert r.broker("z") is z and r.broker("q") is None


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"queueDatas": []}, "route.brokerDatas"),
        ({"brokerDatas": [{"brokerName": "a"}], "queueDatas": []}, "route.brokerDatas[0].brokerAddrs"),
        ({"brokerDatas": [{"brokerAddrs": {}}], "queueDatas": []}, "route.brokerDatas[0].brokerName"),
        ({"brokerDatas": [], "queueDatas": [{"brokerName": "a"}]}, "route.queueDatas[0].readQueueNums"),
    ],
)
def test_from_wire_names_the_missing_field(body: dict[str, object], field: str) -> None:
    with pytest.raises(InvalidParameter) as ei:
        TopicRouteData.from_wire(body)
    assert ei.value.field == field
