"""`rmq-chaos compare`: the side-by-side table of experiments on four combinations of broker and client
(pure, from summaries and events), the choice of combinations and the command's refusals before anything
starts, and one small comparison with real processes when the engine and Apache's clients are here."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from kit.chaos import line_of

from rmqlab.chaos.__main__ import main, resolve
from rmqlab.chaos.compare import (
    COMBOS,
    COMPARE_SET,
    Cell,
    agree,
    before_teardown,
    combination,
    compare_groups,
    event_figures,
    group_figures,
    parse_combos,
    render,
    render_markdown,
    with_client,
)
from rmqlab.chaos.realclients import RealClients
from rmqlab.interop.apache.engine import EngineUnavailable, check_environment
from rmqlab.lab.experiment import ExperimentError, parse
from rmqlab.pipeline.metrics_reference import Event


def summary(**groups: dict[str, Any]) -> dict[str, Any]:
    base = {"sent": 100, "lost": 0, "duplicates": 0, "overlap_ms": 0, "orphan_ms": 0, "verdict": "ok"}
    return {"groups": {g: {**base, **figures} for g, figures in groups.items()}}


def kill(ms: int, converged: bool = True) -> dict[str, Any]:
    return {
        "cause": "kill consumer-2",
        "converged": converged,
        "convergence_ms": ms if converged else None,
    }


def test_group_figures_take_the_slowest_kill_convergence_in_rocketmq_time_and_count_the_unconverged() -> None:
    g = {
        "lost": 0,
        "orphan_ms": 300,
        "convergence": [kill(40), kill(90), {"cause": "start x on consumer-1", "converged": False}],
    }
    figures = group_figures(g, time_scale=0.5)
    assert figures["kill_convergence_ms"] == 180 and figures["unconverged"] == 1
    assert figures["orphan_ms"] == 600 and figures["lost"] == 0
    # the pipeline's own RocketMQ time, when a summary has it, is taken as it is
    assert (
        group_figures({"convergence": [{**kill(40), "convergence_rocketmq_ms": 77}]}, 0.5)[
            "kill_convergence_ms"
        ]
        == 77
    )
    assert group_figures({"convergence": []})["kill_convergence_ms"] is None


def test_cells_show_the_spread_over_seeds_and_every_range_must_share_a_value() -> None:
    assert Cell((3, 3)).show() == "3" and Cell((2, 5, 3)).show() == "2..5" and Cell((None,)).show() == "-"
    assert agree("duplicates", Cell((2, 5)), Cell((5, 9))) is True
    assert agree("duplicates", Cell((0, 1)), Cell((4, 9))) is False
    # three ranges overlapping pairwise share a value; one apart breaks the agreement
    assert agree("duplicates", Cell((0, 4)), Cell((3, 6)), Cell((4, 9)), Cell((None,))) is True
    assert agree("duplicates", Cell((0, 4)), Cell((3, 6)), Cell((7, 9))) is False
    assert agree("lost", Cell((0, 0)), Cell((0, 0)), Cell((0, 1))) is False  # lost is compared exactly
    assert agree("verdict", Cell(("ok",)), Cell(("ok",)), Cell(("fail",))) is False
    assert agree("kill_convergence_ms", Cell((None,)), Cell((10,))) is None


def test_the_table_puts_four_combinations_side_by_side_and_names_who_differs() -> None:
    runs = {
        "emulator+python": [
            summary(g={"duplicates": 2, "convergence": [kill(20)]}),
            summary(g={"duplicates": 4}),
        ],
        "emulator+java": [summary(g={"duplicates": 3}), summary(g={"duplicates": 3})],
        "apache+java": [
            summary(g={"duplicates": 3, "orphan_ms": 900, "verdict": "fail", "convergence": [kill(20)]}),
            summary(g={"duplicates": 3, "orphan_ms": 800}),
        ],
        "apache+python": [summary(g={"duplicates": 9}), summary(g={"duplicates": 8, "lost": 1})],
    }
    table = compare_groups(runs)
    g = table["g"]
    assert g["duplicates"] == {
        "emulator+python": [2, 4],
        "emulator+java": [3, 3],
        "apache+java": [3, 3],
        "apache+python": [9, 8],
        "agree": False,
        "differ": ["apache+python"],
    }
    assert g["orphan_ms"]["differ"] == ["apache+java"] and g["verdict"]["differ"] == ["apache+java"]
    assert g["lost"]["differ"] == ["apache+python"] and g["lost"]["agree"] is False
    assert g["sent"]["agree"] is True and g["sent"]["differ"] == []
    combos = list(runs)
    text = render(table, combos)
    lines = {line.split()[0]: line for line in text.splitlines() if line.strip()}
    assert lines["duplicates"].split() == ["duplicates", "2..4", "3", "3", "8..9", "NO"]
    assert lines["orphan_ms"].split() == ["orphan_ms", "0", "0", "800..900", "0", "NO"]
    assert "4 figure(s) differ: verdict, lost, duplicates, orphan_ms" in text
    md = render_markdown({"combos": combos, "experiments": {"x": {"seeds": [1, 2], "groups": table}}})
    assert "| figure | emulator+python | emulator+java | apache+java | apache+python | agree |" in md
    assert (
        "| duplicates | 2..4 | 3 | 3 | 8..9 | NO |" in md
        and "| verdict | ok | ok | fail/ok | ok | NO |" in md
    )


def ev(ts: int, event: str, **fields: Any) -> dict[str, Any]:
    return {"ts_ms": ts, "event": event, **fields}


def owns(ts: int, client: str, *queues: int, group: str = "g") -> list[dict[str, Any]]:
    return [
        ev(ts, "mq_added", group=group, client_id=client, topic="T", broker="b", queue_id=q) for q in queues
    ]


def test_event_figures_measure_the_window_after_a_pause_and_the_rounds_per_member() -> None:
    events = [
        *(
            ev(0, "consumer_started", group="g", client_id=c, node=n)
            for c, n in (("c1", "consumer-1"), ("c2", "consumer-2"))
        ),
        *owns(10, "c1", 0, 1),
        *owns(10, "c2", 2, 3),
        ev(10, "rebalance", group="g", client_id="c1", changed=True),
        ev(10, "rebalance", group="g", client_id="c2", changed=True),
        ev(11, "rebalance", group="g", client_id="c2", changed=False),
        ev(100, "nemesis", action="pause", target="consumer-2"),
        *owns(150, "c2", 2),  # the paused client itself does not count
        *owns(400, "c1", 2),
        ev(400, "rebalance", group="g", client_id="c1", changed=True),
        *owns(700, "c1", 3),
    ]
    figures = event_figures(events, time_scale=0.5)["g"]
    assert figures["expiry_window_ms"] == 1200  # (700 - 100) wall ms at time scale 0.5
    assert figures["rebalance_rounds"] == 1.5 and figures["orderly_takeover_ms"] is None
    # a queue never taken over leaves the window unknown rather than short
    assert event_figures(events[:-1])["g"]["expiry_window_ms"] is None


def test_a_run_is_measured_up_to_the_teardown() -> None:
    recs = [ev(5, "mq_added"), ev(9, "nemesis"), ev(20, "teardown"), ev(20, "x"), ev(21, "mq_added")]
    events = [Event(r["ts_ms"], "chaos.jsonl", i, r) for i, r in enumerate(recs, 1)]
    assert [e.line for e in before_teardown(events)] == [1, 2, 3, 4]
    assert before_teardown(events[:2]) == events[:2]


def consumed(ts: int, client: str, queue: int) -> dict[str, Any]:
    return ev(
        ts,
        "message_consumed",
        group="g",
        client_id=client,
        topic="T",
        broker="b",
        queue_id=queue,
        mode="ORDERLY",
    )


def test_event_figures_measure_an_orderly_take_over_by_consumption_after_a_kill() -> None:
    events = [
        *(
            ev(0, "consumer_started", group="g", client_id=c, node=n)
            for c, n in (("c1", "consumer-1"), ("c2", "consumer-2"))
        ),
        *owns(10, "c1", 0),
        *owns(10, "c2", 1, 2),
        consumed(20, "c2", 1),
        ev(100, "nemesis", action="kill", target="consumer-2"),
        *owns(110, "c1", 1, 2),  # added, but the lock is the broker's for a while yet
        consumed(300, "c1", 1),
        consumed(350, "c1", 0),
        consumed(500, "c1", 2),
    ]
    assert event_figures(events)["g"]["orderly_takeover_ms"] == 400
    assert event_figures(events)["g"]["expiry_window_ms"] is None
    concurrent = [{**e, "mode": "CONCURRENTLY"} if e["event"] == "message_consumed" else e for e in events]
    assert event_figures(concurrent)["g"]["orderly_takeover_ms"] is None


def test_a_bad_combination_is_named_with_the_valid_ones(capsys: pytest.CaptureFixture[str]) -> None:
    assert [c.name for c in parse_combos("apache+java, emulator+python,apache+java")] == [
        "apache+java",
        "emulator+python",
    ]
    valid = "emulator+python, emulator+java, apache+java, apache+python"
    with pytest.raises(ValueError) as e:
        parse_combos("ours,emulator+java,java")
    assert str(e.value).endswith(f"'ours', 'java': use some of {valid}")
    with pytest.raises(ValueError, match="names no combination"):
        parse_combos(" , ")
    assert main(["compare", "java-kill-one-of-four", "--combos", "emulator+go"]) == 2
    assert f"unknown combination(s) 'emulator+go': use some of {valid}" in capsys.readouterr().err
    assert main(["compare", "--combos", "emulator+java"]) == 2
    assert "name an experiment, or --set" in capsys.readouterr().err


FAST = """\
name = "fast"
time_scale = 0.05
duration = 20

