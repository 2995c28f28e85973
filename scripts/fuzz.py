"""Long fuzz run against a durable broker process, as a hostile client would do it.

Starts ``python -m rmqlab.broker --store-dir TMP --remoting-port 0`` and throws ``--frames`` frames at it from
this process: random commands on the msgpack port (every request code, admin codes included, random
ext fields with values across the whole signed and unsigned 64-bit range, random bodies, one-way
flags, pulls held up to 2 s), random commands on the native port (number strings of any length), and
mutated bytes on throw-away connections. A probe connection measures a cheap request's round trip all
along. Prints one JSON document:

    frames, answered, unanswered, bad_answers, closed_by_broker, handler_errors (with examples),
    rss_kb_before / rss_kb_after, probe_ms {p50, p99, max}, seconds

A request is unanswered when its connection closed or the run ended (30 s after the last frame)
without its answer; an answer is bad when it is not a response, names no request in flight, answers a
one-way request, or carries a code RocketMQ does not have; handler errors are error lines in the broker's
log (a handler that failed instead of answering INVALID_PARAMETER). Exit status 1 when any of the three
is not 0.

    python scripts/fuzz.py --frames 1000000 [--seed 1] [--connections 4]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rmqlab.protocol.codes import Flag, RequestCode, ResponseCode
from rmqlab.protocol.command import FrameDecoder, RemotingCommand, encode_frame

REPO = Path(__file__).resolve().parents[1]

VALID_CODES = {int(c) for c in ResponseCode}
CODES = [int(c) for c in RequestCode]
FIELDS = [
    "consumerGroup", "topic", "queueId", "queueOffset", "maxMsgNums", "commitOffset", "suspendTimeoutMillis",
    "subscription", "subVersion", "clientID", "producerGroup", "bornTimestamp", "tags", "keys", "group",
    "originTopic", "offset", "originMsgId", "delayLevel", "maxReconsumeTimes", "setZeroIfNotFound",
    "readQueueNums", "writeQueueNums", "perm", "timestamp", "brokerName", "brokerAddr", "clusterName",
    "brokerId", "faultId", "sysFlag", "notifyOnChannelExpired", "x",
]  # fmt: skip
NAMES = ["T", "g", "%RETRY%g", "%DLQ%g", "TBW102", "a b", "x" * 300, "", "*", "\n", "é"]
WINDOW = 64


def rand_int(rng: random.Random) -> int:
    r = rng.random()
    if r < 0.3:
        return rng.randint(-2, 40)
    if r < 0.5:
        return rng.choice([2**31 - 1, 2**31, -(2**31) - 1, 2**63 - 1, 2**63, -(2**63), 2**64 - 1])
    if r < 0.75:
        return rng.randint(-(2**63), 2**63 - 1)
    return rng.randint(0, 2**64 - 1)


def rand_scalar(rng: random.Random) -> Any:
    r = rng.random()
    if r < 0.45:
        return rand_int(rng)
    if r < 0.75:
        return rng.choice(NAMES)
    if r < 0.85:
        return rng.choice([True, False, None])
    if r < 0.92:
        return rng.random() * rng.choice([1, 1e30, -1e30])
    return "".join(rng.choice("abc%|_-09 ") for _ in range(rng.randint(0, 12)))


def rand_value(rng: random.Random, depth: int = 0) -> Any:
    r = rng.random()
    if depth > 2 or r < 0.5:
        return rand_scalar(rng) if r < 0.45 or depth > 2 else rng.randbytes(rng.randint(0, 64))
    if r < 0.75:
        return [rand_value(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    return {
        rng.choice([*FIELDS, "body", "mqSet", "consumerDataSet"]): rand_value(rng, depth + 1)
        for _ in range(4)
    }


def rand_body(rng: random.Random, code: int) -> Any:
    r = rng.random()
    if code == RequestCode.HEART_BEAT and r < 0.6:
        sub = {"topic": rng.choice(NAMES), "subString": rng.choice(["*", "a || b", rand_scalar(rng)])}
        sub["subVersion"] = rand_int(rng)
        cds = [
            {"groupName": rng.choice(NAMES), "subscriptionDataSet": [sub]} for _ in range(rng.randint(0, 3))
        ]
        return {"clientID": rng.choice(["c1", "c2", rand_scalar(rng)]), "consumerDataSet": cds}
    if code in (RequestCode.LOCK_BATCH_MQ, RequestCode.UNLOCK_BATCH_MQ) and r < 0.6:
        mqs = [
            {"topic": "T", "brokerName": "broker-a", "queueId": rand_int(rng)}
            for _ in range(rng.randint(0, 5))
        ]
        return {"consumerGroup": rng.choice(NAMES), "clientId": rng.choice(["c1", "c2"]), "mqSet": mqs}
    if code in (RequestCode.SEND_MESSAGE, RequestCode.SEND_MESSAGE_V2) and r < 0.7:
        return {"body": rng.randbytes(rng.randint(0, 256)), "properties": {"k": rng.choice(NAMES)}}
    if code == RequestCode.ADMIN_FAULT_ADD:
        # A fault that drops answers would make requests unanswered on purpose: never drop here.
        err = {"code": rng.choice(sorted(VALID_CODES)), "remark": "fuzz"}
        spec: dict[str, Any] = {"requestCode": rng.choice(CODES), "errors": [err], "drop": False}
        spec["count"] = rng.choice([1, 2, rand_int(rng)])
        spec["latencyMs"] = rng.choice([0, 5, rand_int(rng)])
        return spec
    return rand_value(rng)


def rand_command(rng: random.Random) -> RemotingCommand:
    code = rng.choice(CODES) if rng.random() < 0.9 else rng.randint(-(2**31), 2**31 - 1)
    ext = {rng.choice(FIELDS): rand_scalar(rng) for _ in range(rng.randint(0, 8))}
    if code == RequestCode.PULL_MESSAGE or "suspendTimeoutMillis" in ext:
        ext["suspendTimeoutMillis"] = rng.randint(0, 2000)  # long holds, but answered within the run
    if code == RequestCode.ADMIN_POLICY_SET:
        ext = {}  # a policy change is legitimate; keep the run's rules fixed
    return RemotingCommand.request(code, ext, rand_body(rng, code), oneway=rng.random() < 0.05)


def native_frame(rng: random.Random, opaque: int, oneway: bool) -> bytes:
    code = rng.choice(CODES) if rng.random() < 0.9 else rng.randint(-(2**15), 2**15 - 1)
    if code == RequestCode.ADMIN_POLICY_SET or code == RequestCode.ADMIN_FAULT_ADD:
        code = RequestCode.ADMIN_FAULT_LIST

    def value() -> str:
        r = rng.random()
        if r < 0.5:
            return str(rand_int(rng))
        if r < 0.55:
            return "9" * rng.choice([30, 4301, 6000])
        return str(rand_scalar(rng))

    ext = {rng.choice(FIELDS): value() for _ in range(rng.randint(0, 8))}
    if "suspendTimeoutMillis" in ext or code == RequestCode.PULL_MESSAGE:
        ext["suspendTimeoutMillis"] = str(rng.randint(0, 2000))
    header = {"code": code, "language": "JAVA", "version": 399, "opaque": opaque}
    header |= {"flag": 2 if oneway else 0, "extFields": ext}
    body = json.dumps(rand_value(rng), default=lambda b: b.hex()).encode() if rng.random() < 0.5 else b""
    hdr = json.dumps(header).encode()
    return struct.pack(">II", 4 + len(hdr) + len(body), len(hdr)) + hdr + body


def mutate(rng: random.Random, data: bytes) -> bytes:
    b = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        i = rng.randrange(len(b))
        b[i] = rng.randrange(256)
    if rng.random() < 0.2:
        b = b[: rng.randrange(len(b))]
    return bytes(b)


class Stats:
    def __init__(self) -> None:
        self.frames = self.answered = self.unanswered = self.bad = self.closed = self.oneway = 0
        self.bad_examples: list[str] = []

    def bad_answer(self, why: str) -> None:
        self.bad += 1
        if len(self.bad_examples) < 10:
            self.bad_examples.append(why)


class FuzzConn(asyncio.Protocol):
    """A command connection: requests in flight by opaque, answers checked as they come."""

    def __init__(self, stats: Stats, native: bool) -> None:
        self.stats = stats
        self.native = native
        self.pending: set[int] = set()
        self.transport: asyncio.Transport | None = None
        self.decoder = FrameDecoder(64 * 1024 * 1024)
        self.buf = b""
        self.room = asyncio.Event()
        self.room.set()
        self.lost = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        for code, opaque, flag in self._split(data):
            if not flag & Flag.RESPONSE:
                continue  # a push from the broker (notify); not an answer
            if opaque not in self.pending:
                self.stats.bad_answer(f"answer to opaque {opaque} not in flight (code {code})")
                continue
            self.pending.discard(opaque)
            self.stats.answered += 1
            if code not in VALID_CODES:
                self.stats.bad_answer(f"unknown response code {code}")
        if len(self.pending) < WINDOW:
            self.room.set()

    def _split(self, data: bytes) -> list[tuple[int, int, int]]:
        if not self.native:
            return [(c.code, c.opaque, c.flag) for c in self.decoder.feed(data)]
        self.buf += data
        out = []
        while len(self.buf) >= 8:
            (total,) = struct.unpack_from(">I", self.buf)
            if len(self.buf) < 4 + total:
                break
            (info,) = struct.unpack_from(">I", self.buf, 4)
            header = json.loads(self.buf[8 : 8 + (info & 0xFFFFFF)])
            out.append((header["code"], header["opaque"], header.get("flag", 0)))
            self.buf = self.buf[4 + total :]
        return out

    def connection_lost(self, exc: Exception | None) -> None:
        self.room.set()
        if not self.lost.done():
            self.lost.set_result(None)

    def send(self, data: bytes, opaque: int, expect_answer: bool) -> None:
        assert self.transport is not None
        if expect_answer:
            self.pending.add(opaque)
            if len(self.pending) >= WINDOW:
                self.room.clear()
        self.transport.write(data)


async def garbage_conn(
    host: str, port: int, frames: list[bytes], native: bool, stats: Stats, slots: asyncio.Semaphore
) -> None:
    """Mutated frames on a throw-away connection: whatever comes back must be valid answers."""
    async with slots:
        try:
            reader, writer = await asyncio.open_connection(host, port)
        except OSError:
            stats.bad_answer("garbage connection refused")
            return
        writer.write(b"".join(frames))
        got = b""
        try:
            async with asyncio.timeout(0.3):
                while chunk := await reader.read(1 << 16):
                    got += chunk
        except (TimeoutError, ConnectionError):
            pass
        writer.close()
    try:
        parser = FuzzConn(stats, native)
        for code, _, flag in parser._split(got):
            if not flag & Flag.RESPONSE and code == RequestCode.NOTIFY_CONSUMER_IDS_CHANGED:
                continue  # a push to a connection that registered a consumer, not an answer
            if not flag & Flag.RESPONSE or code not in VALID_CODES:
                stats.bad_answer(f"garbage answered with code {code} flag {flag}")
            else:
                stats.answered += 1
    except Exception as exc:  # an undecodable answer is a bad answer
        stats.bad_answer(f"undecodable answer to garbage: {type(exc).__name__}: {exc}")


def rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


async def probe(host: str, port: int, stop: asyncio.Event, latencies: list[float]) -> None:
    reader, writer = await asyncio.open_connection(host, port)
    opaque = 0
    while not stop.is_set():
        opaque += 1
        cmd = RemotingCommand.request(RequestCode.GET_MAX_OFFSET, {"topic": "T", "queueId": 0})
        cmd.opaque = opaque
        t0 = time.perf_counter()
        writer.write(encode_frame(cmd))
        (n,) = struct.unpack(">I", await reader.readexactly(4))
        await reader.readexactly(n)
        latencies.append((time.perf_counter() - t0) * 1000)
        await asyncio.sleep(0.1)
    writer.close()


def pct(vals: list[float], q: float) -> float:
    if not vals:
        return float("nan")
    s = sorted(vals)
    return round(s[min(len(s) - 1, int(q * (len(s) - 1)))], 3)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    rng = random.Random(args.seed)
    store = tempfile.mkdtemp(prefix="fuzz-store-")
    log_file = os.path.join(store, "broker.log")
    argv = [
        sys.executable,
        "-m",
        "rmqlab.broker",
        "--port",
        "0",
        "--remoting-port",
        "0",
        "--store-dir",
        store,
    ]
    proc = subprocess.Popen(  # noqa: ASYNC220 - once, before the run
        [*argv, "--log-file", log_file],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        line = proc.stdout.readline() if proc.stdout else ""
        if not line.startswith("READY "):
            raise SystemExit(f"fuzz: the broker did not start: {line!r}")
        addr, _, native = line.split(maxsplit=1)[1].strip().partition(" native=")
        host, port = addr.rsplit(":", 1)
        nport = int(native.rsplit(":", 1)[1])
        rss_before = rss_kb(proc.pid)
        stats = Stats()
        stop = asyncio.Event()
        latencies: list[float] = []
        probe_task = asyncio.create_task(probe(host, int(port), stop, latencies))
        loop = asyncio.get_running_loop()
        t0 = time.monotonic()
        per_worker = args.frames // (args.connections + 1)
        slots = asyncio.Semaphore(16)
        garbage_tasks: set[asyncio.Task[None]] = set()

        async def worker(native_port: bool, quota: int) -> None:
            opaque = 0
            conn: FuzzConn | None = None
            sent = 0
            while sent < quota:
                if conn is None or conn.lost.done():
                    if conn is not None:
                        stats.closed += 1
                        stats.unanswered += len(conn.pending)
                    _, conn = await loop.create_connection(
                        lambda: FuzzConn(stats, native_port), host, nport if native_port else int(port)
                    )
                r = rng.random()
                if r < 0.03:  # a batch of mutated frames on a connection of their own
                    batch = []
                    for _ in range(rng.randint(1, 20)):
                        cmd = rand_command(rng)
                        cmd.opaque = rng.randint(1, 2**31 - 1)
                        base = native_frame(rng, cmd.opaque, False) if native_port else encode_frame(cmd)
                        batch.append(mutate(rng, base))
                    target = nport if native_port else int(port)
                    task = asyncio.create_task(garbage_conn(host, target, batch, native_port, stats, slots))
                    garbage_tasks.add(task)
                    task.add_done_callback(garbage_tasks.discard)
                    sent += len(batch)
                    stats.frames += len(batch)
                    continue
                opaque += 1
                if native_port:
                    oneway = rng.random() < 0.05
                    data = native_frame(rng, opaque, oneway)
                else:
                    cmd = rand_command(rng)
                    cmd.opaque = opaque
                    oneway = cmd.is_oneway
                    data = encode_frame(cmd)
                await conn.room.wait()
                if conn.lost.done():
                    continue
                conn.send(data, opaque, not oneway)
                stats.oneway += oneway
                sent += 1
                stats.frames += 1
                if not native_port and opaque % 2000 == 0:  # faults come and go, none for long
                    clear = RemotingCommand.request(RequestCode.ADMIN_FAULT_CLEAR)
                    opaque += 1
                    clear.opaque = opaque
                    await conn.room.wait()
                    if not conn.lost.done():
                        conn.send(encode_frame(clear), opaque, True)
            # wait for the answers still owed (held pulls, injected latency)
            deadline = time.monotonic() + 30
            while conn is not None and conn.pending and not conn.lost.done():
                if time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.05)
            if conn is not None:
                stats.unanswered += len(conn.pending)
                if conn.lost.done() and conn.pending:
                    stats.closed += 1
                conn.pending.clear()
                if conn.transport is not None:
                    conn.transport.close()

        async with asyncio.TaskGroup() as tg:
            for _ in range(args.connections):
                tg.create_task(worker(False, per_worker))
            tg.create_task(worker(True, args.frames - per_worker * args.connections))
        while garbage_tasks:
            await asyncio.gather(*list(garbage_tasks))
        seconds = time.monotonic() - t0
        stop.set()
        await probe_task
        rss_after = rss_kb(proc.pid)
        alive = proc.poll() is None
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
    errors = 0
    error_examples: dict[str, int] = {}
    with open(log_file) as f:  # noqa: ASYNC230 - after the run
        for text in f:
            if '"level": "error"' in text or '"level":"error"' in text:
                errors += 1
                if len(error_examples) < 10 or text[:300] in error_examples:
                    error_examples[text[:300]] = error_examples.get(text[:300], 0) + 1
    shutil.rmtree(store, ignore_errors=True)
    return {
        "frames": stats.frames,
        "answered": stats.answered,
        "unanswered": stats.unanswered,
        "bad_answers": stats.bad,
        "bad_examples": stats.bad_examples,
        "oneway": stats.oneway,
        "closed_by_broker": stats.closed,
        "handler_errors": errors,
        "handler_error_examples": error_examples,
        "broker_alive": alive,
        "rss_kb_before": rss_before,
        "rss_kb_after": rss_after,
        "probe_ms": {"p50": pct(latencies, 0.5), "p99": pct(latencies, 0.99), "max": pct(latencies, 1.0)},
        "probes": len(latencies),
        "seconds": round(seconds, 1),
        "frames_per_s": round(stats.frames / seconds) if seconds else None,
        "seed": args.seed,
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--frames", type=int, default=100_000, help="frames to send in all (default 100000)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--connections", type=int, default=4, help="msgpack command connections (plus one native)")
    args = p.parse_args()
    if args.frames <= 0 or args.connections <= 0:
        p.error("--frames and --connections must be positive")
    result = asyncio.run(run(args))
    print(json.dumps(result, indent=2))
    ok = result["unanswered"] == 0 and result["bad_answers"] == 0 and result["handler_errors"] == 0
    return 0 if ok and result["broker_alive"] else 1


if __name__ == "__main__":
    sys.exit(main())
