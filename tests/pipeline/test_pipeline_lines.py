"""Reading lines: what is well-formed, what is malformed (counted, never fatal), what is skipped, and
the event order — the same in the reference and in Spark, including lines Spark's JSON reader alone
would accept (it turns a number into text where a string is expected)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rmqlab.pipeline.discover import RunDirError, discover
from rmqlab.pipeline.metrics_reference import load_run, parse_line
from rmqlab.pipeline.synth import MALFORMED_LINES

BASE = {"ts_ms": 5, "event": "log", "node": "n", "role": "broker"}


def obj(**changes: Any) -> str:
    return json.dumps({**BASE, **changes})


# (line, well-formed?) -- the answers follow EVENTS.md "Lines".
JUDGED = [
    (obj(), True),
    (obj(extra={"nested": [1, "}"]}), True),  # other fields may be anything
    (obj(group=5, queue_id="x"), True),  # ... including named fields an event does not require
    (obj(ts_ms=-(2**63)), True),
    (obj(ts_ms=2**63 - 1), True),
    (obj(ts_ms=2**63), False),  # beyond a 64-bit int
    (obj(ts_ms="5"), False),
    (obj(ts_ms=5.0), False),  # a float where an int is required
    (obj(ts_ms=True), False),  # a bool where an int is required
    (obj(ts_ms=None), False),  # null is never of the right type
    (obj(node=7), False),  # an int where a string is required
    (obj(node=True), False),
    (obj(node=["n"]), False),
    (obj(node={"a": 1}), False),
    (obj(node="7"), True),  # a string that looks like a number is still a string
    (obj(node="true"), True),
    (obj(node='"quoted"'), True),
    (obj(node="é \u2603 \U0001f600"), True),
    ('{"ts_ms": 5, "event": "log", "node": "n", "role": "broker", "x": "\\ud800"}', False),  # lone surrogate
    ('{"ts_ms": 5, "event": "log", "node": "n", "role": "broker", "x": 1e400}', True),
    ('{"ts_ms": 5, "event": "log", "node": "n", "role": "broker", "x": NaN}', False),
    ('{"ts_ms": 5, "event": "log", "node": "n", "role": "broker"} trailing', False),
    ('{"ts_ms": 5, "event": "log", "node": "n", "role": "broker"}{"ts_ms": 6}', False),
    ('{"ts_ms": 5, "event": "log", "node": "n", "role": "broker"}\t ', True),
    ('{"ts_ms": 5, "event": "log", "node": "n", "role": "broker", "node": 5}', False),  # the last one counts
    ('{"ts_ms": "x", "event": "log", "node": "n", "role": "broker", "ts_ms": 7}', True),
    ("{'ts_ms': 5, 'event': 'log', 'node': 'n', 'role': 'broker'}", False),
    (obj(event="message_sent", msg_id="m", topic="T", broker="b", queue_id=1, queue_offset=0), True),
    (obj(event="message_sent", msg_id=17, topic="T", broker="b", queue_id=1, queue_offset=0), False),
    (obj(event="message_sent", msg_id="m", topic="T", broker="b", queue_id=1), False),  # missing field
    (
        obj(
            event="rebalance",
            group="g",
            client_id="c",
            topic="T",
            strategy="S",
            cid_all=[],
            allocated=[],
            changed=False,
        ),
        True,
    ),
    (
        obj(
            event="rebalance",
            group="g",
            client_id="c",
            topic="T",
            strategy="S",
            cid_all=["c", None],
            allocated=[],
            changed=False,
        ),
        False,
    ),
    (
        obj(
            event="rebalance",
            group="g",
            client_id="c",
            topic="T",
            strategy="S",
            cid_all=["c"],
            allocated=[],
            changed=0,
        ),
        False,
    ),
    (obj(event="nemesis", action="kill", target="x", target_role="broker"), True),
    (obj(event="nemesis", action="kill", target="x", target_role="consumer"), False),  # needs its group
    (obj(event="nemesis", action="kill", target="x", target_role="consumer", group="g"), True),
    (obj(event="consumer_unregistered", group="g", client_id="c"), False),  # reason is required
    # Where the byte-wise shape check and the first-character filter of the fast path could go wrong:
    # a '}' inside a string, multi-byte characters before the last '}', strings that start like a
    # number, a bool, a list or an object without being one.
    (obj(node="é}☃"), True),
    (obj(node="☃é") + " \t", True),
    (obj(node="☃é") + '{"ts_ms": 6}', False),
    (obj(node="é") + " x}", False),
    (obj(node="-x", group="trick", client_id="[c", topic="{t", broker="fb", msg_id="12ab"), True),
    (obj(event="message_sent", msg_id="0012", topic="T", broker="b", queue_id=1, queue_offset=0), True),
    (obj(event="message_sent", msg_id="-12", topic="T", broker="b", queue_id=1, queue_offset=0), True),
    (obj(event="message_sent", msg_id="1e5", topic="T", broker="b", queue_id=1, queue_offset=0), True),
    (obj(event="message_sent", msg_id="m", topic="false", broker="b", queue_id=1, queue_offset=0), True),
    (obj(event="message_sent", msg_id="m", topic=False, broker="b", queue_id=1, queue_offset=0), False),
    (obj(event="message_sent", msg_id=-12, topic="T", broker="b", queue_id=1, queue_offset=0), False),
    # The fast path tests every string field and list element with one regex over them joined by NUL.
    (obj(event="topic_route", client_id="c", topic="T", queues=[]), True),
    (obj(event="topic_route", client_id="c", topic="T", queues=["q", "5", "[x", "true", ""]), True),
    (obj(event="topic_route", client_id="c", topic="T", queues=["q", 5]), False),
    (obj(event="topic_route", client_id="c", topic="T", queues=[1.5, "q"]), False),
    (obj(event="topic_route", client_id="c", topic="T", queues=["q", True]), False),
    (obj(event="topic_route", client_id="c", topic="T", queues=["q", ["r"]]), False),
    (obj(event="topic_route", client_id="c", topic="T", queues=[{"q": 1}]), False),
    (obj(event="topic_route", client_id="c", topic="T", queues=["q", None]), False),
    (obj(event="topic_route", client_id="5", topic="T", queues=["q"]), True),
    (obj(event="topic_route", client_id=5, topic="T", queues=["q"]), False),
    (obj(event="topic_route", client_id="c", topic="T\u0000", queues=["q\u0001"]), True),
    *[(text, False) for text in MALFORMED_LINES],
]


@pytest.mark.parametrize(("text", "ok"), JUDGED)
def test_reference_judges_lines(text: str, ok: bool) -> None:
    assert (parse_line(text) is not None) == ok


def write_lines(root: Path) -> None:
    root.mkdir(parents=True, exist_ok=True)
    lines = [text.replace('"ts_ms": 5,', f'"ts_ms": {10 + i},', 1) for i, (text, _) in enumerate(JUDGED)]
    (root / "a.jsonl").write_text("\n".join([*lines, "", "   ", "\t"]) + "\n", encoding="utf-8")
    # CR, LF and CRLF all end lines; bad UTF-8 is replaced; the last line lacks its newline.
    tail = b'{"ts_ms": 1, "event": "log", "node": "n\xff", "role": "broker"}\r\n'
    tail += b'{"ts_ms": 1, "event": "log", "node": "cr", "role": "broker"}\r'
    tail += b'{"ts_ms": 1, "event": "log", "node": "lf", "role": "broker"}\n\n  \n{"ts_ms": 4, "ev'
    (root / "b.jsonl").write_bytes(tail)


def test_reference_counts_and_orders_lines(tmp_path: Path) -> None:
    write_lines(tmp_path)
    events, malformed = load_run(tmp_path)
    assert malformed == sum(1 for _, ok in JUDGED if not ok) + 1  # + the truncated last line of b.jsonl
    assert len(events) == sum(1 for _, ok in JUDGED if ok) + 3
    # Same millisecond: file path first, then line number.
    assert [e.rec["node"] for e in events if e.ts == 1] == ["n\ufffd", "cr", "lf"]


@pytest.mark.spark
@pytest.mark.parametrize("cached", [False, True], ids=["checkpoint", "columnar-cache"])
def test_spark_reads_lines_like_the_reference(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cached: bool
) -> None:
    """The same events, counts and order whichever store holds the read lines (large inputs go to the
    columnar cache, small ones to a local checkpoint)."""
    import rmqlab.pipeline.ingest
    from rmqlab.pipeline.ingest import ORDER_COLUMNS, load_json_run

    write_lines(tmp_path)
    events, malformed = load_run(tmp_path)
    if cached:
        monkeypatch.setattr(rmqlab.pipeline.ingest, "CACHE_FROM_BYTES", 0)
    run = load_json_run(spark, tmp_path)
    try:
        assert run.cached[0].is_cached is cached
        assert (run.stats.events, run.stats.malformed_lines) == (len(events), malformed)
        assert (run.stats.start_ms, run.stats.end_ms) == (events[0].ts, events[-1].ts)
        rows = run.events.orderBy(*ORDER_COLUMNS).select("ts_ms", "node").collect()
        assert [(r["ts_ms"], r["node"]) for r in rows] == [(e.ts, e.rec["node"]) for e in events]
    finally:
        run.release()


@pytest.mark.spark
def test_fast_path_agrees_with_the_exact_path(spark: Any, tmp_path: Path) -> None:
    """Lines the JSON reader decides (the fast path) get the same verdict and the same typed values as
    when every line goes through the exact VARIANT checks."""
    from rmqlab.pipeline.ingest import ORDER_COLUMNS, parse_lines

    write_lines(tmp_path)
    files = discover(tmp_path)

    def rows(fast_path: bool) -> list[Any]:
        lines = parse_lines(spark, files, fast_path=fast_path)
        return lines.orderBy(*ORDER_COLUMNS).collect()

    fast, exact = rows(True), rows(False)
    assert len(fast) == len(exact) > len(JUDGED)
    assert sum(1 for r in fast if not r["ok"]) == sum(1 for _, ok in JUDGED if not ok) + 1
    for a, b in zip(fast, exact, strict=True):
        assert a.asDict() == b.asDict()


@pytest.mark.spark
def test_parquet_copy_keeps_events_counts_and_order(spark: Any, tmp_path: Path) -> None:
    from rmqlab.pipeline.ingest import ORDER_COLUMNS, load_json_run, load_parquet_run, write_parquet

    write_lines(tmp_path / "run")
    run = load_json_run(spark, tmp_path / "run", columns=None)
    write_parquet(run.events, run.stats, tmp_path / "pq", "run")
    run.release()
    assert (tmp_path / "pq" / "event=log").is_dir() and (tmp_path / "pq" / "_ingest.json").is_file()
    copy = load_parquet_run(spark, tmp_path / "pq")
    try:
        events, malformed = load_run(tmp_path / "run")
        assert (copy.stats.events, copy.stats.malformed_lines) == (len(events), malformed)
        rows = copy.events.orderBy(*ORDER_COLUMNS).select("ts_ms", "node").collect()
        assert [(r["ts_ms"], r["node"]) for r in rows] == [(e.ts, e.rec["node"]) for e in events]
    finally:
        copy.release()


def test_discovery_skips_dot_and_underscore_names(tmp_path: Path) -> None:
    for rel in ["a.jsonl", "sub/deep/b.jsonl", "_tmp/c.jsonl", ".git/d.jsonl", "sub/_e.jsonl", "sub/.f.jsonl",
                "notes.txt", "g.jsonl.bak"]:  # fmt: skip
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("{}\n")
    assert [f.rel for f in discover(tmp_path)] == ["a.jsonl", "sub/deep/b.jsonl"]
    with pytest.raises(RunDirError, match="does not exist"):
        discover(tmp_path / "missing")
    with pytest.raises(RunDirError, match="not a directory"):
        discover(tmp_path / "a.jsonl")
