"""Synthetic run directories for tests, the benchmark and demos.

Two generators:
- `chaotic_run`: many small, independent scenarios (one group each, names prefixed so they never
  meet) full of edge cases: same-millisecond events across files, repeated `mq_added`, kills that
  leave no `mq_removed`, pauses, stale `cid_all`, late lines of killed clients, malformed lines and
  files that must be skipped. Used by the differential test.
- `realistic_run`: a simulated cluster (producer, consumers rebalancing with AllocateMessageQueueAveragely,
  a kill, a restart and a pause) streamed to disk at any size. Used by the benchmark and the report demo.
"""

from __future__ import annotations

import json
import os
import random
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from rmqlab.pipeline.contract import members_digest

# Lines the pipeline must count as malformed (one per kind of damage named in EVENTS.md).
MALFORMED_LINES: tuple[str, ...] = (
    "not json at all",
    "Exception in thread main java.lang.NullPointerException",
    '{"ts_ms": 5, "event": "mq_added", "node": "c", "role": "consumer", "group": "g"',  # truncated
    '{"ts_ms": 5, "event": "message_se',  # truncated by a kill
    "[1, 2, 3]",
    '"just a string"',
    "null",
    "42",
    '{"ts_ms": "5", "event": "log", "node": "n", "role": "broker"}',  # string where int
    '{"ts_ms": 5.0, "event": "log", "node": "n", "role": "broker"}',  # float where int
    '{"ts_ms": 5.5, "event": "log", "node": "n", "role": "broker"}',
    '{"ts_ms": true, "event": "log", "node": "n", "role": "broker"}',  # bool where int
    '{"ts_ms": null, "event": "log", "node": "n", "role": "broker"}',  # null
    '{"ts_ms": 5, "event": null, "node": "n", "role": "broker"}',
    '{"ts_ms": 5, "event": "log", "node": 7, "role": "broker"}',  # int where string
    '{"ts_ms": 5, "event": "log", "role": "broker"}',  # missing node
    '{"event": "log", "node": "n", "role": "broker"}',  # missing ts_ms
    '{"ts_ms": 1e3, "event": "log", "node": "n", "role": "broker"}',
    '{"ts_ms": 99999999999999999999, "event": "log", "node": "n", "role": "broker"}',  # beyond int64
    '{"ts_ms": 5, "event": "log", "node": "n", "role": "broker"} trailing',
    '{"ts_ms": 5, "event": "log", "node": "n", "role": "broker"}{"ts_ms": 6}',
    '{"ts_ms": NaN, "event": "log", "node": "n", "role": "broker"}',
    "{'ts_ms': 5, 'event': 'log', 'node': 'n', 'role': 'broker'}",
    '{"ts_ms": 5, "event": "mq_added", "node": "c", "role": "consumer", "group": "g", "client_id": "x", '
    '"topic": "T", "broker": "b", "queue_id": "1", "next_offset": 0}',
    '{"ts_ms": 5, "event": "mq_added", "node": "c", "role": "consumer", "group": "g", "client_id": "x", '
    '"topic": "T", "broker": "b", "queue_id": 1}',  # missing next_offset
    '{"ts_ms": 5, "event": "rebalance", "node": "c", "role": "consumer", "group": "g", "client_id": "x", '
    '"topic": "T", "strategy": "AVG", "cid_all": ["x"], "allocated": ["b:1"], "changed": 1}',  # int as bool
    '{"ts_ms": 5, "event": "rebalance", "node": "c", "role": "consumer", "group": "g", "client_id": "x", '
    '"topic": "T", "strategy": "AVG", "cid_all": ["x", 3], "allocated": [], "changed": true}',  # list item
    '{"ts_ms": 5, "event": "rebalance", "node": "c", "role": "consumer", "group": "g", "client_id": "x", '
    '"topic": "T", "strategy": "AVG", "cid_all": "x", "allocated": [], "changed": true}',  # not a list
    '{"ts_ms": 5, "event": "rebalance", "node": "c", "role": "consumer", "group": "g", "client_id": "x", '
    '"topic": "T", "strategy": "AVG", "allocated": [], "changed": true}',  # neither cid_all nor a digest
    '{"ts_ms": 5, "event": "rebalance", "node": "c", "role": "consumer", "group": "g", "client_id": "x", '
    '"topic": "T", "strategy": "AVG", "cid_all_digest": "'
    + "AB" * 32
    + '", "allocated": [], "changed": true}',
    '{"ts_ms": 5, "event": "rebalance", "node": "c", "role": "consumer", "group": "g", "client_id": "x", '
    '"topic": "T", "strategy": "AVG", "cid_all_digest": "'
    + "ab" * 31
    + '", "allocated": [], "changed": true}',
    '{"ts_ms": 5, "event": "topic_route", "node": "c", "role": "consumer", "client_id": "x", "topic": "T", '
    '"queues": ["b:1", null]}',
    '{"ts_ms": 5, "event": "nemesis", "node": "chaos", "role": "chaos", "action": "kill", "target": "c", '
    '"target_role": "consumer"}',  # group required for a consumer target
    '{"ts_ms": 5, "event": "message_consumed", "node": "c", "role": "consumer", "group": "g", "client_id": '
    '"x", "msg_id": "m", "topic": "T", "broker": "b", "queue_id": 1, "queue_offset": 2, "started_ms": 4.0, '
    '"mode": "ORDERLY"}',
    '{"ts_ms": 5, "event": "message_sent", "node": "p", "role": "producer", "msg_id": 17, "topic": "T", '
    '"broker": "b", "queue_id": 1, "queue_offset": 2}',
    '{"ts_ms": 5, "event": "consumer_unregistered", "node": "b", "role": "broker", "group": "g", '
    '"client_id": "x"}',  # missing reason
    '{"ts_ms": 5, "event": "offset_committed", "node": "b", "role": "broker", "group": "g", "topic": "T", '
    '"queue_id": 1, "offset": false}',
)

