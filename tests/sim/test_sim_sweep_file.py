"""Sweep files: the grid they expand to, the experiment text of each run, and every kind of mistake
reported as ``file:line: problem`` before anything runs (no Spark, no simulation here). Also the
[sim] table's client switches a sweep varies: they reach the simulated consumers."""

from __future__ import annotations

import gc
import io
import json
import tomllib
from pathlib import Path
from typing import Any

import pytest

from rmqlab.lab.experiment import ExperimentError
from rmqlab.sim.__main__ import main
from rmqlab.sim.sim_table import parse
from rmqlab.sim.sweep import load_sweep, parse_sweep, to_toml
from rmqlab.sim.sweep_run import Progress, SweepMismatch, prepare, task_batches

ROOT = Path(__file__).resolve().parents[2]

SWEEP = """\
name = "tiny"
question = "q"
seeds = [5, 9]

[experiment]
time_scale = 1
duration = 60

[[experiment.topics]]
name = "T"
queues = 8

[[experiment.consumers]]
group = "G"
topic = "T"
count = 2

[[experiment.consumers]]
group = "H"
topic = "T"
count = 1
strategy = "AVG_BY_CIRCLE"

[experiment.workload]
rate = 10
count = 100

[set]
drain_timeout = 30

[vary]
consumers.strategy = ["AVG", "CONSISTENT_HASH"]
"consumers.1.count" = { from = 2, to = 6, step = 2 }
policies.notify_on_channel_expired = [false, true]
"""


def test_the_grid_is_every_combination_in_file_order_with_every_seed() -> None:
    sweep = parse_sweep(SWEEP, "tiny.toml")
    assert len(sweep.points) == 2 * 3 * 2
    assert sweep.points[0].params == {
        "consumers.strategy": "AVG",
        "consumers.1.count": 2,
        "policies.notify_on_channel_expired": False,
    }
    assert sweep.points[-1].params == {
        "consumers.strategy": "CONSISTENT_HASH",
        "consumers.1.count": 6,
        "policies.notify_on_channel_expired": True,
    }
    runs = sweep.runs()
    assert [r.seed for r in runs[:4]] == [5, 9, 5, 9]
    assert runs[1].rel == "p001_strategy-AVG_count-2_notify_on_channel_expired-false/seed-9"
    assert len({r.rel for r in runs}) == len(runs) == 24


def test_each_run_is_the_base_with_its_point_and_seed() -> None:
    run = parse_sweep(SWEEP, "tiny.toml").runs()[-1]
    exp = parse(run.text, source="tiny.toml").exp
    assert exp.seed == 9 and exp.drain_timeout == 30 and exp.duration == 60
    # without an index, every [[consumers]] table gets the value; with one, only that table
    assert [c.strategy for c in exp.consumers] == ["CONSISTENT_HASH", "CONSISTENT_HASH"]
    assert [c.count for c in exp.consumers] == [6, 1]
    assert exp.policies.notify_on_channel_expired is True
    assert run.text.startswith("# Sweep tiny, point p012")


def test_a_float_range_and_a_base_by_file_and_by_shipped_name(tmp_path: Path) -> None:
    base = tmp_path / "base.toml"
    base.write_text((ROOT / "chaos/experiments/churn-avg.toml").read_text())
    (tmp_path / "s.toml").write_text(
        'base = "base.toml"\n[vary]\nduration = { from = 100, to = 101, step = 0.5 }\n'
    )
    assert [p.params["duration"] for p in load_sweep(tmp_path / "s.toml").points] == [100.0, 100.5, 101.0]
    (tmp_path / "t.toml").write_text('base = "kill-one-of-four"\nseeds = 2\n')
    shipped = load_sweep(tmp_path / "t.toml")
    assert len(shipped.runs()) == 2 and shipped.base_source.endswith("kill-one-of-four.toml")


@pytest.mark.parametrize(
    "name",
    sorted(p.name for d in ("chaos/experiments", "sim/experiments") for p in (ROOT / d).glob("*.toml")),
)
def test_experiment_text_reads_back_as_the_same_data(name: str) -> None:
    folder = "sim/experiments" if (ROOT / "sim/experiments" / name).is_file() else "chaos/experiments"
    data = tomllib.loads((ROOT / folder / name).read_text())
    assert tomllib.loads(to_toml(data)) == data


def test_the_shipped_sweeps_expand() -> None:
    sizes = {p.name: len(load_sweep(p).runs()) for p in sorted((ROOT / "sweeps").glob("*.toml"))}
    assert sizes == {
        "broker-policies.toml": 12,
        "rocketmq5-rolling.toml": 12,
        "strategy-churn.toml": 12,
        "strategy-churn-full.toml": 90,
    }


