"""The proxy's sans-IO decisions, case by case from the Java proxy (RouteActivity, GrpcValidator,
ReceiveMessageActivity, GrpcClientSettingsManager, GrpcConverter, SendMessageActivity)."""

from __future__ import annotations

import hashlib

import pytest

from rmqlab.protocol.codes import ResponseCode
from rmqlab.protocol.model import Message
from rmqlab.protocol.route import BrokerData, QueueData, TopicRouteData
from rmqlab.proxy import convert
from rmqlab.proxy.convert import Delivery, ProxyError
from rmqlab.proxy.v5 import Code, pb

ENDPOINTS = pb.Endpoints(scheme=pb.IPv4, addresses=[pb.Address(host="127.0.0.1", port=8081)])


def route(*queues: tuple[str, int, int, int]) -> TopicRouteData:
    brokers = tuple(BrokerData("c", name, ((0, f"10.0.0.{i}:10911"),)) for i, (name, *_) in enumerate(queues))
    return TopicRouteData(brokers, tuple(QueueData(n, r, w, p) for n, r, w, p in queues))


def code_of(fn, *args, **kwargs) -> int:
    with pytest.raises(ProxyError) as info:
        fn(*args, **kwargs)
    return info.value.code


# -- validation ----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("name", "has"),
    [
        ("", True),
        ("   ", True),
        ("T", False),
        ("a b", True),
        ("x" * 128, True),
        ("rmq_sys_x", True),
        ("TBW102", True),
    ],
)
def test_bad_topics_are_illegal_topic(name: str, has: bool) -> None:
    assert code_of(convert.validate_topic, pb.Resource(name=name), has) == Code.ILLEGAL_TOPIC


def test_good_names_pass() -> None:
    assert convert.validate_topic(pb.Resource(name="T-1_x" + "y" * 122)) == "T-1_x" + "y" * 122
    assert convert.validate_group(pb.Resource(name="g" * 255)) == "g" * 255


@pytest.mark.parametrize(("name", "has"), [("", True), ("g", False), ("g/1", True), ("g" * 256, True)])
def test_bad_groups_are_illegal_consumer_group(name: str, has: bool) -> None:
    assert code_of(convert.validate_group, pb.Resource(name=name), has) == Code.ILLEGAL_CONSUMER_GROUP


def test_invisible_time_bounds_are_inclusive() -> None:
    assert convert.validate_invisible_ms(10_000) == 10_000
    assert convert.validate_invisible_ms(12 * 3600 * 1000) == 12 * 3600 * 1000
    assert code_of(convert.validate_invisible_ms, 9_999) == Code.ILLEGAL_INVISIBLE_TIME
    assert code_of(convert.validate_invisible_ms, 12 * 3600 * 1000 + 1) == Code.ILLEGAL_INVISIBLE_TIME


@pytest.mark.parametrize(
    ("tag", "ok"), [("a", True), ("", False), (" ", False), ("a|b", False), ("a\x01", False)]
)
def test_tags(tag: str, ok: bool) -> None:
    if ok:
        convert.validate_tag(tag)
    else:
        assert code_of(convert.validate_tag, tag) == Code.ILLEGAL_MESSAGE_TAG


# -- long polling ----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("requested", "remaining", "expected"),
    [
        (15_000, 60_000, 15_000),  # as asked
        (1_000, 60_000, 5_000),  # raised to the minimum
        (30_000, 60_000, 20_000),  # cut to the maximum
        (None, 13_000, 11_500),  # the deadline less half the request timeout
        (20_000, 8_000, 8_000),  # cut to what the call has left
        (20_000, 5_000, 5_000),  # exactly the minimum left is still enough
    ],
)
def test_polling_time(requested: int | None, remaining: int, expected: int) -> None:
    assert convert.polling_time_ms(requested, remaining, 3_000, "5.1.2") == expected


def test_too_little_time_left_depends_on_client_version() -> None:
    assert code_of(convert.polling_time_ms, 20_000, 4_999, 3_000, "5.1.2") == Code.ILLEGAL_POLLING_TIME
    assert code_of(convert.polling_time_ms, 20_000, 4_999, 3_000, "5.0.2") == Code.BAD_REQUEST
    assert code_of(convert.polling_time_ms, 20_000, 4_999, 3_000, None) == Code.BAD_REQUEST


