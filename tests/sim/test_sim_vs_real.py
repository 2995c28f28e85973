"""Is the simulator right? Five shipped experiments simulated, compared with what RocketMQ's timers
dictate and with the same experiments run as real processes on this project's lab.

``real_runs.json`` holds the real-process results (``rmq-chaos run NAME --no-analyze``, then
``pipeline.metrics_reference``) of one run of each, kept because the real runs take minutes; the
README has the whole comparison. Only what does not depend on OS noise is compared: the verdict, whether
anything was lost, and when the group takes over the victim's queues, which RocketMQ's timers fix:

- a kill is seen at once (the connection closes, the broker sends NOTIFY): well within one 20 s round;
- an orderly consumer's queues wait for the broker's 60 s lock to lapse, counted from its last renewal
  (every 20 s): between 40 s and 60 s after the kill, plus at most one 20 s round;
- a paused consumer's connection goes idle: the broker closes a connection idle for 120 s
  (serverChannelMaxIdleTimeSeconds, counted from its last frame, at most a 30 s heartbeat before the
  pause) and notifies the group; without that close the channel expires silently after 120 s (scan
  every 10 s) and the others take its queues at their next 20 s round. Either way: 90 s to 150 s.

The stored real runs were made before the broker closed idle connections; they fall in the same bounds.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest

from rmqlab.pipeline.metrics_reference import summarize_run
from rmqlab.sim.__main__ import resolve
from rmqlab.sim.sim_cluster import SimCluster

REAL: dict[str, dict[str, Any]] = json.loads((Path(__file__).parent / "real_runs.json").read_text())
SCALE = 0.05  # the five experiments' time_scale: timer bounds below are in their wall milliseconds

# experiment -> (victim, earliest and latest take-over after the nemesis, in RocketMQ seconds)
TAKEOVER: dict[str, tuple[str, float, float]] = {
    "kill-one-of-four": ("consumer-2", 0, 20),
    "kill-orderly-consumer": ("consumer-2", 40, 60 + 20),
    "pause-past-channel-expiry": ("consumer-3", 120 - 30, 120 + 10 + 20),
}


def takeover_ms(run_dir: Path, victim: str) -> list[int]:
    """Milliseconds from the nemesis on ``victim`` until another client adds each queue it held."""
    events = []
    for f in run_dir.rglob("*.jsonl"):
        for line in f.read_text().splitlines():
            if line.startswith("{"):
                events.append(json.loads(line))
    events.sort(key=lambda e: e["ts_ms"])
    hit = next(e for e in events if e["event"] == "nemesis" and e["target"] == victim)
    cid, held, first = hit["client_id"], set(), {}
    for e in events:
        q = (e.get("broker"), e.get("queue_id"))
        if e["ts_ms"] <= hit["ts_ms"]:
            if e.get("client_id") == cid and e["event"] == "mq_added":
                held.add(q)
            elif e.get("client_id") == cid and e["event"] == "mq_removed":
                held.discard(q)
        elif e["event"] == "mq_added" and e.get("client_id") != cid and q in held and q not in first:
            first[q] = e["ts_ms"] - hit["ts_ms"]
    assert held and set(first) == held, "every queue of the victim must be taken over"
    return sorted(first.values())


@pytest.fixture(scope="module")
def simulated(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = {}
    for name in REAL:
        sx = resolve(name)
        assert sx.exp.time_scale == SCALE
        d = tmp_path_factory.mktemp(name)
        result = SimCluster(sx, d, out=io.StringIO(), progress=False).run()
        assert not result.errors, result.errors
        out[name] = d
    return out


@pytest.mark.parametrize("name", list(REAL))
def test_same_verdict_and_loss_as_real_processes(simulated: dict[str, Path], name: str) -> None:
    real = REAL[name]
    (group, sim), *_ = summarize_run(simulated[name])["groups"].items()
    assert group == real["group"]
    assert sim["verdict"] == real["verdict"]
    assert (sim["lost"] > 0) == (real["lost"] > 0)
    if real["verdict"] == "ok":
        w = resolve(name).exp.workload
        assert w is not None
        assert sim["lost"] == 0 and sim["sent"] == w.count  # every send acknowledged, every one consumed


def test_the_seed_problem_loses_the_topics_nobody_consistently_subscribes(simulated: dict[str, Path]) -> None:
    (_, sim), *_ = summarize_run(simulated["seed-different-subscriptions"])["groups"].items()
    assert sim["verdict"] == "fail" and 0 < sim["lost"] < sim["sent"]


@pytest.mark.parametrize("name", list(TAKEOVER))
def test_takeover_follows_rocketmq_timers_simulated_and_real(simulated: dict[str, Path], name: str) -> None:
    victim, lo, hi = TAKEOVER[name]
    lo_ms, hi_ms = lo * 1000 * SCALE, hi * 1000 * SCALE
    sim = takeover_ms(simulated[name], victim)
    real = REAL[name]["takeover_ms"]
    for got in (sim, real):
        assert lo_ms <= min(got) and max(got) <= hi_ms, (got, lo_ms, hi_ms)


def test_pause_past_expiry_stalls_the_paused_queues_in_both(simulated: dict[str, Path]) -> None:
    (_, sim), *_ = summarize_run(simulated["pause-past-channel-expiry"])["groups"].items()
    real = REAL["pause-past-channel-expiry"]
    # four or so queues stalled from the pause until the 120 s expiry and the next round
    for stalled in (sim["stalled_ms"], real["stalled_ms"]):
        assert 3 * 120_000 * SCALE <= stalled <= 5 * 150_000 * SCALE
