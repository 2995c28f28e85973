"""The Spark analysis against answers worked out by hand, and against the plain-Python reference of
EVENTS.md on random synthetic runs (a differential test)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from kit.handmade import EXPECTED_CONVERGENCE, EXPECTED_GROUP, EXPECTED_RUN, RUN

from pipeline.ingest import load_json_run
from pipeline.metrics import Analysis
from pipeline.reference import summarize_run
from pipeline.synth import chaotic_run, write_run


def spark_summary(spark: Any, run_dir: Path) -> dict[str, Any]:
    run = load_json_run(spark, run_dir)
    try:
        return Analysis(run.events, run.stats).summary()
    finally:
        run.release()


def check_handmade(summary: dict[str, Any]) -> None:
    assert summary["run"] == EXPECTED_RUN
    g = summary["groups"]["g"]
    assert {k: g[k] for k in EXPECTED_GROUP} == EXPECTED_GROUP
    assert [(c["change_ms"], c["convergence_ms"]) for c in g["convergence"]] == EXPECTED_CONVERGENCE
    assert all(c["converged"] for c in g["convergence"]) and all(c["cause"] for c in g["convergence"])
    assert set(summary["groups"]) == {"g"}  # the file under _ignored/ is not part of the run


def test_reference_gives_the_hand_worked_answers(tmp_path: Path) -> None:
    check_handmade(summarize_run(write_run(tmp_path, RUN)))


@pytest.mark.spark
def test_spark_gives_the_hand_worked_answers(spark: Any, tmp_path: Path) -> None:
    check_handmade(spark_summary(spark, write_run(tmp_path, RUN)))


@pytest.mark.spark
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_spark_agrees_with_the_reference_on_random_runs(spark: Any, tmp_path: Path, seed: int) -> None:
    run_dir = write_run(tmp_path / f"run{seed}", chaotic_run(seed, scenarios=6))
    assert spark_summary(spark, run_dir) == summarize_run(run_dir)
