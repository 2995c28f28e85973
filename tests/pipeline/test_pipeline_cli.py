"""rmq-analyze as a user runs it: summary.json, report.html, the verdict's exit code, input errors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from kit.handmade import EXPECTED_GROUP, RUN

from pipeline.__main__ import main
from pipeline.synth import write_run


@pytest.mark.spark
def test_analyze_writes_summary_and_report(
    spark: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = write_run(tmp_path / "run", RUN)
    out = tmp_path / "out"
    rc = main([str(run_dir), "--out", str(out), "--quiet"])
    assert rc == 1  # a lost message fails the verdict
    summary = json.loads((out / "summary.json").read_text())
    assert summary["groups"]["g"]["lost"] == EXPECTED_GROUP["lost"]
    report = (out / "report.html").read_text()
    assert report.count("data:image/png;base64,") >= 3 and "FAIL" in report
    stdout = capsys.readouterr().out
    assert "verdict: FAIL (g)" in stdout and "lost 1" in stdout


@pytest.mark.spark
def test_ingest_then_analyze_parquet(spark: Any, tmp_path: Path) -> None:
    run_dir = write_run(tmp_path / "run", RUN)
    parquet = tmp_path / "parquet"
    assert main(["ingest", str(run_dir), "--out", str(parquet), "--quiet"]) == 0
    assert (parquet / "event=mq_added").is_dir()
    assert (
        main([str(parquet), "--format", "parquet", "--out", str(tmp_path / "o"), "--no-report", "--quiet"])
        == 1
    )
    from_parquet = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert main([str(run_dir), "--out", str(tmp_path / "j"), "--no-report", "--quiet"]) == 1
    assert from_parquet == json.loads((tmp_path / "j" / "summary.json").read_text())


def test_input_errors_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(tmp_path / "missing")]) == 2
    assert "does not exist" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert main([str(tmp_path / "empty")]) == 2
    assert "no *.jsonl" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        main([str(tmp_path), "--format", "xml"])
    assert exc.value.code == 2
