"""rmq-analyze reads a simulated run directory unchanged (rmq-sim hands its runs to the same pipeline)."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path
from typing import Any

import pytest

from rmqlab.pipeline.__main__ import main
from rmqlab.pipeline.availability_reference import summarize_run
from rmqlab.sim.__main__ import resolve
from rmqlab.sim.sim_cluster import SimCluster


@pytest.mark.spark
def test_a_simulated_run_is_analysed_like_a_real_one(
    spark: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = tmp_path / "sim"
    result = SimCluster(resolve("kill-one-of-four"), run_dir, out=io.StringIO(), progress=False).run()
    assert result.drained and not result.errors
    assert json.loads((run_dir / "manifest.json").read_text())["mode"] == "sim"
    assert main([str(run_dir)]) == 0
    out = capsys.readouterr().out  # a simulated run has no wall time: its durations say simulated
    assert (
        re.search(r"slowest convergence (\d+\.\d s RocketMQ \()?\d+ ms simulated", out)
        and " ms wall" not in out
    )
    page = (run_dir / "report.html").read_text()
    assert " ms simulated</small>" in page and " ms wall" not in page
    summary = json.loads((run_dir / "summary.json").read_text())
    assert any("kill consumer-2" in line for line in summary.pop("answer"))
    assert summary == summarize_run(run_dir)
    group = summary["groups"]["GID_orders"]
    assert group["verdict"] == "ok" and group["lost"] == 0 and group["sent"] == 1500
    assert any(c["cause"].startswith("kill consumer-2") for c in group["convergence"])
