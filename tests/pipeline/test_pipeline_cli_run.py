"""rmq-analyze as the chaos lab and people run it: outputs in the run directory, exit codes (0 ok, 1 a
verdict failed, 2 usage or input errors), the Parquet copy, and a clear message without Java."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from kit.handmade import EXPECTED_GROUP, RUN

from rmqlab.pipeline.__main__ import main
from rmqlab.pipeline.availability_reference import summarize_run
from rmqlab.pipeline.availability_reference import summarize_run as full_summary
from rmqlab.pipeline.metrics_reference import summarize_run as contract_summary
from rmqlab.pipeline.synth import chaotic_run, realistic_run, write_run


@pytest.mark.spark
def test_analyze_writes_summary_and_report_into_the_run_directory(
    spark: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = tmp_path / "run"
    facts = realistic_run(run_dir, events=8_000, seed=11)
    assert main([str(run_dir)]) == 0  # every group ok
    summary = json.loads((run_dir / "summary.json").read_text())
    assert isinstance(summary.pop("answer"), list)
    assert summary == summarize_run(run_dir)
    report = (run_dir / "report.html").read_text()
    # Two groups, four pictures each (ownership, rate, duplicates, convergence), and the offset
    # regressions' picture for a group whose committed offsets moved back; all inline.
    regressed = sum(1 for g in summary["groups"].values() if g["offset_regressions"])
    assert report.count("src='data:image/png;base64,") == 8 + regressed and "src='http" not in report
    assert "kill consumer-2" in report and "Verdict OK" in report
    captured = capsys.readouterr()
    assert "verdict: OK" in captured.out
    for stage in ("start spark", "read events", "metrics", "unavailability", "report"):
        assert f"[rmq-analyze] {stage}" in captured.err
    assert facts["kill_ms"] in [c["change_ms"] for c in summary["groups"]["g-concurrent"]["convergence"]]


@pytest.mark.spark
def test_a_failed_verdict_exits_1_and_out_dir_is_honoured(
    spark: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = tmp_path / "run"
    realistic_run(run_dir, events=5_000, seed=12, loss_every=50, orderly_group=False, nemesis=False)
    out = tmp_path / "out"
    assert main([str(run_dir), "--out", str(out), "--no-report", "--quiet"]) == 1
    assert not (run_dir / "summary.json").exists() and not (out / "report.html").exists()
    summary = json.loads((out / "summary.json").read_text())
    assert summary["groups"]["g-concurrent"]["lost"] > 0
    captured = capsys.readouterr()
    assert "verdict: FAIL (g-concurrent)" in captured.out and captured.err == ""


@pytest.mark.spark
def test_a_hand_made_run_with_a_lost_message_fails_in_summary_report_and_output(
    spark: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = write_run(tmp_path / "run", RUN)
    out = tmp_path / "out"
    rc = main([str(run_dir), "--out", str(out), "--quiet"])
    assert rc == 1  # a lost message fails the verdict
    summary = json.loads((out / "summary.json").read_text())
    assert summary["groups"]["g"]["lost"] == EXPECTED_GROUP["lost"]
    report = (out / "report.html").read_text()
    assert report.count("data:image/png;base64,") >= 3 and "FAIL" in report
    stdout = capsys.readouterr().out
    assert "verdict: FAIL (g)" in stdout and "lost 1" in stdout


@pytest.mark.spark
def test_ingest_then_analyse_the_parquet_copy(spark: Any, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    realistic_run(run_dir, events=3_000, seed=13)
    parquet = tmp_path / "copy"
    assert main(["ingest", str(run_dir), "--out", str(parquet), "--quiet"]) == 0
    assert (parquet / "event=mq_added").is_dir() and (parquet / "_ingest.json").is_file()
    assert (
        main([str(parquet), "--format", "parquet", "--out", str(tmp_path / "p"), "--no-report", "--quiet"])
        == 0
    )
    from_parquet = json.loads((tmp_path / "p" / "summary.json").read_text())
    # The copy keeps the contract's fields only: the broker's markers and the runner's clock stay behind.
    contract = contract_summary(run_dir)
    assert {k: from_parquet["run"][k] for k in contract["run"]} == contract["run"]
    for name, g in contract["groups"].items():
        got = from_parquet["groups"][name]
        assert {k: got[k] for k in g if k != "convergence"} == {
            k: v for k, v in g.items() if k != "convergence"
        }
        assert [{k: e[k] for k in c} for e, c in zip(got["convergence"], g["convergence"], strict=True)] == (
            g["convergence"]
        )


def test_input_errors_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(tmp_path / "missing")]) == 2
    assert "does not exist" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "notes.txt").write_text("not an event file\n")
    assert main([str(tmp_path / "empty")]) == 2
    assert "no *.jsonl event files" in capsys.readouterr().err
    assert main([str(tmp_path / "empty"), "--format", "parquet"]) == 2
    assert "not a Parquet copy" in capsys.readouterr().err
    # A folder of anything but events is turned away before Spark starts, and gets no summary.json.
    junk = write_run(tmp_path / "junk", {"a.jsonl": ["not json", '{"ts_ms": "1"}', "", "[1, 2]"]})
    assert main([str(junk)]) == 2
    assert "no well-formed event lines" in capsys.readouterr().err
    assert not (junk / "summary.json").exists()
    # The Parquet copy replaces its folder: never the run itself, a folder around it, or other files.
    run_dir = write_run(tmp_path / "run", {"a.jsonl": ["{}"]})
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "keep.txt").write_text("precious\n")
    for out in (run_dir, tmp_path, run_dir / "copy", tmp_path / "other"):
        assert main(["ingest", str(run_dir), "--out", str(out)]) == 2
    assert (tmp_path / "other" / "keep.txt").is_file() and (run_dir / "a.jsonl").is_file()
    assert "refusing to replace it" in capsys.readouterr().err
    for argv in ([str(tmp_path), "--format", "xml"], ["ingest", str(tmp_path)], []):
        with pytest.raises(SystemExit) as exc:
            main(argv)
        assert exc.value.code == 2


def test_missing_java_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import rmqlab.pipeline.session

    monkeypatch.setattr(rmqlab.pipeline.session, "find_java", lambda: None)
    run_dir = write_run(
        tmp_path / "run", {"a.jsonl": ['{"ts_ms": 1, "event": "log", "node": "n", "role": "r"}']}
    )
    assert main([str(run_dir)]) == 2
    err = capsys.readouterr().err
    assert "Java was not found" in err and "JAVA_HOME" in err and "Traceback" not in err


def test_module_entry_point_help() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "rmqlab.pipeline", "--help"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0 and "--master" in done.stdout and "ingest" in done.stdout


@pytest.mark.spark
def test_a_root_of_runs_in_one_application(
    spark: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "sweep"
    for i, consumers in enumerate((3, 4)):
        run_dir = root / "2026" / f"run-{i}"
        realistic_run(run_dir, events=2_500, seed=30 + i, consumers=consumers, loss_every=0 if i else 97)
        manifest = {"name": "sweep", "seed": 30 + i, "params": {"consumers": consumers, "strategy": "AVG"}}
        (run_dir / "manifest.json").write_text(json.dumps(manifest))
    write_run(root / "loose", chaotic_run(31, scenarios=3))  # no manifest: its *.jsonl files make it a run
    (root / "broken").mkdir()
    (root / "broken" / "manifest.json").write_text("{not json")
    (root / "broken" / "x.jsonl").write_text('{"ts_ms": 1, "event": "log", "node": "n", "role": "broker"}\n')
    out = tmp_path / "out"
    # The Spark analysis of many runs (small runs like these go to the reference by default, see
    # test_pipeline_small_runs.py). Run-0 loses messages, and one run is skipped.
    assert main([str(root), "--out", str(out), "--analysis", "spark"]) == 1
    captured = capsys.readouterr()
    assert "skipping run 'broken': manifest.json is not valid JSON" in captured.err
    for stage in (
        "3 run(s) found, 1 skipped",
        "read events: 3 runs",
        "metrics",
        "plot data",
        "write outputs",
    ):
        assert stage in captured.err
    assert "2026/run-0: FAIL (g-concurrent)" in captured.out and "2026/run-1: OK" in captured.out
    for rel in ("2026/run-0", "2026/run-1", "loose"):
        # Like a single run's: the contract's fields plus RocketMQ time, unavailability and the answer.
        summary = json.loads((out / rel / "summary.json").read_text())
        assert isinstance(summary.pop("answer"), list)
        assert summary == full_summary(root / rel), rel
        assert "data:image/png;base64," in (out / rel / "report.html").read_text()
    with open(out / "runs.csv", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    assert {(r["run"], r["group"]) for r in rows if r["run"].startswith("2026")} == {
        (f"2026/run-{i}", g) for i in (0, 1) for g in ("g-concurrent", "g-orderly")
    }
    first = next(r for r in rows if r["run"] == "2026/run-0" and r["group"] == "g-concurrent")
    assert first["experiment"] == "sweep" and first["seed"] == "30" and first["param.consumers"] == "3"
    assert int(first["lost"]) > 0 and first["verdict"] == "fail"
    for row in rows:  # the unavailability columns are the summaries' numbers
        if row["group"]:
            group = json.loads((out / row["run"] / "summary.json").read_text())["groups"][row["group"]]
            by_cause = group["unavailability"]["by_cause_rocketmq_ms"]
            assert int(row["unavailable_rocketmq_ms"]) == group["unavailability"]["total_rocketmq_ms"]
            assert {c: int(row[f"unavailable_{c}_rocketmq_ms"]) for c in by_cause} == by_cause
    assert float(first["time_scale"]) == 1.0
    table = spark.read.parquet(str(out / "runs.parquet"))
    assert table.count() == len(rows) and dict(table.dtypes)["lost"] == "bigint"
    index = (out / "index.html").read_text()
    assert "href='2026/run-1/report.html'" in index and "broken" in index
    assert "lost by consumers" in index  # the metric plotted against the parameter that varies


def test_the_verdict_tells_a_simulated_runs_durations_as_simulated(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from rmqlab.pipeline.__main__ import print_verdict
    from rmqlab.pipeline.discover import clock_word

    group = {
        "verdict": "ok",
        "sent": 1,
        "consumed_unique": 1,
        "lost": 0,
        "duplicates": 0,
        "overlap_ms": 0,
        "orphan_ms": 0,
        "stalled_ms": 0,
        "convergence": [{"convergence_ms": 204, "converged": True}],
    }
    (tmp_path / "manifest.json").write_text('{"mode": "sim"}')
    assert clock_word(tmp_path) == "simulated" and clock_word(tmp_path / "elsewhere") == "wall"
    assert print_verdict({"groups": {"g": group}}, tmp_path, False, clock_word(tmp_path)) == 0
    assert "slowest convergence 204 ms simulated" in capsys.readouterr().out
    print_verdict({"groups": {"g": group}}, tmp_path, False)
    assert "slowest convergence 204 ms wall" in capsys.readouterr().out