# -- routes ------------------------------------------------------------------------------------------------
def test_route_queues_split_by_permission_as_the_java_proxy_numbers_them() -> None:
    r = route(("broker-a", 4, 2, 6), ("broker-b", 2, 2, 4))
    qs = convert.route_message_queues(r, "T", ENDPOINTS)
    got = [(q.broker.name, q.id, q.permission) for q in qs]
    assert got == [
        ("broker-a", 0, pb.READ),
        ("broker-a", 1, pb.READ),
        ("broker-a", 2, pb.READ_WRITE),
        ("broker-a", 3, pb.READ_WRITE),
        ("broker-b", 0, pb.READ),
        ("broker-b", 1, pb.READ),
    ]
    assert all(q.broker.endpoints == ENDPOINTS and q.topic.name == "T" for q in qs)
    assert list(qs[0].accept_message_types) == [pb.NORMAL]


def test_write_only_queues() -> None:
    qs = convert.route_message_queues(route(("broker-a", 4, 3, 2)), "T", ENDPOINTS)
    assert [(q.id, q.permission) for q in qs] == [(0, pb.WRITE), (1, pb.WRITE), (2, pb.WRITE)]


def test_assignment_is_one_any_queue_per_readable_broker() -> None:
    r = route(("broker-a", 4, 4, 6), ("broker-b", 4, 4, 2), ("broker-c", 0, 4, 6), ("broker-d", 8, 8, 4))
    got = [
        (a.message_queue.broker.name, a.message_queue.id, a.message_queue.permission)
        for a in convert.assignments(r, "T", ENDPOINTS)
    ]
    assert got == [("broker-a", -1, pb.READ_WRITE), ("broker-d", -1, pb.READ)]


def test_no_readable_queue_is_forbidden() -> None:
    assert code_of(convert.assignments, route(("broker-a", 4, 4, 2)), "T", ENDPOINTS) == Code.FORBIDDEN


# -- settings ----------------------------------------------------------------------------------------------
def test_consumer_settings_answer() -> None:
    s = pb.Settings(client_type=pb.PUSH_CONSUMER)
    s.subscription.group.name = "g"
    s.subscription.receive_batch_size = 7
    s.metric.on = True
    out = convert.answer_settings(s)
    assert out.subscription.group.name == "g"
    assert out.subscription.receive_batch_size == 32
    assert convert.duration_ms(out.subscription.long_polling_timeout) == 20_000
    assert out.subscription.fifo is False
    assert out.backoff_policy.max_attempts == 17
    assert [d.seconds for d in out.backoff_policy.customized_backoff.next][:4] == [1, 5, 10, 30]
    assert len(out.backoff_policy.customized_backoff.next) == 18
    assert out.metric.on is False
    assert s.subscription.receive_batch_size == 7  # the client's own settings are left alone


def test_producer_settings_answer() -> None:
    out = convert.answer_settings(pb.Settings(client_type=pb.PRODUCER))
    assert out.backoff_policy.max_attempts == 3
    assert convert.duration_ms(out.backoff_policy.exponential_backoff.initial) == 10
    assert convert.duration_ms(out.backoff_policy.exponential_backoff.max) == 1000
    assert out.backoff_policy.exponential_backoff.multiplier == 2
    assert out.publishing.max_body_size == 4 * 1024 * 1024


def test_subscriptions_from_settings() -> None:
    s = pb.Settings(client_type=pb.SIMPLE_CONSUMER)
    e = s.subscription.subscriptions.add()
    e.topic.name = "T"
    e.expression.type = pb.TAG
    e.expression.expression = "a || b"
    s.subscription.subscriptions.add().topic.name = "U"
    subs = convert.subscriptions(s)
    assert [(x.topic, x.sub_string, x.tags_set) for x in subs] == [
        ("T", "a || b", ["a", "b"]),
        ("U", "*", []),
    ]
    e.expression.type = pb.SQL
    assert code_of(convert.subscriptions, s) == Code.ILLEGAL_FILTER_EXPRESSION


# -- statuses ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("code", "expected"),
    [
        (ResponseCode.SUCCESS, Code.OK),
        (ResponseCode.SYSTEM_BUSY, Code.TOO_MANY_REQUESTS),
        (ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST, Code.CONSUMER_GROUP_NOT_FOUND),
        (ResponseCode.TOPIC_NOT_EXIST, Code.TOPIC_NOT_FOUND),
        (ResponseCode.SUBSCRIPTION_NOT_EXIST, Code.INTERNAL_SERVER_ERROR),
        (12345, Code.INTERNAL_SERVER_ERROR),
    ],
)
def test_broker_codes(code: int, expected: int) -> None:
    status = convert.broker_status(code, "why")
    assert status.code == expected
    assert "why" in status.message


