"""The two analyses agree on every shipped experiment: each is simulated, then the root of runs is
analysed by the plain-Python reference (what prints the verdict the moment a run ends) and by the
Spark analysis (what writes summary.json and the report), and the summaries must be equal field by
field."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from kit.pipeline import first_difference

from rmqlab.cli import CHAOS_SHELVES, SIM_EXPERIMENTS, shipped
from rmqlab.pipeline.__main__ import main

pytestmark = [pytest.mark.spark, pytest.mark.slow]

# Experiments whose runs take minutes to simulate and analyse (a 1,000-consumer group); the quick
# verdict's agreement on them is measured by scripts/bench/verdict.py instead.
LARGE = {"sim-1000", "sim-scale"}


def test_the_reference_and_spark_agree_on_every_shipped_experiment(spark: Any, tmp_path: Path) -> None:
    root = tmp_path / "root"
    names = sorted(set(shipped((*CHAOS_SHELVES, SIM_EXPERIMENTS))) - LARGE)
    simulated, refused = [], []
    env = {k: v for k, v in os.environ.items() if k != "PYTHONHASHSEED"}
    for name in names:
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "rmqlab.sim",
                "run",
                name,
                "--no-analyze",
                "--quiet",
                "--out",
                str(root / name),
            ],
            capture_output=True,
            text=True,
            timeout=300,
            env=env,
        )
        if done.returncode == 2:  # real clients or a durable broker: not simulated (rmq-sim says why)
            refused.append(name)
            continue
        assert done.returncode in (0, 1), done.stdout + done.stderr
        simulated.append(name)
    assert len(simulated) >= 15 and "demo" in simulated and "kill-orderly-consumer" in simulated
    out = {how: tmp_path / how for how in ("reference", "spark")}
    for how, folder in out.items():
        assert main([str(root), "--out", str(folder), "--analysis", how, "--no-report", "--quiet"]) in (0, 1)
    regressed, slave_regressed = set(), set()
    for name in simulated:
        by = {how: json.loads((folder / name / "summary.json").read_text()) for how, folder in out.items()}
        assert by["spark"]["groups"], name
        where = first_difference(by["spark"], by["reference"])
        assert where is None, f"{name}: {where}"
        # the offset regressions are compared like every field; named here so that a summary without
        # them on both sides cannot pass
        for how, summary in by.items():
            for group, g in summary["groups"].items():
                assert isinstance(g["offset_regressions"], list), (name, how, group)
                assert g["regression_redelivered"] == sum(r["redelivered"] for r in g["offset_regressions"])
                if g["regression_redelivered"]:
                    regressed.add(name)
                assert isinstance(g["slave_offset_regressions"], list), (name, how, group)
                if g["slave_offset_regressions"]:
                    slave_regressed.add(name)
    # a slow consumer's stale commits roll its queues back after the others took them over: the
    # comparison covers regressions with deliveries again, not only empty lists
    assert "latency-5s-one-consumer" in regressed
    # #1094: the master back with its older offsets moves its slave's table back (offset_synced)
    assert "ha-stale-master-offsets" in slave_regressed
