"""Small runs written by hand, each with its answers worked out by hand (the comments show the arithmetic).

A case builds its event files through a `Builder`, which can prefix every name (groups, clients,
nodes, topics, brokers, msg ids) and shift every time. The reference is checked on each case alone
(no prefix, no shift); Spark analyses all cases at once in one run, each case under its own prefix
and shifted so that every case ends at the same `run_end` (durations and verdicts do not change,
change times move by the shift).
"""

from __future__ import annotations

import hashlib
import json
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

CONSUMER = "consumer"


def sha256_members(ids: list[str]) -> str:
    """cid_all_digest written out from EVENTS.md's words (not with the pipeline's helper)."""
    text = "\n".join(sorted(set(ids)))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


class Builder:
    def __init__(self, prefix: str = "", shift: int = 0, end: int = 0) -> None:
        self.prefix = prefix
        self.shift = shift
        self.end = end
        self.files: dict[str, list[str]] = defaultdict(list)

    # -- naming --------------------------------------------------------------------------------------

    def n(self, name: str) -> str:
        return f"{self.prefix}{name}"

    def q(self, queue: str) -> str:
        return self.n(queue)  # "b:0" -> "<prefix>b:0": the broker part carries the prefix

    def path(self, rel: str) -> str:
        return f"{self.prefix.rstrip('-')}/{rel}" if self.prefix else rel

    def t(self, ts: int) -> int:
        assert ts <= self.end, f"event at {ts} after the case's end {self.end}"
        return ts + self.shift

    # -- lines ---------------------------------------------------------------------------------------

    def raw(self, rel: str, text: str) -> None:
        self.files[self.path(rel)].append(text)

    def ev(self, rel: str, ts: int, event: str, node: str, role: str, **fields: Any) -> None:
        record: dict[str, Any] = {"ts_ms": self.t(ts), "event": event, "node": self.n(node), "role": role}
        for key, value in fields.items():
            if key == "topic" and isinstance(value, tuple):  # (group, topic): the pop retry topic
                value = f"%RETRY%{self.n(value[0])}_{self.n(value[1])}"
            elif key in ("group", "client_id", "topic", "broker", "msg_id", "target"):
                value = self.n(value)
            elif key in ("queues", "allocated", "pull", "pop"):
                value = [self.q(v) for v in value]
            elif key == "cid_all":
                value = [self.n(v) for v in value]
            elif key == "started_ms":
                value = self.t(value)
            record[key] = value
        self.files[self.path(rel)].append(json.dumps(record))

    def started(self, ts: int, node: str, client: str, group: str = "g", rel: str | None = None) -> None:
        self.ev(rel or f"{node}.jsonl", ts, "consumer_started", node, CONSUMER, group=group, client_id=client)

    def stopped(self, ts: int, node: str, client: str, group: str = "g", rel: str | None = None) -> None:
        self.ev(rel or f"{node}.jsonl", ts, "consumer_stopped", node, CONSUMER, group=group, client_id=client)

    def route(self, ts: int, node: str, client: str, queues: list[str], topic: str = "T") -> None:
        self.ev(
            f"{node}.jsonl", ts, "topic_route", node, CONSUMER, client_id=client, topic=topic, queues=queues
        )

    def rebalance(
        self, ts: int, node: str, client: str, cid_all: list[str], allocated: list[str], group: str = "g",
        topic: str = "T", digest_of: list[str] | None = None, with_list: bool = True,
    ) -> None:  # fmt: skip
        """A rebalance line; `digest_of` adds a cid_all_digest of those ids, `with_list=False` drops
        cid_all (a large group's line)."""
        members: dict[str, Any] = {"cid_all": cid_all} if with_list else {}
        if digest_of is not None:
            members["cid_all_digest"] = sha256_members([self.n(c) for c in digest_of])
        self.ev(
            f"{node}.jsonl", ts, "rebalance", node, CONSUMER, group=group, client_id=client, topic=topic,
            strategy="AVG", allocated=allocated, changed=True, **members,
        )  # fmt: skip

    def added(
        self, ts: int, node: str, client: str, queue: str, group: str = "g", topic: str = "T",
        rel: str | None = None, next_offset: int = 0,
    ) -> None:  # fmt: skip
        broker, qid = queue.split(":")
        self.ev(
            rel or f"{node}.jsonl", ts, "mq_added", node, CONSUMER, group=group, client_id=client,
            topic=topic, broker=broker, queue_id=int(qid), next_offset=next_offset,
        )  # fmt: skip

    def committed(
        self, ts: int, queue: str, offset: int, group: str = "g", topic: str = "T", node: str | None = None
    ) -> None:
        """The broker of `queue` (its node is its name) stores `offset` for the group; or its node
        `node` (a slave), whose line names the broker."""
        broker, qid = queue.split(":")
        named = {} if node is None else {"broker": broker, "broker_id": 1}
        self.ev(
            f"{node or broker}.jsonl", ts, "offset_committed", node or broker, "broker", group=group,
            topic=topic, queue_id=int(qid), offset=offset, **named,
        )  # fmt: skip

    def synced(
        self, ts: int, queue: str, offset: int, prev: int, group: str = "g", topic: str = "T",
        node: str = "b-s1",
    ) -> None:  # fmt: skip
        """The slave `node` of `queue`'s broker replaced its offset `prev` with its master's `offset`."""
        broker, qid = queue.split(":")
        self.ev(
            f"{node}.jsonl", ts, "offset_synced", node, "broker", broker=broker, broker_id=1, group=group,
            topic=topic, queue_id=int(qid), offset=offset, prev_offset=prev, master_addr="10.0.0.1:10911",
        )  # fmt: skip

    def removed(
        self, ts: int, node: str, client: str, queue: str, group: str = "g", topic: str = "T",
        rel: str | None = None,
    ) -> None:  # fmt: skip
        broker, qid = queue.split(":")
        self.ev(
            rel or f"{node}.jsonl", ts, "mq_removed", node, CONSUMER, group=group, client_id=client,
            topic=topic, broker=broker, queue_id=int(qid), reason="reallocated",
        )  # fmt: skip

    def sent(self, ts: int, msg: str, queue: str, offset: int = 0, topic: str = "T") -> None:
        broker, qid = queue.split(":")
        self.ev(
            "producer.jsonl", ts, "message_sent", "producer-1", "producer", msg_id=msg, topic=topic,
            broker=broker, queue_id=int(qid), queue_offset=offset,
        )  # fmt: skip

    def consumed(
        self, ts: int, node: str, client: str, msg: str, queue: str, offset: int = 0,
        started: int | None = None, mode: str = "CONCURRENTLY", group: str = "g",
        topic: str | tuple[str, str] = "T",
    ) -> None:  # fmt: skip
        broker, qid = queue.split(":")
        self.ev(
            f"{node}.jsonl", ts, "message_consumed", node, CONSUMER, group=group, client_id=client,
            msg_id=msg, topic=topic, broker=broker, queue_id=int(qid), queue_offset=offset,
            started_ms=ts - 1 if started is None else started, mode=mode,
        )  # fmt: skip

    def assignment(
        self, ts: int, node: str, client: str, group: str, topic: str = "T",
        pull: list[str] | None = None, pop: list[str] | None = None,
    ) -> None:  # fmt: skip
        """A RocketMQ 5 consumer's QUERY_ASSIGNMENT answer (EVENTS.md's proposed `assignment`)."""
        self.ev(
            f"{node}.jsonl", ts, "assignment", node, CONSUMER, group=group, client_id=client, topic=topic,
            strategy="AVG", pull=pull or [], pop=pop or [], changed=True,
        )  # fmt: skip

    def nemesis(
        self, ts: int, action: str, target: str, group: str | None = "g", role: str = CONSUMER
    ) -> None:
        fields: dict[str, Any] = {"action": action, "target": target, "target_role": role}
        if group is not None:
            fields["group"] = group
        self.ev("chaos.jsonl", ts, "nemesis", "chaos", "chaos", **fields)

    def finish(self) -> dict[str, list[str]]:
        # Every case ends with a line at its `end`, so run_end is known before the case is read.
        self.ev("zz-end.jsonl", self.end, "log", "chaos", "chaos", msg="end of case")
        return dict(self.files)


