"""The Spark pipeline on the hand-made cases, every case as its own run under one root, all analysed in
one set of Spark jobs (the cases reuse the same group, client, node and topic names, so any leak between
runs shows), then checked case by case and against the reference run by run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from kit.pipeline import check_case
from kit.pipeline_cases import CASES, Case, write_case_files

from rmqlab.pipeline.discover import discover_runs
from rmqlab.pipeline.runs import analyse_runs

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def all_cases(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    root = tmp_path_factory.mktemp("cases")
    for c in CASES:
        write_case_files(root / "cases" / c.name, c.files())
    runs, bad = discover_runs(root)
    assert not bad and len(runs) == len(CASES)
    return root, analyse_runs(spark, runs, bad, plots=False).summaries


@pytest.mark.parametrize("i", range(len(CASES)), ids=[c.name for c in CASES])
def test_spark_gives_the_hand_worked_answers(all_cases: tuple[Path, dict[str, Any]], i: int) -> None:
    _root, summaries = all_cases
    c: Case = CASES[i]
    check_case(c, summaries[f"cases/{c.name}"])


def test_spark_agrees_with_the_reference_run_by_run(all_cases: tuple[Path, dict[str, Any]]) -> None:
    from rmqlab.pipeline.availability_reference import summarize_run

    root, summaries = all_cases
    for c in CASES:
        # The whole summary, not only the fields worked out by hand (line counts included): a run of a
        # root carries the RocketMQ-time and unavailability additions too, so its twin is the full one.
        got = dict(summaries[f"cases/{c.name}"])
        # the report's one-sentence answers, a list (empty: no manifest names an experiment here)
        assert got.pop("answer") == [], c.name
        assert got == summarize_run(root / "cases" / c.name), c.name
