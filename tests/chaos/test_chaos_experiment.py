"""Experiment files: validation messages name the line; schedules expand deterministically."""

from __future__ import annotations

from pathlib import Path

import pytest
from kit.chaos import line_of, problems

from rmqlab.lab import experiment as ex
from rmqlab.lab import schedule

BASE = """\
name = "t"
question = "q?"
time_scale = 0.05
duration = 600
seed = 7

[cluster]
brokers = 2

[[topics]]
name = "TopicA"
queues = 8

[[consumers]]
group = "g1"
topic = "TopicA"
count = 4

[workload]
rate = 50
count = 100
"""


def test_base_parses_with_nodes_and_defaults() -> None:
    e = ex.parse(BASE)
    assert e.brokers == ("broker-a", "broker-b")
    assert e.consumers[0].nodes == ("consumer-1", "consumer-2", "consumer-3", "consumer-4")
    assert e.consumers[0].strategy == "AVG"
    assert e.workload is not None and e.workload.nodes == (("producer-1", "TopicA"),)
    assert e.topic_queues_per_broker("TopicA") == 4
    nodes = e.nodes()
    assert nodes["consumer-3"].role == "consumer" and nodes["consumer-3"].group == "g1"
    assert nodes["namesrv"].role == "namesrv" and nodes["broker-b"].role == "broker"
    assert e.wall(600) == pytest.approx(30.0)


def test_offset_flush_interval_becomes_a_broker_flag_and_needs_a_durable_store() -> None:
    flushed = "brokers = 2\ndurable = true\nflush_consumer_offset_interval = 5000"
    e = ex.parse(BASE.replace("brokers = 2", flushed))
    assert e.broker_flags() == ["--flush-consumer-offset-interval", "5000"]
    assert ex.parse(BASE).broker_flags() == []
    text = BASE.replace("brokers = 2", "brokers = 2\nflush_consumer_offset_interval = 5000")
    [(line, msg)] = problems(text)
    assert line == line_of(text, "flush_consumer_offset_interval")
    assert "needs durable = true" in msg


def test_unknown_key_names_its_line_and_suggests() -> None:
    text = BASE.replace("count = 4", 'count = 4\nstratgy = "AVG"')
    [(line, msg)] = problems(text)
    assert line == line_of(text, "stratgy")
    assert "unknown key 'stratgy'" in msg and "did you mean 'strategy'" in msg


def test_wrong_type_and_bad_value_each_name_their_line() -> None:
    text = BASE.replace("brokers = 2", 'brokers = "two"').replace("queues = 8", "queues = 0")
    got = problems(text)
    expected = "cluster.brokers: must be an integer, got string 'two'"
    assert (line_of(text, 'brokers = "two"'), expected) in got
    assert any(line == line_of(text, "queues = 0") and "must be > 0" in msg for line, msg in got)


def test_schedule_mistakes_are_reported_with_the_others() -> None:
    text = BASE.replace("time_scale = 0.05", "time_scale = -1") + (
        '\n[[nemesis]]\naction = "kill"\ntarget = "consumer-9"\nat = 10\n'
        '\n[[nemesis]]\naction = "pause"\ntarget = "consumer-1"\nat = 700\n'
    )
    got = problems(text)
    assert [line for line, _ in got] == [
        line_of(text, "time_scale"), line_of(text, '"consumer-9"'), line_of(text, "at = 700"),
    ]  # fmt: skip
    assert "unknown node 'consumer-9'" in got[1][1] and "not before the end" in got[2][1]
    # a broken [[consumers]] table is not echoed as unknown targets
    broken = text.replace("count = 4", 'count = 4\nstrategy = "NOPE"')
    assert [msg for _, msg in problems(broken) if "consumer-9" in msg or "strategy" in msg] == [
        "consumers[1].strategy: must be one of AVG, AVG_BY_CIRCLE, CONSISTENT_HASH; got 'NOPE'"
    ]