@dataclass
class Case:
    name: str
    end: int
    build: Callable[[Builder], None]
    groups: dict[str, dict[str, Any]] = field(default_factory=dict)  # expected metric subsets per group
    convergence: dict[str, list[tuple[int, bool, int | None]]] = field(default_factory=dict)
    # expected offset regressions per group: (change_ms, queue, from, to, event, node, redelivered)
    regressions: dict[str, list[tuple[int, str, int, int, str, str, int]]] = field(default_factory=dict)
    # expected slave offset regressions per group: (change_ms, queue, from, to, node)
    slave_regressions: dict[str, list[tuple[int, str, int, int, str]]] = field(default_factory=dict)
    run: dict[str, Any] | None = None  # expected run block, when the case is about the lines themselves

    def files(self, prefix: str = "", shift: int = 0) -> dict[str, list[str]]:
        b = Builder(prefix, shift, self.end)
        self.build(b)
        return b.finish()


CASES: list[Case] = []


def case(
    name: str, end: int, **expect: Any
) -> Callable[[Callable[[Builder], None]], Callable[[Builder], None]]:
    def register(build: Callable[[Builder], None]) -> Callable[[Builder], None]:
        CASES.append(Case(name, end, build, **expect))
        return build

    return register


# ---------------------------------------------------------------------------------------------------


@case(
    "message_counts", 100,
    # sent: m1 m2 m3 m4 on T (m2 sent twice counts once, x1 is on topic Other) = 4
    # consumed_unique: m1 m2 m4 z9 = 4 (the line for x1 is on Other, not a group topic)
    # lost: m3 = 1; duplicates: m2 three times -> 3 - 1 = 2; duplicated_messages: m2 = 1
    groups={"g": dict(sent=4, consumed_unique=4, lost=1, duplicates=2, duplicated_messages=1, overlap_ms=0,
                      orphan_ms=0, verdict="fail")},
    # start c1 at 10; at 20 it owns b:0 and rebalanced with [c1] -> 20 - 10 = 10 ms
    convergence={"g": [(10, True, 10)]},
    # 4 control lines + 6 sends + 7 consumptions + the end line = 18
    run=dict(events=18, malformed_lines=0, start_ms=10, end_ms=100),
)  # fmt: skip
def _message_counts(b: Builder) -> None:
    b.started(10, "n1", "c1")
    b.route(10, "n1", "c1", ["b:0"])
    b.rebalance(20, "n1", "c1", ["c1"], ["b:0"])
    b.added(20, "n1", "c1", "b:0")
    for i, msg in enumerate(["m1", "m2", "m3", "m4", "m2"]):
        b.sent(30 + i, msg, "b:0", i)
    b.sent(35, "x1", "b:0", topic="Other")
    for i, msg in enumerate(["m1", "m2", "m2", "m2", "m4", "z9"]):
        b.consumed(40 + i, "n1", "c1", msg, "b:0", i)
    b.consumed(46, "n1", "c1", "x1", "b:0", topic="Other")


@case(
    "consumers_without_messages", 100,
    # clients of g: c1, c2 (started, rebalanced, consumed), c3 (started, rebalanced, owns b:2, where
    # nothing is sent: never consumed), c4 (started only) -> without messages: c3, c4 = 2. c5 consumed
    # for group h only: h has one client, consuming -> 0.
    groups={"g": dict(consumers_without_messages=2), "h": dict(consumers_without_messages=0)},
)  # fmt: skip
def _consumers_without_messages(b: Builder) -> None:
    b.route(10, "n1", "c1", ["b:0", "b:1", "b:2"])
    for i, (node, client) in enumerate([("n1", "c1"), ("n2", "c2"), ("n3", "c3")]):
        b.started(10, node, client)
        b.rebalance(20, node, client, ["c1", "c2", "c3"], [f"b:{i}"])
        b.added(20, node, client, f"b:{i}")
    b.started(30, "n4", "c4")
    b.started(10, "n5", "c5", group="h")
    for i, msg in enumerate(["m1", "m2"]):
        b.sent(40 + i, msg, f"b:{i}", 0)
        b.consumed(50 + i, f"n{i + 1}", f"c{i + 1}", msg, f"b:{i}", 0)
    b.consumed(60, "n5", "c5", "m1", "b:0", 0, group="h")


@case(
    "half_open_handover", 100,
    # b:1: c1 [20,60) then c2 [60,100): they touch at 60 but [s, e) never share an instant -> overlap 0.
    # c2's [70,70) on b:0 is empty. b:0: c1 [20,100). Nothing unowned after T0 = 20 -> orphan 0.
    groups={"g": dict(overlap_ms=0, orphan_ms=0, stalled_ms=0, verdict="ok")},
    # start c1 at 10 -> whole at 20 (10 ms); start c2 at 50 -> at 60 both rebalanced with [c1, c2],
    # b:0 c1, b:1 c2 -> 10 ms
    convergence={"g": [(10, True, 10), (50, True, 10)]},
)  # fmt: skip
def _half_open(b: Builder) -> None:
    b.started(10, "n1", "c1")
    b.route(10, "n1", "c1", ["b:0", "b:1"])
    b.rebalance(20, "n1", "c1", ["c1"], ["b:0", "b:1"])
    b.added(20, "n1", "c1", "b:0")
    b.added(20, "n1", "c1", "b:1")
    b.started(50, "n2", "c2")
    b.rebalance(60, "n1", "c1", ["c1", "c2"], ["b:0"])
    b.removed(60, "n1", "c1", "b:1")
    b.rebalance(60, "n2", "c2", ["c1", "c2"], ["b:1"])
    b.added(60, "n2", "c2", "b:1")
    b.added(70, "n2", "c2", "b:0")
    b.removed(70, "n2", "c2", "b:0")