def test_merged_status() -> None:
    ok, bad = convert.ok_status(), pb.Status(code=Code.INVALID_RECEIPT_HANDLE, message="x")
    assert convert.merged_status([ok, ok]).code == Code.OK
    assert convert.merged_status([bad, bad]).code == Code.INVALID_RECEIPT_HANDLE
    assert convert.merged_status([ok, bad]).code == Code.MULTIPLE_RESULTS


# -- messages ----------------------------------------------------------------------------------------------
def stored(**kw: object) -> Message:
    base: dict = dict(
        msg_id="M1",
        topic="T",
        broker_name="broker-a",
        queue_id=2,
        queue_offset=7,
        body=b"hello",
        tags="tagA",
        keys="k1 k2",
        born_timestamp=1_700_000_000_123,
        store_timestamp=1_700_000_000_456,
        reconsume_times=0,
        properties={"UNIQ_KEY": "U1", "POP_CK": "rh", "color": "red"},
    )
    base.update(kw)
    return Message(**base)


def test_outgoing_message() -> None:
    m = convert.outgoing_message("T", stored(), Delivery("rh", 30_000, "10.0.0.1:10911"))
    sp = m.system_properties
    assert sp.message_id == "U1"
    assert sp.body_digest.type == pb.MD5
    assert sp.body_digest.checksum == hashlib.md5(b"hello").hexdigest().upper()
    assert (sp.tag, list(sp.keys)) == ("tagA", ["k1", "k2"])
    assert (sp.queue_id, sp.queue_offset, sp.delivery_attempt) == (2, 7, 1)
    assert sp.receipt_handle == "rh"
    assert convert.duration_ms(sp.invisible_duration) == 30_000
    assert sp.born_timestamp.seconds * 1000 + sp.born_timestamp.nanos // 1_000_000 == 1_700_000_000_123
    assert dict(m.user_properties) == {"color": "red"}
    assert (m.topic.name, m.body) == ("T", b"hello")


def test_message_ids_of_retried_copies() -> None:
    assert convert.message_id_of("M2", {"ORIGIN_MESSAGE_ID": "M1"}) == "M1"
    assert convert.message_id_of("M2", {"ORIGIN_MESSAGE_ID": "M1", "UNIQ_KEY": "U"}) == "U"
    assert convert.message_id_of("M2", {}) == "M2"
    m = convert.outgoing_message("T", stored(reconsume_times=3, properties={}), Delivery("", 1, ""))
    assert (m.system_properties.message_id, m.system_properties.delivery_attempt) == ("M1", 4)


def v5_message(**sp: object) -> object:
    m = pb.Message(topic=pb.Resource(name="T"), body=b"b", user_properties={"color": "red"})
    m.system_properties.message_id = "U1"
    for k, v in sp.items():
        if k == "keys":
            m.system_properties.keys.extend(v)  # type: ignore[arg-type]
        else:
            setattr(m.system_properties, k, v)
    return m


def test_incoming_message() -> None:
    out = convert.incoming_message(v5_message(tag="tagA", keys=["k1", "k2"]))
    assert (out.topic, out.message_id, out.body, out.tags, out.keys) == ("T", "U1", b"b", "tagA", "k1 k2")
    assert out.properties == {"color": "red", "UNIQ_KEY": "U1"}


def test_incoming_message_errors() -> None:
    assert code_of(convert.incoming_message, v5_message(message_id="")) == Code.ILLEGAL_MESSAGE_ID
    assert code_of(convert.incoming_message, v5_message(tag="a|b")) == Code.ILLEGAL_MESSAGE_TAG
    assert code_of(convert.incoming_message, v5_message(keys=[" "])) == Code.ILLEGAL_MESSAGE_KEY
    assert code_of(convert.incoming_message, v5_message(), 0) == Code.MESSAGE_BODY_TOO_LARGE
    assert code_of(convert.incoming_message, v5_message(message_type=pb.TRANSACTION)) == Code.UNSUPPORTED
    clash = v5_message()
    clash.user_properties["UNIQ_KEY"] = "x"  # type: ignore[attr-defined]
    assert code_of(convert.incoming_message, clash) == Code.ILLEGAL_MESSAGE_PROPERTY_KEY
    no_topic = v5_message()
    no_topic.ClearField("topic")  # type: ignore[attr-defined]
    assert code_of(convert.incoming_message, no_topic) == Code.ILLEGAL_TOPIC


def test_send_topic() -> None:
    a, b = convert.incoming_message(v5_message()), convert.incoming_message(v5_message())
    assert convert.send_topic([a, b]) == "T"
    b.topic = "U"
    assert code_of(convert.send_topic, [a, b]) == Code.BAD_REQUEST
    assert code_of(convert.send_topic, []) == Code.BAD_REQUEST
