"""SIGKILL a durable broker again and again under load; count what it had acknowledged and then lost.

Each cycle starts ``python -m rmqlab.broker --store-dir DIR`` on the same directory, checks that every
consumer offset it acknowledged before is still there (an offset read back must be at least the last
one acknowledged: commits only grow), then sends messages and commits offsets from several pipelined
connections until a random moment (``--min-ms``..``--max-ms``) when the broker is killed with SIGKILL.
At the end one more start reads every queue back and compares each acknowledged message (queue,
offset, body) with what is stored. Prints one JSON document:

    cycles, acknowledged_messages, lost_messages, changed_messages, acknowledged_commits,
    lost_offsets, restart_ms {p50, p99, max} (spawn to READY), seconds

Exit status 1 when anything acknowledged was lost.

    python scripts/crash_cycles.py --cycles 100 [--seed 1]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rmqlab.protocol.codes import RequestCode, ResponseCode
from rmqlab.protocol.command import RemotingCommand
from rmqlab.protocol.remoting import RemotingClient, RemotingError

REPO = Path(__file__).resolve().parents[1]

TOPIC = "CrashTopic"
GROUP = "crash_group"
QUEUES = 4
SENDERS = 4


class Broker:
    def __init__(self, store: str) -> None:
        self.store = store
        self.proc: asyncio.subprocess.Process | None = None
        self.addr = ""

    async def start(self) -> float:
        t0 = time.perf_counter()
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "rmqlab.broker", "--port", "0", "--store-dir", self.store,
            "--create-topic", f"{TOPIC}:{QUEUES}",
            cwd=REPO, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL,
        )  # fmt: skip
        assert self.proc.stdout is not None
        async with asyncio.timeout(60):
            line = (await self.proc.stdout.readline()).decode()
        if not line.startswith("READY "):
            raise SystemExit(f"crash_cycles: the broker did not start: {line!r}")
        self.addr = line.split()[1]
        return (time.perf_counter() - t0) * 1000

    async def kill(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.send_signal(signal.SIGKILL)
            await self.proc.wait()


class Ledger:
    """What the broker acknowledged: messages by (queue, offset) and the last commit per queue."""

    def __init__(self) -> None:
        self.messages: dict[tuple[int, int], bytes] = {}
        self.commits: dict[int, int] = {}
        self.acked_commits = 0
        self.next_commit = dict.fromkeys(range(QUEUES), 0)


async def load(addr: str, ledger: Ledger, rng: random.Random, stop: asyncio.Event, serial: list[int]) -> None:
    client = RemotingClient(connect_timeout_s=2.0)

    async def sender(n: int) -> None:
        while not stop.is_set():
            serial[0] += 1
            body = f"{n}:{serial[0]}:{rng.random()}".encode()
            qid = rng.randrange(QUEUES)
            ext = {
                "producerGroup": "pg",
                "topic": TOPIC,
                "queueId": qid,
                "bornTimestamp": int(time.time() * 1000),
            }
            try:
                resp = await client.invoke(
                    addr, RemotingCommand.request(RequestCode.SEND_MESSAGE, ext, {"body": body}), 5.0
                )
            except (RemotingError, OSError):
                return
            if resp.code == ResponseCode.SUCCESS:
                ledger.messages[(resp.ext["queueId"], resp.ext["queueOffset"])] = body

    async def committer() -> None:
        while not stop.is_set():
            qid = rng.randrange(QUEUES)
            ledger.next_commit[qid] += rng.randint(1, 5)
            offset = ledger.next_commit[qid]
            ext = {"consumerGroup": GROUP, "topic": TOPIC, "queueId": qid, "commitOffset": offset}
            try:
                resp = await client.invoke(
                    addr, RemotingCommand.request(RequestCode.UPDATE_CONSUMER_OFFSET, ext), 5.0
                )
            except (RemotingError, OSError):
                return
            if resp.code == ResponseCode.SUCCESS:
                ledger.commits[qid] = max(ledger.commits.get(qid, 0), offset)
                ledger.acked_commits += 1

    try:
        async with asyncio.TaskGroup() as tg:
            for n in range(SENDERS):
                tg.create_task(sender(n))
            tg.create_task(committer())
    finally:
        await client.close()


async def lost_offsets(addr: str, ledger: Ledger) -> int:
    client = RemotingClient()
    lost = 0
    try:
        for qid, acked in ledger.commits.items():
            ext = {"consumerGroup": GROUP, "topic": TOPIC, "queueId": qid, "setZeroIfNotFound": False}
            resp = await client.invoke(
                addr, RemotingCommand.request(RequestCode.QUERY_CONSUMER_OFFSET, ext), 10
            )
            if resp.code != ResponseCode.SUCCESS or resp.ext.get("offset", -1) < acked:
                lost += 1
    finally:
        await client.close()
    return lost


async def read_back(addr: str) -> dict[tuple[int, int], bytes]:
    client = RemotingClient()
    stored: dict[tuple[int, int], bytes] = {}
    try:
        hb = {
            "clientID": "crash-reader",
            "consumerDataSet": [
                {"groupName": "crash_reader", "subscriptionDataSet": [{"topic": TOPIC, "subString": "*"}]}
            ],
        }
        await client.invoke(addr, RemotingCommand.request(RequestCode.HEART_BEAT, body=hb), 10)
        for qid in range(QUEUES):
            offset = 0
            while True:
                ext = {
                    "consumerGroup": "crash_reader", "topic": TOPIC, "queueId": qid, "queueOffset": offset,
                    "maxMsgNums": 32, "commitOffset": 0, "suspendTimeoutMillis": 0, "subVersion": 0,
                }  # fmt: skip
                resp = await client.invoke(addr, RemotingCommand.request(RequestCode.PULL_MESSAGE, ext), 10)
                if resp.code != ResponseCode.SUCCESS or not resp.body or not resp.body.get("messages"):
                    break
                for m in resp.body["messages"]:
                    stored[(qid, m["queueOffset"])] = m["body"]
                offset = resp.ext["nextBeginOffset"]
    finally:
        await client.close()
    return stored


def pct(vals: list[float], q: float) -> float:
    s = sorted(vals)
    return round(s[min(len(s) - 1, int(q * (len(s) - 1)))], 1) if s else float("nan")


async def run(args: argparse.Namespace) -> dict[str, Any]:
    rng = random.Random(args.seed)
    store = tempfile.mkdtemp(prefix="crash-store-")
    ledger = Ledger()
    restarts: list[float] = []
    offsets_lost = 0
    serial = [0]
    t0 = time.monotonic()
    try:
        for _ in range(args.cycles):
            broker = Broker(store)
            restarts.append(await broker.start())
            offsets_lost += await lost_offsets(broker.addr, ledger)
            stop = asyncio.Event()
            task = asyncio.create_task(load(broker.addr, ledger, rng, stop, serial))
            await asyncio.sleep(rng.uniform(args.min_ms, args.max_ms) / 1000)
            await broker.kill()  # mid-load, with requests in flight
            stop.set()
            await task
        broker = Broker(store)
        restarts.append(await broker.start())
        offsets_lost += await lost_offsets(broker.addr, ledger)
        stored = await read_back(broker.addr)
        await broker.kill()
    finally:
        shutil.rmtree(store, ignore_errors=True)
    lost = sum(1 for key in ledger.messages if key not in stored)
    changed = sum(1 for key, body in ledger.messages.items() if key in stored and stored[key] != body)
    return {
        "cycles": args.cycles,
        "acknowledged_messages": len(ledger.messages),
        "lost_messages": lost,
        "changed_messages": changed,
        "stored_messages": len(stored),
        "acknowledged_commits": ledger.acked_commits,
        "lost_offsets": offsets_lost,
        "restart_ms": {"p50": pct(restarts, 0.5), "p99": pct(restarts, 0.99), "max": pct(restarts, 1.0)},
        "seconds": round(time.monotonic() - t0, 1),
        "seed": args.seed,
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cycles", type=int, default=10, help="SIGKILL/restart cycles (default 10)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--min-ms", type=int, default=200, help="shortest load before the kill (ms)")
    p.add_argument("--max-ms", type=int, default=1500, help="longest load before the kill (ms)")
    args = p.parse_args()
    if args.cycles <= 0 or not 0 < args.min_ms <= args.max_ms:
        p.error("--cycles must be positive and 0 < --min-ms <= --max-ms")
    result = asyncio.run(run(args))
    print(json.dumps(result, indent=2))
    bad = result["lost_messages"] or result["changed_messages"] or result["lost_offsets"]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
