"""The schedule an experiment expands to, pure and seeded, and the parser's hook for a backend's own table."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from rmqlab.lab.experiment import Experiment, ExperimentError, Problems, parse
from rmqlab.lab.schedule import (
    NemesisSpec,
    NodeInfo,
    Step,
    expand_schedule,
    live_random_targets,
    nemesis_times,
    pick_targets,
)

BASE = """\
name = "schedule"
duration = 100
seed = 3

[[topics]]
name = "T"
queues = 4

[[consumers]]
group = "G"
topic = "T"
count = 3
"""

NODES = {
    "namesrv": NodeInfo("namesrv", "namesrv"),
    "broker-a": NodeInfo("broker-a", "broker"),
    **{f"consumer-{i}": NodeInfo(f"consumer-{i}", "consumer", "G", "T", "python") for i in (1, 2, 3)},
}


def spec(**kw: Any) -> NemesisSpec:
    fields: dict[str, Any] = {
        "index": 1,
        "line": None,
        "action": "kill",
        "target": "consumer-1",
        "group": None,
        "at": (),
        "every": None,
        "start": None,
        "until": None,
        "times": None,
        "random_count": None,
        "for_s": None,
    }
    return NemesisSpec(**{**fields, **kw})


def plain(steps: list[Step]) -> list[tuple[float, str, str]]:
    return [(s.t, s.action, s.target) for s in steps]


def test_times_at_every_and_random() -> None:
    assert nemesis_times(spec(at=(30.0, 10.0)), 0, 100) == [10.0, 30.0]
    assert nemesis_times(spec(every=20.0), 0, 100) == [20.0, 40.0, 60.0, 80.0]
    assert nemesis_times(spec(every=20.0, start=5.0, until=50.0), 0, 100) == [5.0, 25.0, 45.0]
    assert nemesis_times(spec(every=10.0, times=2), 0, 100) == [10.0, 20.0]
    drawn = nemesis_times(spec(random_count=5, start=40.0, until=60.0), 7, 100)
    assert drawn == sorted(drawn) and len(drawn) == 5 and all(40 <= t <= 60 for t in drawn)
    assert drawn == nemesis_times(spec(random_count=5, start=40.0, until=60.0), 7, 100)
    assert drawn != nemesis_times(spec(random_count=5, start=40.0, until=60.0), 8, 100)


def test_selectors_pick_in_turn_all_or_at_random() -> None:
    nodes = ["a", "b", "c"]
    assert [pick_targets("consumer:next", nodes, k, None) for k in range(4)] == [["a"], ["b"], ["c"], ["a"]]  # type: ignore[arg-type]
    assert pick_targets("consumer:all", nodes, 0, None) == nodes  # type: ignore[arg-type]
    assert pick_targets("b", ["b"], 0, None) == ["b"]  # type: ignore[arg-type]


def test_an_entry_with_for_is_undone_after_it_and_steps_come_in_time_order() -> None:
    steps = expand_schedule(
        [
            spec(index=1, action="pause", target="consumer-2", at=(50.0,), for_s=20.0),
            spec(
                index=2,
                action="latency",
                target="consumer-1",
                at=(10.0,),
                for_s=5.0,
                params={"broker": "broker-a", "ms": 100},
            ),
            spec(index=3, action="kill", target="consumer:next", every=30.0),
        ],
        NODES,
        0,
        100,
    )
    assert plain(steps) == [
        (10.0, "latency", "consumer-1"),
        (15.0, "heal", "consumer-1"),
        (30.0, "kill", "consumer-1"),
        (50.0, "pause", "consumer-2"),
        (60.0, "kill", "consumer-2"),
        (70.0, "resume", "consumer-2"),
        (90.0, "kill", "consumer-3"),
    ]
    heal = steps[1]
    assert heal.params == {"broker": "broker-a"} and heal.source == 2 and heal.group == "G"


def test_a_random_pick_the_schedule_left_down_is_drawn_again_among_the_nodes_up() -> None:
    kill = [spec(index=1, action="kill", target="consumer:random", at=(10.0, 20.0, 30.0))]
    steps = expand_schedule(kill, NODES, 5, 100)
    assert sorted(s.target for s in steps) == ["consumer-1", "consumer-2", "consumer-3"]
    # one more kill than consumers: the last finds none up and stays as drawn (the Runner skips it)
    four = expand_schedule([spec(**{**kill[0].__dict__, "at": (10.0, 20.0, 30.0, 40.0)})], NODES, 5, 100)
    assert len({s.target for s in four[:3]}) == 3 and four[3].target in {
        "consumer-1",
        "consumer-2",
        "consumer-3",
    }
    # the drawing is a pure function of the steps, the nodes and the seed
    assert live_random_targets(steps, NODES, 5) == steps


@dataclass(frozen=True)
class Extra:
    """A backend's own table: a pause of ``node`` at ``at`` (and a problem when ``at`` is negative)."""

    node: str
    at: float

    def steps(self, exp: Experiment) -> list[Step]:
        return [Step(self.at, "pause", self.node, "consumer", "G", {"extra": True}, 99)]


class ExtraTable:
    name = "extra"

    def parse(self, value: Any, exp: Experiment, problems: Problems) -> Extra:
        value = value or {}
        at = value.get("at", 0.0)
        if at < 0:
            problems.add(("extra", "at"), "extra.at: must be >= 0")
        if value.get("node", "consumer-1") not in exp.nodes():
            problems.add(("extra", "node"), f"extra.node: no node {value['node']!r}")
        return Extra(value.get("node", "consumer-1"), at)


def test_a_backends_table_is_checked_with_the_file_and_adds_its_steps() -> None:
    nemesis = '\n[[nemesis]]\naction = "kill"\ntarget = "consumer-1"\nat = 60\n'
    text = BASE + nemesis + '\n[extra]\nnode = "consumer-2"\nat = 45\n'
    with pytest.raises(ExperimentError, match="unknown key 'extra'"):
        parse(text)  # without the extension the table is no part of the language
    exp = parse(text, extensions=(ExtraTable(),))
    assert isinstance(exp.extensions["extra"], Extra)
    assert plain(exp.schedule()) == [(45.0, "pause", "consumer-2"), (60.0, "kill", "consumer-1")]
    assert exp.text == text  # the text as written, read once


def test_a_backends_table_reports_at_the_lines_of_its_keys() -> None:
    text = BASE + '\n[extra]\nnode = "consumer-9"\nat = -1\n'
    with pytest.raises(ExperimentError) as e:
        parse(text, source="exp.toml", extensions=(ExtraTable(),))
    lines = text.splitlines()
    node_line, at_line = lines.index('node = "consumer-9"') + 1, lines.index("at = -1") + 1
    assert str(e.value).splitlines() == [
        f"exp.toml:{node_line}: extra.node: no node 'consumer-9'",
        f"exp.toml:{at_line}: extra.at: must be >= 0",
    ]


def test_the_extension_is_asked_only_once_the_rest_of_the_file_is_sound() -> None:
    text = BASE.replace("count = 3", "count = 0") + "\n[extra]\nat = -1\n"
    with pytest.raises(ExperimentError) as e:
        parse(text, extensions=(ExtraTable(),))
    assert "count" in str(e.value) and "extra.at" not in str(e.value)
