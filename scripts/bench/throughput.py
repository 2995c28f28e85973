"""Message throughput benchmark: 1 KiB messages sent to and pulled from one broker on loopback.

Runs the broker as its own process, in memory and with ``--store-dir``, and measures
- sends: SEND_MESSAGE with 64 requests in flight over 4 connections, round-robin over 8 queues;
- pulls: one consumer connection pulling 32 messages per PULL_MESSAGE, one pull in flight per queue
  (as RocketMQ's push consumer does), until every message was read;
and, in the same run, the raw framing ceiling of the stack: a server answering the same sends and pulls
with canned responses (no store), and a one-way bulk stream of 32-message frames over one connection.
Prints one JSON document.

    python scripts/bench/throughput.py [--messages 100000] [--durable-messages 50000]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import msgpack

sys.path.insert(0, str(Path(__file__).resolve().parent))
import rpc

from rmqlab.cli import announce_ready
from rmqlab.protocol.codes import RequestCode, ResponseCode
from rmqlab.protocol.command import RemotingCommand, encode_frame
from rmqlab.protocol.main_loop import run_async_main
from rmqlab.protocol.model import ConsumerData, HeartbeatData, SubscriptionData
from rmqlab.protocol.remoting import Connection, RemotingServer

TOPIC = "BenchTopic"
GROUP = "bench_consumer"
QUEUES = 8
BODY_SIZE = 1024
PULL_BATCH = 32
SEND_CONNECTIONS = 4
SEND_WINDOW = 16  # per connection: 64 in flight
PULL_PASSES = 3


# -- the canned server: the stack's ceiling ------------------------------------------------------------


def canned_messages(n: int) -> list[dict[str, Any]]:
    return [
        {
            "msgId": f"{i:032X}",
            "topic": TOPIC,
            "brokerName": "broker-a",
            "queueId": 0,
            "queueOffset": i,
            "body": b"x" * BODY_SIZE,
            "tags": None,
            "keys": None,
            "bornTimestamp": 0,
            "storeTimestamp": 0,
            "reconsumeTimes": 0,
            "properties": {},
        }
        for i in range(n)
    ]


async def serve_canned(port: int) -> int:
    batch = canned_messages(PULL_BATCH)
    received = 0

    async def send(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        return cmd.response(ext={"msgId": "0" * 32, "queueId": cmd.ext.get("queueId", 0), "queueOffset": 0})

    async def pull(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        off = cmd.ext.get("queueOffset", 0)
        ext = {"nextBeginOffset": off + PULL_BATCH, "minOffset": 0, "maxOffset": 1 << 40}
        return cmd.response(ext=ext, body={"messages": batch})

    async def bulk(conn: Connection, cmd: RemotingCommand) -> RemotingCommand | None:
        nonlocal received
        received += len(cmd.body["messages"])
        return None if cmd.is_oneway else cmd.response(ext={"received": received})

    server = RemotingServer("127.0.0.1", port)
    server.register(RequestCode.SEND_MESSAGE, send)
    server.register(RequestCode.PULL_MESSAGE, pull)
    server.set_default_handler(bulk)
    await server.start()
    announce_ready(server.address)
    try:
        await asyncio.Event().wait()
    finally:
        await server.close()
    return 0


# -- a pipelining raw client -----------------------------------------------------------------------------


class FrameConnection(asyncio.Protocol):
    """Writes pre-encoded frames and hands every complete response payload to ``on_frame``."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.on_frame: Any = None
        self.lost: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        buf = self.buf
        buf += data
        pos = 0
        n = len(buf)
        while n - pos >= 4:
            length = int.from_bytes(buf[pos : pos + 4], "big")
            if n - pos - 4 < length:
                break
            self.on_frame(bytes(buf[pos + 4 : pos + 4 + length]))
            pos += 4 + length
        if pos:
            del buf[:pos]

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.lost.done():
            self.lost.set_result(None)

    def write(self, frame: bytes) -> None:
        assert self.transport is not None
        self.transport.write(frame)


