"""The native port from the command line: `python -m rmqlab.broker --remoting-port` and `rmq-namesrv
--remoting-port`, with brokers publishing their native address through a stand-alone name server."""

from __future__ import annotations

import asyncio
import json
import sys

import pytest
from kit.native_wire import NativePeer, json_frame

from rmqlab.protocol.codes import RequestCode, ResponseCode


async def start_role(*argv: str) -> tuple[asyncio.subprocess.Process, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    assert proc.stdout is not None
    async with asyncio.timeout(20):
        line = (await proc.stdout.readline()).decode().strip()
    assert line.startswith("READY "), line
    return proc, line.removeprefix("READY ")


async def stop(proc: asyncio.subprocess.Process) -> None:
    if proc.returncode is None:
        proc.terminate()
        async with asyncio.timeout(10):
            await proc.wait()


async def route(native_addr: str, topic: str) -> dict:
    peer = await NativePeer.connect(int(native_addr.rsplit(":", 1)[1]))
    try:
        await peer.send(json_frame(RequestCode.GET_ROUTEINFO_BY_TOPIC, 1, {"topic": topic}))
        reply = await peer.recv()
        assert reply.code == ResponseCode.SUCCESS, reply.remark
        return json.loads(reply.body)
    finally:
        await peer.close()


async def test_broker_cli_opens_a_native_port_with_topics() -> None:
    proc, ready = await start_role(
        "-m",
        "rmqlab.broker",
        "--port",
        "0",
        "--remoting-port",
        "0",
        "--create-topic",
        "Orders:8",
        "--create-topic",
        "T2",
    )
    try:
        addr, _, native = ready.partition(" native=")
        assert native and native != addr
        data = await route(native, "Orders")
        assert data["queueDatas"][0]["readQueueNums"] == 8
        # Routes asked for on the native port send real clients back to the native port.
        assert data["brokerDatas"][0]["brokerAddrs"] == {"0": native}
        assert (await route(native, "T2"))["queueDatas"][0]["writeQueueNums"] == 4
    finally:
        await stop(proc)


async def test_standalone_namesrv_routes_real_clients_to_brokers_native_ports() -> None:
    ns, ns_ready = await start_role("-m", "rmqlab.broker.namesrv_main", "--port", "0", "--remoting-port", "0")
    procs = [ns]
    try:
        ns_addr, _, ns_native = ns_ready.partition(" native=")
        natives = {}
        for name in ("broker-a", "broker-b"):
            proc, ready = await start_role(
                "-m", "rmqlab.broker", "--port", "0", "--remoting-port", "0", "--broker-name", name,
                "--namesrv", ns_addr, "--create-topic", "Shared:2",
            )  # fmt: skip
            procs.append(proc)
            natives[name] = ready.partition(" native=")[2]
        data: dict = {}
        for _ in range(100):
            data = await route(ns_native, "Shared")
            if len(data.get("brokerDatas", [])) == 2:
                break
            await asyncio.sleep(0.1)
        got = {bd["brokerName"]: bd["brokerAddrs"]["0"] for bd in data["brokerDatas"]}
        assert got == natives
    finally:
        for p in reversed(procs):
            await stop(p)


@pytest.mark.parametrize("bad", ["Orders:0", "Orders:x", ":4", "a b"])
async def test_bad_create_topic_is_a_usage_error(bad: str) -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "rmqlab.broker", "--port", "0", "--create-topic", bad,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    async with asyncio.timeout(20):
        out, err = await proc.communicate()
    assert proc.returncode == 2 and b"--create-topic" in err and b"READY" not in out
