"""timeline.html and trace.json: what they hold (from plot data and the run's event files), and the page
as a person uses it in headless Chromium (load, zoom, pan, hover, filter; at 1280 and 700 px)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from rmqlab.pipeline import timeline
from rmqlab.pipeline.discover import discover
from rmqlab.pipeline.report_data import PlotData
from rmqlab.pipeline.unavailability import RunClock

T0 = 1_700_000_000_000
SCALE = 0.05


def _line(ts: int, event: str, node: str, **fields: Any) -> str:
    return json.dumps({"ts_ms": T0 + ts, "event": event, "node": node, "role": "consumer", **fields})


def _consumed(ts: int, client: str, node: str, queue_id: int, offset: int) -> str:
    return _line(
        ts,
        "message_consumed",
        node,
        group="g",
        client_id=client,
        msg_id=f"m{ts}-{queue_id}",
        topic="T",
        broker="broker-a",
        queue_id=queue_id,
        queue_offset=offset,
        started_ms=T0 + ts,
        mode="CONCURRENTLY",
    )


def small_run(tmp_path: Path) -> tuple[PlotData, dict[str, Any], Path]:
    """Two consumers on two queues of broker-a; c1 is paused, then killed at 6 s, c2 takes queue 0."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "consumer-1.jsonl").write_text(
        "\n".join(
            [
                _line(
                    0,
                    "rebalance",
                    "consumer-1",
                    group="g",
                    client_id="c1",
                    topic="T",
                    allocated=["broker-a:0"],
                    changed=True,
                ),
                _consumed(1000, "c1", "consumer-1", 0, 0),
                _consumed(2000, "c1", "consumer-1", 0, 1),
                _consumed(5000, "c1", "consumer-1", 0, 2),
                "not json",
            ]
        )
        + "\n"
    )
    (run / "consumer-2.jsonl").write_text(
        "\n".join(
            [
                _line(
                    0,
                    "rebalance",
                    "consumer-2",
                    group="g",
                    client_id="c2",
                    topic="T",
                    allocated=["broker-a:1"],
                    changed=True,
                ),
                _line(
                    100,
                    "rebalance",
                    "consumer-2",
                    group="g",
                    client_id="c2",
                    topic="T",
                    allocated=["broker-a:1"],
                    changed=False,
                ),
                _consumed(1500, "c2", "consumer-2", 1, 7),
                _line(
                    7000,
                    "rebalance",
                    "consumer-2",
                    group="g",
                    client_id="c2",
                    topic="T",
                    allocated=["broker-a:0", "broker-a:1"],
                    changed=True,
                ),
                _consumed(8000, "c2", "consumer-2", 0, 3),
            ]
        )
        + "\n"
    )
    (run / "broker-a.jsonl").write_text(
        json.dumps({"ts_ms": T0, "event": "broker_started", "node": "broker-a", "role": "broker"}) + "\n"
    )
    data = PlotData(T0, T0 + 10_000, 100, clock=RunClock(T0, SCALE))
    data.intervals = [
        {
            "group": "g",
            "client_id": "c1",
            "node": "consumer-1",
            "topic": "T",
            "queue": "broker-a:0",
            "start": T0,
            "end": T0 + 6000,
        },
        {
            "group": "g",
            "client_id": "c2",
            "node": "consumer-2",
            "topic": "T",
            "queue": "broker-a:1",
            "start": T0,
            "end": T0 + 10_000,
        },
        {
            "group": "g",
            "client_id": "c2",
            "node": "consumer-2",
            "topic": "T",
            "queue": "broker-a:0",
            "start": T0 + 7000,
            "end": T0 + 10_000,
        },
    ]
    data.nemeses = [
        {"ts_ms": T0 + 3000, "action": "pause", "target": "consumer-1"},
        {"ts_ms": T0 + 6000, "action": "kill", "target": "consumer-1"},
    ]
    summary = {"run": {"t0_ms": T0, "time_scale": SCALE, "start_ms": T0, "end_ms": T0 + 10_000}, "groups": {}}
    return data, summary, run


def test_each_ownership_interval_gets_its_messages_and_offsets_and_only_changed_rebalances_are_kept(
    tmp_path: Path,
) -> None:
    data, summary, run = small_run(tmp_path)
    doc = timeline.build(data, summary, discover(run))
    assert [c["node"] for c in doc["consumers"]] == ["consumer-1", "consumer-2"]
    q0, q1 = doc["queues"]
    assert (q0["broker"], q0["queue"], q1["queue"]) == ("broker-a", "0", "1")
    # queue 0: c1's three messages (offsets 0..2), then c2's one (offset 3); queue 1: c2's one
    assert q0["iv"] == [[T0, T0 + 6000, 0, 3, 0, 2], [T0 + 7000, T0 + 10_000, 1, 1, 3, 3]]
    assert q1["iv"] == [[T0, T0 + 10_000, 1, 1, 7, 7]]
    assert [r[0] - T0 for r in doc["rebalances"]] == [0, 0, 7000]  # the unchanged round is left out
    assert doc["rebalances"][-1][5] == 2
    assert doc["brokers"] == [[T0, "broker_started", "broker-a"]]
    assert timeline.paused_spans(doc) == [("consumer-1", T0 + 3000, T0 + 6000)]