def test_toml_syntax_error_reports_line() -> None:
    text = BASE + "\n[[nemesis]]\naction = kill\n"
    [(line, msg)] = problems(text)
    assert line == line_of(text, "action = kill")
    assert msg.startswith("not valid TOML")


def test_message_format_includes_source_and_line() -> None:
    text = BASE.replace("seed = 7", "seed = 7.5")
    with pytest.raises(ex.ExperimentError) as info:
        ex.parse(text, source="exp.toml")
    line = line_of(text, "seed = 7.5")
    assert str(info.value) == f"exp.toml:{line}: seed: must be an integer, got number 7.5"


def test_missing_required_key_points_at_table() -> None:
    text = BASE.replace('group = "g1"\n', "")
    [(line, msg)] = problems(text)
    assert line == line_of(text, "[[consumers]]")
    assert "consumers[1]: missing required key 'group'" in msg


def test_queues_must_spread_evenly_and_topic_must_exist() -> None:
    text = BASE.replace("queues = 8", "queues = 7").replace('topic = "TopicA"', 'topic = "TopicB"')
    got = problems(text)
    q_line, t_line = line_of(text, "queues = 7"), line_of(text, 'topic = "TopicB"')
    assert any("cannot be spread evenly over 2 brokers" in m and line == q_line for line, m in got)
    assert any("'TopicB' is not declared" in m and line == t_line for line, m in got)


NEMESES = """
[[nemesis]]
action = "kill"
target = "consumer-2"
at = 100

[[nemesis]]
action = "pause"
target = "consumer:random"
group = "g1"
random = 3
from = 50
until = 500
for = 30

[[nemesis]]
action = "restart"
target = "consumer:next"
every = 120
times = 3

[[nemesis]]
action = "latency"
target = "consumer-1"
broker = "broker-b"
ms = 200
at = [10, 20]
for = 5

[[nemesis]]
action = "fault"
target = "broker-a"
code = "PULL_MESSAGE"
errors = ["1:boom", "2"]
count = 2
group = "g1"
at = 300
"""


def test_schedule_expansion_is_deterministic_and_complete() -> None:
    e = ex.parse(BASE + NEMESES)
    steps = e.schedule()
    assert steps == ex.parse(BASE + NEMESES).schedule()
    assert [s.t for s in steps] == sorted(s.t for s in steps)
    kills = [s for s in steps if s.action == "kill"]
    assert [(s.t, s.target, s.group, s.target_role) for s in kills] == [(100, "consumer-2", "g1", "consumer")]
    pauses = [s for s in steps if s.action == "pause"]
    resumes = [s for s in steps if s.action == "resume"]
    assert len(pauses) == 3 and len(resumes) == 3
    assert all(50 <= s.t < 500 for s in pauses)
    assert sorted(s.t + 30 for s in pauses) == sorted(s.t for s in resumes)
    assert all(s.target.startswith("consumer-") for s in pauses)
    restarts = [s for s in steps if s.action == "restart"]
    assert [(s.t, s.target) for s in restarts] == [
        (120, "consumer-1"),
        (240, "consumer-2"),
        (360, "consumer-3"),
    ]
    assert restarts[0].params == {"mode": "stop", "down": 0.0}
    lat = [s for s in steps if s.action in ("latency", "heal")]
    assert [(s.t, s.action) for s in lat] == [(10, "latency"), (15, "heal"), (20, "latency"), (25, "heal")]
    assert lat[1].params == {"broker": "broker-b"}
    [fault] = [s for s in steps if s.action == "fault"]
    assert fault.params["code"] == 11 and fault.params["errors"] == [(1, "boom"), (2, "")]
    assert fault.params["group"] == "g1" and fault.target_role == "broker"
    assert e.network_targets() == {"consumer-1"}


def test_random_schedule_depends_on_seed() -> None:
    a = [s for s in ex.parse(BASE + NEMESES).schedule() if s.action == "pause"]
    other = ex.parse(BASE.replace("seed = 7", "seed = 8") + NEMESES)
    b = [s for s in other.schedule() if s.action == "pause"]
    assert [(s.t, s.target) for s in a] != [(s.t, s.target) for s in b]


