"""Shared pieces of the pipeline tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def analyse(spark: Any, run_dir: Path) -> dict[str, Any]:
    """summary.json of a JSON-lines run directory, computed by the Spark pipeline."""
    from pipeline.ingest import load_json_run
    from pipeline.metrics import Analysis

    run = load_json_run(spark, run_dir)
    analysis = Analysis(run.events, run.stats)
    try:
        return analysis.summary()
    finally:
        analysis.close()
        run.release()
