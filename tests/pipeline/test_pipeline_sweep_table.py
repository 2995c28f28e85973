"""The sweep table's arithmetic (no Spark): each point's distribution over its seeds, the counts of
failing and losing runs, and the page that shows them with the failing runs' replay commands."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rmqlab.pipeline.discover import discover_runs
from rmqlab.pipeline.sweep_report import SWEEP_METRICS, point_rows, quantile, render_sweep, sweep_runs


def test_quantiles_interpolate_between_ranks() -> None:
    values = [1.0, 2.0, 3.0, 4.0]
    got = [quantile(values, q) for q in (0.5, 0.9, 0.99, 1.0)]
    assert got == pytest.approx([2.5, 3.7, 3.97, 4.0])
    assert quantile([7.0], 0.9) == 7.0


def _row(run: str, strategy: str, group: str, lost: int, dup: int, verdict: str) -> dict[str, Any]:
    row: dict[str, Any] = {m: None for m in SWEEP_METRICS}
    row.update(run=run, group=group, lost=lost, duplicates=dup, verdict=verdict)
    row["param.consumers.strategy"] = strategy
    return row


def test_points_and_groups_summarise_their_seeds() -> None:
    rows = [
        _row("p1/seed-1", "AVG", "G", 0, 1, "ok"),
        _row("p1/seed-2", "AVG", "G", 3, 5, "fail"),
        _row("p1/seed-3", "AVG", "G", 0, 9, "ok"),
        _row("p1/seed-1", "AVG", "H", 0, 0, "ok"),
        _row("p2/seed-1", "CONSISTENT_HASH", "G", 0, 2, "ok"),
    ]
    columns, table = point_rows(["param.consumers.strategy"], rows, failed={"p2/seed-1"})
    assert columns[:5] == ["param.consumers.strategy", "group", "runs", "failed_runs", "lost_runs"]
    first = table[0]
    assert (first["group"], first["runs"], first["failed_runs"], first["lost_runs"]) == ("G", 3, 1, 1)
    assert (first["duplicates_median"], first["duplicates_p90"], first["duplicates_max"]) == (5.0, 8.2, 9.0)
    assert first["lost_max"] == 3.0 and first["orphan_ms_median"] is None
    assert [(r["group"], r["runs"]) for r in table[1:]] == [("H", 1), ("G", 1)]
    assert table[2]["failed_runs"] == 1  # a run that failed outside its verdict (the simulation's errors)
    sweep = {
        "name": "s", "question": "q?", "base": "b.toml", "seeds": [1, 2, 3], "points": [{}, {}],
        "vary": {"consumers.strategy": ["AVG", "CONSISTENT_HASH"]},
    }  # fmt: skip
    failing = [{"run": "p1/seed-2", "why": "verdict fail (G)", "command": "rmq-sim replay out/p1/seed-2"}]
    page = render_sweep(sweep, columns, table, failing, 4)
    assert "rmq-sim replay out/p1/seed-2" in page and "5 / 8.2 / 8.92 / 9" in page
    assert 'consumers.strategy in ["AVG", "CONSISTENT_HASH"]' in page.replace("&quot;", '"')


def test_the_driver_finds_its_runs_as_a_walk_of_the_tree_does(tmp_path: Path) -> None:
    manifests: dict[str, Any] = {
        "p002_x/seed-1": {"mode": "sim", "seed": 1},
        "p001_y/seed-2": {"mode": "sim", "seed": 2, "params": {"a": 1}},
        "p001_y/seed-3": "[1, 2",  # not JSON: a bad run to the walk, left out by both
    }
    for rel, manifest in manifests.items():
        run = tmp_path / rel
        run.mkdir(parents=True)
        (run / "broker.jsonl").write_text("{}\n")
        (run / "manifest.json").write_text(manifest if isinstance(manifest, str) else json.dumps(manifest))
    asked = ["p002_x/seed-1", "p001_y/seed-2", "p001_y/seed-3", "p003/seed-1"]  # the last never ran
    walked, _bad = discover_runs(tmp_path)
    found = sweep_runs(tmp_path, asked)
    assert [(r.rel, r.path, r.manifest) for r in found] == [
        (r.rel, r.path, r.manifest) for r in walked if r.rel in asked
    ]
    assert [r.rel for r in found] == ["p001_y/seed-2", "p002_x/seed-1"]
    assert all(r.files == [] for r in found)  # listed only for a run the Spark analysis reads