@pytest.mark.parametrize(
    ("snippet", "needle", "expected"),
    [
        ('action = "explode"\ntarget = "consumer-1"\nat = 1', "explode", "must be one of kill, stop"),
        ('action = "kill"\ntarget = "consumer-9"\nat = 1', "consumer-9", "unknown node 'consumer-9'"),
        ('action = "kill"\ntarget = "consumer:any"\nat = 1', "consumer:any", "ROLE:SELECTOR"),
        ('action = "kill"\ntarget = "consumer-1"\nat = 700', "at = 700", "not before the end"),
        ('action = "kill"\ntarget = "consumer-1"\nat = 1\nevery = 5', "[[nemesis]]", "exactly one of"),
        ('action = "latency"\ntarget = "broker-a"\nms = 5\nat = 1', "broker-a", "target a consumer"),
        ('action = "blackhole"\ntarget = "broker-a"\nat = 1', "[[nemesis]]", "needs the other end"),
        ('action = "blackhole"\ntarget = "broker-a"\npeer = "nobody"\nat = 1', "nobody", "unknown node"),
        ('action = "blackhole"\ntarget = "broker-a"\npeer = "broker-a"\nat = 1', "peer", "two ends"),
        (
            'action = "blackhole"\ntarget = "consumer-1"\npeer = "namesrv"\nbroker = "broker-a"\nat = 1',
            "peer",
            "not both",
        ),
        ('action = "latency"\ntarget = "consumer-1"\npeer = "namesrv"\nms = 5\nat = 1', "peer", "goes with"),
        (
            'action = "blackhole"\ntarget = "consumer-1"\nbroker = "consumer-2"\nat = 1',
            "consumer-2",
            "unknown broker",
        ),
        ('action = "loss"\ntarget = "consumer-1"\nat = 1', "[[nemesis]]", "missing required key 'percent'"),
        ('action = "loss"\ntarget = "consumer-1"\npercent = 0\nat = 1', "percent", "more than 0"),
        ('action = "loss"\ntarget = "consumer-1"\npercent = 101\nat = 1', "percent", "at most 100"),
        (
            'action = "fault"\ntarget = "consumer-1"\ncode = 11\ndrop = true\nat = 2',
            "consumer-1",
            "is sent to a broker",
        ),
        ('action = "fault"\ntarget = "broker-a"\ncode = "NOPE"\ndrop = true\nat = 1', "NOPE", "request code"),
        ('action = "fault"\ntarget = "broker-a"\ncode = 11\nerrors = ["x:y"]\nat = 1', "errors", "integer"),
        ('action = "kill"\ntarget = "consumer-1"\nat = 1\nfor = 5\ncolour = 1', "colour", "unknown key"),
        ('action = "resume"\ntarget = "consumer-1"\nat = 1\nfor = 5', "for = 5", "'for' is not supported"),
        ('action = "kill"\ntarget = "consumer:random"\ngroup = "nope"\nat = 1', "nope", "no [[consumers]]"),
    ],
)
def test_bad_nemesis_entries(snippet: str, needle: str, expected: str) -> None:
    text = BASE + "\n[[nemesis]]\n" + snippet + "\n"
    got = problems(text)
    assert any(expected in msg for _, msg in got), got
    assert any(line == line_of(text, needle) for line, _ in got), (got, line_of(text, needle))


def test_key_lines_handles_arrays_inline_tables_and_multiline_values() -> None:
    text = 'a = [\n  1,\n  2,\n]\n[[t]]\nx = 1\n[[t]]\ny = { z = 1 }\n[t.sub]\nw = """\nq = 1\n"""\nk = 2\n'
    kl = ex.KeyLines(text)
    assert kl.line_of(("a",)) == 1
    assert kl.line_of(("t", 0, "x")) == 6
    assert kl.line_of(("t", 1, "y", "z")) == 8
    assert kl.line_of(("t", 1, "sub", "w")) == 10
    assert kl.line_of(("t", 1, "sub", "k")) == 13
    assert kl.line_of(("t", 1, "nothing")) == 7


