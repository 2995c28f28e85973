"""rmq-chaos run's hand-over to the analysis: ``python -m rmqlab.pipeline RUN_DIR`` decides the verdict and
the exit code (0 only when ok). A stand-in ``pipeline`` package plays the analysis here."""

from __future__ import annotations

import asyncio
import io
import json
import sys
import textwrap
from pathlib import Path

import pytest

from rmqlab.chaos import run as run_mod
from rmqlab.chaos.__main__ import resolve
from rmqlab.chaos.run import ChaosRun

FAKE_PIPELINE = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path
    run = Path(sys.argv[1])
    verdict = (run / "want").read_text().strip()
    if verdict == "crash":
        sys.exit(2)
    summary = {"run": {"events": 1}, "groups": {"g1": {
        "verdict": verdict, "sent": 10, "consumed_unique": 10 if verdict == "ok" else 7,
        "lost": 0 if verdict == "ok" else 3, "duplicates": 1,
        "convergence": [
            {"change_ms": 1, "cause": "kill consumer-2", "converged": True, "convergence_ms": 42,
             "convergence_rocketmq_ms": 840}]}},
        "answer": ["consumer-2's queues were served again 0.8 s after the kill"]}
    (run / "summary.json").write_text(json.dumps(summary))
    (run / "report.html").write_text("<html></html>")
    sys.exit(0 if verdict == "ok" else 1)
    """
)


@pytest.fixture
def fake_pipeline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    script = tmp_path / "fake_pipeline.py"
    script.write_text(FAKE_PIPELINE)
    monkeypatch.setattr(run_mod, "pipeline_available", lambda: True)
    return [sys.executable, str(script)]


@pytest.mark.parametrize(
    ("want", "verdict", "code"), [("ok", "ok", 0), ("fail", "fail", 1), ("crash", None, 3)]
)
def test_verdict_and_exit_code_come_from_the_analysis(
    fake_pipeline: list[str], tmp_path: Path, want: str, verdict: str | None, code: int
) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "want").write_text(want)
    out = io.StringIO()
    r = ChaosRun(resolve("demo"), run_dir, out=out, analysis_command=fake_pipeline)
    r.result.quick_verdict = "ok"
    asyncio.run(r._analyze())
    r._print_verdict()
    text = out.getvalue()
    assert r.result.verdict == verdict and r.result.exit_code == code
    if verdict is not None:
        assert f"verdict: {verdict.upper()} (analysis)" in text
        assert f"report:  {run_dir / 'report.html'}" in text
        assert f"summary: {run_dir / 'summary.json'}" in text
        assert (
            "group g1: " + verdict.upper() in text
            and "slowest convergence 0.8 s RocketMQ (42 ms wall)" in text
        )
        assert "answer: consumer-2's queues were served again 0.8 s after the kill" in text
        assert json.loads((run_dir / "summary.json").read_text())["groups"]["g1"]["verdict"] == verdict
    else:
        assert "the analysis failed (python -m rmqlab.pipeline exited with 2)" in text


def test_without_the_pipeline_the_live_counts_decide(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(run_mod, "pipeline_available", lambda: False)
    out = io.StringIO()
    r = ChaosRun(resolve("demo"), tmp_path, out=out)
    r.result.quick_verdict = "fail"
    asyncio.run(r._analyze())
    r._print_verdict()
    assert "analysis skipped: the pipeline extra (pyspark) is not installed" in out.getvalue()
    assert "verdict: FAIL (live counts (no analysis))" in out.getvalue()
    assert r.result.exit_code == 1


AGREEING_PIPELINE = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path
    from rmqlab.pipeline.quick import failed_groups, quick_summary
    run = Path(sys.argv[1])
    summary = quick_summary(run)
    (run / "summary.json").write_text(json.dumps(summary))
    (run / "report.html").write_text("<html></html>")
    sys.exit(1 if failed_groups(summary) else 0)
    """
)


@pytest.mark.parametrize("agreeing", [True, False])
def test_the_quick_verdict_comes_first_and_an_analysis_that_differs_is_an_error(
    fake_pipeline: list[str], tmp_path: Path, agreeing: bool
) -> None:
    from rmqlab.pipeline.synth import realistic_run

    run_dir = tmp_path / "run"
    realistic_run(run_dir, events=1_500, seed=5)
    (run_dir / "want").write_text("ok")
    command = fake_pipeline
    if agreeing:
        script = tmp_path / "agreeing.py"
        script.write_text(AGREEING_PIPELINE)
        command = [sys.executable, str(script)]
    out = io.StringIO()
    r = ChaosRun(resolve("demo"), run_dir, out=out, analysis_command=command)
    r.result.quick_verdict = "ok"
    asyncio.run(r._analyze())
    r._print_verdict()
    text = out.getvalue()
    said = text.index("(plain-Python analysis, ")
    assert text.index("group ") < said < text.index("(analysis)")
    group_lines = [line for line in text.splitlines() if line.startswith("group ")]
    assert r._quick is not None and len(group_lines) == len(r._quick["groups"])  # said once, by the quick one
    if agreeing:
        assert r.result.exit_code in (0, 1) and "disagree" not in text
    else:
        assert r.result.exit_code == 3 and "error: the quick verdict and the analysis disagree at" in text


def test_a_run_over_the_quick_verdicts_limit_is_said_to_go_to_the_analysis_alone(
    fake_pipeline: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rmqlab.pipeline.synth import realistic_run

    monkeypatch.setattr("rmqlab.pipeline.quick.QUICK_RUN_EVENTS", 100)
    run_dir = tmp_path / "run"
    realistic_run(run_dir, events=1_500, seed=5)
    (run_dir / "want").write_text("ok")
    out = io.StringIO()
    r = ChaosRun(resolve("demo"), run_dir, out=out, analysis_command=fake_pipeline)
    r.result.quick_verdict = "ok"
    asyncio.run(r._analyze())
    r._print_verdict()
    text = out.getvalue()
    assert r._quick is None and "no quick verdict: the run has more than 100 event lines" in text
    assert "plain-Python analysis" not in text and "RunTooLarge" not in text
    assert r.result.exit_code == 0 and "(analysis)" in text  # the analysis's verdict, said once
    assert "42 ms wall" in text  # a run of processes: its convergence in wall ms
