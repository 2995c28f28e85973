"""rmq-analyze on a real standalone Spark cluster (the `cluster` fixture of this folder's conftest: a
master and a worker started from the installed pyspark on 127.0.0.1), the analysis submitted to it with
--master spark://..., on one run and on a root of runs; the summaries must equal local mode's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from kit.pipeline import analyse

from rmqlab.pipeline.availability_reference import summarize_run as full_summary
from rmqlab.pipeline.discover import discover_runs
from rmqlab.pipeline.runs import analyse_runs
from rmqlab.pipeline.synth import chaotic_run, realistic_run, write_run

pytestmark = pytest.mark.spark


def _rmq_analyze(*args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, RMQ_ANALYZE_DRIVER_MEMORY="1g")
    env.pop("SPARK_CONF_DIR", None)
    return subprocess.run(
        [sys.executable, "-m", "rmqlab.pipeline", *args], env=env, capture_output=True, text=True, timeout=900
    )


def test_a_run_and_a_root_of_runs_on_a_standalone_cluster(spark: Any, cluster: str, tmp_path: Path) -> None:
    run_dir = tmp_path / "one"
    realistic_run(run_dir, events=1_500, seed=21, loss_every=97)
    root = tmp_path / "root"
    realistic_run(root / "a" / "r1", events=1_500, seed=22)
    write_run(root / "a" / "r2", chaotic_run(23, scenarios=3))
    (root / "b").mkdir()
    (root / "b" / "manifest.json").write_text('{"name": "x", "seed": 1}')  # a run with no event files

    single = _rmq_analyze(str(run_dir), "--master", cluster, "--out", str(tmp_path / "out1"), "--no-report")
    assert single.returncode == 1, single.stderr  # loss_every loses messages: verdict fail
    assert f"start spark: {cluster}" in single.stderr
    # both ways of analysing a root: the reference in the executors' tasks (the default for small runs)
    # and the Spark analysis
    many = _rmq_analyze(str(root), "--master", cluster, "--out", str(tmp_path / "out2"), "--no-report")
    assert many.returncode == 1, many.stderr  # one skipped run
    assert "skipping run 'b'" in many.stderr and "small runs in tasks: 2 run(s)" in many.stderr
    columnar = _rmq_analyze(
        str(root), "--master", cluster, "--out", str(tmp_path / "out3"), "--no-report", "--analysis", "spark"
    )
    assert columnar.returncode == 1, columnar.stderr
    assert "read events: 2 runs" in columnar.stderr

    # Local mode (the tests' session) on the same inputs.
    # A single run also gets the RocketMQ-time and unavailability additions (the reference twin of that
    # path equals local mode's Spark output, tests/pipeline/test_pipeline_cli_run.py); no answer with
    # --no-report.
    single_summary = json.loads((tmp_path / "out1" / "summary.json").read_text())
    assert single_summary.pop("answer") == []
    assert single_summary == full_summary(run_dir)
    assert {k: v for k, v in single_summary["run"].items() if k not in ("time_scale", "t0_ms")} == analyse(
        spark, run_dir
    )["run"]
    runs, bad = discover_runs(root)
    local = analyse_runs(spark, runs, bad, plots=False).summaries
    for rel in ("a/r1", "a/r2"):
        for out in ("out2", "out3"):
            assert json.loads((tmp_path / out / rel / "summary.json").read_text()) == local[rel], (out, rel)