@case(
    "same_millisecond_order", 100,
    # At 50, a.jsonl (mq_removed b:0) sorts before b.jsonl (mq_added b:0): c1's interval closes at 50
    # and a new one opens at 50 -> b:0 is owned throughout.
    # At 60, in x.jsonl, mq_added b:1 (line before) is inside the open interval and ignored, then
    # mq_removed b:1 closes it -> b:1 unowned [60,100) = 40. orphan = 0 + 40 = 40.
    groups={"g": dict(orphan_ms=40, overlap_ms=0)},
    convergence={"g": [(10, True, 10)]},
)  # fmt: skip
def _same_ms(b: Builder) -> None:
    b.started(10, "n1", "c1", rel="x.jsonl")
    b.ev("x.jsonl", 10, "topic_route", "n1", CONSUMER, client_id="c1", topic="T", queues=["b:0", "b:1"])
    b.ev("x.jsonl", 20, "rebalance", "n1", CONSUMER, group="g", client_id="c1", topic="T", strategy="AVG",
         cid_all=["c1"], allocated=["b:0", "b:1"], changed=True)  # fmt: skip
    b.added(20, "n1", "c1", "b:0", rel="x.jsonl")
    b.added(20, "n1", "c1", "b:1", rel="x.jsonl")
    b.added(50, "n1", "c1", "b:0", rel="b.jsonl")
    b.removed(50, "n1", "c1", "b:0", rel="a.jsonl")
    b.added(60, "n1", "c1", "b:1", rel="x.jsonl")
    b.removed(60, "n1", "c1", "b:1", rel="x.jsonl")


def _two_owners(b: Builder) -> None:
    b.started(10, "n1", "c1")
    b.route(10, "n1", "c1", ["b:0", "b:1"])
    b.started(11, "n2", "c2")
    b.route(11, "n2", "c2", ["b:0", "b:1"])
    b.rebalance(20, "n1", "c1", ["c1", "c2"], ["b:0"])
    b.added(20, "n1", "c1", "b:0")
    b.rebalance(20, "n2", "c2", ["c1", "c2"], ["b:1"])
    b.added(20, "n2", "c2", "b:1")


@case(
    "idle_member_stale_view", 100,
    # c1 holds b:0 and b:1 from 20. c2 starts at 50 and at 60 allocates over a stale member list of
    # three (nothing for itself), while c1, over [c1, c2], gives b:1 up at 60; c2 takes b:1 at 90.
    # Two queues of T, two live members: c2 holds nothing of T from its first rebalance (60) to 90 ->
    # idle_member_ms 30 (its time from its start at 50 to 60 is before its first rebalance); c1 always
    # holds a queue. b:1 unowned [60,90) -> orphan 30; overlap 0.
    groups={"g": dict(idle_member_ms=30, orphan_ms=30, overlap_ms=0, verdict="ok")},
    # start c1 at 10 -> whole at 20; start c2 at 50 -> at 90 both hold a queue over [c1, c2] -> 40 ms
    convergence={"g": [(10, True, 10), (50, True, 40)]},
)  # fmt: skip
def _idle_member(b: Builder) -> None:
    b.started(10, "n1", "c1")
    b.route(10, "n1", "c1", ["b:0", "b:1"])
    b.rebalance(20, "n1", "c1", ["c1"], ["b:0", "b:1"])
    b.added(20, "n1", "c1", "b:0")
    b.added(20, "n1", "c1", "b:1")
    b.started(50, "n2", "c2")
    b.route(50, "n2", "c2", ["b:0", "b:1"])
    b.rebalance(60, "n2", "c2", ["c0", "c1", "c2"], [])
    b.rebalance(60, "n1", "c1", ["c1", "c2"], ["b:0"])
    b.removed(60, "n1", "c1", "b:1")
    b.rebalance(90, "n2", "c2", ["c1", "c2"], ["b:1"])
    b.added(90, "n2", "c2", "b:1")


@case(
    "kill_without_mq_removed", 400,
    # c2 on n2 is killed at 300 and never writes mq_removed: its b:1 interval is [20,300).
    # c1 takes b:1 at 340 -> b:1 unowned [300,340) = 40 -> orphan 40; overlap 0.
    groups={"g": dict(orphan_ms=40, overlap_ms=0, verdict="ok")},
    # start c1 at 10 -> whole at 20 (10 ms); start c2 at 11 -> 20 (9 ms);
    # kill n2 at 300 -> at 340 b:1 is c1's and c1 rebalanced with [c1] -> 40 ms
    convergence={"g": [(10, True, 10), (11, True, 9), (300, True, 40)]},
)  # fmt: skip
def _kill(b: Builder) -> None:
    _two_owners(b)
    b.nemesis(300, "kill", "n2")
    b.rebalance(340, "n1", "c1", ["c1"], ["b:0", "b:1"])
    b.added(340, "n1", "c1", "b:1")


@case(
    "line_of_a_dead_client", 400,
    # As kill_without_mq_removed, plus an mq_added of c2 at 300 in n2.jsonl, which sorts after
    # chaos.jsonl: the kill closes c2's b:1 interval [20,300), then the late line opens [300,400).
    # b:1 is owned by c2 [300,400) and c1 [340,400) -> overlap 60; never unowned -> orphan 0.
    groups={"g": dict(orphan_ms=0, overlap_ms=60, verdict="fail")},
    # After the kill, b:1's only interval until 340 belongs to a dead client, and from 340 it has two:
    # never converged before run_end.
    convergence={"g": [(10, True, 10), (11, True, 9), (300, False, None)]},
)  # fmt: skip
def _dead_line(b: Builder) -> None:
    _kill(b)
    b.added(300, "n2", "c2", "b:1")


@case(
    "graceful_and_nemesis_stop", 300,
    # c2 writes consumer_stopped at 100 (no mq_removed): b:1 [20,100). c1 takes b:1 at 120.
    # nemesis stop of n1 at 200 closes c1's b:0 [20,200) and b:1 [120,200). run_end 300, T0 = 20.
    # Nobody is live after 200, so only b:1's [100,120) counts (c1 live) -> orphan 20.
    groups={"g": dict(orphan_ms=20, overlap_ms=0, verdict="ok")},
    # Both starts at 10 make one entry -> whole at 20 (10 ms); consumer_stopped at 100 -> at 120 c1 owns
    # both queues and rebalanced with [c1] -> 20 ms. A nemesis stop is not a change point.
    convergence={"g": [(10, True, 10), (100, True, 20)]},
)  # fmt: skip
def _stops(b: Builder) -> None:
    b.started(10, "n1", "c1")
    b.route(10, "n1", "c1", ["b:0", "b:1"])
    b.started(10, "n2", "c2")
    b.rebalance(20, "n1", "c1", ["c1", "c2"], ["b:0"])
    b.added(20, "n1", "c1", "b:0")
    b.rebalance(20, "n2", "c2", ["c1", "c2"], ["b:1"])
    b.added(20, "n2", "c2", "b:1")
    b.stopped(100, "n2", "c2")
    b.rebalance(120, "n1", "c1", ["c1"], ["b:0", "b:1"])
    b.added(120, "n1", "c1", "b:1")
    b.nemesis(200, "stop", "n1")


