"""Name server with two brokers, ``python -m rmqlab.broker`` as a process, and durability across SIGKILL."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from kit import wait_until
from kit.broker import RecordingLog

from rmqlab.broker.controller import BrokerController
from rmqlab.broker.namesrv import NamesrvController
from rmqlab.broker.server_config import BrokerConfig, NamesrvConfig
from rmqlab.protocol.codes import RequestCode, ResponseCode
from rmqlab.protocol.remoting import RemotingError

REPO = Path(__file__).resolve().parents[2]


async def route(peer, topic: str):
    resp = await peer.call(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": topic})
    if resp.code != ResponseCode.SUCCESS:
        return resp.code
    return sorted((b["brokerName"], b["brokerAddrs"]["0"]) for b in resp.body["brokerDatas"])


async def test_two_brokers_behind_one_name_server(make_peer):
    ns = NamesrvController(NamesrvConfig(port=0, time_scale=0.01), log=RecordingLog())
    await ns.start()
    brokers = []
    try:
        for name in ("broker-a", "broker-b"):
            b = BrokerController(
                BrokerConfig(port=0, broker_name=name, namesrv=ns.address, time_scale=0.01),
                log=RecordingLog(),
            )
            await b.start()
            brokers.append(b)
        client = make_peer(ns.address)
        assert await route(client, "T") == ResponseCode.TOPIC_NOT_EXIST
        for b in brokers:
            assert (await make_peer(b.address).send("T")).code == ResponseCode.SUCCESS
        expected = sorted((b.config.broker_name, b.broker_addr) for b in brokers)

        async def both():
            return await route(client, "T") == expected

        for _ in range(100):
            if await both():
                break
            await asyncio.sleep(0.05)
        assert await both()
        resp = await client.ok(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "T"})
        assert {q["brokerName"]: q["writeQueueNums"] for q in resp.body["queueDatas"]} == {
            "broker-a": 4,
            "broker-b": 4,
        }
        # the group is registered on every broker; any one of them answers the consumer list
        for cid in ("C1", "C2"):
            for b in brokers:
                await make_peer(b.address).heartbeat(cid)
        for b in brokers:
            lst = await make_peer(b.address).ok(
                RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": "g"}
            )
            assert sorted(lst.body["consumerIdList"]) == ["C1", "C2"]
        # a broker that goes away leaves the route
        await brokers[1].shutdown()
        for _ in range(100):
            if await route(client, "T") == expected[:1]:
                break
            await asyncio.sleep(0.05)
        assert await route(client, "T") == expected[:1]
        assert ns.log.of("broker_unregistered", broker="broker-b")
    finally:
        for b in brokers:
            await b.shutdown()
        await ns.shutdown()


class Proc:
    """A role started as ``python -m <module>`` that announced ``READY host:port``."""

    def __init__(self, proc: asyncio.subprocess.Process, addr: str) -> None:
        self.proc = proc
        self.addr = addr

    async def stop(self, sig: int = signal.SIGTERM) -> int:
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(sig)
        async with asyncio.timeout(10):
            return await self.proc.wait()


async def test_a_read_only_broker_registers_its_topics_without_write_permission(make_peer):
    """brokerPermission 4 (maintenance): the name server routes the broker's topics readable only, so
    producers leave it out (TopicRouteData's publish queues) and consumers still divide its queues."""
    from rmqlab.protocol.route import PERM_READ, PERM_WRITE, TopicRouteData

    ns = NamesrvController(NamesrvConfig(port=0, time_scale=0.01), log=RecordingLog())
    await ns.start()
    brokers = []
    try:
        for name, perm in (("broker-a", PERM_READ | PERM_WRITE), ("broker-b", PERM_READ)):
            cfg = BrokerConfig(port=0, broker_name=name, namesrv=ns.address, time_scale=0.01)
            b = BrokerController(replace(cfg, broker_permission=perm), log=RecordingLog())
            await b.start()
            brokers.append(b)
            assert (await make_peer(b.address).send("T")).code == ResponseCode.SUCCESS
        client = make_peer(ns.address)

        async def perms() -> dict[str, int]:
            resp = await client.call(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "T"})
            if resp.code != ResponseCode.SUCCESS:
                return {}
            return {q["brokerName"]: q["perm"] for q in resp.body["queueDatas"]}

        for _ in range(100):
            if len(await perms()) == 2:
                break
            await asyncio.sleep(0.05)
        assert await perms() == {"broker-a": PERM_READ | PERM_WRITE, "broker-b": PERM_READ}
        resp = await client.ok(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "T"})
        route = TopicRouteData.from_wire(resp.body)
        assert {mq.broker_name for mq in route.publish_queues("T")} == {"broker-a"}
        assert {mq.broker_name for mq in route.subscribe_queues("T")} == {"broker-a", "broker-b"}
    finally:
        for b in brokers:
            await b.shutdown()
        await ns.shutdown()


