"""A small run written by hand, with every answer worked out by hand (checked by
tests/pipeline/test_pipeline_analysis.py)."""

from __future__ import annotations

from rmqlab.pipeline.synth import line

C1 = dict(node="n1", role="consumer", group="g", client_id="c1")
C2 = dict(node="n2", role="consumer", group="g", client_id="c2")


def _c(ts: int, event: str, who: dict, **kw: object) -> str:
    fields = {k: v for k, v in who.items() if k not in ("node", "role")}
    return line(ts, event, who["node"], who["role"], **fields, **kw)


def mq(queue_id: int) -> dict:
    return {"topic": "T", "broker": "b", "queue_id": queue_id}


def consumed(ts: int, who: dict, msg: str, queue_id: int, offset: int, started: int) -> str:
    return _c(
        ts, "message_consumed", who, msg_id=msg, **mq(queue_id), queue_offset=offset, started_ms=started,
        mode="CONCURRENTLY",
    )  # fmt: skip


def sent(ts: int, msg: str, queue_id: int, offset: int) -> str:
    return line(ts, "message_sent", "p1", "producer", msg_id=msg, **mq(queue_id), queue_offset=offset)


def rebalance(ts: int, who: dict, cids: list[str], allocated: list[str]) -> str:
    return _c(
        ts, "rebalance", who, topic="T", strategy="AVG", cid_all=cids, allocated=allocated, changed=True
    )


RUN = {
    "consumer-1.jsonl": [
        _c(100, "consumer_started", C1),
        _c(100, "topic_route", C1, topic="T", queues=["b:0", "b:1"]),
        rebalance(110, C1, ["c1"], ["b:0", "b:1"]),
        _c(110, "mq_added", C1, **mq(0), next_offset=0),
        _c(110, "mq_added", C1, **mq(1), next_offset=0),
        consumed(125, C1, "m1", 0, 0, 121),
        consumed(135, C1, "m2", 1, 0, 131),
        rebalance(220, C1, ["c1", "c2"], ["b:0"]),
        _c(220, "mq_removed", C1, **mq(1), reason="reallocated"),
        rebalance(350, C1, ["c1"], ["b:0", "b:1"]),
        _c(350, "mq_added", C1, **mq(1), next_offset=1),
        "this line is not JSON",
        "   ",
    ],
    "consumer-2.jsonl": [
        _c(200, "consumer_started", C2),
        rebalance(210, C2, ["c1", "c2"], ["b:1"]),
        _c(210, "mq_added", C2, **mq(1), next_offset=0),
        consumed(215, C2, "m2", 1, 0, 212),
    ],
    "producer.jsonl": [sent(120, "m1", 0, 0), sent(130, "m2", 1, 0), sent(250, "m3", 1, 1)],
    "chaos.jsonl": [
        line(300, "nemesis", "chaos", "chaos", action="kill", target="n2", target_role="consumer", group="g"),
        line(400, "log", "chaos", "chaos", msg="end of run"),
    ],
    "_ignored/x.jsonl": [_c(50, "consumer_started", dict(C1, client_id="ghost"))],
}

# Worked out by hand:
#   sent m1 m2 m3 = 3; consumed m1 m2 = 2; lost m3 = 1; m2 twice -> duplicates 1, duplicated_messages 1.
#   b:1 owned by c1 [110,220), c2 [210,300) (closed by the kill of n2), c1 [350,400):
#     overlap [210,220) = 10; orphan [300,350) = 50 (b:0 is owned [110,400) throughout).
#   m2's consumptions [131,135) and [212,215) never overlap -> concurrent_consume_ms 0; nothing paused.
#   change points: start c1 at 100 -> whole at 110 (10 ms); start c2 at 200 -> whole at 220 when c1 has
#   rebalanced with [c1, c2] and given b:1 up (20 ms); kill n2 at 300 -> whole at 350 (50 ms).
#   verdict fail (a message was lost). 20 well-formed lines, 1 malformed, the blank line not counted,
#   the file under _ignored/ not read.
EXPECTED_GROUP = {
    "topics": ["T"],
    "sent": 3, "consumed_unique": 2, "lost": 1, "duplicates": 1, "duplicated_messages": 1,
    "overlap_ms": 10, "orphan_ms": 50, "stalled_ms": 0, "concurrent_consume_ms": 0, "order_violations": 0,
    "verdict": "fail",
}  # fmt: skip
EXPECTED_CONVERGENCE = [(100, 10), (200, 20), (300, 50)]
EXPECTED_RUN = {"events": 20, "malformed_lines": 1, "start_ms": 100, "end_ms": 400}