BAD = [
    ("colour = 1\n[experiment]\n", 1, "unknown key 'colour'"),
    ('base = "x.toml"\n[experiment]\nduration = 1\n', 1, "either as base = FILE"),
    ("seeds = 3\n", None, "give the base experiment"),  # a missing key has no line
    ('seeds = 0\nbase = "churn-avg"\n', 1, "seeds: must be >= 1"),
    ('base = "nowhere.toml"\n', 1, "no experiment file"),
    ('base = "churn-avg"\n[vary]\nseed = [1, 2]\n', 3, "the seeds are the sweep's 'seeds'"),
    ('base = "churn-avg"\n[vary]\nduration = []\n', 3, "an empty list varies nothing"),
    ('base = "churn-avg"\n[vary]\nduration = { from = 9, to = 1 }\n', 3, "to >= from"),
    ('base = "churn-avg"\n[vary]\nduration = 300\n', 3, "give a list of values or a range"),
    ('base = "churn-avg"\n\n[vary]\nconsumers.strategy = ["AVG", "NOPE"]\n', 4, "must be one of AVG"),
    (
        'base = "churn-avg"\n[vary]\n"consumers.2.count" = [1, 2]\n',
        3,
        "the base has 1 [[consumers]] table(s), not 2",
    ),
    ('base = "churn-avg"\n[vary]\nconsumers.strategyy = ["AVG"]\n', 3, "unknown key 'strategyy'"),
    ('base = "churn-avg"\n[set]\nduration = -5\n', 3, "duration = -5: duration: must be > 0"),
    ('base = "churn-avg"\n[vary]\nduration = [1, 1]\n', 3, "a value is listed twice"),
    ('base = "churn-avg"\n[vary]\nduration = [100]\n"duration" = [200]\n', 4, "not valid TOML"),
    ('base = "churn-avg"\n[vary]\nsim.client.pull_batch_size = [16, 5000]\n', 3, "out of range"),
    ('base = "churn-avg"\n[vary]\nsim.client.namesrv_addr = ["x:1"]\n', 3, "set by the simulator"),
    ('base = "churn-avg"\n[vary]\nsim.rocketmq5 = [false, 1]\n', 3, "sim.rocketmq5: must be true or false"),
]


@pytest.mark.parametrize(("text", "line", "problem"), BAD, ids=[b[2] for b in BAD])
def test_a_bad_sweep_file_names_its_line_and_problem(
    tmp_path: Path, text: str, line: int | None, problem: str
) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(ExperimentError) as info:
        load_sweep(path)
    where = f"{path}:{line}: " if line else f"{path}: "
    assert where in str(info.value), str(info.value)
    assert problem in str(info.value)


def test_a_bad_base_experiment_names_its_own_file_and_line(tmp_path: Path) -> None:
    (tmp_path / "base.toml").write_text('duration = 10\n[[topics]]\nname = "T"\nqueues = 0\n')
    (tmp_path / "s.toml").write_text('base = "base.toml"\n')
    with pytest.raises(ExperimentError, match=r"base\.toml:4: topics\[1\]\.queues: must be > 0"):
        load_sweep(tmp_path / "s.toml")


def test_rmq_sim_sweep_refuses_a_bad_file_before_anything_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "bad.toml"
    path.write_text('base = "churn-avg"\n[vary]\nconsumers.count = [2, 0]\n')
    assert main(["sweep", str(path), "--out", str(tmp_path / "out")]) == 2
    assert f"{path}:3: consumers.count = 0: consumers[1].count: must be > 0" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_a_resumed_output_folder_must_hold_the_same_sweep(tmp_path: Path) -> None:
    prepare(parse_sweep(SWEEP, "tiny.toml"), tmp_path / "out")
    prepare(parse_sweep(SWEEP, str(tmp_path / "elsewhere" / "tiny.toml")), tmp_path / "out")  # same grid
    with pytest.raises(SweepMismatch, match="another sweep"):
        prepare(parse_sweep(SWEEP.replace("[5, 9]", "[5]"), "tiny.toml"), tmp_path / "out")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("")
    with pytest.raises(SweepMismatch, match="not empty"):
        prepare(parse_sweep(SWEEP, "tiny.toml"), tmp_path / "full")


RUN = """\
name = "switches"
time_scale = 1
duration = 60
seed = 1
drain_timeout = 60

[[topics]]
name = "T"
queues = 4

[[consumers]]
group = "G"
topic = "T"
count = 2

[sim]
omit_repeated_rebalances = false
"""


def _rebalances(run_dir: Path) -> int:
    return sum(
        p.read_text().count('"event": "rebalance"') + p.read_text().count('"event":"rebalance"')
        for p in run_dir.glob("consumer-*.jsonl")
    )


def test_sim_client_and_rocketmq5_reach_the_simulated_consumers(tmp_path: Path) -> None:
    from rmqlab.sim.sim_cluster import SimCluster

    def run(extra: str, name: str) -> Path:
        sx = parse(RUN + extra, source=f"{name}.toml")
        with open(tmp_path / f"{name}.log", "w") as printed:
            SimCluster(sx, tmp_path / name, progress=False, out=printed).run()
        return tmp_path / name

    default = _rebalances(run("", "default"))
    fast = _rebalances(run("[sim.client]\nrebalance_wait_interval = 5000\n", "fast"))
    assert default > 0 and fast >= 3 * default  # 60 s of rebalancing every 5 s instead of every 20 s
    four = (tmp_path / "default" / "consumer-1.jsonl").read_bytes()
    five = (run("rocketmq5 = true\n", "five") / "consumer-1.jsonl").read_bytes()
    assert four != five
    manifest = (tmp_path / "five" / "manifest.json").read_text()
    assert '"rocketmq5": true' in manifest


