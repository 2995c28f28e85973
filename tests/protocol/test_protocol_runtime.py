"""Shared runtime: event lines, time scale, CLI flags."""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path

import pytest

from rmqlab.cli import add_common_args
from rmqlab.protocol.client_id import build_client_id
from rmqlab.protocol.clock import ManualClock, TimerSet, TimeScale
from rmqlab.protocol.event_log import EventLog


def test_event_lines_have_required_fields(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "n.jsonl"
    clock = ManualClock(1000)
    log = EventLog("consumer-1", "consumer", str(path), clock=clock)
    log.emit("mq_added", group="g", client_id="c", topic="T", broker="b", queue_id=1, next_offset=0)
    clock.advance(5)
    log.warning("pull failed", code=24)
    log.close()
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert lines[0] == {
        "ts_ms": 1000, "event": "mq_added", "node": "consumer-1", "role": "consumer", "group": "g",
        "client_id": "c", "topic": "T", "broker": "b", "queue_id": 1, "next_offset": 0,
    }  # fmt: skip
    assert lines[1]["event"] == "log" and lines[1]["level"] == "warning" and lines[1]["ts_ms"] == 1005
    log.emit("after_close")  # ignored, no crash


def test_time_scale() -> None:
    ts = TimeScale(0.05)
    assert ts.seconds(20_000) == pytest.approx(1.0)
    assert ts.ms(120_000) == 6000 and ts.ms(10) == pytest.approx(0.5)
    assert ts.whole_ms(10) == 1 and ts.whole_ms(30) == 2 and ts.whole_ms(0) == 1
    with pytest.raises(ValueError):
        TimeScale(0)


@pytest.mark.parametrize("bad", ["0", "-1", "abc", "nan", "inf"])
def test_common_args_reject_bad_time_scale(bad: str, capsys: pytest.CaptureFixture[str]) -> None:
    p = argparse.ArgumentParser()
    add_common_args(p)
    with pytest.raises(SystemExit):
        p.parse_args(["--time-scale", bad])
    assert "--time-scale" in capsys.readouterr().err


def test_client_ids_differ_per_call() -> None:
    a, b = build_client_id(), build_client_id()
    assert a != b and "@" in a and "#" in a.split("@", 1)[1]


async def test_timer_set_runs_callbacks_until_cancel_all() -> None:
    timers = TimerSet()
    fired: list[str] = []
    timers.call_later(1, lambda: fired.append("a"))
    timers.call_later(-5, lambda: fired.append("now"))  # a negative delay runs at the next loop turn
    timers.call_later(10_000, lambda: fired.append("late"))
    assert len(timers) == 3
    await asyncio.sleep(0.05)
    assert sorted(fired) == ["a", "now"] and len(timers) == 1
    timers.cancel_all()
    timers.call_later(0, lambda: fired.append("after"))
    await asyncio.sleep(0.01)
    assert sorted(fired) == ["a", "now"] and len(timers) == 0


def test_event_lines_are_the_bytes_structlog_rendered(tmp_path: Path) -> None:
    """The JSON lines are written without structlog's chain; they must stay the bytes it wrote (key
    order, separators, non-ASCII text, str() of what JSON cannot hold, a given ts_ms kept)."""
    import structlog

    clock = ManualClock(1234)
    lines: list[str] = []

    class Sink:
        def put(self, line: str) -> None:
            lines.append(line)

        def flush(self) -> None: ...

        def close(self) -> None: ...

    def stamp(_: object, __: str, ev: dict[str, object]) -> dict[str, object]:
        ev.setdefault("ts_ms", clock.now_ms())
        ev["node"] = "n1"
        ev["role"] = "broker"
        return ev

    reference = structlog.wrap_logger(
        None,
        processors=[
            stamp,
            structlog.processors.JSONRenderer(separators=(",", ":"), ensure_ascii=False, default=str),
        ],
    )
    log = EventLog("n1", "broker", None, clock=clock, console=False, sink=Sink())
    cases: list[tuple[str, dict[str, object]]] = [
        ("mq_added", {"topic": "Tö", "queue_id": 3, "cid_all": ["a", "b"], "x": None, "f": 0.5}),
        ("pull_served", {"ts_ms": 99, "path": Path("/a"), "ok": True}),
        ("odd", {"node": "overridden", "nested": {"k": [1, {"z": "ü"}]}}),
        ("numbers", {"n": 2**70, "nan": float("nan"), "inf": float("-inf"), "keys": {1: 2, 2.5: None}}),
        ("text", {"msg": 'a "q" \\ \n\t\x01 \u2028 😀', "t": ("x", b"y"), "s": frozenset()}),
    ]
    for event, fields in cases:
        log.emit(event, **fields)
    log.warning("pull failed", code=24, peer=("10.0.0.1", 1))
    expected = [reference._process_event("msg", e, dict(f))[0][0] for e, f in cases]
    expected.append(
        reference._process_event("msg", "log", {"level": "warning", "msg": "pull failed", "code": 24,
                                                "peer": ("10.0.0.1", 1)})[0][0]
    )  # fmt: skip
    assert lines == expected