[[topics]]
name = "T"
queues = 4

[[consumers]]
group = "g"
topic = "T"
count = 2
broadcast = true
"""


def test_a_client_override_is_checked_at_the_lines_it_breaks() -> None:
    exp = parse(FAST, source="fast.toml")
    assert {c.client for c in with_client(exp, "python").consumers} == {"python"}
    with pytest.raises(ExperimentError) as e:
        combination(exp, COMBOS["emulator+java"], "apache-4.9.7")
    text = str(e.value)
    assert (
        f"fast.toml:{line_of(FAST, 'time_scale')}: combination emulator+java: time_scale: must be >= 0.5"
        in text
    )
    assert (
        f"fast.toml:{line_of(FAST, 'broadcast')}: combination emulator+java: consumers[1].broadcast" in text
    )
    java = combination(resolve("java-kill-one-of-four"), COMBOS["emulator+python"], "apache-4.9.7")
    assert java.engine == "emulator" and {c.client for c in java.consumers} == {"python"}


POLICY = """\
name = "policy"
time_scale = 0.5
duration = 20

[policies]
notify_on_channel_expired = true

[[topics]]
name = "T"
queues = 4

[[consumers]]
group = "g"
topic = "T"
count = 2
"""


def test_an_experiment_apache_broker_cannot_run_is_refused_at_its_lines_before_anything_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    f = tmp_path / "policy.toml"
    f.write_text(POLICY)
    assert main(["compare", str(f), "--out", str(tmp_path / "cmp")]) == 2
    err = capsys.readouterr().err
    for combo in ("apache+java", "apache+python"):
        assert (
            f"{f}:{line_of(POLICY, '[policies]')}: combination {combo}: policies: engine 'apache-4.9.7'"
            in err
        )
    assert "emulator+" not in err
    assert not (tmp_path / "cmp").exists()


def test_an_engine_that_does_not_exist_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "policy.toml"
    f.write_text(POLICY.replace("[policies]\nnotify_on_channel_expired = true\n", ""))
    assert main(["compare", str(f), "--engine", "apache-4.9.8", "--combos", "apache+java"]) == 2
    err = capsys.readouterr().err
    assert "engine 'apache-4.9.8'" in err and "use apache-4.9.7" in err
    assert main(["compare", str(f), "--engine", "emulator"]) == 2
    assert "--engine must name an Apache engine" in capsys.readouterr().err


def test_the_shipped_comparison_set_runs_on_every_combination() -> None:
    assert len(COMPARE_SET) == 6
    for name in COMPARE_SET:
        exp = resolve(name)
        assert exp.engine == "emulator" and exp.time_scale >= 0.5, name
        for combo in COMBOS.values():
            variant = combination(exp, combo, "apache-4.9.7")
            assert {c.client for c in variant.consumers} == {combo.client}, name
            assert variant.engine == ("emulator" if combo.broker == "emulator" else "apache-4.9.7")
        assert exp.wall(exp.duration + exp.drain_timeout) <= 130, name
    actions = {n.action for name in COMPARE_SET for n in resolve(name).nemeses}
    assert actions == {"kill", "pause", "restart"}
    assert resolve("java-kill-orderly-consumer").consumers[0].orderly
    assert len({c.topic for c in resolve("compare-seed-different-subscriptions").consumers}) == 2


def test_an_offset_flush_is_compared_only_at_the_interval_apache_broker_runs() -> None:
    exp = resolve("compare-broker-kill-restart")
    assert exp.durable and exp.flush_consumer_offset_interval == 5000
    assert combination(exp, COMBOS["apache+java"], "apache-4.9.7").flush_consumer_offset_interval == 5000
    text = exp.text.replace("flush_consumer_offset_interval = 5000", "flush_consumer_offset_interval = 3000")
    with pytest.raises(ExperimentError) as e:
        combination(parse(text, source="flush.toml"), COMBOS["apache+java"], "apache-4.9.7")
    line = line_of(text, "flush_consumer_offset_interval")
    assert f"flush.toml:{line}: combination apache+java: cluster.flush_consumer_offset_interval" in str(
        e.value
    )
    assert "5000 ms, scaled with time_scale" in str(e.value)


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
def test_a_small_comparison_runs_two_combinations(tmp_path: Path) -> None:
    f = tmp_path / "small.toml"
    f.write_text(SMALL)
    out = tmp_path / "cmp"
    cmd = [sys.executable, "-m", "rmqlab.chaos", "compare", str(f), "--out", str(out), "--seeds", "1"]
    done = subprocess.run(
        [*cmd, "--combos", "emulator+python,apache+java", "--json"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode in (0, 1), done.stdout + done.stderr
    doc = json.loads(done.stdout)
    assert doc == json.loads((out / "compare.json").read_text())
    assert doc["combos"] == ["emulator+python", "apache+java"]
    exp = doc["experiments"]["compare-small"]
    assert exp["seeds"] == [2] and exp["engines"] == {
        "emulator+python": "emulator",
        "apache+java": "apache-4.9.7",
    }
    g = exp["groups"]["GID_cmp"]
    assert g["sent"] == {"emulator+python": [100], "apache+java": [100], "agree": True, "differ": []}
    assert g["lost"]["emulator+python"] == [0] and g["lost"]["apache+java"] == [0]
    assert g["verdict"]["emulator+python"] == ["ok"] and g["verdict"]["agree"] is True
    assert g["kill_convergence_ms"]["apache+java"][0] is not None
    assert (out / "compare-small" / "apache+java-seed2" / "engine" / "broker-a" / "store").is_dir()
    assert not (out / "compare-small" / "emulator+python-seed2" / "engine").exists()
    assert "| verdict | ok | ok | yes |" in (out / "compare.md").read_text()
    # --resume keeps both complete runs and rebuilds the same table without running anything
    again = subprocess.run(
        [*cmd, "--combos", "emulator+python,apache+java", "--resume", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert again.returncode == done.returncode and "kept from before" in again.stderr
    redone = json.loads(again.stdout)["experiments"]["compare-small"]
    assert redone["groups"] == exp["groups"]
    kept = redone["runs"]["apache+java"][0]
    assert kept["kept"] and kept["load_average"] == exp["runs"]["apache+java"][0]["load_average"]
