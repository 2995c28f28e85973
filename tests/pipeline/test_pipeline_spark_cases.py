"""The Spark pipeline on the hand-made cases: all cases in one run (each under its own name prefix and
shifted to end together), analysed once, then checked case by case."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from kit.pipeline import analyse, check_case
from kit.pipeline_cases import CASES, Case, combined, write_case_files

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def all_cases(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], dict[str, int]]:
    files, shifts = combined(CASES)
    root = tmp_path_factory.mktemp("cases")
    write_case_files(root, files)
    return analyse(spark, root), shifts


@pytest.mark.parametrize("i", range(len(CASES)), ids=[c.name for c in CASES])
def test_spark_gives_the_hand_worked_answers(
    all_cases: tuple[dict[str, Any], dict[str, int]], i: int
) -> None:
    summary, shifts = all_cases
    c: Case = CASES[i]
    check_case(c, summary, prefix=f"k{i}-", shift=shifts[c.name])


def test_spark_counts_lines_of_all_cases(
    all_cases: tuple[dict[str, Any], dict[str, int]], tmp_path: Path
) -> None:
    from pipeline.reference import summarize_run

    summary, _ = all_cases
    files, _ = combined(CASES)
    write_case_files(tmp_path, files)
    reference = summarize_run(tmp_path)
    assert summary["run"] == reference["run"]
    malformed_case = next(c for c in CASES if c.name == "malformed_lines_and_skipped_files")
    assert malformed_case.run is not None
    assert summary["run"]["malformed_lines"] == malformed_case.run["malformed_lines"]
    # And the whole summary agrees with the reference, not only the fields worked out by hand.
    assert summary == reference