def guarded(on_frame: Any, done: asyncio.Future[None]) -> Any:
    """Fail the phase at once when a response handler raises, instead of waiting for its timeout."""

    def handler(payload: bytes) -> None:
        try:
            on_frame(payload)
        except Exception as exc:
            if not done.done():
                done.set_exception(exc)

    return handler


async def connect(addr: str) -> FrameConnection:
    host, port = addr.rsplit(":", 1)
    _, proto = await asyncio.get_running_loop().create_connection(FrameConnection, host, int(port))
    return proto


def frame(
    code: int, ext: dict[str, Any] | None = None, body: Any = None, opaque: int = 1, oneway: bool = False
) -> bytes:
    cmd = RemotingCommand.request(code, ext, body, oneway=oneway)
    cmd.opaque = opaque
    return encode_frame(cmd)


async def call(addr: str, code: int, ext: dict[str, Any] | None = None, body: Any = None) -> dict[str, Any]:
    conn = await connect(addr)
    fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
    conn.on_frame = lambda p: fut.done() or fut.set_result(msgpack.unpackb(p))
    conn.write(frame(code, ext, body))  # nothing pushes requests to this connection: the frame is the answer
    try:
        async with asyncio.timeout(10):
            return await fut
    finally:
        assert conn.transport is not None
        conn.transport.close()


async def send_phase(addr: str, total: int) -> dict[str, Any]:
    conns = [await connect(addr) for _ in range(SEND_CONNECTIONS)]
    body = {"body": b"x" * BODY_SIZE, "properties": {}}
    frames = [
        frame(
            RequestCode.SEND_MESSAGE,
            {"producerGroup": "bench_producer", "topic": TOPIC, "queueId": q, "bornTimestamp": 0},
            body,
        )
        for q in range(QUEUES)
    ]
    per_conn = [
        total // SEND_CONNECTIONS + (1 if i < total % SEND_CONNECTIONS else 0)
        for i in range(SEND_CONNECTIONS)
    ]
    done = asyncio.get_running_loop().create_future()
    state = {"acked": 0, "errors": 0}

    def make_handler(i: int, conn: FrameConnection) -> Any:
        sent = 0

        def on_frame(payload: bytes) -> None:
            nonlocal sent
            resp = msgpack.unpackb(payload)
            if not resp.get("flag", 0) & 1:
                return
            if resp["code"] != ResponseCode.SUCCESS:
                state["errors"] += 1
            state["acked"] += 1
            if sent < per_conn[i]:
                conn.write(frames[(sent * SEND_CONNECTIONS + i) % QUEUES])
                sent += 1
            if state["acked"] >= total and not done.done():
                done.set_result(None)

        def start() -> None:
            nonlocal sent
            for _ in range(min(SEND_WINDOW, per_conn[i])):
                conn.write(frames[(sent * SEND_CONNECTIONS + i) % QUEUES])
                sent += 1

        conn.on_frame = guarded(on_frame, done)
        conn.lost.add_done_callback(lambda _: done.done() or done.set_exception(ConnectionError("closed")))
        return start

    starters = [make_handler(i, c) for i, c in enumerate(conns)]
    t0 = time.perf_counter()
    for s in starters:
        s()
    async with asyncio.timeout(600):
        await done
    elapsed = time.perf_counter() - t0
    for c in conns:
        assert c.transport is not None
        c.transport.close()
    return {
        "messages": total,
        "errors": state["errors"],
        "seconds": round(elapsed, 3),
        "msgs_per_s": round(total / elapsed, 1),
    }


