"""rmq-sim sweep end to end: a small sweep killed mid-way and started again runs only what was not
finished and ends with the complete tables; the summaries its tasks wrote equal the Spark analysis of the
same runs; its runs replay byte for byte; on a standalone Spark cluster the same sweep gives the same
runs and the same tables as local mode."""

from __future__ import annotations

import contextlib
import csv
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rmqlab.pipeline.discover import discover_runs
from rmqlab.pipeline.ingest import run_prefix
from rmqlab.pipeline.runs import analyse_runs
from rmqlab.pipeline.sweep_report import queue_moves
from rmqlab.sim.__main__ import event_files
from rmqlab.sim.sweep import COMPLETE, load_sweep
from rmqlab.sim.sweep_run import SweepResult, run_sweep

pytestmark = pytest.mark.spark

SWEEP = """\
name = "small"
question = "Which strategy moves fewest queues when a consumer is killed?"
seeds = 2

[experiment]
time_scale = 1
duration = 30
drain_timeout = 60

[[experiment.topics]]
name = "T"
queues = 8

[[experiment.consumers]]
group = "G"
topic = "T"
count = 3
consume_ms = 1
orderly = true  # queues allocated but not yet locked: the unavailability's lock_wait

[experiment.workload]
rate = 10
count = 300

[[experiment.nemesis]]
action = "restart"
target = "consumer:next"
mode = "kill"
down = 5
at = 10

[vary]
consumers.strategy = ["AVG", "CONSISTENT_HASH"]
"""
RUNS = 4


def _env() -> dict[str, str]:
    env = dict(os.environ, RMQ_ANALYZE_DRIVER_MEMORY="1g")
    env.pop("SPARK_CONF_DIR", None)  # each process makes its own quiet configuration
    return env


def _descendants(root: int) -> list[int]:
    """Every process below ``root`` (by parent pid, read from /proc)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"  # a zombie runs nothing more


def _wait_gone(pids: list[int]) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and any(_running(pid) for pid in pids):
        time.sleep(0.05)


def _markers(out: Path) -> dict[str, tuple[int, bytes]]:
    return {
        p.parent.relative_to(out).as_posix(): (p.stat().st_mtime_ns, p.read_bytes())
        for p in out.glob(f"*/seed-*/{COMPLETE}")
    }


@pytest.fixture(scope="module")
def resumed(
    spark: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Path, Path, dict, SweepResult]]:
    """A sweep killed (with its Spark JVM and workers) after its first finished run, then run again
    in-process on the tests' Spark session: (sweep file, output, markers before, result)."""
    tmp = tmp_path_factory.mktemp("sweep")
    path, out = tmp / "small.toml", tmp / "out"
    path.write_text(SWEEP)
    with open(tmp / "killed.log", "wb") as log:
        proc = subprocess.Popen(
            # one task at a time, so that the kill comes between runs
            [sys.executable, "-m", "rmqlab.sim", "sweep", str(path), "--out", str(out),
             "--master", "local[1]"],
            env=_env(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        deadline = time.monotonic() + 600
        while not _markers(out) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        # PySpark's worker daemon puts itself and its workers in a process group of their own, so a kill
        # of the sweep's group leaves a worker running the rest of its task's runs for a moment: kill
        # every descendant, whatever its group, so no run finishes after the markers are read below.
        doomed = _descendants(proc.pid)
        os.killpg(proc.pid, signal.SIGKILL)
        for pid in doomed:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        proc.wait()
        _wait_gone(doomed)
    finished = sorted(out.glob(f"*/seed-*/{COMPLETE}"))
    assert 0 < len(finished) < RUNS, (tmp / "killed.log").read_text()[-3000:]
    # As if a sweep that did not analyse in its tasks had finished the first run: the resumed sweep
    # analyses that one in Spark.
    marker = json.loads(finished[0].read_text())
    assert isinstance(marker.pop("queue_moves"), dict)
    finished[0].write_text(json.dumps(marker, sort_keys=True))
    before = _markers(out)
    result = run_sweep(load_sweep(path), out, show_progress=False)
    yield path, out, before, result


def _table(path: Path) -> list[dict[str, str]]:
    with open(path, encoding="utf-8", newline="") as fh:
        return list(csv.DictReader(fh))


def test_an_interrupted_sweep_resumes_without_rerunning_finished_runs(resumed: Any) -> None:
    _path, out, before, result = resumed
    after = _markers(out)
    assert len(after) == RUNS
    for rel, marker in before.items():
        assert after[rel] == marker, f"{rel} was run again"
    assert (result.resumed, result.ran) == (len(before), RUNS - len(before))
    assert {o["hash_seed"] for o in result.outcomes.values()} == {"0"}
    rows = _table(out / "sweep.csv")
    assert [r["param.consumers.strategy"] for r in rows] == ["AVG", "CONSISTENT_HASH"]
    assert {r["runs"] for r in rows} == {"2"} and {r["group"] for r in rows} == {"G"}
    for r in rows:
        assert float(r["changes_median"]) >= 1  # the kill and the return are membership changes
        assert float(r["lost_max"]) == 0
    assert len(_table(out / "runs.csv")) == RUNS
    page = (out / "sweep.html").read_text()
    assert "queue_moves by consumers.strategy" in page and "data:image/png;base64," in page


def test_the_summaries_of_the_tasks_equal_the_spark_analysis(spark: Any, resumed: Any) -> None:
    _path, out, before, _result = resumed
    runs, bad = discover_runs(out)
    assert len(runs) == RUNS and not bad
    analysed = analyse_runs(spark, runs, [], plots=False, extra=queue_moves)
    in_spark = []
    for i, run in enumerate(runs):
        expected = json.loads(json.dumps(analysed.summaries[run.rel]))
        assert json.loads((out / run.rel / "summary.json").read_text()) == expected, run.rel
        marker = json.loads((out / run.rel / COMPLETE).read_text())
        if "queue_moves" not in marker:
            in_spark.append(run.rel)
            continue
        moves = {g: n for (prefix, g), n in analysed.extra.items() if prefix == run_prefix(i)}
        assert marker["queue_moves"] == moves and sum(moves.values()) > 0, run.rel
    assert len(in_spark) == 1 and in_spark[0] in before  # the one the fixture made look older


def test_a_run_of_the_sweep_replays_byte_for_byte(resumed: Any) -> None:
    _path, out, before, _result = resumed
    rel = next(r for r in sorted(_markers(out)) if r not in before)  # run in the tests' Spark worker
    done = subprocess.run(
        [sys.executable, "-m", "rmqlab.sim", "replay", str(out / rel)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "identical" in done.stdout


def test_a_standalone_cluster_gives_the_same_runs_and_tables(
    resumed: Any, cluster: str, tmp_path: Path
) -> None:
    path, local, _before, _result = resumed
    out = tmp_path / "on-cluster"
    done = subprocess.run(
        [sys.executable, "-m", "rmqlab.sim", "sweep", str(path), "--master", cluster, "--out", str(out)],
        env=_env(), capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert done.returncode in (0, 1), done.stdout + done.stderr[-3000:]
    assert f"spark: {cluster}" in done.stderr
    for rel in _markers(local):
        assert event_files(out / rel) == event_files(local / rel), rel
    assert _table(out / "sweep.csv") == _table(local / "sweep.csv")
    assert _table(out / "runs.csv") == _table(local / "runs.csv")