@case(
    "second_mq_added_in_open_interval", 200,
    # c1 owns b:0 from 20; its mq_added at 80 is inside the open interval and starts nothing, so c1's
    # interval is [20,100) (not [80,100)). c2 owns b:0 [60,200). overlap = [60,100) = 40; orphan 0.
    groups={"g": dict(overlap_ms=40, orphan_ms=0)},
    # start c1 at 10 -> 20 (10 ms). start c2 at 50: b:0 has two owners from 60 until c1's removal at
    # 100, when c1 also rebalanced with [c1, c2] -> 50 ms.
    convergence={"g": [(10, True, 10), (50, True, 50)]},
)  # fmt: skip
def _second_add(b: Builder) -> None:
    b.started(10, "n1", "c1")
    b.route(10, "n1", "c1", ["b:0"])
    b.rebalance(20, "n1", "c1", ["c1"], ["b:0"])
    b.added(20, "n1", "c1", "b:0")
    b.started(50, "n2", "c2")
    b.rebalance(60, "n2", "c2", ["c1", "c2"], ["b:0"])
    b.added(60, "n2", "c2", "b:0")
    b.added(80, "n1", "c1", "b:0")
    b.rebalance(100, "n1", "c1", ["c1", "c2"], [])
    b.removed(100, "n1", "c1", "b:0")


@case(
    "paused_owners", 400,
    # Intervals: c1 b:0 [20,400), c1 b:1 [20,400), c2 b:2 [20,300), c2 b:1 [150,300), c3 b:2 [330,400).
    # n1 paused [100,200), n2 paused [250,300) (the kill at 300 ends that pause).
    # stalled: b:0 [100,200) = 100; b:1 [100,150) = 50 (from 150 c2 serves it too; at [250,300) c1 is
    # not paused); b:2 [250,300) = 50; c3 runs on n2 after the kill, which is not paused -> 200.
    # overlap: b:1 [150,300) = 150. orphan: b:2 [300,330) = 30.
    groups={"g": dict(stalled_ms=200, overlap_ms=150, orphan_ms=30, verdict="ok")},
    # Starts at 10 -> whole at 20 (10 ms). kill n2 at 300 -> at 330 c3 owns b:2, c1 and c3 rebalanced
    # with [c1, c3] -> 30 ms. start c3 at 320 -> 330 (10 ms).
    convergence={"g": [(10, True, 10), (300, True, 30), (320, True, 10)]},
)  # fmt: skip
def _paused(b: Builder) -> None:
    b.started(10, "n1", "c1")
    b.route(10, "n1", "c1", ["b:0", "b:1", "b:2"])
    b.started(10, "n2", "c2")
    b.rebalance(20, "n1", "c1", ["c1", "c2"], ["b:0", "b:1"])
    b.added(20, "n1", "c1", "b:0")
    b.added(20, "n1", "c1", "b:1")
    b.rebalance(20, "n2", "c2", ["c1", "c2"], ["b:2"])
    b.added(20, "n2", "c2", "b:2")
    b.nemesis(100, "pause", "n1")
    b.added(150, "n2", "c2", "b:1")
    b.nemesis(200, "resume", "n1")
    b.nemesis(250, "pause", "n2")
    b.nemesis(300, "kill", "n2")
    b.started(320, "n2", "c3")
    b.rebalance(330, "n2", "c3", ["c1", "c3"], ["b:2"])
    b.added(330, "n2", "c3", "b:2")
    b.rebalance(330, "n1", "c1", ["c1", "c3"], ["b:0", "b:1"])


@case(
    "paused_consumer_is_live", 400,
    # n1 is paused from 30 to the end; c1 keeps b:0 and b:1 -> stalled [30,400) x 2 = 740.
    groups={"g": dict(stalled_ms=740, orphan_ms=0, verdict="ok")},
    # start c1 at 10 -> 20 (10 ms). start c2 at 40: c1 is paused but live, so the live set is [c1, c2];
    # c1 is excused from rebalancing, c2 rebalances with [c1, c2] at 50; every queue has one live owner
    # (c1) -> 10 ms.
    convergence={"g": [(10, True, 10), (40, True, 10)]},
)  # fmt: skip
def _paused_live(b: Builder) -> None:
    b.started(10, "n1", "c1")
    b.route(10, "n1", "c1", ["b:0", "b:1"])
    b.rebalance(20, "n1", "c1", ["c1"], ["b:0", "b:1"])
    b.added(20, "n1", "c1", "b:0")
    b.added(20, "n1", "c1", "b:1")
    b.nemesis(30, "pause", "n1")
    b.started(40, "n2", "c2")
    b.rebalance(50, "n2", "c2", ["c1", "c2"], ["b:1"])


@case(
    "concurrent_consumption", 400,
    # b:0 spans: c1 [100,110) and [105,120) (one client: union [100,120)); c2 [115,130) -> both clients
    # inside [115,120) = 5. c2 [200,210) alone; c1's [205,205) and [209,208) are empty. c1 on b:1 and
    # c2 on b:0 at [300,310) are different queues. -> 5 ms; the group is CONCURRENTLY, so verdict ok.
    groups={"g": dict(concurrent_consume_ms=5, order_violations=0, lost=0, duplicates=0, verdict="ok")},
    convergence={"g": [(10, True, 10), (11, True, 9)]},
)  # fmt: skip
def _concurrent(b: Builder) -> None:
    _two_owners(b)
    spans = [("c1", "n1", "m1", "b:0", 100, 110), ("c1", "n1", "m2", "b:0", 105, 120),
             ("c2", "n2", "m3", "b:0", 115, 130), ("c2", "n2", "m4", "b:0", 200, 210),
             ("c1", "n1", "m5", "b:0", 205, 205), ("c1", "n1", "m6", "b:0", 209, 208),
             ("c1", "n1", "m7", "b:1", 300, 310), ("c2", "n2", "m8", "b:0", 300, 310)]  # fmt: skip
    for i, (client, node, msg, queue, start, end) in enumerate(spans):
        b.sent(50 + i, msg, queue, i)
        b.consumed(end, node, client, msg, queue, i, started=start)


@case(
    "orderly_group", 200,
    # ORDERLY lines of c1 on b:0 in the interval [20,100): offsets 5, 6, 6, 4, 7 -> the second 6
    # (<= 6) and the 4 (<= 6) are violations = 2. The line at 110 is outside every interval: not
    # counted, not history. New interval [120,200): offsets 2 (first, fine), 2 (<= 2) -> 1 more.
    # The CONCURRENTLY line and c2's lines (c2 owns nothing) do not count -> 3.
    # c2's span [135,145) overlaps c1's [139,140) on b:0 -> concurrent_consume_ms 1.
    # An ORDERLY group with either -> verdict fail.
    groups={"go": dict(order_violations=3, concurrent_consume_ms=1, orphan_ms=20, verdict="fail")},
    convergence={"go": [(10, True, 10)]},
)  # fmt: skip
def _orderly(b: Builder) -> None:
    g = "go"
    b.started(10, "n1", "c1", group=g)
    b.route(10, "n1", "c1", ["b:0"])
    b.rebalance(20, "n1", "c1", ["c1"], ["b:0"], group=g)
    b.added(20, "n1", "c1", "b:0", group=g)
    for ts, offset in [(30, 5), (40, 6), (50, 6), (60, 4), (70, 7)]:
        b.consumed(ts, "n1", "c1", f"o{ts}", "b:0", offset, mode="ORDERLY", group=g)
    b.removed(100, "n1", "c1", "b:0", group=g)
    b.consumed(110, "n1", "c1", "o110", "b:0", 3, mode="ORDERLY", group=g)
    b.added(120, "n1", "c1", "b:0", group=g)
    b.consumed(130, "n1", "c1", "o130", "b:0", 2, mode="ORDERLY", group=g)
    b.consumed(140, "n1", "c1", "o140", "b:0", 2, started=139, mode="ORDERLY", group=g)
    b.consumed(145, "n2", "c2", "o145", "b:0", 1, started=135, mode="ORDERLY", group=g)
    b.consumed(150, "n1", "c1", "o150", "b:0", 1, mode="CONCURRENTLY", group=g)
    b.consumed(160, "n2", "c2", "o160", "b:0", 0, mode="ORDERLY", group=g)