async def pull_phase(addr: str, total: int, *, canned: bool = False) -> dict[str, Any]:
    conn = await connect(addr)
    loop = asyncio.get_running_loop()
    if not canned:
        sub = SubscriptionData.build(TOPIC, "*", 1)
        hb = HeartbeatData(
            "bench@consumer", consumer_data_set=[ConsumerData(GROUP, subscription_data_set=[sub])]
        )
        fut: asyncio.Future[bytes] = loop.create_future()
        # the broker also pushes NOTIFY_CONSUMER_IDS_CHANGED, possibly before the heartbeat's answer
        conn.on_frame = lambda p: fut.done() or not msgpack.unpackb(p).get("flag", 0) & 1 or fut.set_result(p)
        conn.write(frame(RequestCode.HEART_BEAT, body=hb.to_wire()))
        async with asyncio.timeout(30):
            await fut
    offsets = [0] * QUEUES
    targets = [total // QUEUES + (1 if q < total % QUEUES else 0) for q in range(QUEUES)]
    done = loop.create_future()
    state = {"messages": 0, "pulls": 0, "bytes": 0, "other": 0}

    def pull(q: int) -> None:
        ext = {
            "consumerGroup": GROUP,
            "topic": TOPIC,
            "queueId": q,
            "queueOffset": offsets[q],
            "maxMsgNums": PULL_BATCH,
            "commitOffset": 0,
            "suspendTimeoutMillis": 0,
            "subVersion": 0,
        }
        conn.write(frame(RequestCode.PULL_MESSAGE, ext, opaque=q + 1))

    def on_frame(payload: bytes) -> None:
        resp = msgpack.unpackb(payload)  # a consumer decodes every message, so the client does too
        if not resp.get("flag", 0) & 1:
            return  # a request pushed by the broker (NOTIFY_CONSUMER_IDS_CHANGED), not a pull's answer
        q = resp["opaque"] - 1
        state["pulls"] += 1
        if resp["code"] == ResponseCode.SUCCESS:
            msgs = resp["body"]["messages"]
            state["messages"] += len(msgs)
            state["bytes"] += sum(len(m["body"]) for m in msgs)
            offsets[q] = resp["ext"]["nextBeginOffset"]
        else:
            state["other"] += 1
        if offsets[q] < targets[q]:
            pull(q)
        elif all(o >= t for o, t in zip(offsets, targets, strict=True)) and not done.done():
            done.set_result(None)

    conn.on_frame = guarded(on_frame, done)
    conn.lost.add_done_callback(lambda _: done.done() or done.set_exception(ConnectionError("closed")))
    t0 = time.perf_counter()
    for q in range(QUEUES):
        pull(q)
    async with asyncio.timeout(600):
        await done
    elapsed = time.perf_counter() - t0
    assert conn.transport is not None
    conn.transport.close()
    return {
        "messages": state["messages"],
        "pulls": state["pulls"],
        "non_success": state["other"],
        "seconds": round(elapsed, 3),
        "msgs_per_s": round(state["messages"] / elapsed, 1),
        "mib_per_s": round(state["bytes"] / elapsed / 2**20, 1),
    }


async def bulk_stream(addr: str, frames_n: int) -> dict[str, Any]:
    """One-way frames of 32 x 1 KiB messages over one connection, then a sync one to time the end."""
    conn = await connect(addr)
    body = {"messages": canned_messages(PULL_BATCH)}
    one = frame(9999, body=body, oneway=True)
    fut: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
    conn.on_frame = lambda p: fut.done() or fut.set_result(p)
    t0 = time.perf_counter()
    for i in range(frames_n):
        conn.write(one)
        if i % 64 == 63:
            await asyncio.sleep(0)  # let the transport drain
    conn.write(frame(9999, body=body, opaque=7))
    async with asyncio.timeout(600):
        await fut
    elapsed = time.perf_counter() - t0
    assert conn.transport is not None
    conn.transport.close()
    msgs = (frames_n + 1) * PULL_BATCH
    return {
        "frames": frames_n + 1,
        "frame_bytes": len(one),
        "seconds": round(elapsed, 3),
        "msgs_per_s": round(msgs / elapsed, 1),
        "mib_per_s": round(len(one) * (frames_n + 1) / elapsed / 2**20, 1),
    }


def run(coro_factory: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}

    async def go() -> int:
        out.update(await coro_factory())
        return 0

    run_async_main(go)
    return out


def median_pass(passes: list[dict[str, Any]]) -> dict[str, Any]:
    return sorted(passes, key=lambda p: p["msgs_per_s"])[len(passes) // 2]


def measure_broker(label: str, extra: list[str], messages: int, tmp: str) -> dict[str, Any]:
    server = rpc.start_broker(extra, log_file=os.path.join(tmp, f"{label}.jsonl"))
    try:
        topic = {"topic": TOPIC, "readQueueNums": QUEUES, "writeQueueNums": QUEUES, "perm": 6}
        created = run(lambda: call(server.addr, RequestCode.UPDATE_AND_CREATE_TOPIC, topic))
        if created["code"] != ResponseCode.SUCCESS:
            raise RuntimeError(f"topic creation failed: {created}")
        cpu0 = server.cpu_seconds()
        sent = run(lambda: send_phase(server.addr, messages))
        cpu1 = server.cpu_seconds()
        sent["server_cpu_util"] = round((cpu1 - cpu0) / max(sent["seconds"], 1e-9), 2)
        passes = []
        for _ in range(PULL_PASSES):  # every pass reads all messages again from offset 0
            cpu1 = server.cpu_seconds()
            pulled = run(lambda: pull_phase(server.addr, messages))
            pulled["server_cpu_util"] = round((server.cpu_seconds() - cpu1) / max(pulled["seconds"], 1e-9), 2)
            passes.append(pulled)
        return {
            "send": sent,
            "pull": median_pass(passes),
            "pull_passes_msgs_per_s": [p["msgs_per_s"] for p in passes],
        }
    finally:
        server.stop()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--messages", type=int, default=100_000, help="messages for the in-memory run")
    p.add_argument("--durable-messages", type=int, default=50_000, help="messages for the --store-dir run")
    p.add_argument("--serve-canned", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.serve_canned:
        return run_async_main(lambda: serve_canned(args.port))
    rpc.pin_load()
    doc: dict[str, Any] = {
        "benchmark": "throughput",
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "cpu_pinning": "server on CPU 0, load on the others" if rpc.PIN else "none",
        "body_bytes": BODY_SIZE,
        "pull_batch": PULL_BATCH,
        "queues": QUEUES,
        "send_in_flight": SEND_CONNECTIONS * SEND_WINDOW,
        "pulls_in_flight": QUEUES,
    }
    with tempfile.TemporaryDirectory() as tmp:
        doc["memory"] = measure_broker("memory", [], args.messages, tmp)
        print(f"# memory: {doc['memory']}", file=sys.stderr)
        store = os.path.join(tmp, "store")
        doc["durable"] = measure_broker("durable", ["--store-dir", store], args.durable_messages, tmp)
        print(f"# durable: {doc['durable']}", file=sys.stderr)
        canned = rpc.ServerProc([sys.executable, str(Path(__file__).resolve()), "--serve-canned"])
        try:
            doc["ceiling"] = {
                "send": run(lambda: send_phase(canned.addr, args.messages)),
                "pull": median_pass(
                    [
                        run(lambda: pull_phase(canned.addr, args.messages, canned=True))
                        for _ in range(PULL_PASSES)
                    ]
                ),
                "bulk_one_way_stream": run(lambda: bulk_stream(canned.addr, args.messages // PULL_BATCH)),
            }
        finally:
            canned.stop()
    mem_pull = doc["memory"]["pull"]["msgs_per_s"]
    doc["pull_vs_ceiling"] = round(mem_pull / doc["ceiling"]["pull"]["msgs_per_s"], 3)
    doc["goal"] = {
        "pulled_in_memory_msgs_per_s_min": 50_000,
        "pulled_in_memory": mem_pull,
        "met": mem_pull >= 50_000,
    }
    print(json.dumps(doc, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
