"""Property tests: random frames and random commands thrown at a live durable broker, on both ports,
which must keep answering. Values span the whole signed and unsigned 64-bit range; admin codes are
fuzzed too (except the two that change the broker's behaviour on purpose). ``scripts/fuzz.py`` runs the
same kind of attack for millions of frames.

The broker runs on its own event loop in a thread; the tests talk to it over blocking sockets.
"""

from __future__ import annotations

import asyncio
import json
import socket
import struct
import tempfile
import threading
from typing import Any

import msgpack
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from kit.broker import RecordingLog

from rmqlab.broker.controller import BrokerController
from rmqlab.broker.server_config import BrokerConfig
from rmqlab.protocol.codes import RequestCode, ResponseCode
from rmqlab.protocol.command import FrameDecoder, RemotingCommand, encode_frame

VALID_CODES = {int(c) for c in ResponseCode}
# Admin commands that change faults or policies would make the broker misbehave on purpose.
FUZZ_CODES = [
    int(c) for c in RequestCode if c not in (RequestCode.ADMIN_FAULT_ADD, RequestCode.ADMIN_POLICY_SET)
]
FIELD_NAMES = [
    "consumerGroup", "topic", "queueId", "queueOffset", "maxMsgNums", "commitOffset", "suspendTimeoutMillis",
    "subscription", "subVersion", "clientID", "producerGroup", "bornTimestamp", "tags", "keys", "group",
    "originTopic", "offset", "originMsgId", "delayLevel", "maxReconsumeTimes", "setZeroIfNotFound",
    "readQueueNums", "writeQueueNums", "perm", "timestamp", "brokerName", "brokerAddr", "clusterName",
    "brokerId", "faultId", "x",
]  # fmt: skip
BODY_KEYS = [
    "clientID", "consumerDataSet", "producerDataSet", "groupName", "subscriptionDataSet", "topic",
    "subString", "consumerGroup", "clientId", "mqSet", "brokerName", "queueId", "body", "properties",
    "topicConfigTable",
]  # fmt: skip

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**64 - 1),
    st.sampled_from([2**31, -(2**31) - 1, 2**63 - 1, 2**63, -(2**63), 2**64 - 1]),
    st.floats(allow_nan=True),
    st.text(max_size=12),
    st.sampled_from(["T", "g", "%RETRY%g", "*", "a || b", "watch"]),
    st.integers(min_value=-2, max_value=40),
)
bodies = st.recursive(
    st.one_of(scalars, st.binary(max_size=64)),
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.dictionaries(st.one_of(st.sampled_from(BODY_KEYS), st.text(max_size=6)), children, max_size=5),
    ),
    max_leaves=16,
)
commands = st.fixed_dictionaries(
    {
        "code": st.one_of(st.sampled_from(FUZZ_CODES), st.integers(min_value=-(2**31), max_value=2**31 - 1)),
        "ext": st.dictionaries(st.sampled_from(FIELD_NAMES), scalars, max_size=8),
        "body": bodies,
        "oneway": st.booleans(),
    }
)


class LiveBroker:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.store_dir = tempfile.TemporaryDirectory()
        config = BrokerConfig(port=0, store_dir=self.store_dir.name)
        self.broker = BrokerController(config, log=RecordingLog())
        self.run(self.broker.start())
        host, port = self.broker.address.rsplit(":", 1)
        self.addr = (host, int(port))
        native = self.run(self.broker.start_native_port(0))
        self.native_addr = (host, int(native.rsplit(":", 1)[1]))

    def run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(30)

    def close(self) -> None:
        self.run(self.broker.shutdown())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()
        self.store_dir.cleanup()


class Wire:
    """A blocking connection speaking PROTOCOL.md frames."""

    def __init__(self, addr: tuple[str, int]) -> None:
        self.sock = socket.create_connection(addr, timeout=5)
        self.dec = FrameDecoder()
        self.opaque = 0
        self.pending: list[RemotingCommand] = []

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def request(self, code: int, ext: dict | None = None, body: Any = None, oneway: bool = False) -> int:
        self.opaque += 1
        cmd = RemotingCommand.request(code, ext, body, oneway=oneway)
        cmd.opaque = self.opaque
        self.send_raw(encode_frame(cmd))
        return self.opaque

    def read_until(self, opaque: int) -> tuple[RemotingCommand, list[RemotingCommand]]:
        """The response with ``opaque`` and every other frame that came before it."""
        others: list[RemotingCommand] = []
        while True:
            for cmd in self.pending:
                if cmd.is_response and cmd.opaque == opaque:
                    self.pending.remove(cmd)
                    others.extend(self.pending)
                    self.pending.clear()
                    return cmd, others
            data = self.sock.recv(1 << 20)
            if not data:
                raise ConnectionError("closed by the broker")
            self.pending.extend(self.dec.feed(data))

    def call(self, code: int, ext: dict | None = None, body: Any = None) -> RemotingCommand:
        return self.read_until(self.request(code, ext, body))[0]

    def close(self) -> None:
        self.sock.close()


@pytest.fixture(scope="module")
def live():
    lb = LiveBroker()
    watch = Wire(lb.addr)
    hb = {"clientID": "watch", "consumerDataSet": [{"groupName": "watch", "subscriptionDataSet": []}]}
    assert watch.call(RequestCode.HEART_BEAT, body=hb).code == ResponseCode.SUCCESS
    yield lb, watch
    watch.close()
    lb.close()


