"""The plain-Python reference on each hand-made case (see cases.py for the arithmetic)."""

from __future__ import annotations

from pathlib import Path

import pytest
from kit.pipeline import check_case
from kit.pipeline_cases import CASES, Case, write_case_files

from rmqlab.pipeline.metrics_reference import summarize_run


@pytest.mark.parametrize("c", CASES, ids=[c.name for c in CASES])
def test_reference_gives_the_hand_worked_answers(c: Case, tmp_path: Path) -> None:
    write_case_files(tmp_path, c.files())
    check_case(c, summarize_run(tmp_path))


def test_every_summary_field_is_present(tmp_path: Path) -> None:
    c = next(c for c in CASES if c.name == "convergence_search")
    write_case_files(tmp_path, c.files())
    summary = summarize_run(tmp_path)
    assert set(summary) == {"run", "groups"}
    assert set(summary["run"]) == {"events", "malformed_lines", "start_ms", "end_ms"}
    group = summary["groups"]["g"]
    assert set(group) == {
        "topics", "sent", "consumed_unique", "lost", "duplicates", "duplicated_messages", "overlap_ms",
        "orphan_ms", "idle_member_ms", "stalled_ms", "concurrent_consume_ms", "order_violations",
        "consumers_without_messages", "convergence", "offset_regressions", "regression_redelivered",
        "slave_offset_regressions", "verdict",
    }  # fmt: skip
    for entry in group["convergence"]:
        assert set(entry) == {"change_ms", "cause", "converged", "convergence_ms"}
    c = next(c for c in CASES if c.name == "offset_regressions")
    write_case_files(tmp_path / "offsets", c.files())
    for entry in summarize_run(tmp_path / "offsets")["groups"]["g"]["offset_regressions"]:
        assert set(entry) == {"change_ms", "topic", "queue", "from", "to", "event", "node", "redelivered"}
    # Two starts in the same millisecond give one entry naming both (graceful_and_nemesis_stop).
    c = next(c for c in CASES if c.name == "graceful_and_nemesis_stop")
    write_case_files(tmp_path / "stops", c.files())
    first = summarize_run(tmp_path / "stops")["groups"]["g"]["convergence"][0]
    assert first["change_ms"] == 10 and "c1" in first["cause"] and "c2" in first["cause"]


def test_empty_run_has_every_run_field(tmp_path: Path) -> None:
    (tmp_path / "a.jsonl").write_text("garbage\n\n", encoding="utf-8")
    assert summarize_run(tmp_path) == {
        "run": {"events": 0, "malformed_lines": 1, "start_ms": None, "end_ms": None},
        "groups": {},
    }
