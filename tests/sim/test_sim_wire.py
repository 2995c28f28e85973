"""sim.wire: a command handed over as an object is what the peer would have decoded from bytes."""

from __future__ import annotations

import enum
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rmqlab.protocol.codes import RequestCode, ResponseCode
from rmqlab.protocol.command import RemotingCommand, decode_payload, encode_payload
from rmqlab.sim.wire import copy_command, wire_copy


class Color(enum.StrEnum):
    RED = "red"


def through_bytes(cmd: RemotingCommand) -> RemotingCommand:
    return decode_payload(encode_payload(cmd))


BODIES: list[Any] = [
    None,
    {"consumerIdList": ("a", "b", "c")},  # the broker's kept tuple: a list on the other side
    {"msgs": [{"body": bytearray(b"xy"), "props": {"k": "v"}, "qid": ResponseCode.SUCCESS}]},
    [1, 2.5, True, None, "s", b"b", (3, [4, (5,)])],
    {1: "int key", Color.RED: Color.RED, "nested": {"t": (Color.RED, RequestCode.PULL_MESSAGE)}},
    "plain",
]


@pytest.mark.parametrize("body", BODIES)
def test_an_object_frame_equals_a_decoded_one(body: Any) -> None:
    cmd = RemotingCommand(RequestCode.PULL_MESSAGE, 7, 1, "why", {"topic": "T", "n": 3}, body)
    got, want = copy_command(cmd), through_bytes(cmd)
    assert got == want
    assert repr(got) == repr(want)  # same types all the way down (enums are plain values, tuples lists)
    assert type(got.code) is int and type(got.ext) is dict


def test_the_copy_is_taken_at_the_write() -> None:
    ids = ["a", "b"]
    body = {"consumerIdList": ids, "nested": {"x": [1]}}
    cmd = RemotingCommand(1, 1, 0, None, {"k": "v"}, body)
    sent = copy_command(cmd)
    ids.append("c")
    body["nested"]["x"].append(2)
    cmd.ext["k"] = "changed"
    cmd.opaque = 99  # a retry of the same command gets a new opaque
    assert sent.body == {"consumerIdList": ["a", "b"], "nested": {"x": [1]}}
    assert sent.ext == {"k": "v"} and sent.opaque == 1


def test_a_value_msgpack_cannot_carry_fails_the_write_as_encoding_would() -> None:
    cmd = RemotingCommand(1, 1, 0, None, {}, {"bad": object()})
    with pytest.raises(TypeError):
        encode_payload(cmd)
    with pytest.raises(TypeError):
        copy_command(cmd)


_json = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False)
    | st.text()
    | st.binary(),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.tuples(inner, inner)
        | st.dictionaries(st.text(max_size=3) | st.integers(0, 9), inner, max_size=4)
    ),
    max_leaves=12,
)


@given(_json)
def test_any_msgpack_value_copies_as_it_round_trips(value: Any) -> None:
    cmd = RemotingCommand(2, 3, 0, None, {}, value)
    assert repr(wire_copy(value)) == repr(through_bytes(cmd).body)


def test_a_long_tuple_is_checked_once_and_each_answer_is_still_its_own_list() -> None:
    """A broker's tuple of client ids (a thousand members) is checked once and remembered by identity;
    every answer is still a fresh list, and a tuple holding a container or an enum is never taken as
    checked, however long."""
    ids = tuple(f"10.0.0.{i}@{i}" for i in range(100))
    first, second = wire_copy(ids), wire_copy(ids)
    assert first == second == list(ids) and first is not second
    first.append("changed")
    assert wire_copy(ids) == list(ids)
    nested = (*ids, ["inner"])
    for _ in range(2):
        got = wire_copy(nested)
        assert got[-1] == ["inner"] and got[-1] is not nested[-1]
    enums = (*ids, Color.RED, RequestCode.PULL_MESSAGE)
    for _ in range(2):
        got = wire_copy(enums)
        assert repr(got[-2:]) == repr(["red", int(RequestCode.PULL_MESSAGE)])
    many = [tuple(f"{n}-{i}" for i in range(40)) for n in range(200)]  # more than it keeps
    assert [wire_copy(t) for t in many] == [list(t) for t in many]
    assert [wire_copy(t) for t in many] == [list(t) for t in many]