def test_a_run_task_skips_a_finished_run_and_redoes_an_interrupted_one(tmp_path: Path) -> None:
    from rmqlab.sim.sweep import COMPLETE, ERROR, RunSpec, run_task

    good = parse_sweep(SWEEP.replace("duration = 60", "duration = 20"), "tiny.toml").runs()[0]
    broken = RunSpec(**{**good.__dict__, "text": good.text.replace("duration = 20", "duration = -1")})
    crashed = run_task(broken, str(tmp_path))
    assert crashed["status"] == "crashed" and "duration: must be > 0" in crashed["error"]
    run_dir = tmp_path / good.rel
    assert (run_dir / ERROR).is_file() and not (run_dir / COMPLETE).exists()
    done = run_task(good, str(tmp_path))  # the crashed run's directory is replaced
    assert done["status"] == "ok" and not (run_dir / ERROR).exists()
    assert "queue_moves" in done and gc.isenabled()  # analysed with the collector off, then on again
    marker = (run_dir / COMPLETE).read_bytes()
    assert json.loads((run_dir / "manifest.json").read_text())["params"] == good.params
    again = run_task(good, str(tmp_path))
    assert again == {**done, "resumed": True} and (run_dir / COMPLETE).read_bytes() == marker


def test_a_spark_task_runs_each_run_with_the_workers_objects_frozen_and_unfreezes_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import rmqlab.sim.sweep_run

    specs = parse_sweep(SWEEP, "tiny.toml").runs()[:3]
    seen: list[tuple[str, int, bool]] = []

    def run_task(spec: Any, out_dir: str) -> dict[str, Any]:
        seen.append((spec.rel, gc.get_freeze_count(), gc.isenabled()))
        return {"run": spec.rel}

    monkeypatch.setattr(rmqlab.sim.sweep_run, "run_task", run_task)
    assert gc.get_freeze_count() == 0
    assert rmqlab.sim.sweep_run.run_batch(specs, "out") == [{"run": s.rel} for s in specs]
    assert [rel for rel, _, _ in seen] == [s.rel for s in specs]
    assert all(frozen > 1000 and enabled for _, frozen, enabled in seen)  # this process's modules, ...
    assert gc.get_freeze_count() == 0  # a worker's next task starts as it would have


def test_the_sweeps_spark_runs_a_jvm_for_light_work(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import rmqlab.pipeline.session
    from rmqlab.sim.sweep_run import SWEEP_SPARK_CONF, run_sweep

    asked: dict[str, Any] = {}

    class Stop(Exception):
        pass

    def start_spark(master: str | None, *, app_name: str, conf: dict[str, str]) -> None:
        asked.update(master=master, conf=conf)
        raise Stop

    monkeypatch.setattr(rmqlab.pipeline.session, "start_spark", start_spark)
    monkeypatch.setenv("PYTHONHASHSEED", "0")
    with pytest.raises(Stop):
        run_sweep(parse_sweep(SWEEP, "tiny.toml"), tmp_path / "out", show_progress=False)
    assert asked["conf"] == SWEEP_SPARK_CONF
    for side in ("driver", "executor"):
        assert "-XX:TieredStopAtLevel=1" in asked["conf"][f"spark.{side}.extraJavaOptions"].split()


def test_progress_counts_runs_and_weighs_the_time_left_by_cost() -> None:
    out = io.StringIO()
    progress = Progress(out, total=10, resumed=2, failed_before=1, enabled=True)
    progress.t0 -= 100
    progress.update(6, 2, cost_done=900, cost_left=100)  # the costly runs went first
    progress.update(6, 2, cost_done=900, cost_left=100)  # nothing new: no second line
    assert out.getvalue() == (
        "[rmq-sim sweep] 6/10 runs done (2 failed, 2 from before), 100 s elapsed, about 11 s left\n"
    )


def test_runs_share_spark_tasks_long_ones_first_single_runs_last() -> None:
    sweep = parse_sweep(SWEEP.replace("seeds = [5, 9]", "seeds = 50"), "many.toml")
    runs = sweep.runs()  # 2 points x 50 seeds
    costs = {r.rel: (10.0 if r.point == 1 else 1.0) for r in runs}
    ordered = sorted(runs, key=lambda r: -costs[r.rel])
    batches = task_batches(ordered, costs, slots=2)
    assert [r for b in batches for r in b] == ordered  # every run once, costliest first
    assert len(batches) < len(runs) / 4  # far fewer tasks than runs
    cost = [sum(costs[r.rel] for r in b) for b in batches]
    assert cost[0] <= sum(cost) / 4  # a quarter of the cost at most: both cores share the start
    assert cost == sorted(cost, reverse=True) and [len(b) for b in batches[-3:]] == [1, 1, 1]
    assert task_batches(ordered[:1], costs, slots=8) == [ordered[:1]]
