"""Live metrics on --metrics-port: RocketMQ 5's names on the broker and the name server, a consumer's
own, and a group's lag that rises while a member is frozen and falls once it is killed and the group
takes its queues over."""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from rmqlab.chaos.pytest_plugin import RmqLab
from rmqlab.protocol.event_log import EventLog
from rmqlab.protocol.metrics import ConsumerMetrics

Samples = dict[str, list[tuple[dict[str, str], float]]]


def scrape(addr: str) -> Samples:
    with urllib.request.urlopen(f"http://{addr}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def value(samples: Samples, name: str, **labels: str) -> float:
    return sum(v for lab, v in samples.get(name, []) if all(lab.get(k) == x for k, x in labels.items()))


def wait_until(what: str, check: Callable[[], bool], timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def metrics_addr(ready_info: str | None) -> str:
    words = (ready_info or "").split()
    return next(w.removeprefix("metrics=") for w in words if w.startswith("metrics="))


@pytest.mark.slow
def test_a_groups_lag_rises_while_a_member_is_frozen_and_falls_once_it_is_killed(tmp_path: Path) -> None:
    with RmqLab(tmp_path / "run", time_scale=0.05) as lab:
        lab.start_broker(extra_args=["--metrics-port", "0"])
        addr = metrics_addr(lab.sup.member("broker-a").ready_info)
        lab.create_topic("T", queues=4)
        lab.start_consumers("g", "T", count=2)
        lab.wait_converged("g")
        assert value(scrape(addr), "rocketmq_consumer_connections", consumer_group="g") == 2
        producer = lab.produce("T", 1500, rate=150, wait=False)
        assert isinstance(producer, str)
        lab.pause("consumer-1")  # still a member (heartbeats stopped, channel not yet expired): lag grows
        wait_until(
            "the group's lag to rise",
            lambda: (
                value(scrape(addr), "rocketmq_consumer_lag_messages", consumer_group="g", topic="T") >= 100
            ),
        )
        lab.kill("consumer-1")  # its connection closes: the broker notifies, the survivor takes over
        sent = lab.wait_produced(producer, timeout_s=120)
        wait_until(
            "the group's lag to fall to nothing",
            lambda: value(scrape(addr), "rocketmq_consumer_lag_messages", consumer_group="g", topic="T") == 0,
            timeout_s=120,
        )
        after = scrape(addr)
        assert value(after, "rocketmq_consumer_connections", consumer_group="g") == 1
        assert value(after, "rocketmq_messages_in_total", topic="T") >= len(sent)
        assert value(after, "rocketmq_messages_out_total", topic="T", consumer_group="g") >= len(sent)
        assert value(after, "rocketmq_rpc_latency_count", request_code="11", node_type="broker") > 0
        assert {lab_["node_id"] for lab_, _ in after["rocketmq_consumer_lag_messages"]} == {"broker-a"}


@pytest.mark.slow
def test_the_name_server_counts_its_live_brokers(tmp_path: Path) -> None:
    def start(*argv: str) -> tuple[subprocess.Popen[str], str]:
        proc = subprocess.Popen([sys.executable, "-m", *argv], stdout=subprocess.PIPE, text=True)
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("READY "), line
        return proc, line[len("READY ") :].strip()

    ns, ns_ready = start(
        "rmqlab.broker.namesrv_main",
        "--port",
        "0",
        "--metrics-port",
        "0",
        "--time-scale",
        "0.05",
        "--log-file",
        str(tmp_path / "ns.jsonl"),
    )
    broker = None
    try:
        addr = metrics_addr(ns_ready)
        assert value(scrape(addr), "active_broker_num", node_type="nameserver") == 0
        broker, _ = start(
            "rmqlab.broker",
            "--port",
            "0",
            "--namesrv",
            ns_ready.split()[0],
            "--time-scale",
            "0.05",
            "--log-file",
            str(tmp_path / "b.jsonl"),
        )
        wait_until("the broker to register", lambda: value(scrape(addr), "active_broker_num") == 1)
    finally:
        for proc in (broker, ns):
            if proc is not None:
                proc.terminate()
                proc.wait(timeout=30)


def test_a_consumers_metrics_come_from_its_own_events() -> None:
    registry = CollectorRegistry()
    log = EventLog.null("consumer-1", "consumer")
    log.listeners.append(ConsumerMetrics(registry).on_event)
    common = {"group": "g", "topic": "T", "client_id": "c1"}
    log.emit("rebalance", **common, allocated=["b:0"], changed=True)
    log.emit("rebalance", **common, allocated=["b:0"], changed=False)
    log.emit("message_consumed", **common, msg_id="m", started_ms=1000, ts_ms=1004, mode="CONCURRENTLY")
    text = generate_latest(registry).decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    rebalances = {
        s.labels["changed"]: s.value
        for s in families["rmqlab_consumer_rebalances"].samples
        if s.name.endswith("_total")
    }
    assert rebalances == {"true": 1.0, "false": 1.0}
    process = {s.name: s.value for s in families["rocketmq_process_time"].samples}
    assert process["rocketmq_process_time_count"] == 1 and process["rocketmq_process_time_sum"] == 4