@case(
    "convergence_search", 100,
    # T0 = 11; b:0 c1 [11,100) (the stop at 100 is run_end anyway); b:1 c1 [11,15), c2 [16,100)
    # -> orphan [15,16) = 1.
    groups={"g": dict(orphan_ms=1, overlap_ms=0, verdict="fail")},
    convergence={"g": [
        (10, True, 1),     # start c1: whole at 11 (c1 owns both, rebalanced with [c1])
        (12, True, 5),     # start c2: whole again only at 17, when c3 (started at 14) rebalanced too
        (14, True, 3),     # start c3 -> 17
        (50, True, 5),     # kill n3: live [c1, c2]; both rebalance with [c1, c2] at 55
        (60, True, 0),     # a second kill of n3: already whole at 60 itself
        (80, False, None),  # start c4, nobody rebalances afterwards
        (100, False, None),  # stop c1 at run_end: t0 itself is the only candidate; nothing is open then
    ]},
)  # fmt: skip
def _convergence(b: Builder) -> None:
    b.started(10, "n1", "c1")
    b.route(10, "n1", "c1", ["b:0", "b:1"])
    b.rebalance(11, "n1", "c1", ["c1"], ["b:0", "b:1"])
    b.added(11, "n1", "c1", "b:0")
    b.added(11, "n1", "c1", "b:1")
    b.started(12, "n2", "c2")
    b.started(14, "n3", "c3")
    everyone = ["c1", "c2", "c3"]
    b.rebalance(15, "n1", "c1", everyone, ["b:0"])
    b.removed(15, "n1", "c1", "b:1")
    b.rebalance(16, "n2", "c2", everyone, ["b:1"])
    b.added(16, "n2", "c2", "b:1")
    b.rebalance(17, "n3", "c3", everyone, [])
    b.nemesis(50, "kill", "n3")
    b.rebalance(55, "n1", "c1", ["c1", "c2"], ["b:0"])
    b.rebalance(55, "n2", "c2", ["c1", "c2"], ["b:1"])
    b.nemesis(60, "kill", "n3")
    b.started(80, "n4", "c4")
    b.stopped(100, "n1", "c1")


@case(
    "universe_and_group_topics", 100,
    # Group topics: T only (U has a route and an mq_added but no rebalance). Universe of T: the union
    # of its routes = b:0 b:1 b:2. T0 = 20 (the mq_added on U at 15 does not count).
    # b:0 owned [20,100) -> 0; b:1 from 30 -> [20,30) = 10; b:2 never -> [20,100) = 80. orphan 90.
    groups={"g": dict(topics=["T"], orphan_ms=90, verdict="fail")},
    convergence={"g": [(10, False, None)]},  # b:2 never gets an owner
)  # fmt: skip
def _universe(b: Builder) -> None:
    b.started(10, "n1", "c1")
    b.route(10, "n1", "c1", ["b:0", "b:1"])
    b.route(10, "n1", "c1", ["b:9"], topic="U")
    b.added(15, "n1", "c1", "b:9", topic="U")
    b.rebalance(20, "n1", "c1", ["c1"], ["b:0", "b:1"])
    b.added(20, "n1", "c1", "b:0")
    b.added(30, "n1", "c1", "b:1")
    b.route(50, "n1", "c1", ["b:0", "b:2"])


@case(
    "restart_on_the_same_node", 200,
    # c1 on n1 killed at 100; the chaos runner's start (ignored action) at 110; c1b starts on n1 at 120
    # and takes b:0 at 130. b:0 is unowned [100,130), but nobody is live in [100,120) -> orphan
    # [120,130) = 10. Kills of n9 (no client of g) and of a broker node are not change points.
    groups={"g": dict(orphan_ms=10, verdict="ok")},
    # start c1 at 10 -> 20 (10 ms); kill n1 at 100: the group is empty then -> 0 ms; start c1b at 120
    # -> 130 (10 ms)
    convergence={"g": [(10, True, 10), (100, True, 0), (120, True, 10)]},
)  # fmt: skip
def _restart(b: Builder) -> None:
    b.started(10, "n1", "c1")
    b.route(10, "n1", "c1", ["b:0"])
    b.rebalance(20, "n1", "c1", ["c1"], ["b:0"])
    b.added(20, "n1", "c1", "b:0")
    b.nemesis(100, "kill", "n1")
    b.nemesis(110, "start", "n1")
    b.started(120, "n1", "c1b")
    b.route(120, "n1", "c1b", ["b:0"])
    b.rebalance(130, "n1", "c1b", ["c1b"], ["b:0"])
    b.added(130, "n1", "c1b", "b:0")
    b.nemesis(150, "kill", "n9")
    b.nemesis(160, "kill", "broker-x", group=None, role="broker")


@case(
    "same_client_id_started_again", 100,
    # c1 stops at 50 (closing [20,50)) and starts again with the same id at 60; it takes b:0 at 70.
    # b:0 is unowned [50,70), with somebody live only in [60,70) -> orphan 10.
    groups={"g": dict(orphan_ms=10, verdict="ok")},
    # start at 10 -> 20 (10 ms). stop at 50: the group is empty -> 0 ms. start at 60: live [c1] and its
    # latest rebalance (at 20) says [c1], but b:0 is unowned until 70 -> 10 ms.
    convergence={"g": [(10, True, 10), (50, True, 0), (60, True, 10)]},
)  # fmt: skip
def _same_id(b: Builder) -> None:
    b.started(10, "n1", "c1")
    b.route(10, "n1", "c1", ["b:0"])
    b.rebalance(20, "n1", "c1", ["c1"], ["b:0"])
    b.added(20, "n1", "c1", "b:0")
    b.stopped(50, "n1", "c1")
    b.started(60, "n1", "c1")
    b.added(70, "n1", "c1", "b:0")


@case(
    "graceful_end_empty_group", 101,
    # c1 and c2 own b:0 and b:1 from 20; c1 stops at 100, c2 at 101 (run_end). T0 = 20.
    # b:0 unowned [100,101) while c2 is live -> orphan 1; b:1 c2's until 101 -> 0.
    groups={"g": dict(orphan_ms=1, overlap_ms=0, verdict="ok")},
    # starts at 10 -> whole at 20 (10 ms). stop c1 at 100: b:0 has no owner; at 101 = run_end nobody is
    # live, an empty group is converged, and the search reaches run_end -> 1 ms. stop c2 at 101: empty
    # at once -> 0 ms. (Before the amendment both entries failed.)
    convergence={"g": [(10, True, 10), (100, True, 1), (101, True, 0)]},
)  # fmt: skip
def _graceful_end(b: Builder) -> None:
    b.started(10, "n1", "c1")
    b.started(10, "n2", "c2")
    b.route(10, "n1", "c1", ["b:0", "b:1"])
    b.rebalance(20, "n1", "c1", ["c1", "c2"], ["b:0"])
    b.added(20, "n1", "c1", "b:0")
    b.rebalance(20, "n2", "c2", ["c1", "c2"], ["b:1"])
    b.added(20, "n2", "c2", "b:1")
    b.removed(100, "n1", "c1", "b:0")
    b.stopped(100, "n1", "c1")
    b.stopped(101, "n2", "c2")