def test_load_reports_unreadable_file(tmp_path: Path) -> None:
    with pytest.raises(ex.ExperimentError, match="cannot read the file"):
        ex.load(tmp_path / "missing.toml")


def test_partition_direction_and_which_nodes_need_a_fault_relay() -> None:
    text = BASE + (
        '[[nemesis]]\naction = "blackhole"\ntarget = "consumer-1"\nbroker = "broker-a"\n'
        'direction = "out"\nat = 10\n'
        '[[nemesis]]\naction = "blackhole"\ntarget = "consumer-2"\nat = 10\n'
        '[[nemesis]]\naction = "latency"\ntarget = "consumer-3"\nms = 5\nat = 10\n'
    )
    exp = ex.parse(text)
    assert [n.params.get("direction") for n in exp.nemeses] == ["out", None, None]
    assert exp.kernel_only_network_faults() == ["blackhole consumer-1 (direction=out)"]
    assert exp.network_targets() == {"consumer-1", "consumer-2", "consumer-3"}
    assert exp.network_targets(("latency", "reset")) == {"consumer-3"}
    both = ex.parse(text.replace('direction = "out"', 'direction = "both"'))
    assert both.kernel_only_network_faults() == []
    [(line, msg)] = problems(text.replace('direction = "out"', 'direction = "sideways"'))
    assert line == len(BASE.splitlines()) + 5 and "direction" in msg and "sideways" in msg
    [(line, msg)] = problems(
        BASE + '[[nemesis]]\naction = "latency"\ntarget = "consumer-1"\nms = 5\ndirection = "in"\nat = 10\n'
    )
    assert "direction" in msg


def test_partitions_between_any_two_nodes_and_loss_are_the_kernels_to_do() -> None:
    text = BASE + (
        '[[nemesis]]\naction = "blackhole"\ntarget = "broker-a"\npeer = "namesrv"\nat = 10\nfor = 50\n'
        '[[nemesis]]\naction = "loss"\ntarget = "consumer-2"\nbroker = "broker-b"\npercent = 30\n'
        'direction = "in"\nat = 20\nfor = 40\n'
        '[[nemesis]]\naction = "blackhole"\ntarget = "consumer-3"\npeer = "broker-b"\nat = 30\nfor = 5\n'
        '[[nemesis]]\naction = "blackhole"\ntarget = "consumer-4"\nbroker = "namesrv"\nat = 40\n'
    )
    exp = ex.parse(text)
    steps = [(s.t, s.action, s.target, s.params) for s in exp.schedule()]
    assert steps == [
        (10, "blackhole", "broker-a", {"broker": "namesrv"}),
        (20, "loss", "consumer-2", {"broker": "broker-b", "direction": "in", "percent": 30}),
        (30, "blackhole", "consumer-3", {"broker": "broker-b"}),
        (35, "heal", "consumer-3", {"broker": "broker-b"}),
        (40, "blackhole", "consumer-4", {"broker": "namesrv"}),
        (60, "heal", "broker-a", {"broker": "namesrv"}),
        (60, "heal", "consumer-2", {"broker": "broker-b"}),
    ]
    # the relay does a client's link to a server, both ways, without loss: the rest is the kernel's
    assert exp.kernel_only_network_faults() == [
        "blackhole broker-a (a link between broker-a and namesrv)",
        "loss consumer-2 (direction=in, packet loss)",
    ]
    # only clients get fault relays, and only for what the relay does
    assert exp.network_targets(("latency", "reset")) == set()
    assert exp.network_targets() == {"broker-a", "consumer-2", "consumer-3", "consumer-4"}


