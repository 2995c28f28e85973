"""rmq-consumer and rmq-producer as real processes against an in-process broker."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import pytest
from kit import wait_until
from kit.cluster import Cluster

ROOT = Path(__file__).resolve().parents[2]


def read_events(path: Path, name: str) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            ev = json.loads(line)
            if ev["event"] == name:
                out.append(ev)
    return out


async def spawn(module: str, *args: str) -> asyncio.subprocess.Process:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        module,
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
        cwd=str(ROOT),
    )


@pytest.fixture
async def cluster(tmp_path):  # type: ignore[no-untyped-def]
    c = Cluster(str(tmp_path))
    yield c
    await c.close()


async def test_consumer_and_producer_processes(cluster: Cluster, tmp_path: Path) -> None:
    await cluster.start_broker()
    await cluster.create_topic("T", 4)
    consumer_log = tmp_path / "consumer-1.jsonl"
    producer_log = tmp_path / "producer-1.jsonl"
    common = ["--namesrv", cluster.namesrv, "--time-scale", str(cluster.scale)]
    consumer = await spawn(
        "rmqlab.client.consumer_main",
        *common,
        "--group", "cli", "--topic", "T", "--consume-from", "first", "--consume-ms", "2",
        "--node", "consumer-1", "--log-file", str(consumer_log),
    )  # fmt: skip
    try:
        async with asyncio.timeout(15):
            assert consumer.stdout is not None
            ready = (await consumer.stdout.readline()).decode()
        assert ready.startswith("READY ") and "@" in ready
        client_id = ready.split()[1]
        producer = await spawn(
            "rmqlab.client.producer_main",
            *common,
            "--topic", "T", "--rate", "400", "--count", "30", "--size", "64",
            "--node", "producer-1", "--log-file", str(producer_log),
        )  # fmt: skip
        async with asyncio.timeout(20):
            out, err = await producer.communicate()
        assert producer.returncode == 0, err.decode()
        assert out.decode().startswith("READY ")
        sent = {e["msg_id"] for e in read_events(producer_log, "message_sent")}
        assert len(sent) == 30
        await wait_until(
            lambda: sent <= {e["msg_id"] for e in read_events(consumer_log, "message_consumed")},
            15,
            "consumption",
        )
    finally:
        if consumer.returncode is None:
            consumer.send_signal(signal.SIGTERM)
        async with asyncio.timeout(15):
            await consumer.wait()
    assert consumer.returncode == 0
    stopped = read_events(consumer_log, "consumer_stopped")
    assert [e["client_id"] for e in stopped] == [client_id]
    consumed = read_events(consumer_log, "message_consumed")
    assert all(e["mode"] == "CONCURRENTLY" and e["started_ms"] <= e["ts_ms"] for e in consumed)
    # the graceful shutdown unregistered the client: the broker logged it
    await wait_until(
        lambda: any(e["client_id"] == client_id for e in cluster.events("consumer_unregistered")),
        5,
        "unregister",
    )


async def test_cli_errors_are_clear(cluster: Cluster) -> None:
    await cluster.start_broker(auto_create_topic=False)
    bad_strategy = await spawn(
        "rmqlab.client.consumer_main",
        "--namesrv",
        cluster.namesrv,
        "--group",
        "g",
        "--topic",
        "T",
        "--strategy",
        "NOPE",
    )
    producer = await spawn(
        "rmqlab.client.producer_main", "--namesrv", cluster.namesrv, "--topic", "Missing",
        "--rate", "100", "--count", "2", "--time-scale", str(cluster.scale),
    )  # fmt: skip
    async with asyncio.timeout(20):
        _, err1 = await bad_strategy.communicate()
        _, err2 = await producer.communicate()
    assert bad_strategy.returncode == 2 and b"unknown allocation strategy" in err1
    assert producer.returncode == 1 and b"2 of 2 sends failed" in err2 and b"no route info" in err2


async def test_hung_listener_signal_under_pop(cluster: Cluster, tmp_path: Path) -> None:
    """SIGUSR1 hangs rmq-consumer's listener (the process lives on and heartbeats); under POP its
    in-flight messages come back to the group after their invisible time; SIGUSR2 releases it."""
    broker = await cluster.start_broker(default_message_request_mode="POP")
    await cluster.create_topic("T", 2)
    log = tmp_path / "consumer-1.jsonl"
    proc = await spawn(
        "rmqlab.client.consumer_main",
        "--namesrv", cluster.namesrv, "--time-scale", str(cluster.scale),
        "--group", "g", "--topic", "T", "--consume-from", "first", "--rocketmq5",
        "--set", "client_rebalance=false", "--set", "pop_invisible_time=5000",
        "--node", "consumer-1", "--log-file", str(log),
    )  # fmt: skip
    try:
        async with asyncio.timeout(15):
            assert proc.stdout is not None
            assert (await proc.stdout.readline()).startswith(b"READY ")
        proc.send_signal(signal.SIGUSR1)
        await wait_until(lambda: read_events(log, "listener_hung"), 5, "the hang")
        producer = cluster.producer()
        await producer.start()
        sent = [(await producer.send("T", b"x%d" % i)).msg_id for i in range(4)]
        await wait_until(lambda: broker.pop_state.in_flight() == 4, 10, "the hung consumer pops")
        survivor = cluster.consumer("g", "survivor", **{**FIVE_OPTIONS})
        survivor.subscribe("T")
        survivor.register_message_listener(lambda msgs: None)
        await survivor.start()
        # the hung one holds only its in-flight messages, for their invisible time (5 s, scaled)
        await wait_until(
            lambda: set(sent) <= {e["msg_id"] for e in cluster.events("message_consumed")}, 20, "revived"
        )
        assert not read_events(log, "message_consumed")
        assert proc.returncode is None  # alive all along
        proc.send_signal(signal.SIGUSR2)
        await wait_until(lambda: read_events(log, "listener_released"), 5, "the release")
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
        async with asyncio.timeout(15):
            await proc.wait()
    assert proc.returncode == 0


FIVE_OPTIONS = {
    "rebalance_retry_when_unbalanced": True,
    "pull_request_dispatch_delay": 500,
    "client_rebalance": False,
    "consume_from_where": "first",
    "pop_invisible_time": 5000,
}