def test_the_trace_puts_groups_queues_consumers_and_nemeses_on_the_rocketmq_clock(tmp_path: Path) -> None:
    data, summary, run = small_run(tmp_path)
    tr = timeline.trace(timeline.build(data, summary, discover(run)))
    events = tr["traceEvents"]
    slices = [e for e in events if e["ph"] == "X" and e.get("cat") == "ownership"]
    assert len(slices) == 3
    first = min(slices, key=lambda e: (e["tid"], e["ts"]))
    # 6 s of wall time at time scale 0.05 is 120 s of RocketMQ time
    assert first["ts"] == 0 and first["dur"] == 120_000_000 and first["args"]["consumed"] == 3
    paused = [e for e in events if e.get("name") == "paused"]
    assert len(paused) == 1 and paused[0]["ts"] == 60_000_000 and paused[0]["dur"] == 60_000_000
    nemeses = [e for e in events if e.get("cat") == "nemesis" and e["ph"] == "i"]
    assert [e["name"] for e in nemeses] == ["pause consumer-1", "kill consumer-1"] and nemeses[0]["s"] == "g"
    names = {e["args"]["name"] for e in events if e["ph"] == "M"}
    assert {"group g", "consumers", "T broker-a:0", "consumer-1"} <= names
    json.dumps(tr)  # serialisable as written


def test_write_makes_a_self_contained_page_and_a_trace(tmp_path: Path) -> None:
    data, summary, run = small_run(tmp_path)
    timeline.write(tmp_path, data, summary, str(run), "Run <x>")
    page = (tmp_path / "timeline.html").read_text()
    assert "Run &lt;x&gt;" in page and "http://" not in page and "https://" not in page
    assert "<script src" not in page
    assert json.loads((tmp_path / "trace.json").read_text())["traceEvents"]


def _browser() -> Any:
    playwright = pytest.importorskip("playwright.sync_api")
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("headless Chromium is not installed (apt-get install chromium)")
    return playwright, chromium


@pytest.mark.slow
@pytest.mark.parametrize("width", [1280, 700])
def test_the_page_zooms_pans_hovers_and_filters_in_chromium(tmp_path: Path, width: int) -> None:
    playwright, chromium = _browser()
    data, summary, run = small_run(tmp_path)
    timeline.write(tmp_path, data, summary, str(run), "Run small")
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": width, "height": 700})
            errors: list[str] = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto((tmp_path / "timeline.html").as_uri())
            whole = page.evaluate("window.timeline.view")
            assert whole[0] <= 0 and whole[1] >= 200  # 10 s of wall time at 0.05: 200 s
            box = page.locator("canvas").bounding_box()
            assert box is not None
            x, top = box["x"] + box["width"] * 0.6, box["y"]
            page.mouse.move(x, top + 80)
            page.mouse.wheel(0, -600)  # zoom in around the pointer
            page.wait_for_timeout(100)
            zoomed = page.evaluate("window.timeline.view")
            assert zoomed[1] - zoomed[0] < (whole[1] - whole[0]) / 2
            page.mouse.down()
            page.mouse.move(x - 100, top + 80, steps=4)
            page.mouse.up()
            panned = page.evaluate("window.timeline.view")
            assert panned[0] > zoomed[0] and abs((panned[1] - panned[0]) - (zoomed[1] - zoomed[0])) < 1e-6
            page.keyboard.press("0")
            page.wait_for_timeout(50)
            # hover queue 1's row (second queue row under the group header): consumer-2 owns it throughout
            row_y = top + 24 + 22 + 18 + 14 + 7
            page.mouse.move(box["x"] + box["width"] * 0.5, row_y)
            tip = page.locator("#tip")
            assert (
                tip.is_visible()
                and "consumer-2 (c2)" in tip.inner_text()
                and "consumed 1" in tip.inner_text()
            )
            rows = page.evaluate("window.timeline.rows()")
            page.fill("#filter", "consumer-1")
            assert page.evaluate("window.timeline.rows()") == rows - 1  # queue 1 was never consumer-1's
            page.fill("#filter", "")
            page.screenshot(path=str(tmp_path / f"timeline-{width}.png"), full_page=True)
            assert not errors, errors
        finally:
            browser.close()