@case(
    "orphan_only_while_someone_is_live", 300,
    # Two groups on one topic. g: c1 owns b:0 [20,100), killed at 100; c3 starts at 200 and owns b:0
    # from 250. b:0 unowned [100,250), someone live only from 200 -> orphan 50. h: c2 is live the whole
    # time but in another group: it does not make g's time count.
    groups={"g": dict(orphan_ms=50, verdict="ok"), "h": dict(orphan_ms=0, verdict="ok")},
    # g: start c1 at 10 -> 20; kill n1 at 100, empty -> 0; start c3 at 200 -> 250 (50 ms).
    convergence={"g": [(10, True, 10), (100, True, 0), (200, True, 50)], "h": [(10, True, 20)]},
)  # fmt: skip
def _orphan_live(b: Builder) -> None:
    b.started(10, "n1", "c1")
    b.route(10, "n1", "c1", ["b:0"])
    b.started(10, "n2", "c2", group="h")
    b.rebalance(20, "n1", "c1", ["c1"], ["b:0"])
    b.added(20, "n1", "c1", "b:0")
    b.rebalance(30, "n2", "c2", ["c2"], ["b:0"], group="h")
    b.added(30, "n2", "c2", "b:0", group="h")
    b.nemesis(100, "kill", "n1")
    b.started(200, "n3", "c3")
    b.rebalance(250, "n3", "c3", ["c3"], ["b:0"])
    b.added(250, "n3", "c3", "b:0")


@case(
    "cid_all_digest", 200,
    # c1 and c2 start at 10 and own b:0 / b:1 from 20 (orphan 0). Their member sets:
    # c1 at 20: digest of [c1, c2] and no cid_all -> right. c2 at 20: digest of [c2] -> wrong.
    # c2 at 30: digest of [c2, c1, c2] (distinct, sorted -> same as [c1, c2]) -> right.
    # c3 starts at 50; c1 at 60: cid_all [c1, c2, c3] plus a wrong digest -> cid_all wins, right;
    # c2 at 60 and c3 at 70: digest of [c1, c2, c3] -> right; c3 owns nothing but the queues are
    # owned once each. Lines with a bad digest (upper case, 63 characters, not a string) or neither
    # field are malformed and change nothing.
    groups={"g": dict(orphan_ms=0, overlap_ms=0, verdict="ok")},
    # start c1, c2 at 10 -> whole at 30 (20 ms); start c3 at 50 -> 70 (20 ms)
    convergence={"g": [(10, True, 20), (50, True, 20)]},
    # 2 starts, 1 route, 7 good rebalances, 2 mq_added, 1 start + the end line = 14; 4 malformed.
    run=dict(events=14, malformed_lines=4, start_ms=10, end_ms=200),
)  # fmt: skip
def _digest(b: Builder) -> None:
    b.started(10, "n1", "c1")
    b.started(10, "n2", "c2")
    b.route(10, "n1", "c1", ["b:0", "b:1"])
    b.rebalance(20, "n1", "c1", [], ["b:0"], digest_of=["c1", "c2"], with_list=False)
    b.added(20, "n1", "c1", "b:0")
    b.rebalance(20, "n2", "c2", [], ["b:1"], digest_of=["c2"], with_list=False)
    b.added(20, "n2", "c2", "b:1")
    b.rebalance(30, "n2", "c2", [], ["b:1"], digest_of=["c2", "c1", "c2"], with_list=False)
    b.started(50, "n3", "c3")
    b.rebalance(60, "n1", "c1", ["c1", "c2", "c3"], ["b:0"], digest_of=["c1"])
    b.rebalance(60, "n2", "c2", [], ["b:1"], digest_of=["c1", "c2", "c3"], with_list=False)
    b.rebalance(65, "n3", "c3", ["c3"], [])  # wrong, then put right at 70
    b.rebalance(70, "n3", "c3", [], [], digest_of=["c3", "c2", "c1"], with_list=False)
    good = sha256_members([b.n(c) for c in ("c1", "c2", "c3")])
    fields = {"ts_ms": b.t(80), "event": "rebalance", "node": b.n("n1"), "role": CONSUMER,
              "group": b.n("g"), "client_id": b.n("c1"), "topic": b.n("T"), "strategy": "AVG",
              "allocated": [], "changed": True}  # fmt: skip
    for bad in ({"cid_all_digest": good.upper()}, {"cid_all_digest": good[1:]}, {"cid_all_digest": 7}, {}):
        b.raw("n1.jsonl", json.dumps({**fields, **bad}))


@case(
    "omitted_repeat_rebalances", 200,
    # c1 and c2 rebalance with [c1, c2] at 20 and then leave out every identical later round. c3 starts
    # at 50 and stops at 55 before anyone rebalances (it never owned anything) -> orphan 0.
    groups={"g": dict(orphan_ms=0, verdict="ok")},
    # start c1 at 10 -> 20 (10 ms), c2 at 11 -> 20 (9 ms). start c3 at 50: c3 has no rebalance -> not
    # converged until it stops at 55, when the live set is [c1, c2] again and the latest lines (at 20)
    # still say so -> 5 ms. stop c3 at 55 -> 0 ms.
    convergence={"g": [(10, True, 10), (11, True, 9), (50, True, 5), (55, True, 0)]},
)  # fmt: skip
def _omitted(b: Builder) -> None:
    _two_owners(b)
    b.started(50, "n3", "c3")
    b.stopped(55, "n3", "c3")


