"""The hand-made run (kit.handmade): the plain-Python reference and the Spark analysis both give the answers
worked out by hand. Random runs are compared in test_pipeline_differential.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from kit.handmade import EXPECTED_CONVERGENCE, EXPECTED_GROUP, EXPECTED_RUN, RUN
from kit.pipeline import analyse

from rmqlab.pipeline.metrics_reference import summarize_run
from rmqlab.pipeline.synth import write_run


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
    check_handmade(analyse(spark, write_run(tmp_path, RUN)))