async def start_proc(module: str, *args: str) -> Proc:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", module, "--host", "127.0.0.1", "--port", "0", *args,
        cwd=REPO, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        async with asyncio.timeout(20):
            line = (await proc.stdout.readline()).decode()
    except TimeoutError:
        proc.kill()
        raise
    if not line.startswith("READY "):
        proc.kill()
        err = (await proc.stderr.read()).decode()
        raise AssertionError(f"{module} did not start: {line!r} {err}")
    return Proc(proc, line.split()[1])


@pytest.fixture
async def procs():
    started: list[Proc] = []

    async def start(module: str, *args: str) -> Proc:
        p = await start_proc(module, *args)
        started.append(p)
        return p

    yield start
    for p in started:
        await p.stop(signal.SIGKILL)


async def test_namesrv_and_two_broker_processes(procs, make_peer, tmp_path):
    ns = await procs(
        "rmqlab.broker.namesrv_main", "--time-scale", "0.01", "--log-file", str(tmp_path / "ns.jsonl")
    )
    a = await procs("broker", "--namesrv", ns.addr, "--broker-name", "broker-a", "--time-scale", "0.01")
    b = await procs("broker", "--namesrv", ns.addr, "--broker-name", "broker-b", "--time-scale", "0.01")
    for p in (a, b):
        assert (await make_peer(p.addr).send("T")).code == ResponseCode.SUCCESS
    client = make_peer(ns.addr)
    want = sorted([("broker-a", a.addr), ("broker-b", b.addr)])
    for _ in range(200):
        if await route(client, "T") == want:
            break
        await asyncio.sleep(0.05)
    assert await route(client, "T") == want
    assert await b.stop(signal.SIGTERM) == 0
    for _ in range(200):
        if await route(client, "T") == want[:1]:
            break
        await asyncio.sleep(0.05)
    assert await route(client, "T") == want[:1]
    assert await ns.stop() == 0
    log = (tmp_path / "ns.jsonl").read_text()
    assert '"event":"broker_registered"' in log and '"role":"namesrv"' in log


async def test_sync_master_and_slave_processes(procs, make_peer):
    ns = await procs("rmqlab.broker.namesrv_main", "--time-scale", "0.01")
    common = ("--namesrv", ns.addr, "--time-scale", "0.01")
    master = await procs("broker", *common, "--broker-role", "SYNC_MASTER")
    slave = await procs(
        "broker", *common, "--broker-id", "1", "--broker-role", "SLAVE", "--node", "broker-a-s1"
    )

    async def status(p: Proc) -> dict:
        return (await make_peer(p.addr).ok(RequestCode.ADMIN_BROKER_STATUS)).body

    await wait_until_async(lambda: status(master), lambda s: s["haSlaves"] == 1)
    resp = await make_peer(master.addr).send("T")
    assert resp.code == ResponseCode.SUCCESS  # acknowledged: the slave holds it
    assert (await status(slave))["messages"] == 1
    await master.stop(signal.SIGKILL)
    # the name server forgets the killed master; the slave's next registration names no master
    await wait_until_async(lambda: status(slave), lambda s: s["masterAddr"] is None)


async def wait_until_async(fetch, pred, tries: int = 400) -> None:
    for _ in range(tries):
        if pred(await fetch()):
            return
        await asyncio.sleep(0.025)
    raise AssertionError("condition not reached")


async def test_slave_flags_that_do_not_fit_stop_the_broker():
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "rmqlab.broker", "--port", "0", "--broker-role", "SLAVE", cwd=REPO,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await proc.communicate()
    assert proc.returncode == 2 and b"READY" not in out
    assert b"broker id 0 does not fit role SLAVE" in err


async def test_broker_cli_rejects_bad_flags():
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "rmqlab.broker", "--time-scale", "0", cwd=REPO,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    _, err = await proc.communicate()
    assert proc.returncode == 2 and b"--time-scale" in err


