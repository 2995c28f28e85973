"""pipeline.pop_metrics on hand-worked event lists: a classic group and a POP group over the same
topic, a revive, a lost message, idle consumers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pipeline.pop_metrics import idle_ms, main, mode_metrics


def ev(ts: int, event: str, **f: Any) -> dict[str, Any]:
    """An event line with the fields EVENTS.md requires of its kind (so the run loader keeps it)."""
    if event == "message_consumed":
        f = {"queue_id": 0, "queue_offset": 0, "started_ms": ts, "mode": "CONCURRENTLY", **f}
    if event == "rebalance":
        f = {"strategy": "AVG", "changed": True, **f}
    return {"ts_ms": ts, "event": event, "node": f.pop("node", "n"), "role": f.pop("role", "consumer"), **f}


def run() -> list[dict[str, Any]]:
    return [
        ev(1000, "schedule_started", role="chaos", time_scale=0.5),
        ev(1000, "consumer_started", group="C", client_id="c1", node="consumer-1"),
        ev(1000, "consumer_started", group="C", client_id="c2", node="consumer-2"),
        ev(1000, "consumer_started", group="P", client_id="p1", node="consumer-3"),
        ev(1010, "rebalance", group="C", client_id="c1", topic="T", allocated=["b:0"], cid_all=["c1", "c2"]),
        # c2 gets nothing: idle from 1010 until it is killed at 1500
        ev(1010, "rebalance", group="C", client_id="c2", topic="T", allocated=[], cid_all=["c1", "c2"]),
        ev(1010, "rebalance", group="C", client_id="c1", topic="%RETRY%C", allocated=["b:0"], cid_all=["c1"]),
        ev(1020, "assignment", group="P", client_id="p1", topic="T", pull=[], pop=["b:-1"], changed=True),
        ev(
            1100,
            "message_sent",
            role="producer",
            msg_id="m1",
            topic="T",
            broker="b",
            queue_id=0,
            queue_offset=0,
        ),
        ev(
            1200,
            "message_sent",
            role="producer",
            msg_id="m2",
            topic="T",
            broker="b",
            queue_id=0,
            queue_offset=1,
        ),
        ev(
            1300,
            "message_consumed",
            group="C",
            client_id="c1",
            msg_id="m1",
            topic="T",
            broker="b",
            queue_id=0,
        ),
        ev(
            1400,
            "message_consumed",
            group="C",
            client_id="c1",
            msg_id="m1",
            topic="T",
            broker="b",
            queue_id=0,
        ),
        ev(1150, "message_popped", role="broker", group="P", msg_id="m1"),
        ev(1250, "message_popped", role="broker", group="P", msg_id="m2"),
        ev(3000, "message_revived", role="broker", group="P", msg_id="m1"),
        ev(3600, "message_consumed", group="P", client_id="p1", msg_id="m1", topic="%RETRY%P_T", broker="b"),
        ev(
            1300,
            "message_consumed",
            group="P",
            client_id="p1",
            msg_id="m2",
            topic="T",
            broker="b",
            queue_id=0,
        ),
        ev(
            1500,
            "nemesis",
            role="chaos",
            action="kill",
            target="consumer-2",
            target_role="consumer",
            group="C",
        ),
        ev(1600, "invisible_time_changed", role="broker", group="P"),
        ev(
            4000,
            "message_sent",
            role="producer",
            msg_id="m3",
            topic="U",
            broker="b",
            queue_id=0,
            queue_offset=0,
        ),
    ]


def test_hand_worked_groups() -> None:
    out = mode_metrics(run())
    assert out["run"] == {"start_ms": 1000, "end_ms": 4000, "time_scale": 0.5, "t0_ms": 1000}
    c, p = out["groups"]["C"], out["groups"]["P"]
    # C: m1 consumed twice (a duplicate), m2 never: lost, waiting from its send (1200) to the end (4000)
    assert (c["mode"], c["topics"], c["sent"], c["lost"], c["duplicates"]) == ("client", ["T"], 2, 1, 1)
    assert c["longest_wait_ms"] == 2800 and c["time_to_drain_ms"] is None
    # c2 was idle (live, no queue) from its empty rebalance at 1010 until its kill at 1500
    assert (c["idle_consumers"], c["idle_consumer_ms"]) == (1, 490)
    # P: m1 popped at 1150, revived, consumed at 3600 from the retry topic; m2 consumed at 1300
    assert (p["mode"], p["sent"], p["lost"], p["duplicates"]) == ("server-pop", 2, 0, 0)
    assert p["longest_wait_ms"] == 3600 - 1100 and p["time_to_drain_ms"] == 3600 - 1200
    assert (p["revived"], p["revived_messages"], p["longest_revived_wait_ms"]) == (1, 1, 3600 - 1150)
    assert p["invisible_time_changes"] == 1 and p["idle_consumers"] == 0


def test_idle_ms_counts_only_live_spans_after_the_first_allocation() -> None:
    allocs = [(10, "T", False), (20, "U", True), (30, "U", False), (50, "T", True)]
    # idle at [10, 20) and [30, 50); live [0, 15) and [35, 100)
    assert idle_ms(allocs, [(0, 15), (35, 100)], 100) == 5 + 15
    assert idle_ms([], [(0, 100)], 100) == 0  # never balanced: not idle
    assert idle_ms([(10, "T", False)], [(0, 100)], 100) == 90


def test_cli_writes_modes_json(tmp_path: Path, capsys: Any) -> None:
    (tmp_path / "all.jsonl").write_text("\n".join(json.dumps(r) for r in run()) + "\n")
    assert main([str(tmp_path)]) == 0
    table = capsys.readouterr().out
    assert "| P | server-pop | 2 | 0 | 0 | 5 | 5 | 1 | 0 |" in table  # 2500 ms at scale 0.5 = 5 s
    assert json.loads((tmp_path / "modes.json").read_text())["groups"]["C"]["lost"] == 1
    assert main([str(tmp_path / "nope")]) == 2


def test_spark_twin_equals_the_reference(spark: Any, tmp_path: Path) -> None:
    from pipeline.pop_spark import mode_metrics_spark

    records = run()
    # more of the same: a second POP consumer idle for lack of an assignment, a malformed line
    records += [
        ev(1000, "consumer_started", group="P", client_id="p2", node="consumer-4"),
        ev(1030, "assignment", group="P", client_id="p2", topic="T", pull=[], pop=[], changed=True),
        ev(3700, "message_consumed", group="P", client_id="p2", msg_id="m1", topic="T", broker="b"),
    ]
    lines = [json.dumps(r) for r in records] + ['{"ts_ms": "x"}']
    (tmp_path / "a.jsonl").write_text("\n".join(lines[:12]) + "\n")
    (tmp_path / "b.jsonl").write_text("\n".join(lines[12:]) + "\n")
    expected = mode_metrics(records)
    got = mode_metrics_spark(spark, tmp_path)
    assert got == expected
    assert got["groups"]["P"]["idle_consumers"] == 1 and got["groups"]["P"]["duplicates"] == 1
