"""rmq-analyze ROOT with small runs analysed in Spark tasks by the plain-Python reference and large ones
by the Spark analysis: the same outputs, byte for byte, as the Spark analysis of every run."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from rmqlab.pipeline.__main__ import main
from rmqlab.pipeline.availability_reference import summarize_run
from rmqlab.pipeline.discover import RunDir, RunFile, discover_runs
from rmqlab.pipeline.report_story import answers
from rmqlab.pipeline.small_runs import analyse_root, deal, run_bytes, split_by_size
from rmqlab.pipeline.synth import MALFORMED_LINES, chaotic_run, realistic_run, write_run


def _root(root: Path) -> None:
    realistic_run(root / "big", events=4_000, seed=41, loss_every=89)
    realistic_run(root / "small", events=1_200, seed=42, consumers=4)
    (root / "small" / "manifest.json").write_text(json.dumps({"name": "x", "seed": 42, "params": {"n": 2}}))
    files = chaotic_run(43, scenarios=3)
    files["zz-corrupt.jsonl"] = [*MALFORMED_LINES, "", "   "]  # every kind of damage, and blank lines
    write_run(root / "corrupt", files)
    write_run(root / "noise", {"a.jsonl": list(MALFORMED_LINES[:5])})  # not one well-formed line
    (root / "broken").mkdir()
    (root / "broken" / "manifest.json").write_text("[1]")


def _outputs(out: Path) -> dict[str, bytes]:
    return {
        p.relative_to(out).as_posix(): p.read_bytes()
        for p in sorted(out.rglob("*"))
        if p.is_file() and ".parquet" not in p.as_posix()
    }


@pytest.mark.spark
def test_small_runs_in_tasks_write_what_the_spark_analysis_writes(
    spark: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "root"
    _root(root)
    runs, _bad = discover_runs(root)
    sizes = {r.rel: run_bytes(r) for r in runs}
    assert sizes["big"] > sizes["small"] and sizes["big"] > sizes["corrupt"]
    threshold = max(sizes["small"], sizes["corrupt"])  # "big" stays on the Spark path
    mixed, every = tmp_path / "mixed", tmp_path / "spark"
    assert main([str(root), "--out", str(mixed), "--small-run-bytes", str(threshold)]) == 1
    err = capsys.readouterr().err
    assert "small runs in tasks: 3 run(s)" in err and "read events: 1 runs" in err
    assert "skipping run 'broken': manifest.json is not a JSON object" in err
    assert main([str(root), "--out", str(every), "--analysis", "spark"]) == 1
    err = capsys.readouterr().err
    assert "small runs in tasks" not in err and "read events: 4 runs" in err

    got, want = _outputs(mixed), _outputs(every)
    assert sorted(got) == sorted(want)
    for name in want:  # summaries, reports (their pictures too), the runs table and the index
        assert got[name] == want[name], name
    corrupt = json.loads(got["corrupt/summary.json"])["run"]
    assert corrupt["malformed_lines"] >= len(MALFORMED_LINES)
    assert corrupt["malformed_lines"] == json.loads(want["corrupt/summary.json"])["run"]["malformed_lines"]
    table = [sorted(spark.read.parquet(str(d / "runs.parquet")).collect()) for d in (mixed, every)]
    assert table[0] == table[1] and len(table[0]) > 3


@pytest.mark.spark
def test_a_run_whose_task_fails_is_reported_and_skipped(spark: Any, tmp_path: Path) -> None:
    root = tmp_path / "root"
    for i in range(3):
        realistic_run(root / f"r{i}", events=800, seed=50 + i)
    runs, bad = discover_runs(root)
    os.remove(runs[1].files[0].path)  # gone between discovery and its task
    result = analyse_root(spark, runs, bad, plots=False, analysis="reference")
    assert [r.rel for r in result.runs] == ["r0", "r2"] and set(result.summaries) == {"r0", "r2"}
    assert [b.rel for b in result.bad] == ["r1"]
    assert "FileNotFoundError" in result.bad[0].problem
    for rel in ("r0", "r2"):  # the Spark analysis equals this reference (the test above, and its twins)
        summary = dict(result.summaries[rel])
        assert summary.pop("answer") == answers(summary, None)
        assert summary == summarize_run(root / rel)


def test_runs_are_routed_by_size_and_dealt_into_tasks_of_about_equal_bytes(tmp_path: Path) -> None:
    runs = []
    for name, size in (("a", 10), ("b", 40), ("c", 11), ("d", 30), ("e", 0)):
        path = tmp_path / name / "x.jsonl"
        path.parent.mkdir()
        path.write_bytes(b"x" * size)
        runs.append(RunDir(name, str(path.parent), [RunFile("x.jsonl", str(path))], {}))
    small, large = split_by_size(runs, "auto", small_run_bytes=30)  # 30 bytes is still small
    assert [(r.rel, n) for r, n in small] == [("a", 10), ("c", 11), ("d", 30), ("e", 0)]
    assert [r.rel for r in large] == ["b"]
    assert [r.rel for r in split_by_size(runs, "spark", 30)[1]] == ["a", "b", "c", "d", "e"]
    assert [r.rel for r, _ in split_by_size(runs, "reference", 30)[0]] == ["a", "b", "c", "d", "e"]
    with pytest.raises(ValueError, match="analysis must be one of"):
        split_by_size(runs, "fast")
    sized = [(r, run_bytes(r)) for r in runs]
    # largest first, each to the lightest task: b | d | c+a+e, each task's runs in run order
    assert [[r.rel for r in task] for task in deal(sized, 3)] == [["b"], ["d"], ["a", "c", "e"]]
    # b 40 | d 30, c 11 (41) | a 10 (b's task, 50) | e 0 (the task of 41)
    assert [[r.rel for r in task] for task in deal(sized, 2)] == [["a", "b"], ["c", "d", "e"]]
    assert len(deal(sized, 50)) == 5 and deal(sized, 0) == [[r for r, _ in sized]]
