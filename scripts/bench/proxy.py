"""rmq-proxy benchmark: messages/s sent, received and acked through the gRPC endpoint, against the same
work done directly on the broker's msgpack port (the requests the proxy itself makes).

A broker and rmq-proxy run as their own processes; the load runs in this process, one call in flight.
Each round sends ``--messages`` messages one by one, then receives and acks them in batches of 32 (one
ACK per message), first straight to the broker (SEND_MESSAGE, POP_MESSAGE, ACK_MESSAGE), then through
the proxy (SendMessage, ReceiveMessage, AckMessage). Prints one JSON document: messages/s of each path,
the CPU seconds (user + system) of the broker, the proxy and this process, and the ratio proxy/direct.
Needs the [v5] extra.

    python scripts/bench/proxy.py [--messages 2000]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from rmqlab.protocol.codes import RequestCode, ResponseCode
from rmqlab.protocol.command import RemotingCommand
from rmqlab.protocol.model import ConsumerData, HeartbeatData, SubscriptionData
from rmqlab.protocol.pop_receipt import PROPERTY_POP_CK, ExtraInfo
from rmqlab.protocol.remoting import RemotingClient
from rmqlab.proxy.v5 import Code, MessagingServiceStub, aio, pb, svc

REPO = Path(__file__).resolve().parents[2]

CLK_TCK = os.sysconf("SC_CLK_TCK")
BATCH = 32


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def self_cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def start(argv: list[str]) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=REPO)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line.startswith("READY"):
        proc.kill()
        raise SystemExit(f"{argv[2]} did not start: {line!r}")
    return proc, line.split()[1]


async def direct_round(rc: RemotingClient, broker: str, topic: str, group: str, n: int) -> None:
    for i in range(n):
        ext = {"producerGroup": "bench", "topic": topic, "queueId": i % 4, "bornTimestamp": 0}
        resp = await rc.invoke(
            broker, RemotingCommand.request(RequestCode.SEND_MESSAGE, ext, {"body": b"x" * 64}), 5
        )
        assert resp.code == ResponseCode.SUCCESS, resp.remark
    got = 0
    while got < n:
        ext = {
            "consumerGroup": group,
            "topic": topic,
            "queueId": -1,
            "maxMsgNums": BATCH,
            "invisibleTime": 60_000,
            "pollTime": 1000,
            "bornTime": int(time.time() * 1000),
            "initMode": 0,
        }
        resp = await rc.invoke(broker, RemotingCommand.request(RequestCode.POP_MESSAGE, ext), 5)
        for m in (resp.body or {}).get("messages", []) if resp.code == ResponseCode.SUCCESS else []:
            receipt = m["properties"][PROPERTY_POP_CK]
            info = ExtraInfo.parse(receipt)
            ack = {
                "consumerGroup": group,
                "topic": topic,
                "queueId": info.queue_id,
                "extraInfo": receipt,
                "offset": info.queue_offset,
            }
            a = await rc.invoke(broker, RemotingCommand.request(RequestCode.ACK_MESSAGE, ack), 5)
            assert a.code == ResponseCode.SUCCESS, a.remark
            got += 1


async def proxy_round(stub: Any, meta: Any, topic: str, group: str, n: int) -> None:
    for i in range(n):
        m = pb.Message(topic=pb.Resource(name=topic), body=b"x" * 64)
        m.system_properties.message_id = f"bench-{time.monotonic_ns()}-{i}"
        resp = await stub.SendMessage(svc.SendMessageRequest(messages=[m]), metadata=meta)
        assert resp.status.code == Code.OK, resp.status
    got = 0
    while got < n:
        req = svc.ReceiveMessageRequest(
            group=pb.Resource(name=group),
            message_queue=pb.MessageQueue(
                topic=pb.Resource(name=topic), id=-1, broker=pb.Broker(name="broker-a")
            ),
            batch_size=BATCH,
        )
        req.invisible_duration.seconds = 60
        req.long_polling_timeout.seconds = 5
        msgs = [
            r.message
            async for r in stub.ReceiveMessage(req, metadata=meta, timeout=20)
            if r.WhichOneof("content") == "message"
        ]
        for msg in msgs:
            ack = svc.AckMessageRequest(group=pb.Resource(name=group), topic=pb.Resource(name=topic))
            ack.entries.add(
                message_id=msg.system_properties.message_id,
                receipt_handle=msg.system_properties.receipt_handle,
            )
            a = await stub.AckMessage(ack, metadata=meta)
            assert a.status.code == Code.OK, a.status
            got += 1


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    py = sys.executable
    broker, baddr = start(
        [py, "-m", "rmqlab.broker", "--port", "0", "--create-topic", "BD:4", "--create-topic", "BP:4"]
    )
    proxy, paddr = start([py, "-m", "rmqlab.proxy", "--namesrv", baddr, "--port", "0"])
    rc = RemotingClient()
    channel = aio.insecure_channel(paddr)
    try:
        hb = HeartbeatData(
            "bench@direct",
            consumer_data_set=[
                ConsumerData("GD", subscription_data_set=[SubscriptionData.build("BD", "*", 0)])
            ],
        )
        await rc.invoke(baddr, RemotingCommand.request(RequestCode.HEART_BEAT, body=hb.to_wire()), 5)
        stub = MessagingServiceStub(channel)
        meta = (("x-mq-client-id", "bench@proxy"), ("x-mq-client-version", "5.1.2"))
        settings = pb.Settings(client_type=pb.SIMPLE_CONSUMER)
        settings.subscription.group.name = "GP"
        settings.subscription.subscriptions.add().topic.name = "BP"
        call = stub.Telemetry(iter([svc.TelemetryCommand(settings=settings)]), metadata=meta)
        await call.read()
        out: dict[str, Any] = {}
        for name, run in (
            ("direct", lambda: direct_round(rc, baddr, "BD", "GD", args.messages)),
            ("proxy", lambda: proxy_round(stub, meta, "BP", "GP", args.messages)),
        ):
            b0, p0, s0, t0 = cpu_s(broker.pid), cpu_s(proxy.pid), self_cpu_s(), time.perf_counter()
            await run()
            wall = time.perf_counter() - t0
            out[name] = {
                "messages": args.messages,
                "wall_s": round(wall, 3),
                "messages_per_s": round(args.messages / wall, 1),
                "cpu_s": {
                    "broker": round(cpu_s(broker.pid) - b0, 2),
                    "proxy": round(cpu_s(proxy.pid) - p0, 2),
                    "load": round(self_cpu_s() - s0, 2),
                },
            }
        out["ratio_proxy_over_direct"] = round(
            out["proxy"]["messages_per_s"] / out["direct"]["messages_per_s"], 3
        )
        return out
    finally:
        await channel.close()
        await rc.close()
        for p in (proxy, broker):
            p.terminate()
            p.wait(10)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--messages", type=int, default=2000)
    args = ap.parse_args()
    result = asyncio.run(main_async(args))
    result["machine"] = {
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "load_avg": os.getloadavg(),
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
