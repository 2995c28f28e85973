"""Hostile native frames against a real broker's native port: numbers no Java long holds, numbers of
thousands of digits, a compressed body that inflates without end."""

from __future__ import annotations

import zlib

import pytest
from kit.native_wire import NativePeer, json_frame

from rmqlab.broker.controller import BrokerController
from rmqlab.broker.server_config import BrokerConfig
from rmqlab.protocol.codes import RequestCode, ResponseCode
from rmqlab.protocol.native.codec import NativeCodec
from rmqlab.protocol.native.translate import MAX_INFLATED_BODY


@pytest.fixture
async def native():
    b = BrokerController(BrokerConfig(port=0, time_scale=0.01))
    await b.start()
    addr = await b.start_native_port(0)
    peer = await NativePeer.connect(int(addr.rsplit(":", 1)[1]))
    yield b, peer
    await peer.close()
    await b.shutdown()


def _send(opaque: int, born: str, body: bytes = b"hello", sys_flag: str = "0") -> bytes:
    ext = {"producerGroup": "pg", "topic": "T", "queueId": "0", "sysFlag": sys_flag, "bornTimestamp": born}
    ext |= {"flag": "0", "properties": "", "reconsumeTimes": "0"}
    return json_frame(RequestCode.SEND_MESSAGE, opaque, ext, body)


async def _call(peer: NativePeer, frame: bytes):
    await peer.send(frame)
    return await peer.recv()


@pytest.mark.parametrize("born", ["1" * 30, "9223372036854775808", "7" * 5000])
async def test_a_send_with_a_born_timestamp_no_long_holds_is_refused(native, born):
    b, peer = native
    reply = await _call(peer, _send(1, born))
    assert reply.code == ResponseCode.INVALID_PARAMETER and "bornTimestamp" in (reply.remark or "")
    # the connection lives, and the queue is not blocked for anyone
    assert (await _call(peer, _send(2, "1700000000000"))).code == ResponseCode.SUCCESS
    assert b.store.get_max_offset("T", 0) == 1  # only the good message was stored


async def test_a_commit_beyond_a_long_is_refused_and_the_offset_stays_readable(native):
    _, peer = native
    ext = {"consumerGroup": "g", "topic": "T", "queueId": "0"}
    reply = await _call(
        peer, json_frame(RequestCode.UPDATE_CONSUMER_OFFSET, 1, ext | {"commitOffset": "1" + "0" * 25})
    )
    assert reply.code == ResponseCode.INVALID_PARAMETER and "commitOffset" in (reply.remark or "")
    reply = await _call(peer, json_frame(RequestCode.QUERY_CONSUMER_OFFSET, 2, ext))
    assert reply.code in (ResponseCode.SUCCESS, ResponseCode.QUERY_NOT_FOUND)


async def test_a_compressed_body_inflates_only_up_to_the_limit(native):
    _, peer = native
    z = zlib.compressobj(9)
    chunk = bytes(1 << 20)
    bomb = b"".join(z.compress(chunk) for _ in range(64)) + z.flush()  # 64 MiB of zeros in ~64 KB
    reply = await _call(peer, _send(1, "1700000000000", bomb, sys_flag="1"))
    assert reply.code == ResponseCode.MESSAGE_ILLEGAL
    codec = NativeCodec()
    (cmd,) = codec.feed(_send(2, "1700000000000", bomb, sys_flag="1"))
    assert len(cmd.body["body"]) == MAX_INFLATED_BODY + 1
