"""Testing a consumer's idempotency and ordering under rebalance with the ``rmqlab`` pytest plugin,
written the way a user of the plugin writes it: the fixtures come from the installed plugin."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow


def apply_orders(msgs):  # the code under test: runs inside each consumer process
    with open(os.environ["ORDERS_FILE"], "a", encoding="utf-8") as f:
        for m in msgs:
            f.write(json.dumps({"msg_id": m.msg_id, "queue": f"{m.broker_name}:{m.queue_id}"}) + "\n")


def test_every_order_is_applied_despite_a_consumer_crash(rmq_lab, tmp_path: Path) -> None:
    applied = tmp_path / "applied.jsonl"
    rmq_lab.start_broker()
    rmq_lab.create_topic("Orders", queues=8)
    nodes = rmq_lab.start_consumers(
        "GID_orders", "Orders", count=3, listener=apply_orders, env={"ORDERS_FILE": str(applied)}
    )
    rmq_lab.wait_converged("GID_orders")

    producer = rmq_lab.produce("Orders", 400, rate=200, wait=False)
    rmq_lab.wait_for(lambda: len(rmq_lab.consumed("GID_orders")) >= 60, 30, "the first orders")
    rmq_lab.kill(nodes[1])  # a crash in the middle of the stream
    rmq_lab.wait_converged("GID_orders")
    sent = rmq_lab.wait_produced(producer)
    rmq_lab.wait_consumed("GID_orders", sent)

    rmq_lab.assert_no_loss("GID_orders", sent)
    applied_ids = [json.loads(line)["msg_id"] for line in applied.read_text().splitlines()]
    assert set(applied_ids) >= set(sent)  # our listener saw every order, some perhaps twice
    assert set(rmq_lab.duplicates("GID_orders")) <= set(sent)
    [kill] = rmq_lab.events("nemesis", action="kill")
    assert kill["target"] == nodes[1] and kill["group"] == "GID_orders"


def test_orderly_group_keeps_queue_order_through_a_pause_and_a_restart(rmq_lab) -> None:
    rmq_lab.start_broker(in_process=True)
    rmq_lab.create_topic("Ledger", queues=4)
    first, second = rmq_lab.start_consumers("GID_ledger", "Ledger", count=2, orderly=True)
    rmq_lab.wait_converged("GID_ledger")
    rmq_lab.pause(first)
    sent = rmq_lab.produce("Ledger", 200, rate=500)
    rmq_lab.resume(first)
    rmq_lab.restart(second)
    rmq_lab.wait_converged("GID_ledger")
    rmq_lab.wait_consumed("GID_ledger", sent)
    rmq_lab.assert_no_loss("GID_ledger", sent)
    rmq_lab.assert_ordered("GID_ledger")
    assert {e["mode"] for e in rmq_lab.consumed("GID_ledger")} == {"ORDERLY"}
    assert len(rmq_lab.live_consumers("GID_ledger")) == 2
