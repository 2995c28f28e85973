"""Differential test: the Spark pipeline and the plain-Python reference of EVENTS.md must give the same
summary.json on random synthetic runs (seeded, so a failure can be replayed)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from kit.pipeline import analyse, first_difference

from rmqlab.pipeline.metrics_reference import summarize_run
from rmqlab.pipeline.synth import chaotic_run, merge_runs, realistic_run, write_run

pytestmark = pytest.mark.spark

# More seeds for a longer soak: RMQ_PIPELINE_SEEDS=1,2,3,4,5
SEEDS = [int(s) for s in os.environ.get("RMQ_PIPELINE_SEEDS", "101,202,303").split(",")]


def test_spark_agrees_with_the_reference_on_random_runs(spark: Any, tmp_path: Path) -> None:
    # Every seed gives a dozen independent scenarios (one group each); all seeds go into one run so one
    # Spark analysis checks them all.
    files = merge_runs(*(chaotic_run(seed, scenarios=12, prefix=f"r{seed}-") for seed in SEEDS))
    run_dir = write_run(tmp_path / "run", files)
    spark_summary, reference = analyse(spark, run_dir), summarize_run(run_dir)
    lines = [text for texts in files.values() for text in texts]
    assert any('"cid_all_digest"' in text and '"cid_all"' not in text for text in lines)  # large groups
    assert len(reference["groups"]) == 12 * len(SEEDS)
    assert reference["run"]["malformed_lines"] > 0  # the generator does damage lines
    converged = [c["converged"] for g in reference["groups"].values() for c in g["convergence"]]
    assert True in converged and False in converged  # both outcomes are exercised
    assert first_difference(spark_summary, reference) is None
    assert spark_summary == reference


def test_spark_agrees_with_the_reference_on_a_simulated_cluster(spark: Any, tmp_path: Path) -> None:
    facts = realistic_run(tmp_path / "run", events=15_000, seed=3, loss_every=997)
    spark_summary, reference = analyse(spark, tmp_path / "run"), summarize_run(tmp_path / "run")
    assert first_difference(spark_summary, reference) is None
    assert spark_summary == reference
    concurrent = reference["groups"]["g-concurrent"]
    # The simulation kills, restarts and pauses consumers and drops every 997th message of TopicA.
    assert concurrent["lost"] > 0 and concurrent["verdict"] == "fail"
    assert concurrent["stalled_ms"] > 0 and concurrent["orphan_ms"] > 0 and concurrent["duplicates"] > 0
    kill = [c for c in concurrent["convergence"] if c["change_ms"] == facts["kill_ms"]]
    assert kill and kill[0]["converged"] and kill[0]["cause"] == "kill consumer-2"
    assert reference["groups"]["g-orderly"]["verdict"] == "ok"