@case(
    "server_assigned_groups", 200,
    # RocketMQ 5 groups: no rebalance lines, the broker's answers as `assignment` lines (EVENTS.md,
    # proposed section). Group topics come from them: p has T and %RETRY%p, s has T.
    # p pops T (queue -1: every queue of b) and pulls %RETRY%p:b:0 (c1's mq_added at 20). Its universe is
    # the queues an mq_added named: %RETRY%p:b:0 only (T's b:0 and b:1 from the route are shared by POP),
    # owned by c1 [20,200) -> orphan 0 (by the classic rule T's two queues would count 2 x 180).
    # Messages: m1 m2 m3 sent on T. c2 pops m2 at 33 and is killed at 50; the broker revives m2 at 110 and
    # c1 consumes the copy from the pop retry topic %RETRY%p_T at 120: it counts for m2 -> sent 3,
    # consumed_unique 3, lost 0; m3 twice -> duplicates 1. Verdict ok.
    # s pulls T's queues as the broker assigns them: d1 owns b:0 [20,160) (killed at 160) and b:1
    # [20,70); d2 owns b:1 [75,200). orphan: b:1 [70,75) = 5, b:0 [160,200) = 40 -> 45. Every message
    # consumed once -> lost 0, and the verdict is ok although a change point never converges: a
    # server-assigned group's convergence is shown, not judged.
    groups={
        "p": dict(topics=["%RETRY%p", "T"], sent=3, consumed_unique=3, lost=0, duplicates=1,
                  duplicated_messages=1, overlap_ms=0, orphan_ms=0, stalled_ms=0, verdict="ok"),
        "s": dict(topics=["T"], sent=3, consumed_unique=3, lost=0, duplicates=0, overlap_ms=0,
                  orphan_ms=45, verdict="ok"),
    },
    # Converged: nobody live, or every universe queue has one open interval with a live owner (no
    # members rule: the broker decides). p: starts at 10 -> c1 owns %RETRY%p:b:0 at 20 (10 ms); kill n2
    # at 50 -> 0 ms. s: start d1 at 10 -> 20 (10 ms); start d2 at 60: d1 still owns both -> 0 ms; kill
    # n3 at 160: b:0 never has an owner again -> not converged.
    convergence={
        "p": [(10, True, 10), (50, True, 0)],
        "s": [(10, True, 10), (60, True, 0), (160, False, None)],
    },
)  # fmt: skip
def _server_assigned(b: Builder) -> None:
    b.started(10, "n1", "c1", group="p")
    b.started(10, "n2", "c2", group="p")
    b.route(10, "n1", "c1", ["b:0", "b:1"])
    b.route(10, "n1", "c1", ["b:0"], topic="%RETRY%p")
    for node, client in (("n1", "c1"), ("n2", "c2")):
        b.assignment(20, node, client, "p", pop=["b:-1"])
    b.assignment(20, "n1", "c1", "p", topic="%RETRY%p", pull=["b:0"])
    b.added(20, "n1", "c1", "b:0", group="p", topic="%RETRY%p")
    b.started(10, "n3", "d1", group="s")
    b.assignment(20, "n3", "d1", "s", pull=["b:0", "b:1"])
    b.added(20, "n3", "d1", "b:0", group="s")
    b.added(20, "n3", "d1", "b:1", group="s")
    for i, (msg, queue) in enumerate((("m1", "b:0"), ("m2", "b:1"), ("m3", "b:0"))):
        b.sent(30 + i, msg, queue, i)
    b.ev("broker.jsonl", 33, "message_popped", "broker-b", "broker", group="p", client_id="c2", msg_id="m2")
    b.consumed(40, "n1", "c1", "m1", "b:0", group="p")
    b.consumed(41, "n3", "d1", "m1", "b:0", group="s")
    b.consumed(42, "n3", "d1", "m3", "b:0", 2, group="s")
    b.consumed(45, "n1", "c1", "m3", "b:0", 2, group="p")
    b.consumed(46, "n1", "c1", "m3", "b:0", 2, group="p")
    b.nemesis(50, "kill", "n2", group="p")
    b.started(60, "n4", "d2", group="s")
    b.assignment(70, "n3", "d1", "s", pull=["b:0"])
    b.removed(70, "n3", "d1", "b:1", group="s")
    b.assignment(70, "n4", "d2", "s", pull=["b:1"])
    b.added(75, "n4", "d2", "b:1", group="s")
    b.consumed(80, "n4", "d2", "m2", "b:1", 1, group="s")
    b.ev("broker.jsonl", 110, "message_revived", "broker-b", "broker", group="p", msg_id="m2")
    b.consumed(120, "n1", "c1", "m2", "b:0", 0, group="p", topic=("p", "T"))
    b.nemesis(160, "kill", "n3", group="s")


def _one_owner(b: Builder, queues: list[str]) -> None:
    b.started(10, "n1", "c1")
    b.route(10, "n1", "c1", queues)
    b.rebalance(20, "n1", "c1", ["c1"], queues)
    for queue in queues:
        b.added(20, "n1", "c1", queue)


@case(
    "offset_no_regression", 100,
    # b:0's committed offset as the lines show it: read 0 at 20 (mq_added), written 2 at 40 and 3 at
    # 50, read 3 at 70 by c2 (the same value is no move back) -> no regression, nothing redelivered,
    # though m1 is delivered twice (a duplicate the offsets do not explain).
    groups={"g": dict(offset_regressions=[], regression_redelivered=0, duplicates=1)},
)  # fmt: skip
def _offset_none(b: Builder) -> None:
    _one_owner(b, ["b:0"])
    for i in range(3):
        b.consumed(30 + i, "n1", "c1", f"m{i}", "b:0", i)
    b.committed(40, "b:0", 2)
    b.committed(50, "b:0", 3)
    b.consumed(60, "n1", "c1", "m1", "b:0", 1)
    b.started(65, "n2", "c2")
    b.added(70, "n2", "c2", "b:0", next_offset=3)


@case(
    "offset_regressions", 100,
    # b:0: read 0 (20), written 3 (35) and 5 (40); the broker stores 2 at 50 (a stale commit):
    # R1 5 -> 2 at 50. Written 6 at 60. c2 takes b:0 at 70 reading 4: R2 6 -> 4 at 70.
    # b:1: written 3 (40), then 1 (65): R3 3 -> 1, and nobody consumes b:1 afterwards -> 0.
    # Deliveries on b:0 (offset, message):
    #   45 (0, m0) a repeat, but before any regression -> nobody's;
    #   55 (2, m2), 56 (3, m3): repeats in R1's [2, 5) -> R1; 58 (5, m5) first delivery, outside;
    #   75 (4, m4): repeat, in R2's [4, 6) -> R2 (the latest regression holding it);
    #   76 (3, m3): repeat, not in R2's range but in R1's -> R1;
    #   80 (2, n9): in R1's range, but n9's first delivery (an offset given to a new message) -> none.
    # R1 = 3, R2 = 1, R3 = 0 -> 4 redelivered; duplicates m0, m2, m4 once, m3 twice = 5.
    # Ignored: another group's commit (h is no group of this run's consumer lines) and g's commit on
    # topic Other (not a group topic), both moving back.
    groups={"g": dict(regression_redelivered=4, duplicates=5)},
    regressions={"g": [
        (50, "b:0", 5, 2, "offset_committed", "b", 3),
        (65, "b:1", 3, 1, "offset_committed", "b", 0),
        (70, "b:0", 6, 4, "mq_added", "n2", 1),
    ]},
)  # fmt: skip
def _offset_regressions(b: Builder) -> None:
    _one_owner(b, ["b:0", "b:1"])
    for i in range(5):
        b.consumed(30 + i, "n1", "c1", f"m{i}", "b:0", i)
    b.committed(35, "b:0", 3)
    b.committed(40, "b:0", 5)
    b.committed(40, "b:1", 3)
    b.committed(41, "b:0", 9, group="h")
    b.committed(42, "b:0", 1, group="h")
    b.committed(43, "b:0", 9, topic="Other")
    b.committed(44, "b:0", 1, topic="Other")
    b.consumed(45, "n1", "c1", "m0", "b:0", 0)
    b.committed(50, "b:0", 2)
    b.consumed(55, "n1", "c1", "m2", "b:0", 2)
    b.consumed(56, "n1", "c1", "m3", "b:0", 3)
    b.consumed(58, "n1", "c1", "m5", "b:0", 5)
    b.committed(60, "b:0", 6)
    b.committed(65, "b:1", 1)
    b.started(68, "n2", "c2")
    b.added(70, "n2", "c2", "b:0", next_offset=4)
    b.consumed(75, "n2", "c2", "m4", "b:0", 4)
    b.consumed(76, "n2", "c2", "m3", "b:0", 3)
    b.consumed(80, "n2", "c2", "n9", "b:0", 2)