BLANK_LINES: tuple[str, ...] = ("", "   ", "\t", " \t ")

RunFiles = dict[str, list[str]]


def line(ts: int, event: str, node: str, role: str, **fields: Any) -> str:
    """One event line as the processes write it."""
    return json.dumps({"ts_ms": ts, "event": event, "node": node, "role": role, **fields})


def write_run(run_dir: str | os.PathLike[str], files: RunFiles, *, final_newline: bool = True) -> Path:
    """Write rel-path -> lines into run_dir (parents created)."""
    root = Path(run_dir)
    for rel, lines in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        text = "\n".join(lines)
        if final_newline and lines:
            text += "\n"
        path.write_text(text, encoding="utf-8")
    return root


def averagely(cid_all: list[str], mq_all: list[str], client: str) -> list[str]:
    """AllocateMessageQueueAveragely: the queues a client takes given the sorted client and queue lists."""
    cids = sorted(set(cid_all))
    mqs = sorted(mq_all)
    if client not in cids or not mqs:
        return []
    index = cids.index(client)
    n, m = len(mqs), len(cids)
    mod = n % m
    if n <= m:
        size = 1
    elif mod > 0 and index < mod:
        size = n // m + 1
    else:
        size = n // m
    start = index * size if mod > 0 and index < mod else index * size + mod
    take = min(size, n - start)
    return [mqs[(start + i) % n] for i in range(max(take, 0))]


# ---------------------------------------------------------------------------------------------------
# chaotic runs (differential test)