async def test_broker_cli_reports_an_unusable_store_dir(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "rmqlab.broker", "--port", "0", "--store-dir", str(blocker / "store"), cwd=REPO,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await proc.communicate()
    assert proc.returncode == 2 and b"READY" not in out
    assert b"cannot start" in err and b"Not a directory" in err


async def test_durability_across_sigkill(procs, make_peer, tmp_path):
    store = str(tmp_path / "store")
    log_file = tmp_path / "broker.jsonl"
    args = ("--store-dir", store, "--time-scale", "0.01", "--log-file", str(log_file))
    b1 = await procs("broker", *args)
    p = make_peer(b1.addr)
    await p.heartbeat("C")
    await p.ok(
        RequestCode.UPDATE_AND_CREATE_TOPIC,
        {"topic": "U", "readQueueNums": 2, "writeQueueNums": 2, "perm": 6},
    )
    first = [await p.send("T", f"m{i}".encode()) for i in range(10)]
    q = {"consumerGroup": "g", "topic": "T", "queueId": 0}
    await p.oneway(RequestCode.UPDATE_CONSUMER_OFFSET, {**q, "commitOffset": 7})
    await p.pull("T", 10, commitOffset=3, queue_id=1)  # pull commitOffset on queue 1, answered
    await p.ok(RequestCode.GET_MAX_OFFSET, {"topic": "T", "queueId": 0})  # answered after the one-way

    # many sends in flight on another connection while the broker is killed
    flood = make_peer(b1.addr)
    acked: list[tuple[int, int, str]] = []

    async def send_one(i: int) -> None:
        try:
            resp = await flood.send("T", f"f{i}".encode(), queue_id=2)
        except RemotingError:
            return
        if resp.code == ResponseCode.SUCCESS:
            acked.append((resp.ext["queueOffset"], i, resp.ext["msgId"]))

    tasks = [asyncio.create_task(send_one(i)) for i in range(400)]
    await wait_until(lambda: len(acked) >= 50, within=10)
    b1.proc.send_signal(signal.SIGKILL)
    await asyncio.gather(*tasks, return_exceptions=True)
    await b1.stop(signal.SIGKILL)
    await p.close()
    await flood.close()
    assert acked

    b2 = await procs("broker", *args)
    p2 = make_peer(b2.addr)
    await p2.heartbeat("C")
    msgs = (await p2.pull("T", 0)).body["messages"]
    assert [m["msgId"] for m in msgs] == [r.ext["msgId"] for r in first]
    assert [m["body"] for m in msgs] == [f"m{i}".encode() for i in range(10)]
    assert (await p2.ok(RequestCode.QUERY_CONSUMER_OFFSET, q)).ext["offset"] == 7
    assert (await p2.ok(RequestCode.QUERY_CONSUMER_OFFSET, {**q, "queueId": 1})).ext["offset"] == 3
    resp = await p2.ok(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "U"})
    assert resp.body["queueDatas"][0]["readQueueNums"] == 2
    # every acknowledged send of the flood is there, at the offset and with the id it was acknowledged with
    stored: dict[int, tuple[bytes, str]] = {}
    offset = 0
    while True:
        resp = await p2.pull("T", offset, queue_id=2)
        if resp.code != ResponseCode.SUCCESS:
            break
        for m in resp.body["messages"]:
            stored[m["queueOffset"]] = (m["body"], m["msgId"])
        offset = resp.ext["nextBeginOffset"]
    for off, i, msg_id in acked:
        assert stored[off] == (f"f{i}".encode(), msg_id)
    # ids stay unique after the restart and offsets continue
    again = await p2.send("T")
    assert again.ext["queueOffset"] == 10
    assert again.ext["msgId"] not in {r.ext["msgId"] for r in first} | {a[2] for a in acked}
    assert await b2.stop() == 0
    text = log_file.read_text()
    assert text.count('"event":"broker_started"') == 2 and '"event":"broker_stopped"' in text
    assert (tmp_path / "store" / "broker.db").is_file()


async def test_periodic_offset_flush_rolls_offsets_back_on_sigkill(procs, make_peer, tmp_path):
    """--flush-consumer-offset-interval: offsets are written as RocketMQ's flushConsumerOffsetInterval
    writes them (first after 10 s, then at the interval), so a SIGKILL loses the commits since the last
    flush; a graceful stop writes them."""
    log_file = tmp_path / "broker.jsonl"
    # at this scale the first flush comes 0.5 s after start and the next one 100 s later
    args = ("--store-dir", str(tmp_path / "store"), "--time-scale", "0.05", "--log-file", str(log_file),
            "--flush-consumer-offset-interval", "2000000")  # fmt: skip
    b1 = await procs("broker", *args)
    p = make_peer(b1.addr)
    await p.send("T")
    q = {"consumerGroup": "g", "topic": "T", "queueId": 0}
    await p.ok(RequestCode.UPDATE_CONSUMER_OFFSET, {**q, "commitOffset": 7})
    await wait_until(lambda: log_file.exists() and '"event":"offsets_flushed"' in log_file.read_text(), 10)
    await p.send("T")  # answered once its batch is on disk, so the flush queued before it is too
    await p.ok(RequestCode.UPDATE_CONSUMER_OFFSET, {**q, "commitOffset": 9})
    assert (await p.ok(RequestCode.QUERY_CONSUMER_OFFSET, q)).ext["offset"] == 9
    await p.close()
    await b1.stop(signal.SIGKILL)

    b2 = await procs("broker", *args)
    p2 = make_peer(b2.addr)
    assert (await p2.ok(RequestCode.QUERY_CONSUMER_OFFSET, q)).ext["offset"] == 7  # rolled back
    await p2.ok(RequestCode.UPDATE_CONSUMER_OFFSET, {**q, "commitOffset": 11})
    await p2.close()
    assert await b2.stop(signal.SIGTERM) == 0

    b3 = await procs("broker", *args)
    p3 = make_peer(b3.addr)
    assert (await p3.ok(RequestCode.QUERY_CONSUMER_OFFSET, q)).ext["offset"] == 11