@case(
    "offset_regression_on_a_slave", 100,
    # b's master (node b, no broker field) stores 5 at 30; its slave b-s1 (broker b) takes a commit of
    # 3 at 40 (the master was down): the same queue b:0, moved back 5 -> 3. Then m3 (offset 3) and m4
    # (offset 4), consumed at 25 and 26, come again at 45 and 46 -> 2 redelivered.
    # At 50 node b stores 2 with a `broker` that is no string: ignored, the node names the broker ->
    # b:0 moves back again, 3 -> 2, and nothing comes after it.
    groups={"g": dict(regression_redelivered=2, duplicates=2)},
    regressions={"g": [(40, "b:0", 5, 3, "offset_committed", "b-s1", 2),
                       (50, "b:0", 3, 2, "offset_committed", "b", 0)]},
)  # fmt: skip
def _offset_slave(b: Builder) -> None:
    _one_owner(b, ["b:0"])
    b.consumed(25, "n1", "c1", "m3", "b:0", 3)
    b.consumed(26, "n1", "c1", "m4", "b:0", 4)
    b.committed(30, "b:0", 5)
    b.committed(40, "b:0", 3, node="b-s1")
    b.consumed(45, "n1", "c1", "m3", "b:0", 3)
    b.consumed(46, "n1", "c1", "m4", "b:0", 4)
    line = {"ts_ms": b.t(50), "event": "offset_committed", "node": b.n("b"), "role": "broker",
            "group": b.n("g"), "topic": b.n("T"), "queue_id": 0, "offset": 2, "broker": 7}  # fmt: skip
    b.raw("b.jsonl", json.dumps(line))


@case(
    "slave_offset_sync_moving_back", 100,
    # The slave b-s1 of broker b copies its master's offsets: b:0 gets 5 (20, none before), 8 (30),
    # then 3 over 8 at 40 (the master's older table: a slave regression 8 -> 3); b:1's entry goes away
    # at 45 (-1: no offset, not a move back) and gets 2 over 6 at 50 (6 -> 2). Ignored: group h's and
    # topic Other's lines moving back. A sync is no observation of the committed offset: the
    # consumers' figure (offset_regressions) stays empty, as nobody committed or resumed.
    groups={"g": dict(offset_regressions=[], regression_redelivered=0)},
    slave_regressions={"g": [(40, "b:0", 8, 3, "b-s1"), (50, "b:1", 6, 2, "b-s1")]},
)  # fmt: skip
def _slave_offset_sync(b: Builder) -> None:
    _one_owner(b, ["b:0", "b:1"])
    b.synced(20, "b:0", 5, -1)
    b.synced(30, "b:0", 8, 5)
    b.synced(40, "b:0", 3, 8)
    b.synced(45, "b:1", -1, 4)
    b.synced(50, "b:1", 2, 6)
    b.synced(55, "b:0", 1, 9, group="h")
    b.synced(56, "b:0", 1, 9, topic="Other")


MALFORMED = [
    "Exception in thread main: not JSON",
    "[1, 2, 3]",
    '{"ts_ms": "5", "event": "log", "node": "n", "role": "r"}',  # a string where an int is required
    '{"ts_ms": 5.0, "event": "log", "node": "n", "role": "r"}',  # a float where an int is required
    '{"ts_ms": true, "event": "log", "node": "n", "role": "r"}',  # a bool where an int is required
    '{"ts_ms": 5, "event": "log", "node": null, "role": "r"}',  # null
    '{"ts_ms": 5, "event": "mq_added", "node": "n", "role": "consumer", "group": "g", "client_id": "c", '
    '"topic": "T", "broker": "b", "queue_id": 0}',  # next_offset missing
    '{"ts_ms": 5, "event": "rebalance", "node": "n", "role": "consumer", "group": "g", "client_id": "c", '
    '"topic": "T", "strategy": "AVG", "cid_all": ["c"], "allocated": [], "changed": 1}',  # an int for a bool
    '{"ts_ms": 5, "event": "topic_route", "node": "n", "role": "consumer", "client_id": "c", "topic": "T", '
    '"queues": ["b:0", 1]}',  # a list item of the wrong type
    '{"ts_ms": 5, "event": "nemesis", "node": "chaos", "role": "chaos", "action": "kill", "target": "n", '
    '"target_role": "consumer"}',  # a consumer target needs a group
]


@case(
    "malformed_lines_and_skipped_files", 40,
    # Well-formed: a.jsonl at 10 and 20, sub/b.jsonl at 40 (found recursively) and the end line (40)
    # -> 4 events, start 10, end 40. Malformed: the 10 lines above + the truncated last line = 11.
    # Blank lines are not counted. _tmp/, .hidden/, sub/.e.jsonl and notes.txt are not part of the
    # run (their lines at 5 and 1000 would move start_ms and end_ms).
    run=dict(events=4, malformed_lines=11, start_ms=10, end_ms=40),
)  # fmt: skip
def _malformed(b: Builder) -> None:
    b.ev("a.jsonl", 10, "log", "n", "broker", msg="hello")
    for text in MALFORMED:
        b.raw("a.jsonl", text)
    for blank in ("", "   ", "\t"):
        b.raw("a.jsonl", blank)
    b.ev("a.jsonl", 20, "heartbeat", "n", "broker", group=5)  # fields no rule names are not checked
    b.ev("sub/b.jsonl", 40, "log", "n", "broker")
    outside = {"_tmp/c.jsonl": 5, ".hidden/d.jsonl": 1000, "sub/.e.jsonl": 1000, "notes.txt": 5}
    for rel, ts in outside.items():
        b.raw(rel, json.dumps({"ts_ms": ts, "event": "log", "node": "n", "role": "broker"}))
    b.raw(
        "trunc.jsonl", '{"ts_ms": 30, "event": "lo'
    )  # a killed writer's last line (written with no newline)


def write_case_files(root: Any, files: dict[str, list[str]]) -> None:
    """Write a case's files; trunc.jsonl gets no final newline, like a writer killed mid-line."""
    from pathlib import Path

    for rel, lines in files.items():
        path = Path(root) / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        text = "\n".join(lines)
        if not rel.endswith("trunc.jsonl"):
            text += "\n"
        path.write_text(text, encoding="utf-8")


def combined(cases: list[Case], end: int = 1_700_000_000_000) -> tuple[dict[str, list[str]], dict[str, int]]:
    """All cases in one run: case i under prefix 'k<i>-', shifted so that each ends at `end`."""
    files: dict[str, list[str]] = {}
    shifts: dict[str, int] = {}
    for i, c in enumerate(cases):
        shifts[c.name] = end - c.end
        files.update(c.files(prefix=f"k{i}-", shift=shifts[c.name]))
    return files, shifts
