"""Durations say what was measured: a simulated run's verdict line and report say simulated (it has no
wall time), a run of real processes' say wall. The run is one `rmq-sim run demo`; its copy without the
manifest's ``mode = sim`` is what a run of processes looks like to the analysis."""

from __future__ import annotations

import contextlib
import io
import json
import re
import shutil
from pathlib import Path

import pytest

from rmqlab.pipeline.discover import RunDir, clock_word, discover
from rmqlab.pipeline.quick import quick_summary, verdict_lines
from rmqlab.pipeline.report_page import render_html
from rmqlab.pipeline.runs import runs_clock
from rmqlab.pipeline.small_runs import analyse_run
from rmqlab.sim.__main__ import main as sim_main


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, str]:
    """(the simulated demo run, its copy as a run of processes, what rmq-sim run printed)."""
    root = tmp_path_factory.mktemp("clock")
    sim = root / "sim"
    out = io.StringIO()
    with pytest.MonkeyPatch.context() as mp:
        # the quick verdict is printed either way; the Spark report is another test's
        mp.setattr("rmqlab.lab.runner.pipeline_available", lambda: False)
        with contextlib.redirect_stdout(out):
            assert sim_main(["run", "demo", "--out", str(sim), "--quiet"]) == 0
    processes = root / "processes"
    shutil.copytree(sim, processes)
    manifest = json.loads((processes / "manifest.json").read_text())
    assert manifest.pop("mode") == "sim"
    (processes / "manifest.json").write_text(json.dumps(manifest))
    return sim, processes, out.getvalue()


def report(run_dir: Path) -> str:
    summary, data = analyse_run(RunDir(".", str(run_dir), discover(run_dir), {}), plots=True)
    return render_html(summary, data, "Run")


def test_rmq_sim_run_says_its_convergence_in_simulated_ms(runs: tuple[Path, Path, str]) -> None:
    _sim, _processes, printed = runs
    lines = [line for line in printed.splitlines() if "slowest convergence" in line]
    assert lines and all(
        re.search(r"slowest convergence (\d+\.\d s RocketMQ \()?\d+ ms simulated\b", line) for line in lines
    ), printed


def test_a_process_runs_verdict_line_says_wall(runs: tuple[Path, Path, str]) -> None:
    sim, processes, _printed = runs
    for run_dir, word in ((sim, "simulated"), (processes, "wall")):
        summary = quick_summary(run_dir)
        assert summary is not None
        (line,) = [x for x in verdict_lines(summary, clock_word(run_dir)) if "slowest convergence" in x]
        assert re.search(rf"slowest convergence (\d+\.\d s RocketMQ \()?\d+ ms {word}\b", line), line


def test_a_simulated_runs_report_never_says_wall(runs: tuple[Path, Path, str]) -> None:
    sim, processes, _printed = runs
    simulated, real = report(sim), report(processes)
    for page, word, other in ((simulated, "simulated", "wall"), (real, "wall", "simulated")):
        assert f" ms {word}</small>" in page  # the metrics table
        assert f"per {word} second" in page  # the rate chart's caption
        assert re.search(rf"\d s {word}\)", page)  # times of the story (the demo's time scale is 0.05)
        assert f"ms {other}" not in page and f"s {other})" not in page
    assert "wall" not in re.sub(r"no wall time", "", simulated)


def test_the_runs_index_names_the_clock_of_its_runs(runs: tuple[Path, Path, str]) -> None:
    sim, processes, _printed = runs

    def run(path: Path) -> RunDir:
        return RunDir(path.name, str(path), discover(path), {})

    assert runs_clock([run(sim)]) == "simulated"
    assert runs_clock([run(processes)]) == "wall"
    assert runs_clock([run(sim), run(processes)]) == "wall or simulated"
