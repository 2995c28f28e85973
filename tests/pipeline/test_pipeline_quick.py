"""The quick verdict: the plain-Python analysis right after a run, its lines, its size limit, and the
check that the Spark analysis's summary agrees with it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rmqlab.pipeline.discover import RunDir, discover
from rmqlab.pipeline.quick import (
    QUICK_RUN_EVENTS,
    RunTooLarge,
    count_lines,
    disagreement,
    quick_summary,
    verdict_lines,
)
from rmqlab.pipeline.synth import realistic_run


def test_a_small_run_is_answered_with_its_verdict_lines(tmp_path: Path) -> None:
    realistic_run(tmp_path / "run", events=3_000, seed=7, loss_every=97)
    summary = quick_summary(tmp_path / "run")
    assert summary is not None and summary["groups"]
    lines = verdict_lines(summary, "simulated")
    assert lines[-1].startswith("verdict: FAIL (") and any("lost" in line for line in lines)
    assert all(" ms simulated" in line for line in lines if "slowest convergence" in line)


def test_the_quick_verdict_reads_up_to_its_limit_in_event_lines_and_says_why_past_it(tmp_path: Path) -> None:
    assert QUICK_RUN_EVENTS >= 200_000  # at least the size asked for; the reference documents it
    realistic_run(tmp_path / "run", events=2_000, seed=3)
    run = RunDir(".", str(tmp_path / "run"), discover(tmp_path / "run"), {})
    lines = sum(len(Path(f.path).read_bytes().splitlines()) for f in run.files)
    assert count_lines(run, 10**9) == lines
    assert quick_summary(tmp_path / "run", max_events=lines) is not None  # at the limit: answered
    with pytest.raises(RunTooLarge, match=f"more than {lines - 1:,} event lines.*Spark analysis"):
        quick_summary(tmp_path / "run", max_events=lines - 1)
    (tmp_path / "run" / "zz.jsonl").write_text('{"last": "line without its newline"}')
    assert count_lines(RunDir(".", str(tmp_path / "run"), discover(tmp_path / "run"), {}), 10**9) == lines + 1


def test_rmq_sim_run_says_a_run_over_the_limit_goes_to_spark_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from rmqlab.sim.__main__ import main as sim_main

    monkeypatch.setattr("rmqlab.pipeline.quick.QUICK_RUN_EVENTS", 1_000)  # the demo logs about 5,000
    monkeypatch.setattr("rmqlab.lab.runner.pipeline_available", lambda: False)
    assert sim_main(["run", "demo", "--out", str(tmp_path / "run"), "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "no quick verdict: the run has more than 1,000 event lines" in out
    assert "slowest convergence" not in out  # no verdict line from a partial reading


def test_a_difference_with_the_analysis_is_named_and_additions_are_not_one() -> None:
    quick = {"run": {"events": 10}, "groups": {"g": {"lost": 0, "duplicates": 2}}, "answer": ["a"]}
    assert disagreement(quick, json.loads(json.dumps(quick))) is None
    assert disagreement(quick, {**quick, "pop": {"extra": 1}}) is None  # the analysis may add fields
    worse = {"run": {"events": 10}, "groups": {"g": {"lost": 1, "duplicates": 2}}, "answer": ["a"]}
    why = disagreement(quick, worse)
    assert why is not None and ".groups.g.lost: 0 != 1" in why


@pytest.mark.slow
@pytest.mark.spark
def test_rmq_sim_run_says_the_verdict_before_the_report_and_both_agree(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONHASHSEED"}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "rmqlab.sim",
            "run",
            "kill-one-of-four",
            "--out",
            str(tmp_path / "run"),
            "--quiet",
        ],
        capture_output=True,
        text=True,
        timeout=900,
        env=env,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert (
        out.index("verdict: OK")
        < out.index("(said ")
        < out.index("writing summary.json")
        < out.index("report: ")
    )
    assert "error:" not in out and (tmp_path / "run" / "summary.json").is_file()


def test_a_group_line_tells_the_offset_regressions_when_there_are_some() -> None:
    from rmqlab.pipeline.quick import group_line

    g = {"verdict": "ok", "sent": 9, "consumed_unique": 9, "lost": 0, "duplicates": 4, "overlap_ms": 0,
         "orphan_ms": 0, "stalled_ms": 0, "convergence": [], "offset_regressions": [],
         "regression_redelivered": 0}  # fmt: skip
    assert "offsets moved back" not in group_line("g", g)
    regressions = [{"queue": "b:0", "redelivered": 3}, {"queue": "b:1", "redelivered": 1}]
    line = group_line("g", {**g, "offset_regressions": regressions, "regression_redelivered": 4})
    assert line.endswith("  offsets moved back 2x (4 delivered again)")
