"""The Runner's decisions on a fake backend and a fake clock: what it asks the backend to do and when, what
it skips and why, what it undoes before the drain, and the lab's own events around them."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from kit.lab_fakes import Events, FakeBackend, run_on_fake_clock

from rmqlab.lab.experiment import ACTIONS, parse
from rmqlab.lab.runner import Console, Runner, RunResult

SCALE = 0.5  # every lab second is half a second of the (fake) loop's clock
BASE = f"""\
name = "runner"
time_scale = {SCALE}
duration = 100
drain_timeout = 20

[[topics]]
name = "T"
queues = 4

[[consumers]]
group = "G"
topic = "T"
count = 3

[[consumers]]
group = "H"
topic = "T"
count = 1
start = 30
assignment = "server-pop"

[workload]
rate = 10
count = 10
start = 5
"""


def nemesis(action: str, target: str, at: float, **keys: object) -> str:
    lines = [f'action = "{action}"', f'target = "{target}"', f"at = {at}"]
    for k, v in keys.items():
        value = f'"{v}"' if isinstance(v, str) else str(v).lower() if isinstance(v, bool) else str(v)
        lines.append(f"{k} = {value}")
    return "\n[[nemesis]]\n" + "\n".join(lines) + "\n"


def run(text: str, **backend: object) -> tuple[Runner, FakeBackend, Events, str]:
    exp = parse(text)
    events = Events()
    fake = FakeBackend(events, **backend)  # type: ignore[arg-type]
    out = io.StringIO()
    runner = Runner(exp, fake, events, RunResult(Path("run")), console=Console(out))
    run_on_fake_clock(runner.run())
    return runner, fake, events, out.getvalue()


def producers_started(fake: FakeBackend) -> float:
    (t,) = [t for t, n, args in fake.calls if n == "start" and args[0] == ("producer-1",)]
    return t


def done(runner: Runner) -> list[tuple[float, str, str, bool]]:
    """What the Runner took up: (lab time, action, target, carried out)."""
    return [(e.step.t, e.step.action, e.step.target, e.skipped is None) for e in runner.record]


def test_the_dispatch_table_covers_the_whole_language() -> None:
    runner = Runner(parse(BASE), FakeBackend(Events()), Events(), RunResult(Path("run")))
    assert sorted(runner.actions) == sorted(ACTIONS)


def test_each_action_goes_to_its_backend_call_at_its_time_on_the_loops_clock() -> None:
    text = BASE + "".join(
        [
            nemesis("kill", "consumer-1", 10),
            nemesis("start", "consumer-1", 20),
            nemesis("stop", "consumer-2", 30),
            nemesis("restart", "consumer-3", 40, mode="kill", down=4),
            nemesis("pause", "consumer-1", 50, **{"for": 10}),
            nemesis("hang", "consumer-1", 70),
            nemesis("policy", "broker-a", 85, release_locks_on_close=True),
        ]
    )
    runner, fake, events, _ = run(text)
    t0 = producers_started(fake) - 5 * SCALE  # the producers start 5 lab seconds after t = 0
    at = {n: (t - t0) / SCALE for t, n, _ in fake.calls if n in ("kill", "stop", "pause", "resume", "hang")}
    assert at == {"kill": 10, "stop": 30, "pause": 50, "resume": 60, "hang": 70}
    assert fake.called("restart") == [("consumer-3", "kill", 4 * SCALE)]
    assert ("consumer-1",) in [a[0] for a in fake.called("start") if a[1]]  # the start action, as a nemesis
    assert fake.called("policy_set") == [("broker-a", None, True)]
    assert done(runner) == [
        (10, "kill", "consumer-1", True),
        (20, "start", "consumer-1", True),
        (30, "stop", "consumer-2", True),
        (40, "restart", "consumer-3", True),
        (50, "pause", "consumer-1", True),
        (60, "resume", "consumer-1", True),
        (70, "hang", "consumer-1", True),
        (85, "policy", "broker-a", True),
        (100, "unhang", "consumer-1", True),  # left hung: undone before the drain
    ]
    assert runner.executed == 9 and runner.result.skipped == []
    policy = events.named("nemesis")[-2]
    assert policy == {
        "event": "nemesis",
        "action": "policy",
        "target": "broker-a",
        "target_role": "broker",
        "release_locks_on_close": True,
    }


def test_an_action_the_node_cannot_take_is_skipped_with_the_backends_reason() -> None:
    runner, fake, events, out = run(
        BASE + nemesis("kill", "consumer-1", 10) + nemesis("kill", "consumer-1", 12)
    )
    assert done(runner) == [(10, "kill", "consumer-1", True), (12, "kill", "consumer-1", False)]
    reason = "consumer-1 is stopped, not running or paused or stopping"
    assert runner.result.skipped == [f"kill consumer-1: {reason}"]
    assert events.named("nemesis_skipped") == [
        {"event": "nemesis_skipped", "action": "kill", "target": "consumer-1", "reason": reason}
    ]
    assert f"skipped kill consumer-1: {reason}" in out
    assert runner.executed == 1 and len(fake.called("kill")) == 2


def test_a_network_fault_is_written_and_applied_in_wall_milliseconds_then_healed() -> None:
    text = BASE + nemesis("latency", "consumer-1", 20, ms=100, jitter_ms=20, broker="broker-a", **{"for": 5})
    _, fake, events, _ = run(text)
    latency, heal = [e for e in events.named("nemesis") if e["target"] == "consumer-1"]
    assert latency == {
        "event": "nemesis",
        "action": "latency",
        "target": "consumer-1",
        "target_role": "consumer",
        "group": "G",
        "client_id": "consumer-1#1",
        "broker": "broker-a",
        "latency_ms": 100 * SCALE,
        "jitter_ms": 20 * SCALE,
        "via": "fake",
    }
    assert heal["action"] == "heal" and heal["broker"] == "broker-a" and "via" not in heal
    assert fake.called("apply_network") == [
        ("consumer-1", "latency", "broker-a", 50.0, 10.0, "both", 0),
        ("consumer-1", "heal", "broker-a", 0, 0, "both", 0),
    ]


def test_a_fault_names_the_clients_current_id_or_waits_for_one() -> None:
    fault = (
        '\n[[nemesis]]\naction = "fault"\ntarget = "broker-a"\ncode = "PULL_MESSAGE"\nerrors = ["2:busy"]\n'
    )
    text = (
        BASE
        + fault
        + 'client = "consumer-2"\nat = 10\nfor = 10\n'
        + fault
        + 'client = "consumer-4"\nat = 12\n'
    )
    runner, fake, events, _ = run(text)
    (request,) = [args[1] for args in fake.called("fault_add")]
    assert request["client_id"] == "consumer-2#1" and request["duration_ms"] == 10 * SCALE * 1000
    assert request["errors"] == [(2, "busy")] and request["request_code"] == 11
    (added,) = [e for e in events.named("nemesis") if e["action"] == "fault"]
    assert added["fault_id"] == 1 and added["client_id"] == "consumer-2#1" and added["errors"] == ["2:busy"]
    # consumer-4 joins at 30: at 12 it has no client id for the fault to name
    (skipped,) = runner.result.skipped
    assert skipped.startswith("fault broker-a (") and skipped.endswith(": consumer-4 has no client id yet")
    # a fault is cleared before the drain, on the running broker that got one
    assert (100, "fault-clear", "broker-a", True) in done(runner)


def test_what_the_nemeses_left_is_undone_before_the_drain_in_order() -> None:
    text = BASE + "".join(
        [
            nemesis("pause", "consumer-2", 90),
            nemesis("hang", "consumer-1", 91),
            nemesis("blackhole", "consumer-3", 92),
            nemesis("fault", "broker-a", 93, code="PULL_MESSAGE", drop=True),
        ]
    )
    runner, fake, _, _ = run(text)
    # the nodes in the backend's order, then the links, then the brokers that got a fault
    assert done(runner)[-4:] == [
        (100, "unhang", "consumer-1", True),
        (100, "resume", "consumer-2", True),
        (100, "heal", "consumer-3", True),
        (100, "fault-clear", "broker-a", True),
    ]
    assert fake.called("apply_network")[-1] == ("consumer-3", "heal", "all", 0, 0, "both", 0)


def test_an_action_due_after_the_end_runs_at_the_end() -> None:
    runner, fake, _, _ = run(BASE + nemesis("pause", "consumer-1", 90, **{"for": 50}))
    (paused_at,), (resumed_at,) = [[t for t, n, _ in fake.calls if n == name] for name in ("pause", "resume")]
    assert resumed_at - paused_at == pytest.approx(10 * SCALE)  # at 100, not 140
    assert (140, "resume", "consumer-1", True) in done(runner)


def test_one_action_at_a_time_on_a_node_and_none_waits_for_another_nodes() -> None:
    text = (
        BASE
        + nemesis("restart", "consumer-1", 10, down=20)
        + nemesis("kill", "consumer-1", 12)
        + nemesis("kill", "consumer-2", 12)
    )
    _, fake, _, _ = run(text)
    (restart_at,) = [t for t, n, _ in fake.calls if n == "restart"]
    kills = {args[0]: t for t, n, args in fake.calls if n == "kill"}
    assert kills["consumer-2"] - restart_at == pytest.approx(2 * SCALE)
    # consumer-1's kill waits for the restart: down 20 lab seconds, then 0.5 s to be ready
    assert kills["consumer-1"] - restart_at == pytest.approx(20 * SCALE + 0.5)


def test_late_consumers_join_at_their_start_unless_a_nemesis_started_them() -> None:
    runner, fake, events, _ = run(BASE)
    assert events.named("consumers_joining") == [
        {"event": "consumers_joining", "nodes": ["consumer-4"], "at": 30.0}
    ]
    assert ("consumer-4",) in [a[0] for a in fake.called("start")]
    runner, _, events, _ = run(BASE + nemesis("start", "consumer-4", 20))
    assert events.named("join_skipped") == [
        {"event": "join_skipped", "target": "consumer-4", "reason": "consumer-4 is already running"}
    ]
    assert runner.result.skipped == ["join consumer-4: consumer-4 is already running"]


def test_the_runs_own_events_and_the_backends_steps_around_the_schedule() -> None:
    runner, fake, events, out = run(BASE)
    names = [e["event"] for e in events.events]
    assert names == [
        "cluster_ready",
        "schedule_started",
        "consumers_joining",
        "teardown",
        "teardown_clients_killed",
    ]
    assert events.events[0] == {"event": "cluster_ready", "nodes": 5}  # name server, broker, three consumers
    assert events.named("teardown_clients_killed")[0]["nodes"] == [
        "consumer-1",
        "consumer-2",
        "consumer-3",
        "consumer-4",
    ]
    steps = [n for _t, n, _a in fake.calls]
    assert steps[:4] == ["prepare", "start_servers", "set_message_request_mode", "start"]
    assert steps[-2:] == ["kill_clients", "close"]
    assert fake.called("set_message_request_mode") == [("T", "H", "POP")]
    assert runner.result.drained and runner.result.quick_verdict == "ok" and runner.result.errors == []
    assert "fake backend ready" in out and "drained: every group consumed all 0 sent message(s)" in out


def test_a_drain_that_never_ends_stops_at_the_drain_timeout() -> None:
    runner, fake, _, out = run(BASE, producers_exit=False)
    (kill_at,) = [t for t, n, _ in fake.calls if n == "kill_clients"]
    # the producers start at 5; the run ends at 100 and the drain gives up 20 lab seconds later (it looks
    # every 0.2 s)
    assert kill_at - producers_started(fake) == pytest.approx((100 - 5 + 20) * SCALE, abs=0.25)
    assert not runner.result.drained and runner.result.quick_verdict == "fail"
    assert "producers still running: producer-1" in out


def test_a_broker_started_again_without_its_store_gets_the_groups_modes_again() -> None:
    """The lab sets a server assignment's mode (setConsumeMode) at setup; a broker that comes back with
    an empty store gets it again, a durable one keeps its own."""
    steps = nemesis("kill", "broker-a", 10) + nemesis("start", "broker-a", 20)
    restart = nemesis("restart", "broker-a", 40)
    _, fake, _, _ = run(BASE + steps + restart)
    calls = [(n, a[0]) for _t, n, a in fake.calls if n in ("set_message_request_mode", "start", "restart")]
    after = [calls[i - 1] for i, c in enumerate(calls) if c[0] == "set_message_request_mode"][1:]
    assert after == [("start", ("broker-a",))] * 2, calls  # a restart is a stop, then a start
    durable = BASE.replace("[[topics]]", "[cluster]\ndurable = true\n\n[[topics]]", 1)
    _, fake, _, _ = run(durable + steps + restart)
    assert fake.called("set_message_request_mode") == [("T", "H", "POP")]
