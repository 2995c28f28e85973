"""Small pure pieces: the verdict rules, the allocation the simulator uses, report text."""

from __future__ import annotations

from rmqlab.pipeline.contract import cause_text, failing_checks, join_causes, verdict
from rmqlab.pipeline.report_data import PlotData, pick_bucket_ms
from rmqlab.pipeline.report_page import render_html
from rmqlab.pipeline.synth import averagely


def entry(converged: bool) -> dict:
    return {"change_ms": 1, "cause": "x", "converged": converged, "convergence_ms": 0 if converged else None}


def test_verdict_rules() -> None:
    ok = dict(lost=0, orderly=False, concurrent_consume_ms=0, order_violations=0, convergence=[entry(True)])
    assert verdict(**ok) == "ok"
    assert verdict(**{**ok, "lost": 1}) == "fail"
    # Concurrency and order only matter for an ORDERLY group.
    assert verdict(**{**ok, "concurrent_consume_ms": 5, "order_violations": 2}) == "ok"
    assert verdict(**{**ok, "orderly": True, "concurrent_consume_ms": 5}) == "fail"
    assert verdict(**{**ok, "orderly": True, "order_violations": 1}) == "fail"
    assert verdict(**{**ok, "convergence": [entry(True), entry(False)]}) == "fail"
    assert verdict(**{**ok, "convergence": []}) == "ok"
    # a group whose queues the broker assigns is not judged on convergence
    assert verdict(**{**ok, "convergence": [entry(False)], "server_assigned": True}) == "ok"


def test_failing_checks_name_every_failed_check_most_severe_first() -> None:
    ok = dict(lost=0, orderly=True, concurrent_consume_ms=0, order_violations=0, convergence=[entry(True)])
    assert failing_checks(**ok) == []
    assert failing_checks(**{**ok, "lost": 1, "order_violations": 1, "convergence": [entry(False)]}) == [
        "lost",
        "orderly",
        "not-converged",
    ]
    assert failing_checks(**{**ok, "concurrent_consume_ms": 1}) == ["orderly"]
    assert failing_checks(**{**ok, "orderly": False, "concurrent_consume_ms": 1}) == []
    assert failing_checks(**{**ok, "convergence": [entry(False)], "server_assigned": True}) == []


def test_causes() -> None:
    assert cause_text("nemesis", None, None, "consumer-2") == "kill consumer-2"
    assert cause_text("consumer_started", "c1", "n1", None) == "start c1 on n1"
    assert join_causes(["start b", "kill a", "start b"]) == "kill a; start b"


def test_averagely_matches_rocketmq() -> None:
    mqs = [f"b:{i}" for i in range(8)]
    assert averagely(["c1", "c2", "c3"], mqs, "c1") == ["b:0", "b:1", "b:2"]
    assert averagely(["c1", "c2", "c3"], mqs, "c2") == ["b:3", "b:4", "b:5"]
    assert averagely(["c1", "c2", "c3"], mqs, "c3") == ["b:6", "b:7"]
    assert averagely(["c1", "c2"], ["b:0"], "c2") == []
    assert averagely(["c1"], mqs, "c9") == []


def test_bucket_width_is_round() -> None:
    assert pick_bucket_ms(100) == 1
    assert pick_bucket_ms(14_000) == 100
    assert pick_bucket_ms(250_000) == 2000
    assert pick_bucket_ms(0) == 1


def test_report_without_groups_still_renders() -> None:
    summary = {"run": {"events": 0, "malformed_lines": 3, "start_ms": None, "end_ms": None}, "groups": {}}
    page = render_html(summary, PlotData(0, 0, 1), "Run x")
    assert "No consumer group" in page and "</html>" in page


def test_a_change_just_before_the_origin_reads_zero_not_negative_zero() -> None:
    from rmqlab.pipeline.report_story import time_text
    from rmqlab.pipeline.unavailability import RunClock

    assert time_text(9_990, RunClock(10_000, 1.0)) == "t = 0.0 s"  # 10 ms before t = 0
    assert time_text(9_998, RunClock(10_000, 0.05)) == "t = 0.0 s (0.00 s wall)"
    assert time_text(12_500, RunClock(10_000, 1.0)) == "t = 2.5 s"
