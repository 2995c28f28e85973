"""The control plane (pipeline.control) on its own, without Spark: every hand-made case's ownership
metrics and convergence from its control events, read with the reference's line parser."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from kit.pipeline_cases import CASES, Case, write_case_files

from rmqlab.pipeline import control
from rmqlab.pipeline.contract import CID_ALL, CID_ALL_DIGEST, STR_LIST, has_type, is_digest, queue_key
from rmqlab.pipeline.metrics_reference import load_run

OWNERSHIP = ("overlap_ms", "orphan_ms", "idle_member_ms", "stalled_ms")


def control_inputs(run_dir: Path) -> tuple[list[dict[str, Any]], set[tuple[str, str, str]], int]:
    """(control rows in the Spark table's shape, consumption triples, run end) of a run directory."""
    events, _ = load_run(run_dir)
    rows, triples = [], set()
    for seq, e in enumerate(events):
        rec = dict(e.rec)
        if e.event == "message_consumed":
            triples.add((rec["group"], rec["client_id"], rec["node"]))
        if e.event not in control.CONTROL_EVENTS:
            continue
        if e.event == "rebalance":  # as the reader keeps them: a member field only when usable
            rec[CID_ALL] = rec.get(CID_ALL) if has_type(rec.get(CID_ALL), STR_LIST) else None
            rec[CID_ALL_DIGEST] = rec.get(CID_ALL_DIGEST) if is_digest(rec.get(CID_ALL_DIGEST)) else None
        rows.append({**rec, "fidx": 0, "blk": 0, "rid": seq})  # seq: the reference's event order
    end = max((e.ts for e in events), default=0)
    return rows, triples, end


@pytest.mark.parametrize("c", CASES, ids=[c.name for c in CASES])
def test_the_control_plane_gives_the_hand_worked_answers(c: Case, tmp_path: Path) -> None:
    write_case_files(tmp_path, c.files())
    rows, triples, end = control_inputs(tmp_path)
    model = control.build(list(reversed(rows)), triples, lambda _g: end)  # any input order
    own = control.ownership_metrics(model, lambda _g: end)
    conv = control.convergence(model, rows, lambda _g: end, lambda name: name)
    for group, expected in c.groups.items():
        wanted = {k: v for k, v in expected.items() if k in OWNERSHIP}
        assert {k: own[group][k] for k in wanted} == wanted, group
        if "topics" in expected:
            assert sorted(model.group_topics[group]) == expected["topics"], group
    for group, expected in c.convergence.items():
        got = [(e["change_ms"], e["converged"], e["convergence_ms"]) for e in conv.get(group, [])]
        assert got == expected, group


def test_intervals_close_on_removal_stop_kill_and_the_run_end() -> None:
    def row(ts: int, event: str, **fields: Any) -> dict[str, Any]:
        return {"ts_ms": ts, "event": event, "fidx": 0, "blk": 0, "rid": ts, **fields}

    base = {"group": "g", "node": "n1", "topic": "T", "broker": "b"}
    rows = [
        row(0, "rebalance", client_id="c1", cid_all=["c1"], cid_all_digest=None, **base),
        row(0, "consumer_started", client_id="c1", **base),
        row(1, "mq_added", client_id="c1", queue_id=0, **base),
        row(2, "mq_added", client_id="c1", queue_id=1, **base),
        row(3, "mq_added", client_id="c1", queue_id=2, **base),
        row(5, "mq_removed", client_id="c1", queue_id=0, **base),
        row(7, "nemesis", action="pause", target="n1"),
        row(8, "nemesis", action="resume", target="n1"),
        row(9, "nemesis", action="kill", target="n1"),
        row(10, "consumer_started", client_id="c2", **{**base, "node": "n2"}),
        row(11, "mq_added", client_id="c2", queue_id=2, **{**base, "node": "n2"}),
    ]
    m = control.build(rows, set(), lambda _g: 20)
    spans = sorted((iv.client_id, iv.queue, iv.start, iv.end) for iv in m.intervals)
    assert spans == [
        ("c1", queue_key("b", 0), 1, 5),
        ("c1", queue_key("b", 1), 2, 9),
        ("c1", queue_key("b", 2), 3, 9),
        ("c2", queue_key("b", 2), 11, 20),
    ]
    assert m.live == {("g", "c1"): [(0, 9)], ("g", "c2"): [(10, control.INF)]}
    assert m.client_pauses == {"c1": [(7, 8)]}
    # Two owned queues paused for 1 ms each; no overlap.
    assert control.ownership_metrics(m, lambda _g: 20)["g"] == {
        "overlap_ms": 0,
        "stalled_ms": 2,
        "orphan_ms": 0,
        "idle_member_ms": 0,  # no topic_route: the universe has no queue of T
    }