def test_hang_for_a_while_or_until_the_end() -> None:
    text = BASE + (
        '\n[[nemesis]]\naction = "hang"\ntarget = "consumer-2"\nat = 100\nfor = 60\n'
        '\n[[nemesis]]\naction = "hang"\ntarget = "consumer:next"\ngroup = "g1"\nat = [200]\n'
    )
    steps = [(s.t, s.action, s.target) for s in ex.parse(text).schedule()]
    assert (100, "hang", "consumer-2") in steps and (160, "unhang", "consumer-2") in steps
    assert [s for s in steps if s[0] == 200 and s[1] == "hang"]
    assert not [s for s in steps if s[1] == "unhang" and s[0] != 160]  # the second one lasts to the end
    bad = BASE + '\n[[nemesis]]\naction = "hang"\ntarget = "broker-a"\nat = 1\n'
    got = problems(bad)
    assert any("lab's own consumers" in msg for _, msg in got), got
    assert any(line == line_of(bad, "broker-a") for line, _ in got)


RANDOM_KILLS = """
[[nemesis]]
action = "kill"
target = "consumer:random"
every = 10
times = 4

[[nemesis]]
action = "pause"
target = "consumer:random"
at = [45, 47, 52]
for = 5

[[nemesis]]
action = "start"
target = "consumer:random"
at = [60]
"""


def test_a_random_target_is_one_the_schedule_left_able_to_take_the_action() -> None:
    # Four kills of four consumers: drawn from the whole group, some would land on a dead one (and be
    # skipped); each is drawn from the living instead, so all four die, and the pauses that follow have
    # nobody to pause (they stay as drawn, to be skipped), and the start brings one back.
    steps = ex.parse(BASE + RANDOM_KILLS).schedule()
    kills = [s.target for s in steps if s.action == "kill"]
    assert sorted(kills) == ["consumer-1", "consumer-2", "consumer-3", "consumer-4"]
    started = [s.target for s in steps if s.action == "start"]
    assert len(started) == 1 and started[0] in kills
    # with two kills only, the three pauses (and their resumes) go to the two left, never one paused
    # twice (the second comes while the first is paused; the third after the first's resume)
    two = RANDOM_KILLS.replace("times = 4", "times = 2")
    steps = ex.parse(BASE + two).schedule()
    dead = {s.target for s in steps if s.action == "kill"}
    pauses = [s for s in steps if s.action == "pause"]
    assert len(dead) == 2 and not dead & {s.target for s in pauses}
    assert pauses[0].target != pauses[1].target
    assert [s.target for s in steps if s.action == "resume"] == [s.target for s in pauses]
    assert steps == ex.parse(BASE + two).schedule()  # still the same for the same seed


def test_a_schedule_whose_random_picks_all_fit_is_drawn_as_before(monkeypatch: pytest.MonkeyPatch) -> None:
    fits = BASE + NEMESES  # random pauses of four running consumers
    drawn = ex.parse(fits).schedule()
    monkeypatch.setattr(schedule, "live_random_targets", lambda steps, nodes, seed: steps)
    assert drawn == ex.parse(fits).schedule()
    assert ex.parse(BASE + RANDOM_KILLS).schedule() != drawn  # (the stand-in above draws differently)


def test_unfit_steps_follow_the_supervisors_rules() -> None:
    def step(t: float, action: str, target: str, **params: object) -> ex.Step:
        return ex.Step(t, action, target, "consumer", "g1", dict(params), 1)

    steps = [
        step(10, "hang", "consumer-1"),
        step(11, "pause", "consumer-1"),  # a hung listener's process runs: it can be paused
        step(12, "unhang", "consumer-2"),  # not hung
        step(13, "resume", "consumer-1"),
        step(14, "unhang", "consumer-1"),
        step(20, "restart", "consumer-2", down=10.0),
        step(25, "kill", "consumer-2"),  # down for the restart's 10 s
        step(31, "kill", "consumer-2"),
        step(32, "restart", "consumer-2"),  # a restart takes a node in any state
        step(33, "start", "consumer-3"),  # running
    ]
    assert [(s.t, state) for s, state in schedule.unfit_steps(steps)] == [
        (12, "running"),
        (25, "down"),
        (33, "running"),
    ]
