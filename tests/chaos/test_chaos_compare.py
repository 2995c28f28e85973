"""`rmq-chaos compare`: the side-by-side table of one experiment on the emulator and on an Apache engine
(pure, from summaries), the command's refusals before anything starts, and one small comparison with
real processes when the engine and Apache's clients are here."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from kit.chaos import line_of

from rmqlab.chaos.__main__ import main
from rmqlab.chaos.compare import Cell, agree, compare_groups, group_figures, render
from rmqlab.chaos.realclients import RealClients
from rmqlab.interop.apache.engine import EngineUnavailable, check_environment


def summary(**groups: dict[str, Any]) -> dict[str, Any]:
    base = {"sent": 100, "lost": 0, "duplicates": 0, "overlap_ms": 0, "orphan_ms": 0, "verdict": "ok"}
    return {"groups": {g: {**base, **figures} for g, figures in groups.items()}}


def kill(ms: int, converged: bool = True) -> dict[str, Any]:
    return {
        "cause": "kill consumer-2",
        "converged": converged,
        "convergence_rocketmq_ms": ms if converged else None,
    }


def test_group_figures_take_the_slowest_kill_convergence_and_count_the_unconverged() -> None:
    g = {
        "lost": 0,
        "convergence": [kill(40), kill(90), {"cause": "start x on consumer-1", "converged": False}],
    }
    figures = group_figures(g)
    assert figures["kill_convergence_ms"] == 90 and figures["unconverged"] == 1
    assert group_figures({"convergence": []})["kill_convergence_ms"] is None


def test_cells_show_the_spread_over_seeds_and_ranges_that_overlap_agree() -> None:
    assert Cell((3, 3)).show() == "3" and Cell((2, 5, 3)).show() == "2..5" and Cell((None,)).show() == "-"
    assert agree("duplicates", Cell((2, 5)), Cell((5, 9))) is True
    assert agree("duplicates", Cell((0, 1)), Cell((4, 9))) is False
    assert agree("lost", Cell((0, 0)), Cell((0, 1))) is False  # lost is compared exactly
    assert agree("verdict", Cell(("ok",)), Cell(("fail",))) is False
    assert agree("kill_convergence_ms", Cell((None,)), Cell((10,))) is None


def test_the_table_puts_engines_side_by_side_and_names_what_differs() -> None:
    ours = [summary(g={"duplicates": 2, "convergence": [kill(20)]}), summary(g={"duplicates": 4})]
    theirs = [
        summary(g={"duplicates": 3, "orphan_ms": 900, "verdict": "fail", "convergence": [kill(20)]}),
        summary(g={"duplicates": 3, "orphan_ms": 800}),
    ]
    table = compare_groups({"emulator": ours, "apache-4.9.7": theirs})
    g = table["g"]
    assert g["duplicates"] == {"emulator": [2, 4], "apache-4.9.7": [3, 3], "agree": True}
    assert g["orphan_ms"]["agree"] is False and g["verdict"]["agree"] is False
    assert g["lost"]["agree"] is True
    text = render(table, ["emulator", "apache-4.9.7"])
    lines = {line.split()[0]: line for line in text.splitlines() if line.strip()}
    assert lines["duplicates"].split() == ["duplicates", "2..4", "3", "yes"]
    assert lines["orphan_ms"].split() == ["orphan_ms", "0", "800..900", "NO"]
    assert "2 figure(s) differ: verdict, orphan_ms" in text


OURS_ONLY = """\
name = "ours"
duration = 20

[[topics]]
name = "T"
queues = 4

[[consumers]]
group = "g"
topic = "T"
count = 2
"""


def test_an_experiment_apache_broker_cannot_run_is_refused_at_its_lines(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # the lab's own consumers join Apache's broker (over RocketMQ's protocol); rmq-proxy's clients cannot
    text = OURS_ONLY.replace("count = 2\n", 'count = 2\nclient = "py5"\n')
    f = tmp_path / "ours.toml"
    f.write_text(text)
    assert main(["compare", str(f), "--out", str(tmp_path / "cmp")]) == 2
    err = capsys.readouterr().err
    line = line_of(text, "py5")
    assert f"{f}:{line}: consumers[1]: engine 'apache-4.9.7'" in err
    assert not (tmp_path / "cmp").exists()


def test_an_engine_that_does_not_exist_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "ours.toml"
    f.write_text(OURS_ONLY.replace("count = 2\n", 'count = 2\nclient = "java"\n'))
    assert main(["compare", str(f), "--engine", "apache-4.9.8"]) == 2
    err = capsys.readouterr().err
    assert "engine 'apache-4.9.8'" in err and "use apache-4.9.7" in err
    assert main(["compare", str(f), "--engine", "emulator"]) == 2
    assert "--engine must name an Apache engine" in capsys.readouterr().err


def _missing() -> str | None:
    why = [w for kind in ("java", "go") if (w := RealClients().missing(kind))]
    try:
        check_environment("apache-4.9.7")
    except EngineUnavailable as e:
        why.append(str(e))
    return "; ".join(why) or None


SMALL = """\
name = "compare-small"
time_scale = 0.5
duration = 30
seed = 2
drain_timeout = 60

[[topics]]
name = "CmpTopic"
queues = 4

[[consumers]]
group = "GID_cmp"
topic = "CmpTopic"
client = "java"
count = 2

[workload]
rate = 10
count = 100

[[nemesis]]
action = "kill"
target = "consumer-1"
at = 14
"""


@pytest.mark.slow
@pytest.mark.skipif(_missing() is not None, reason=_missing() or "")
def test_a_small_comparison_runs_both_engines(tmp_path: Path) -> None:
    f = tmp_path / "small.toml"
    f.write_text(SMALL)
    out = tmp_path / "cmp"
    done = subprocess.run(
        [sys.executable, "-m", "rmqlab.chaos", "compare", str(f), "--out", str(out), "--json"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode in (0, 1), done.stdout + done.stderr
    doc = json.loads(done.stdout)
    assert doc == json.loads((out / "compare.json").read_text())
    assert doc["engines"] == ["emulator", "apache-4.9.7"] and doc["seeds"] == [2]
    g = doc["groups"]["GID_cmp"]
    assert g["sent"] == {"emulator": [100], "apache-4.9.7": [100], "agree": True}
    assert g["lost"] == {"emulator": [0], "apache-4.9.7": [0], "agree": True}
    assert g["verdict"]["emulator"] == ["ok"] and g["verdict"]["agree"] is True
    assert (out / "apache-4.9.7-seed2" / "engine" / "broker-a" / "store").is_dir()
    assert not (out / "emulator-seed2" / "engine").exists()


def test_the_shipped_comparisons_run_on_both_engines() -> None:
    from rmqlab.chaos.__main__ import resolve
    from rmqlab.lab.experiment import with_engine

    for name in ("java-kill-one-of-four", "java-kill-orderly-consumer"):
        exp = resolve(name)
        assert {c.client for c in exp.consumers} == {"java"} and exp.engine == "emulator", name
        for engine in ("apache-4.9.7", "apache-5"):
            assert with_engine(exp, engine).engine == engine
        wall = exp.wall(exp.duration + exp.drain_timeout)
        assert exp.time_scale >= 0.5 and wall <= 80, name
    assert resolve("java-kill-orderly-consumer").consumers[0].orderly