@dataclass
class _Scenario:
    """One small group scenario; every name carries the scenario's prefix."""

    rng: random.Random
    ns: str
    t: int
    out: dict[str, list[str]]
    orderly: bool = False
    topics: list[str] = field(default_factory=list)
    queues: dict[str, list[str]] = field(default_factory=dict)
    nodes: list[str] = field(default_factory=list)
    live: dict[str, str] = field(default_factory=dict)  # client -> node
    paused: set[str] = field(default_factory=set)
    owned: set[tuple[str, str, str]] = field(default_factory=set)  # (client, topic, queue)
    offsets: dict[tuple[str, str], int] = field(default_factory=lambda: defaultdict(int))
    msg_seq: int = 0
    sent: list[tuple[str, str, str, int]] = field(default_factory=list)  # (msg, topic, queue, offset)
    client_seq: int = 0
    # (client, topic) -> (member set, allocated) of the last rebalance line, to leave out repeats
    last_rebalance: dict[tuple[str, str], tuple[frozenset[str], tuple[str, ...]]] = field(
        default_factory=dict
    )

    @property
    def group(self) -> str:
        return f"{self.ns}-g"

    def tick(self) -> int:
        self.t += self.rng.choice((0, 0, 0, 1, 1, 2, 3, 7))
        return self.t

    def emit(self, rel: str, text: str) -> None:
        self.out.setdefault(rel, []).append(text)
        if self.rng.random() < 0.03:
            self.out[rel].append(self.rng.choice(MALFORMED_LINES))
        if self.rng.random() < 0.03:
            self.out[rel].append(self.rng.choice(BLANK_LINES))

    def consumer_file(self, node: str) -> str:
        # Mostly one file per node; sometimes a shared file, so same-ms ties fall to line numbers.
        return f"{self.ns}/mixed.jsonl" if self.rng.random() < 0.2 else f"{self.ns}/{node}.jsonl"

    def cev(self, client: str, node: str, event: str, **fields: Any) -> None:
        self.emit(self.consumer_file(node), line(self.tick(), event, node, "consumer", **fields))

    def chaos(self, action: str, target: str, role: str = "consumer") -> None:
        fields: dict[str, Any] = {"action": action, "target": target, "target_role": role}
        if role == "consumer":
            fields["group"] = self.group
        self.emit("chaos.jsonl", line(self.tick(), "nemesis", "chaos", "chaos", **fields))

    def new_client(self, node: str) -> str:
        self.client_seq += 1
        if self.live and self.rng.random() < 0.05:
            return self.rng.choice(sorted(self.live))  # an id seen on another node
        return f"10.0.{self.ns}@{node}#{self.client_seq}"

    # -- program ---------------------------------------------------------------------------------

    def setup(self) -> None:
        rng = self.rng
        self.orderly = rng.random() < 0.4
        brokers = [f"{self.ns}-b{i}" for i in range(rng.randint(1, 2))]
        self.topics = [f"{self.ns}-T{i}" for i in range(rng.randint(1, 2))]
        for topic in self.topics:
            self.queues[topic] = [f"{b}:{q}" for b in brokers for q in range(rng.randint(1, 3))]
        self.nodes = [f"{self.ns}-consumer-{i}" for i in range(1, rng.randint(2, 4) + 1)]

    def route(self, client: str, node: str) -> None:
        for topic in self.topics:
            queues = self.queues[topic]
            if self.rng.random() < 0.2:
                queues = queues[:-1] or queues  # a partial view; the universe is the union
            self.cev(client, node, "topic_route", client_id=client, topic=topic, queues=queues)

    def start(self, node: str) -> None:
        client = self.new_client(node)
        self.live[client] = node
        self.cev(client, node, "consumer_started", group=self.group, client_id=client)
        if self.rng.random() < 0.8:
            self.route(client, node)

    def drop_owned(self, client: str) -> None:
        self.owned = {o for o in self.owned if o[0] != client}

    def membership_change(self) -> None:
        rng = self.rng
        free = [n for n in self.nodes if n not in self.live.values()]
        choice = rng.random()
        if free and (choice < 0.35 or not self.live):
            self.start(rng.choice(free))
        elif choice < 0.5 and self.live:
            client = rng.choice(sorted(self.live))
            node = self.live.pop(client)
            for _c, topic, queue in sorted(o for o in self.owned if o[0] == client):
                if rng.random() < 0.7:
                    broker, qid = queue.rsplit(":", 1)
                    self.cev(
                        client,
                        node,
                        "mq_removed",
                        group=self.group,
                        client_id=client,
                        topic=topic,
                        broker=broker,
                        queue_id=int(qid),
                        reason="shutdown",
                    )
            self.cev(client, node, "consumer_stopped", group=self.group, client_id=client)
            self.drop_owned(client)
        elif choice < 0.7 and self.live:
            client = rng.choice(sorted(self.live))
            node = self.live[client]
            action = rng.choice(("kill", "kill", "stop"))
            self.chaos(action, node)
            for c in [c for c, n in self.live.items() if n == node]:
                del self.live[c]
                self.drop_owned(c)
            self.paused.discard(node)
            if rng.random() < 0.3:
                # A late line of the dead process in the same millisecond (its file sorts after chaos.jsonl).
                topic = rng.choice(self.topics)
                broker, qid = rng.choice(self.queues[topic]).rsplit(":", 1)
                self.emit(
                    f"{self.ns}/{node}.jsonl",
                    line(
                        self.t,
                        "mq_added",
                        node,
                        "consumer",
                        group=self.group,
                        client_id=client,
                        topic=topic,
                        broker=broker,
                        queue_id=int(qid),
                        next_offset=0,
                    ),
                )
        elif choice < 0.82 and self.live:
            node = self.live[rng.choice(sorted(self.live))]
            self.chaos("pause", node)
            self.paused.add(node)
        elif choice < 0.92 and self.paused:
            node = rng.choice(sorted(self.paused))
            self.chaos("resume", node)
            self.paused.discard(node)
        else:
            # Nemesis actions that the checks ignore, or that target something else.
            self.chaos(rng.choice(("start", "partition", "kill")), f"{self.ns}-broker", role="broker")

    def rebalance_round(self) -> None:
        rng = self.rng
        view = sorted(self.live)
        for client in sorted(self.live):
            node = self.live[client]
            if node in self.paused and rng.random() < 0.7:
                continue
            for topic in self.topics:
                cid_all = view if rng.random() < 0.8 else sorted(set(rng.sample(view, k=len(view) // 2 + 0)))
                mine = averagely(cid_all, self.queues[topic], client)
                current = {q for c, t, q in self.owned if c == client and t == topic}
                same = (frozenset(cid_all), tuple(mine))
                repeat = self.last_rebalance.get((client, topic)) == same
                self.last_rebalance[(client, topic)] = same
                if not (repeat and rng.random() < 0.5):  # a consumer may leave out an identical round
                    self.cev(
                        client,
                        node,
                        "rebalance",
                        group=self.group,
                        client_id=client,
                        topic=topic,
                        strategy="AVG",
                        allocated=mine,
                        changed=set(mine) != current,
                        **self.members(cid_all),
                    )
                for queue in sorted(current - set(mine)):
                    if rng.random() < 0.9:
                        broker, qid = queue.rsplit(":", 1)
                        self.cev(
                            client,
                            node,
                            "mq_removed",
                            group=self.group,
                            client_id=client,
                            topic=topic,
                            broker=broker,
                            queue_id=int(qid),
                            reason="reallocated",
                        )
                        self.owned.discard((client, topic, queue))
                for queue in sorted(set(mine) - current) + ([mine[0]] if mine and rng.random() < 0.1 else []):
                    if rng.random() < 0.95:
                        broker, qid = queue.rsplit(":", 1)
                        self.cev(
                            client,
                            node,
                            "mq_added",
                            group=self.group,
                            client_id=client,
                            topic=topic,
                            broker=broker,
                            queue_id=int(qid),
                            next_offset=self.offsets[(topic, queue)],
                        )
                        self.owned.add((client, topic, queue))

    def members(self, cid_all: list[str]) -> dict[str, Any]:
        """The member set as a line writes it: cid_all, a digest (large groups), or both (cid_all wins,
        so the digest may even be of another set)."""
        r = self.rng.random()
        if r < 0.6:
            return {"cid_all": cid_all}
        if r < 0.85:
            shuffled = self.rng.sample(cid_all, k=len(cid_all)) * self.rng.randint(1, 2)
            return {"cid_all_digest": members_digest(shuffled)}
        return {"cid_all": cid_all, "cid_all_digest": members_digest(cid_all[:1])}

    def traffic(self) -> None:
        rng = self.rng
        for _ in range(rng.randint(0, 6)):
            topic = rng.choice([*self.topics, f"{self.ns}-X"])
            queue = rng.choice(self.queues.get(topic, [f"{self.ns}-b0:0"]))
            broker, qid = queue.rsplit(":", 1)
            self.msg_seq += 1
            msg = f"{self.ns}-m{self.msg_seq}"
            offset = self.offsets[(topic, queue)]
            self.offsets[(topic, queue)] += 1
            self.emit(
                "producer.jsonl",
                line(
                    self.tick(),
                    "message_sent",
                    "producer-1",
                    "producer",
                    msg_id=msg,
                    topic=topic,
                    broker=broker,
                    queue_id=int(qid),
                    queue_offset=offset,
                ),
            )
            self.sent.append((msg, topic, queue, offset))
        for _ in range(rng.randint(0, 8)):
            if not self.sent or not self.live:
                break
            msg, topic, queue, offset = rng.choice(self.sent[-10:])
            owners = [c for c, t, q in self.owned if t == topic and q == queue]
            client = rng.choice(owners) if owners and rng.random() < 0.85 else rng.choice(sorted(self.live))
            node = self.live.get(client, self.nodes[0])
            broker, qid = queue.rsplit(":", 1)
            ts = self.tick()
            started = ts - rng.choice((0, 1, 2, 3, 5, 8)) if rng.random() < 0.95 else ts + 1
            mode = "ORDERLY" if self.orderly and rng.random() < 0.9 else "CONCURRENTLY"
            self.emit(
                self.consumer_file(node),
                line(
                    ts,
                    "message_consumed",
                    node,
                    "consumer",
                    group=self.group,
                    client_id=client,
                    msg_id=msg,
                    topic=topic,
                    broker=broker,
                    queue_id=int(qid),
                    queue_offset=offset,
                    started_ms=started,
                    mode=mode,
                ),
            )

    def noise(self) -> None:
        rng = self.rng
        r = rng.random()
        if r < 0.3:
            self.emit(
                f"{self.ns}/broker.jsonl",
                line(self.tick(), "heartbeat", f"{self.ns}-broker", "broker", group=7, client_id=None),
            )
        elif r < 0.4:
            self.emit(
                f"{self.ns}/broker.jsonl",
                line(
                    self.tick(),
                    "consumer_registered",
                    f"{self.ns}-broker",
                    "broker",
                    group=self.group,
                    client_id="x",
                ),
            )
        elif r < 0.5 and self.live:
            client = rng.choice(sorted(self.live))
            # A stray removal of a queue the client does not own, and a consumer_stopped of an unknown id.
            topic = rng.choice(self.topics)
            broker, qid = rng.choice(self.queues[topic]).rsplit(":", 1)
            self.cev(
                client,
                self.live[client],
                "mq_removed",
                group=self.group,
                client_id=client,
                topic=topic,
                broker=broker,
                queue_id=int(qid),
                reason="pull_expired",
            )
            self.owned.discard((client, topic, f"{broker}:{qid}"))
        elif r < 0.55:
            node = rng.choice(self.nodes)
            self.cev("ghost", node, "consumer_stopped", group=self.group, client_id=f"{self.ns}-ghost")
        elif r < 0.6 and self.live:
            client = rng.choice(sorted(self.live))
            self.cev(
                client,
                self.live[client],
                "mq_added",
                group=self.group,
                client_id=client,
                topic=f"{self.ns}-X",
                broker=f"{self.ns}-b0",
                queue_id=0,
                next_offset=0,
            )

    def run(self, phases: int) -> None:
        self.setup()
        for _ in range(self.rng.randint(1, 2)):
            free = [n for n in self.nodes if n not in self.live.values()]
            if free:
                self.start(self.rng.choice(free))
        for _ in range(phases):
            self.membership_change()
            for _ in range(self.rng.randint(0, 2)):
                self.rebalance_round()
                self.traffic()
            self.noise()


def chaotic_run(
    seed: int, *, scenarios: int = 12, phases: tuple[int, int] = (3, 9), prefix: str = ""
) -> RunFiles:
    """A run of many independent edge-case scenarios (one group each), plus files that must be skipped.

    Names carry `prefix` so that runs of several seeds can be merged into one (see merge_runs)."""
    rng = random.Random(seed)
    out: RunFiles = {}
    base = 1_700_000_000_000 + rng.randint(0, 10_000)
    for k in range(scenarios):
        scenario = _Scenario(
            rng=random.Random(rng.getrandbits(64)), ns=f"{prefix}s{k}", t=base + rng.randint(0, 40), out=out
        )
        scenario.run(rng.randint(*phases))
    # Files outside the run: they would change the answers if they were read.
    poison = line(base - 1, "consumer_started", "x", "consumer", group=f"{prefix}s0-g", client_id="poison")
    out["_spark_metadata/part.jsonl"] = [poison]
    out[".hidden/x.jsonl"] = [poison]
    out["s0/.crash.jsonl"] = [poison]
    out["s0/_tmp.jsonl"] = [poison]
    out["notes.txt"] = [poison]
    return out


def merge_runs(*runs: RunFiles) -> RunFiles:
    """Files of several runs as one run (lines of a file shared by name are appended in turn)."""
    merged: RunFiles = {}
    for run in runs:
        for rel, lines in run.items():
            merged.setdefault(rel, []).extend(lines)
    return merged


# ---------------------------------------------------------------------------------------------------
# realistic runs (benchmark, report demo)


@dataclass
class _Consumer:
    client: str
    node: str
    group: str
    alive: bool = True
    paused: bool = False
    owned: set[str] = field(default_factory=set)
    pos: dict[str, int] = field(default_factory=dict)  # queue -> next offset to consume
    last_rebalance: tuple[tuple[str, ...], tuple[str, ...]] | None = None


class _Writers:
    """Buffered append-only writers, one per event file."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.handles: dict[str, TextIO] = {}
        self.count = 0

    def write(self, rel: str, text: str) -> None:
        fh = self.handles.get(rel)
        if fh is None:
            path = self.root / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            fh = self.handles[rel] = open(path, "a", encoding="utf-8", buffering=1 << 20)  # noqa: SIM115
        fh.write(text)
        fh.write("\n")
        self.count += 1

    def close(self) -> None:
        for fh in self.handles.values():
            fh.close()


class _Cluster:
    """A small time-stepped simulation of producers, consumers, a broker's view and a chaos schedule."""

    STEP = 5

    def __init__(
        self,
        root: Path,
        rng: random.Random,
        *,
        consumers: int,
        queues: int,
        orderly_group: bool,
        loss_every: int,
    ) -> None:
        self.out = _Writers(root)
        self.rng = rng
        self.topics = {"g-concurrent": "TopicA"}
        if orderly_group:
            self.topics["g-orderly"] = "TopicB"
        self.mq_all = [f"broker-{b}:{q}" for b in "ab" for q in range(max(queues // 2, 1))]
        self.n_consumers = consumers
        self.loss_every = loss_every
        self.members: dict[str, list[_Consumer]] = defaultdict(list)
        self.registered: dict[str, set[str]] = defaultdict(set)  # the broker's view of each group
        self.backlog: dict[tuple[str, str], list[str]] = defaultdict(list)  # (topic, mq) -> msg ids by offset
        self.dropped: set[str] = set()
        self.committed: dict[tuple[str, str], int] = defaultdict(int)
        self.pid = 1000
        self.msg_seq = 0
        self.rr = 0

    # -- output ----------------------------------------------------------------------------------

    def emit(self, c: _Consumer, ts: int, event: str, **fields: Any) -> None:
        self.out.write(f"consumers/{c.node}.jsonl", line(ts, event, c.node, "consumer", **fields))

    def broker(self, ts: int, event: str, **fields: Any) -> None:
        self.out.write("brokers/broker-a.jsonl", line(ts, event, "broker-a", "broker", **fields))

    def chaos(self, ts: int, action: str, target: str, group: str) -> None:
        self.out.write(
            "chaos.jsonl",
            line(
                ts,
                "nemesis",
                "chaos",
                "chaos",
                action=action,
                target=target,
                target_role="consumer",
                group=group,
            ),
        )

    def node_of(self, group: str, i: int) -> str:
        return f"consumer-{i}" if group == "g-concurrent" else f"oconsumer-{i}"

    def live(self, group: str, node: str) -> _Consumer:
        return next(c for c in self.members[group] if c.node == node and c.alive)

    # -- membership ---------------------------------------------------------------------------------

    def start(self, group: str, node: str, ts: int) -> _Consumer:
        self.pid += 1
        c = _Consumer(client=f"10.0.0.{node[-1]}@{self.pid}", node=node, group=group)
        self.members[group].append(c)
        self.emit(c, ts, "consumer_started", group=group, client_id=c.client)
        self.emit(c, ts, "topic_route", client_id=c.client, topic=self.topics[group], queues=self.mq_all)
        self.registered[group].add(c.client)
        self.broker(ts, "consumer_registered", group=group, client_id=c.client)
        return c

    def kill(self, group: str, node: str, ts: int) -> _Consumer:
        victim = self.live(group, node)
        self.chaos(ts, "kill", node, group)
        victim.alive = False
        return victim

    def expire(self, group: str, victim: _Consumer, ts: int) -> None:
        """The broker drops a dead client's channel: it leaves the group's view."""
        self.registered[group].discard(victim.client)
        self.broker(
            ts, "consumer_unregistered", group=group, client_id=victim.client, reason="channel_expired"
        )

    def rebalance(self, c: _Consumer, ts: int) -> None:
        topic = self.topics[c.group]
        view = sorted(self.registered[c.group])
        mine = set(averagely(view, self.mq_all, c.client))
        # A round identical to the client's previous one is left out, as EVENTS.md allows; the orderly
        # group writes its member set as a digest, as large groups do.
        same = (tuple(view), tuple(sorted(mine)))
        if c.last_rebalance != same:
            c.last_rebalance = same
            members: dict[str, Any] = (
                {"cid_all_digest": members_digest(view)} if c.group == "g-orderly" else {"cid_all": view}
            )
            self.emit(
                c,
                ts,
                "rebalance",
                group=c.group,
                client_id=c.client,
                topic=topic,
                strategy="AVG",
                allocated=sorted(mine),
                changed=mine != c.owned,
                **members,
            )
        for mq in sorted(c.owned - mine):
            broker, qid = mq.rsplit(":", 1)
            self.emit(
                c,
                ts,
                "mq_removed",
                group=c.group,
                client_id=c.client,
                topic=topic,
                broker=broker,
                queue_id=int(qid),
                reason="reallocated",
            )
            self.committed[(topic, mq)] = c.pos.pop(mq)
        for mq in sorted(mine - c.owned):
            broker, qid = mq.rsplit(":", 1)
            # A new owner resumes at the committed offset; what a dead owner consumed after it comes again.
            c.pos[mq] = self.committed[(topic, mq)]
            self.emit(
                c,
                ts,
                "mq_added",
                group=c.group,
                client_id=c.client,
                topic=topic,
                broker=broker,
                queue_id=int(qid),
                next_offset=c.pos[mq],
            )
        c.owned = mine

    def rebalance_group(self, group: str, now: int) -> None:
        for c in self.members[group]:
            if c.alive and not c.paused:
                self.rebalance(c, now + self.rng.randint(0, 2))

    def commit(self, now: int) -> None:
        for group, topic in self.topics.items():
            for c in self.members[group]:
                if not c.alive:
                    continue
                for mq, pos in sorted(c.pos.items()):
                    self.committed[(topic, mq)] = pos
                    self.broker(
                        now,
                        "offset_committed",
                        group=group,
                        topic=topic,
                        queue_id=int(mq.rsplit(":", 1)[1]),
                        offset=pos,
                    )

    # -- traffic ------------------------------------------------------------------------------------

    def produce(self, now: int, rate_per_ms: float) -> None:
        for topic in self.topics.values():
            for _ in range(int(rate_per_ms * self.STEP + self.rng.random())):
                mq = self.mq_all[self.rr % len(self.mq_all)]
                self.rr += 1
                self.msg_seq += 1
                msg = f"{self.msg_seq:08X}{self.rng.getrandbits(32):08X}"
                key = (topic, mq)
                broker, qid = mq.rsplit(":", 1)
                self.out.write(
                    "producer-1.jsonl",
                    line(
                        now,
                        "message_sent",
                        "producer-1",
                        "producer",
                        msg_id=msg,
                        topic=topic,
                        broker=broker,
                        queue_id=int(qid),
                        queue_offset=len(self.backlog[key]),
                    ),
                )
                self.backlog[key].append(msg)
                if self.loss_every and topic == "TopicA" and self.msg_seq % self.loss_every == 0:
                    self.dropped.add(msg)

    def consume(self, now: int) -> None:
        for group, topic in self.topics.items():
            orderly = group == "g-orderly"
            mode = "ORDERLY" if orderly else "CONCURRENTLY"
            for c in self.members[group]:
                if not c.alive or c.paused:
                    continue
                for mq in sorted(c.owned):
                    # ORDERLY consumers hold the queue's lock: nobody else alive may own it meanwhile.
                    if orderly and any(o is not c and o.alive and mq in o.owned for o in self.members[group]):
                        continue
                    items = self.backlog[(topic, mq)]
                    broker, qid = mq.rsplit(":", 1)
                    todo = range(c.pos[mq], len(items))
                    c.pos[mq] = len(items)
                    # One listener thread per queue here: completion times grow with the offset.
                    times = sorted(now + 1 + self.rng.randint(0, self.STEP - 2) for _ in todo)
                    for offset, ts in zip(todo, times, strict=True):
                        msg = items[offset]
                        if msg in self.dropped:
                            continue
                        self.emit(
                            c,
                            ts,
                            "message_consumed",
                            group=group,
                            client_id=c.client,
                            msg_id=msg,
                            topic=topic,
                            broker=broker,
                            queue_id=int(qid),
                            queue_offset=offset,
                            started_ms=ts - self.rng.randint(0, 1),
                            mode=mode,
                        )


def realistic_run(
    run_dir: str | os.PathLike[str],
    *,
    events: int = 100_000,
    seed: int = 7,
    consumers: int = 3,
    queues: int = 8,
    rate_per_ms: float = 1.0,
    orderly_group: bool = True,
    nemesis: bool = True,
    loss_every: int = 0,
) -> dict[str, Any]:
    """Simulate a cluster and stream about `events` event lines into run_dir; returns facts about the run.

    One producer sends `rate_per_ms` messages per ms to TopicA (and TopicB when `orderly_group`), spread
    over `queues` queues on two brokers. Group `g-concurrent` consumes TopicA, `g-orderly` TopicB in
    ORDERLY mode, each with `consumers` consumers (AllocateMessageQueueAveragely). At 35% of the run the
    chaos runner kills consumer 2 of each group: its queues stay orphaned until the broker drops its
    channel and the others rebalance, and what it consumed after its last commit is consumed again
    (duplicates). At 45% consumer 2 starts again with a new client id; at 65% consumer-3 is paused
    (its queues stall) and at 75% resumed. `loss_every` > 0 never delivers every n-th TopicA message.
    """
    rng = random.Random(seed)
    root = Path(run_dir)
    root.mkdir(parents=True, exist_ok=True)
    cl = _Cluster(
        root, rng, consumers=consumers, queues=queues, orderly_group=orderly_group, loss_every=loss_every
    )
    step = cl.STEP
    # Each message is a send and a consumption; control lines add a few percent.
    duration = max(int(events / (2.05 * rate_per_ms * len(cl.topics))), 400)
    t0 = 1_700_000_000_000
    rebalance_every = max(duration // 20, 50)
    detect_delay = max(duration // 40, 20)
    commit_every = max(duration // 100, 10)
    marks = {
        name: int(duration * f)
        for name, f in (("kill", 0.35), ("restart", 0.45), ("pause", 0.65), ("resume", 0.75))
    }
    facts: dict[str, Any] = {"start_ms": t0, "duration_ms": duration}

    for group in cl.topics:
        for i in range(1, consumers + 1):
            cl.start(group, cl.node_of(group, i), t0 + i)
    notify: list[tuple[int, str]] = [(t0 + consumers + 1, g) for g in cl.topics]
    expiries: list[tuple[int, str, _Consumer]] = []

    def hits(name: str, rel: int) -> bool:
        return nemesis and rel <= marks[name] < rel + step

    now = t0
    # The whole schedule runs (the resume included), so the run's size is close to `events`, not exact.
    while now < t0 + duration:
        rel = now - t0
        if hits("kill", rel):
            for group in cl.topics:
                victim = cl.kill(group, cl.node_of(group, 2), now)
                expiries.append((now + detect_delay, group, victim))
            facts["kill_ms"] = now
        if hits("restart", rel):
            for group in cl.topics:
                node = cl.node_of(group, 2)
                cl.chaos(now, "start", node, group)
                cl.start(group, node, now + 1)
                notify.append((now + 2, group))
        if hits("pause", rel):
            cl.chaos(now, "pause", "consumer-3", "g-concurrent")
            cl.live("g-concurrent", "consumer-3").paused = True
            facts["pause_ms"] = now
        if hits("resume", rel):
            cl.chaos(now, "resume", "consumer-3", "g-concurrent")
            for c in cl.members["g-concurrent"]:
                c.paused = False
        for _due, group, victim in [x for x in expiries if x[0] <= now]:
            cl.expire(group, victim, now)
            notify.append((now, group))
        expiries = [x for x in expiries if x[0] > now]
        for group in sorted({g for due, g in notify if due <= now}):
            cl.rebalance_group(group, now)
        notify = [x for x in notify if x[0] > now]
        if rel % rebalance_every < step:
            for group in cl.topics:
                cl.rebalance_group(group, now)
        if rel % commit_every < step:
            cl.commit(now)
        cl.produce(now, rate_per_ms)
        cl.consume(now)
        if rng.random() < 0.01:
            cl.broker(now, "heartbeat", clients=len(cl.registered))
        if rng.random() < 0.0005:
            cl.out.write("consumers/consumer-1.jsonl", rng.choice(MALFORMED_LINES))
        now += step
    cl.out.close()
    facts["events_written"] = cl.out.count
    facts["end_ms"] = now
    return facts
