"""Shared pieces of the pipeline tests: a Spark summary of a run directory, and the check of a summary
against a hand-made case of ``kit.pipeline_cases``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kit.pipeline_cases import Case
from rmqlab.pipeline.quick import first_difference

__all__ = ["analyse", "check_case", "first_difference"]


def analyse(spark: Any, run_dir: Path) -> dict[str, Any]:
    """summary.json of a JSON-lines run directory, computed by the Spark pipeline."""
    from rmqlab.pipeline.ingest import load_json_run
    from rmqlab.pipeline.metrics_spark import Analysis

    run = load_json_run(spark, run_dir)
    analysis = Analysis(run.events, run.stats)
    try:
        return analysis.summary()
    finally:
        analysis.close()
        run.release()


def check_case(c: Case, summary: dict[str, Any], prefix: str = "", shift: int = 0) -> None:
    """Assert the case's expected run, group fields and convergence entries (group names may carry
    ``prefix``, change times ``shift``)."""
    if c.run is not None and not prefix:
        # the contract's run fields; a summary may add its clock (time_scale, t0_ms) beside them
        assert {k: summary["run"].get(k) for k in c.run} == c.run
    for group, expected in c.groups.items():
        got = dict(summary["groups"][prefix + group])
        got["topics"] = [t.removeprefix(prefix) for t in got["topics"]]
        assert {k: got[k] for k in expected} == expected, group
    for group, expected in c.convergence.items():
        entries = summary["groups"][prefix + group]["convergence"]
        got = [(e["change_ms"] - shift, e["converged"], e["convergence_ms"]) for e in entries]
        assert got == expected, group
        assert all(e["cause"] for e in entries)
    for group, expected in c.regressions.items():
        entries = summary["groups"][prefix + group]["offset_regressions"]
        got = [
            (
                e["change_ms"] - shift, e["queue"].removeprefix(prefix), e["from"], e["to"], e["event"],
                e["node"].removeprefix(prefix), e["redelivered"],
            )
            for e in entries
        ]  # fmt: skip
        assert got == expected, group
        assert all(e["topic"].removeprefix(prefix) == "T" for e in entries), group
    for group, expected_sync in c.slave_regressions.items():
        synced = summary["groups"][prefix + group]["slave_offset_regressions"]
        got_sync = [
            (
                e["change_ms"] - shift,
                e["queue"].removeprefix(prefix),
                e["from"],
                e["to"],
                e["node"].removeprefix(prefix),
            )
            for e in synced
        ]
        assert got_sync == expected_sync, group
        assert all(e["topic"].removeprefix(prefix) == "T" for e in synced), group
