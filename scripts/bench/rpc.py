"""RPC benchmark: HEART_BEAT and GET_CONSUMER_LIST_BY_GROUP against the broker and a bare echo server.

Both servers run as their own processes on the same framing and remoting stack (PROTOCOL.md msgpack
frames over ``protocol.remoting``); the load runs in this process with one request in flight per
connection. Prints one JSON document: requests/s and p50/p99 latency per (target, request,
connections), the CPU the server process used, and the ratio broker/echo.

    python scripts/bench/rpc.py [--seconds 3] [--connections 1,64]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import msgpack

from rmqlab.cli import announce_ready
from rmqlab.protocol.codes import RequestCode, ResponseCode
from rmqlab.protocol.command import RemotingCommand, encode_frame
from rmqlab.protocol.main_loop import run_async_main
from rmqlab.protocol.model import ConsumerData, HeartbeatData, SubscriptionData
from rmqlab.protocol.remoting import Connection, RemotingServer

REPO = Path(__file__).resolve().parents[2]

GROUP = "bench_group"
CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
# With two or more CPUs the server gets CPU 0 and the load the others, so they do not steal each other's.
PIN = hasattr(os, "sched_setaffinity") and (os.cpu_count() or 1) >= 2


def _pin_server() -> None:
    if PIN:
        os.sched_setaffinity(0, {0})


def pin_load() -> None:
    if PIN:
        os.sched_setaffinity(0, set(range(1, os.cpu_count() or 2)))


# -- servers -----------------------------------------------------------------------------------------


async def serve_echo(port: int) -> int:
    """The ceiling: the same remoting stack answering every request with its own ext and body."""

    async def echo(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        return cmd.response(ext=cmd.ext, body=cmd.body)

    server = RemotingServer("127.0.0.1", port)
    server.set_default_handler(echo)
    await server.start()
    announce_ready(server.address)
    try:
        await asyncio.Event().wait()
    finally:
        await server.close()
    return 0


class ServerProc:
    def __init__(self, argv: list[str]) -> None:
        self.proc = subprocess.Popen(
            argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
        )
        line = self.proc.stdout.readline() if self.proc.stdout else ""
        if not line.startswith("READY "):
            self.proc.kill()
            raise RuntimeError(f"{argv} did not start: {line!r}")
        self.addr = line.split()[1]

    def cpu_seconds(self) -> float:
        with open(f"/proc/{self.proc.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLK_TCK

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def start_broker(extra: list[str] | None = None, log_file: str | None = None) -> ServerProc:
    argv = [sys.executable, "-m", "rmqlab.broker", "--host", "127.0.0.1", "--port", "0", *(extra or [])]
    if log_file:
        argv += ["--log-file", log_file]
    return ServerProc(argv)


def start_echo() -> ServerProc:
    return ServerProc([sys.executable, str(Path(__file__).resolve()), "--serve-echo"])


# -- load ----------------------------------------------------------------------------------------------


def heartbeat_body(client_id: str) -> dict[str, Any]:
    sub = SubscriptionData.build("BenchTopic", "*", 1)
    return HeartbeatData(
        client_id, consumer_data_set=[ConsumerData(GROUP, subscription_data_set=[sub])]
    ).to_wire()


def make_request(name: str, client_id: str) -> RemotingCommand:
    if name == "HEART_BEAT":
        return RemotingCommand.request(RequestCode.HEART_BEAT, body=heartbeat_body(client_id))
    return RemotingCommand.request(RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": GROUP})


def percentile(sorted_vals: list[int], q: float) -> float:
    if not sorted_vals:
        return float("nan")
    i = min(len(sorted_vals) - 1, max(0, round(q * (len(sorted_vals) - 1))))
    return sorted_vals[i] / 1e6


class RawConnection(asyncio.Protocol):
    """A deliberately cheap load client: one pre-encoded request in flight, responses split by length.

    The full client stack would cost as much CPU per request as the server and hide the server's cost.
    """

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.waiter: asyncio.Future[bytes] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.buf += data
        if len(self.buf) >= 4:
            n = int.from_bytes(self.buf[:4], "big")
            if len(self.buf) >= 4 + n:
                payload = bytes(self.buf[4 : 4 + n])
                del self.buf[: 4 + n]
                if self.waiter is not None and not self.waiter.done():
                    self.waiter.set_result(payload)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(ConnectionError("closed"))

    async def call(self, frame: bytes) -> bytes:
        self.waiter = asyncio.get_running_loop().create_future()
        assert self.transport is not None
        self.transport.write(frame)
        return await self.waiter


def encoded(cmd: RemotingCommand, opaque: int = 1) -> bytes:
    cmd.opaque = opaque
    return encode_frame(cmd)


async def run_load(
    addr: str, request: str, connections: int, seconds: float, warmup: float
) -> dict[str, Any]:
    host, port = addr.rsplit(":", 1)
    loop = asyncio.get_running_loop()
    conns: list[RawConnection] = []
    try:
        for i in range(connections):
            _, proto = await loop.create_connection(RawConnection, host, int(port))
            conns.append(proto)
            # every connection registers a consumer first, so the group has `connections` members
            resp = msgpack.unpackb(await proto.call(encoded(make_request("HEART_BEAT", f"bench@{i}"))))
            if resp["code"] != ResponseCode.SUCCESS:
                raise RuntimeError(f"heartbeat failed: {resp}")
        frames = [encoded(make_request(request, f"bench@{i}")) for i in range(connections)]
        latencies: list[int] = []
        errors = 0
        measuring = False
        stop = False

        async def worker(i: int) -> None:
            nonlocal errors
            proto = conns[i]
            frame = frames[i]
            unpack = msgpack.unpackb
            perf = time.perf_counter_ns
            while not stop:
                t0 = perf()
                payload = await proto.call(frame)
                dt = perf() - t0
                if measuring:
                    latencies.append(dt)
                    if unpack(payload)["code"] != ResponseCode.SUCCESS:
                        errors += 1

        tasks = [asyncio.create_task(worker(i)) for i in range(connections)]
        await asyncio.sleep(warmup)
        measuring = True
        t_start = time.perf_counter()
        await asyncio.sleep(seconds)
        measuring = False
        elapsed = time.perf_counter() - t_start
        n = len(latencies)
        stop = True
        await asyncio.gather(*tasks, return_exceptions=True)
        latencies.sort()
        return {
            "requests": n,
            "errors": errors,
            "req_per_s": round(n / elapsed, 1),
            "p50_ms": round(percentile(latencies, 0.50), 3),
            "p99_ms": round(percentile(latencies, 0.99), 3),
            "elapsed_s": round(elapsed, 3),
        }
    finally:
        for c in conns:
            if c.transport is not None:
                c.transport.close()


def measure(
    server: ServerProc, request: str, connections: int, seconds: float, warmup: float
) -> dict[str, Any]:
    cpu0 = server.cpu_seconds()
    result: dict[str, Any] = {}

    async def go() -> int:
        result.update(await run_load(server.addr, request, connections, seconds, warmup))
        return 0

    t0 = time.perf_counter()
    run_async_main(go)
    wall = time.perf_counter() - t0
    cpu = server.cpu_seconds() - cpu0
    result["server_cpu_util"] = round(cpu / wall, 2)
    # CPU the server spent per answered request (warm-up and set-up included): unlike req/s it does not
    # depend on whether the load generator could keep the server busy.
    result["server_cpu_us_per_req"] = round(
        cpu / max(1, result["requests"]) * 1e6 * result["elapsed_s"] / wall, 1
    )
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=3.0, help="measured time per run")
    p.add_argument("--warmup", type=float, default=0.5)
    p.add_argument("--connections", default="1,64", help="comma-separated connection counts")
    p.add_argument("--serve-echo", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.serve_echo:
        return run_async_main(lambda: serve_echo(args.port))

    conn_counts = [int(x) for x in args.connections.split(",") if x.strip()]
    pin_load()
    requests = ["HEART_BEAT", "GET_CONSUMER_LIST_BY_GROUP"]
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        servers = {
            "broker": lambda: start_broker(log_file=os.path.join(tmp, "broker.jsonl")),
            "echo": start_echo,
        }
        for target, start in servers.items():
            for request in requests:
                for n in conn_counts:
                    # a fresh server per run, so one run's group does not grow the next one's
                    server = start()
                    try:
                        r = measure(server, request, n, args.seconds, args.warmup)
                    finally:
                        server.stop()
                    results.append({"target": target, "request": request, "connections": n, **r})
                    print(f"# {target} {request} x{n}: {r['req_per_s']} req/s", file=sys.stderr)

    def rate(target: str, request: str, n: int) -> float:
        for r in results:
            if (r["target"], r["request"], r["connections"]) == (target, request, n):
                return float(r["req_per_s"])
        return float("nan")

    ratios = {
        req: {str(n): round(rate("broker", req, n) / rate("echo", req, n), 3) for n in conn_counts}
        for req in requests
    }

    def cost(target: str, request: str, n: int) -> float:
        for r in results:
            if (r["target"], r["request"], r["connections"]) == (target, request, n):
                return float(r["server_cpu_us_per_req"])
        return float("nan")

    cost_ratios = {
        req: {str(n): round(cost("echo", req, n) / cost("broker", req, n), 3) for n in conn_counts}
        for req in requests
    }
    top = max(conn_counts)
    worst = min(ratios[req][str(top)] for req in requests)
    doc = {
        "benchmark": "rpc",
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "seconds_per_run": args.seconds,
        "in_flight_per_connection": 1,
        "cpu_pinning": "server on CPU 0, load on the others" if PIN else "none",
        "note": "GET_CONSUMER_LIST_BY_GROUP answers a group with one member per load connection",
        "results": results,
        "ratio_broker_over_echo": ratios,
        "ratio_echo_cpu_per_req_over_broker_cpu_per_req": cost_ratios,
        "goal": {"connections": top, "min_ratio": 0.6, "worst_ratio": worst, "met": worst >= 0.6},
    }
    print(json.dumps(doc, indent=2))
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