def assert_still_answering(watch: Wire) -> None:
    resp = watch.call(RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": "watch"})
    assert resp.code == ResponseCode.SUCCESS and resp.body == {"consumerIdList": ["watch"]}


frames = st.one_of(
    st.binary(max_size=64),  # garbage, length prefix included
    st.binary(min_size=1, max_size=64).map(lambda p: struct.pack(">I", len(p)) + p),  # framed garbage
    st.builds(
        lambda o: (lambda p: struct.pack(">I", len(p)) + p)(msgpack.packb(o)), bodies
    ),  # framed msgpack
    st.integers(min_value=0, max_value=2**32 - 1).map(lambda n: struct.pack(">I", n) + b"xyz"),  # bad lengths
)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=frames)
def test_random_frames_never_hurt_other_connections(live, data):
    lb, watch = live
    w = Wire(lb.addr)
    try:
        w.send_raw(data)
        w.sock.settimeout(0.1)
        got = b""
        try:
            while chunk := w.sock.recv(65536):
                got += chunk
        except (TimeoutError, ConnectionResetError):
            pass
        # whatever came back (a truncated frame gets nothing) is made of valid responses
        for cmd in FrameDecoder().feed(got):
            assert cmd.is_response and cmd.code in VALID_CODES
    finally:
        w.close()
    assert_still_answering(watch)


@pytest.fixture(scope="module")
def fuzzer(live):
    lb, _ = live
    w = Wire(lb.addr)
    yield w
    w.close()


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
# what broke a durable broker once: numbers no Java long holds
@example(
    cmd={
        "code": 15,
        "ext": {"consumerGroup": "g", "topic": "T", "queueId": 0, "commitOffset": 2**63},
        "body": None,
        "oneway": False,
    }
)
@example(
    cmd={
        "code": 10,
        "ext": {"producerGroup": "p", "topic": "T", "queueId": 0, "bornTimestamp": 2**64 - 1},
        "body": {"body": b"x"},
        "oneway": False,
    }
)
@given(cmd=commands)
def test_random_commands_are_answered_and_the_broker_keeps_serving(live, fuzzer, cmd):
    lb, watch = live
    ext = dict(cmd["ext"])
    if isinstance(ext.get("suspendTimeoutMillis"), int):
        ext["suspendTimeoutMillis"] = min(ext["suspendTimeoutMillis"], 300)  # bound long-poll holds
    opaque = fuzzer.request(cmd["code"], ext, cmd["body"], oneway=cmd["oneway"])
    # a sync ping after it: everything before the ping's answer is the fuzzed command's doing
    # a durable write after it: the store must still take writes
    probe = {"consumerGroup": "watch", "topic": "T", "queueId": 0, "commitOffset": 1}
    resp, before = fuzzer.read_until(fuzzer.request(RequestCode.UPDATE_CONSUMER_OFFSET, probe))
    assert resp.code == ResponseCode.SUCCESS
    replies = [c for c in before if c.is_response and c.opaque == opaque]
    if cmd["oneway"]:
        assert replies == []  # a one-way request never gets a response, not even an error
    else:
        if not replies:  # a held pull may answer after the ping
            fuzzer.sock.settimeout(5)
            replies = [fuzzer.read_until(opaque)[0]]
        (reply,) = replies
        assert reply.code in VALID_CODES
        if reply.code == ResponseCode.INVALID_PARAMETER:
            assert reply.remark
        if cmd["code"] not in {int(c) for c in RequestCode}:
            assert reply.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED
    assert_still_answering(watch)
    # bad input is answered as such, never by a handler crashing into SYSTEM_ERROR
    assert [line for line in lb.broker.log.lines if line[0] == "error"] == []


def _native_frame(code: int, opaque: int, ext: dict[str, str], body: bytes, oneway: bool) -> bytes:
    header = {"code": code, "language": "JAVA", "version": 399, "opaque": opaque, "flag": 2 if oneway else 0}
    hdr = json.dumps(header | {"extFields": ext}).encode()
    return struct.pack(">II", 4 + len(hdr) + len(body), len(hdr)) + hdr + body


native_values = st.one_of(
    st.integers(min_value=-(2**63), max_value=2**64 - 1).map(str),
    st.sampled_from(["", "true", "T", "g", "9" * 30, "1" * 5000, "1e25", "-0", " 7 "]),
    st.text(max_size=12),
)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    code=st.one_of(st.sampled_from(FUZZ_CODES), st.integers(min_value=-(2**15), max_value=2**15 - 1)),
    ext=st.dictionaries(st.sampled_from(FIELD_NAMES), native_values, max_size=8),
    body=st.one_of(st.binary(max_size=64), bodies.map(lambda b: json.dumps(b, default=repr).encode())),
)
def test_random_native_commands_are_answered(live, code, ext, body):
    lb, watch = live
    if "suspendTimeoutMillis" in ext:
        ext["suspendTimeoutMillis"] = "200"
    sock = socket.create_connection(lb.native_addr, timeout=5)
    try:
        sock.sendall(_native_frame(code, 7, ext, body, oneway=False))
        data = b""
        while len(data) < 8 or len(data) < 4 + struct.unpack_from(">I", data)[0]:
            chunk = sock.recv(1 << 16)
            assert chunk, "the broker closed the connection instead of answering"
            data += chunk
        (info,) = struct.unpack_from(">I", data, 4)
        header = json.loads(data[8 : 8 + (info & 0xFFFFFF)])
        assert header["opaque"] == 7 and header["flag"] & 1 and header["code"] in VALID_CODES
    finally:
        sock.close()
    assert_still_answering(watch)
    assert [line for line in lb.broker.log.lines if line[0] == "error"] == []
