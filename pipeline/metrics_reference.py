"""Plain-Python reference of the EVENTS.md checks, written to follow the text literally.

It loads a whole run into memory, so it is meant for tests (the differential test compares it with
the Spark pipeline on random runs) and for small runs; the Spark pipeline is the one for real runs.
"""

from __future__ import annotations

import bisect
import itertools
import json
import operator
import os
import re
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from rmqlab.pipeline.contract import (
    CLIENT_MODE,
    CLIENT_NODE_EVENTS,
    CLOSING_ACTIONS,
    CONSUMER_GROUP_EVENTS,
    INT,
    INT64_MAX,
    INT64_MIN,
    MEMBERS_EVENT,
    OFFSET_OBSERVATIONS,
    ORDERLY,
    RETRY_PREFIX,
    SERVER_ASSIGNMENT,
    SLAVE_OFFSET_SYNC,
    STR,
    UNPAUSING_ACTIONS,
    FieldType,
    cause_text,
    has_type,
    join_causes,
    members_digest,
    offset_queue_broker,
    queue_key,
    rebalance_members,
    required_fields,
    server_mode,
    verdict,
)
from rmqlab.pipeline.discover import RunFile, discover

_MODEL_EVENTS = frozenset((*CLIENT_NODE_EVENTS, SERVER_ASSIGNMENT))  # the lines RunModel's index reads
_BLANK = re.compile(r"[ \t\n\x0b\x0c\r]*")
_INF = 2**62

Queue = tuple[str, str]  # (topic, "broker:queue_id")
OwnerKey = tuple[str, str, str, str]  # (group, client_id, topic, "broker:queue_id")


class Event:
    """A well-formed line with its place in the event order. Its event name is an attribute of its own:
    every definition below tests it, many times per line."""

    __slots__ = ("event", "line", "rec", "rel", "ts")

    def __init__(self, ts: int, rel: str, line: int, rec: dict[str, Any]) -> None:
        self.ts, self.rel, self.line, self.rec = ts, rel, line, rec
        self.event: str = rec["event"]

    def __repr__(self) -> str:
        return f"Event({self.rel}:{self.line} {self.event} ts={self.ts})"

    def get(self, name: str) -> Any:
        return self.rec.get(name)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"non-standard JSON constant {name}")


def _has_lone_surrogate(value: Any) -> bool:
    if isinstance(value, str):
        return any(0xD800 <= ord(ch) <= 0xDFFF for ch in value)
    if isinstance(value, dict):
        return any(_has_lone_surrogate(k) or _has_lone_surrogate(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_has_lone_surrogate(v) for v in value)
    return False


_DECODER = json.JSONDecoder(parse_constant=_reject_constant)  # json.loads would build one per line
_SCAN = _DECODER.scan_once
_JSON_BLANK = re.compile(r"[ \t\n\r]*")  # the whitespace json's decode() skips around a value


def parse_line(text: str) -> dict[str, Any] | None:
    """The decoded line when it is well-formed by EVENTS.md, else None (malformed)."""
    # json's decode() without its two wrappers: skip JSON whitespace, scan one value, allow only JSON
    # whitespace after it (the same accepted texts, the same values)
    start = 0 if text[:1] == "{" else _JSON_BLANK.match(text).end()  # type: ignore[union-attr]
    try:
        rec, end = _SCAN(text, start)
    except (StopIteration, ValueError, RecursionError):
        return None
    if end != len(text) and _JSON_BLANK.match(text, end).end() != len(text):  # type: ignore[union-attr]
        return None
    # A lone surrogate in the decoded values comes from a JSON escape (backslash, u) or from a non-ASCII
    # character of the text: ASCII lines without an escape, nearly all, skip the walk over every value.
    suspect = "\\u" in text or not text.isascii()
    if not isinstance(rec, dict) or (suspect and _has_lone_surrogate(rec)):
        return None
    event = rec.get("event")
    if type(event) is not str:
        return None
    strs, ints, others = _field_checks(event, rec)
    for name in strs:
        if type(rec.get(name)) is not str:  # a missing field is None, never of a type
            return None
    for name in ints:
        value = rec.get(name)
        if type(value) is not int or not INT64_MIN <= value <= INT64_MAX:
            return None
    for name, ftype in others:
        if name not in rec or not has_type(rec[name], ftype):
            return None
    if event == MEMBERS_EVENT and rebalance_members(rec) is None:
        return None
    return rec


_Checks = tuple[tuple[str, ...], tuple[str, ...], tuple[tuple[str, FieldType], ...]]
_CHECKS: dict[str, _Checks] = {}  # by event name: its required fields split by type


def _field_checks(event: str, rec: dict[str, Any]) -> _Checks:
    """The contract's required fields of a line (``required_fields``) as string, int and other fields;
    cached per event name, but for nemesis lines, whose fields depend on their target's role."""
    checks = _CHECKS.get(event)
    if checks is None:
        fields = required_fields(rec)
        checks = (
            tuple(n for n, t in fields.items() if t is STR),
            tuple(n for n, t in fields.items() if t is INT),
            tuple((n, t) for n, t in fields.items() if t is not STR and t is not INT),
        )
        if event != "nemesis":
            _CHECKS[event] = checks
    return checks


def iter_lines(path: str) -> Iterator[tuple[int, str]]:
    """(line number, text) of a file; CR, LF and CRLF all end a line, bad UTF-8 is replaced."""
    with open(path, encoding="utf-8", errors="replace", newline=None) as fh:
        for number, raw in enumerate(fh, start=1):
            yield number, raw.rstrip("\n")


def is_blank(text: str) -> bool:
    return _BLANK.fullmatch(text) is not None


def load_files(files: Iterable[RunFile]) -> tuple[list[Event], int]:
    """Well-formed events in event order, and the number of malformed lines."""
    events: list[Event] = []
    malformed = 0
    # Files in order of their names and lines in file order: a stable sort by timestamp alone then
    # gives the event order (timestamp, file, line) without a key tuple per event.
    for run_file in sorted(files, key=operator.attrgetter("rel")):
        rel = run_file.rel
        # iter_lines' lines, read at once: the same text split at the same line ends (newline=None
        # makes CR and CRLF into LF), and a last empty piece after a final line end is blank
        with open(run_file.path, encoding="utf-8", errors="replace", newline=None) as fh:
            lines = fh.read().split("\n")
        for number, text in enumerate(lines, start=1):
            if text[:1] != "{" and is_blank(text):
                continue
            rec = parse_line(text)
            if rec is None:
                malformed += 1
                continue
            events.append(Event(rec["ts_ms"], rel, number, rec))
    events.sort(key=operator.attrgetter("ts"))
    return events, malformed


def load_run(run_dir: str | os.PathLike[str]) -> tuple[list[Event], int]:
    return load_files(discover(run_dir))


@dataclass
class Interval:
    """A span during which one client held one queue."""

    group: str
    client: str
    topic: str
    queue: str
    start: int
    end: int


@dataclass
class _Timeline:
    """Per-key lists of (ts, seq) of state-changing events, for 'latest event at or before t' questions."""

    ts: dict[Any, list[int]] = field(default_factory=lambda: defaultdict(list))
    seq: dict[Any, list[int]] = field(default_factory=lambda: defaultdict(list))
    payload: dict[Any, list[Any]] = field(default_factory=lambda: defaultdict(list))

    def add(self, key: Any, ts: int, seq: int, payload: Any = None) -> None:
        self.ts[key].append(ts)
        self.seq[key].append(seq)
        self.payload[key].append(payload)

    def latest(self, key: Any, t: int) -> tuple[int, Any] | None:
        """(seq, payload) of the last event of key with ts <= t, in event order."""
        times = self.ts.get(key)
        if not times:
            return None
        i = bisect.bisect_right(times, t) - 1
        if i < 0:
            return None
        return self.seq[key][i], self.payload[key][i]

    def any_after(self, key: Any, seq: int, t: int) -> bool:
        """Is there an event of key later than seq in event order and with ts <= t?"""
        times = self.ts.get(key)
        if not times:
            return False
        i = bisect.bisect_right(self.seq[key], seq)
        return i < len(times) and times[i] <= t


class RunModel:
    """The definitions of EVENTS.md evaluated directly on an ordered event list."""

    def __init__(self, events: list[Event]) -> None:
        self.events = events
        self.run_end = max((e.ts for e in events), default=0)
        self.groups: set[str] = set()
        self.client_nodes: dict[str, set[str]] = defaultdict(set)
        self.group_topics: dict[str, set[str]] = defaultdict(set)
        self.group_clients: dict[str, set[str]] = defaultdict(set)
        topic_queues: dict[str, set[str]] = defaultdict(set)
        # Groups whose queues the broker assigns (RocketMQ 5): see EVENTS.md's proposed section.
        self.server_assigned: set[str] = set()
        self.pop_assigned: set[str] = set()
        for e in events:
            ev = e.event
            if ev not in _MODEL_EVENTS:  # most lines (sends, pulls, offsets) name no member or queue
                continue
            get = e.rec.get
            if ev in CONSUMER_GROUP_EVENTS:
                self.groups.add(get("group"))
                self.group_clients[get("group")].add(get("client_id"))
            if ev in CLIENT_NODE_EVENTS:
                self.client_nodes[get("client_id")].add(e.rec["node"])
            if ev == "rebalance":
                self.group_topics[get("group")].add(get("topic"))
            if ev == SERVER_ASSIGNMENT:
                self.group_topics[get("group")].add(get("topic"))
                self.server_assigned.add(get("group"))
                if get("pop") and not get("topic").startswith(RETRY_PREFIX):
                    self.pop_assigned.add(get("group"))
            if ev == "topic_route":
                topic_queues[get("topic")].update(get("queues"))
        added: dict[str, set[Queue]] = defaultdict(set)
        for e in events:
            if e.event == "mq_added":
                get = e.rec.get
                if get("topic") in self.group_topics[get("group")]:
                    added[get("group")].add((get("topic"), queue_key(get("broker"), get("queue_id"))))
        self.universe: dict[str, set[Queue]] = {
            g: added[g]
            if g in self.server_assigned
            else {(t, q) for t in self.group_topics[g] for q in topic_queues[t]}
            for g in self.groups
        }
        self.event_times = sorted({e.ts for e in events})
        self._build_timelines()
        self.intervals = self._ownership_intervals()
        self.intervals_by_queue: dict[tuple[str, str, str], list[Interval]] = defaultdict(list)
        for iv in self.intervals:
            self.intervals_by_queue[(iv.group, iv.topic, iv.queue)].append(iv)
        self._converged_cache: dict[tuple[str, int], bool] = {}
        self._consumed: dict[str, list[Event]] = {}
        self._consuming: dict[str, set[str]] | None = None

    # -- state at t ---------------------------------------------------------------------------------

    def _targets(self, e: Event) -> set[str]:
        """Client ids whose node is the target of a nemesis event."""
        target = e.get("target")
        return {c for c, nodes in self.client_nodes.items() if target in nodes}

    def _build_timelines(self) -> None:
        self.starts = _Timeline()  # key (group, client)
        self.deaths = _Timeline()  # key client: consumer_stopped, kill/stop of its node
        self.pauses = _Timeline()  # key node
        self.unpauses = _Timeline()  # key node
        self.rebalances = _Timeline()  # key (group, client, topic), payload: digest of the member set
        for seq, e in enumerate(self.events):
            ev = e.event
            if ev == "consumer_started":
                self.starts.add((e.get("group"), e.get("client_id")), e.ts, seq)
            elif ev == "consumer_stopped":
                self.deaths.add(e.get("client_id"), e.ts, seq)
            elif ev == "nemesis":
                action, target = e.get("action"), e.get("target")
                if action in CLOSING_ACTIONS:
                    for c in self._targets(e):
                        self.deaths.add(c, e.ts, seq)
                if action == "pause":
                    self.pauses.add(target, e.ts, seq)
                if action in UNPAUSING_ACTIONS:
                    self.unpauses.add(target, e.ts, seq)
            elif ev == "rebalance":
                key = (e.get("group"), e.get("client_id"), e.get("topic"))
                self.rebalances.add(key, e.ts, seq, rebalance_members(e.rec))

    def mode(self, group: str) -> str:
        """`client`, `server-pull` or `server-pop` (EVENTS.md, proposed section)."""
        return server_mode(group in self.pop_assigned) if group in self.server_assigned else CLIENT_MODE

    def is_live(self, group: str, client: str, t: int) -> bool:
        started = self.starts.latest((group, client), t)
        if started is None:
            return False
        return not self.deaths.any_after(client, started[0], t)

    def liveness_times(self, group: str) -> set[int]:
        """Times at which the live set of the group may change (its starts and its clients' deaths)."""
        times: set[int] = set()
        for (g, c), starts in self.starts.ts.items():
            if g == group:
                times.update(starts)
                times.update(self.deaths.ts.get(c, ()))
        return times

    def live_set(self, group: str, t: int) -> frozenset[str]:
        return frozenset(c for (g, c) in self.starts.ts if g == group and self.is_live(g, c, t))

    def any_live(self, group: str, t: int) -> bool:
        """Is the live set of the group at t non-empty? (``live_set``'s truth, without building it.)"""
        return any(g == group and self.is_live(g, c, t) for (g, c) in self.starts.ts)

    def node_paused(self, node: str, t: int) -> bool:
        paused = self.pauses.latest(node, t)
        if paused is None:
            return False
        return not self.unpauses.any_after(node, paused[0], t)

    def client_paused(self, client: str, t: int) -> bool:
        return any(self.node_paused(n, t) for n in self.client_nodes.get(client, ()))

    def open_intervals(self, group: str, queue: Queue, t: int) -> list[Interval]:
        return [iv for iv in self.intervals_by_queue.get((group, *queue), []) if iv.start <= t < iv.end]

    # -- ownership ----------------------------------------------------------------------------------

    def _ownership_intervals(self) -> list[Interval]:
        opened: dict[OwnerKey, int] = {}
        out: list[Interval] = []

        def close(key: OwnerKey, ts: int) -> None:
            out.append(Interval(*key, start=opened.pop(key), end=ts))

        for e in self.events:
            ev = e.event
            if ev in ("mq_added", "mq_removed"):
                g, topic = e.get("group"), e.get("topic")
                if topic not in self.group_topics[g]:
                    continue
                key = (g, e.get("client_id"), topic, queue_key(e.get("broker"), e.get("queue_id")))
                if ev == "mq_added" and key not in opened:
                    opened[key] = e.ts
                elif ev == "mq_removed" and key in opened:
                    close(key, e.ts)
            elif ev == "consumer_stopped":
                for key in [k for k in opened if k[1] == e.get("client_id")]:
                    close(key, e.ts)
            elif ev == "nemesis" and e.get("action") in CLOSING_ACTIONS:
                clients = self._targets(e)
                for key in [k for k in opened if k[1] in clients]:
                    close(key, e.ts)
        for key in list(opened):
            close(key, self.run_end)
        return out

    # -- metrics -------------------------------------------------------------------------------------

    def group_queues(self, group: str) -> set[Queue]:
        return {(iv.topic, iv.queue) for iv in self.intervals if iv.group == group}

    def overlap_ms(self, group: str) -> int:
        total = 0
        for queue in self.group_queues(group):
            ivs = self.intervals_by_queue[(group, *queue)]
            total += _measure(ivs, lambda a, ivs=ivs: sum(iv.start <= a < iv.end for iv in ivs) >= 2)
        return total

    def orphan_ms(self, group: str) -> int:
        adds = [
            e.ts
            for e in self.events
            if e.event == "mq_added"
            and e.get("group") == group
            and e.get("topic") in self.group_topics[group]
        ]
        if not adds:
            return 0
        t0 = min(adds)
        liveness = self.liveness_times(group)
        live_at: dict[int, bool] = {}  # the group's liveness at an instant, asked once per instant
        total = 0
        for queue in self.universe[group]:
            ivs = self.intervals_by_queue.get((group, *queue), [])
            bounds = sorted({t0, self.run_end} | liveness | {x for iv in ivs for x in (iv.start, iv.end)})
            for a, b in itertools.pairwise(bounds):
                if (
                    t0 <= a
                    and b <= self.run_end
                    and not any(iv.start <= a < iv.end for iv in ivs)
                    and (live_at[a] if a in live_at else live_at.setdefault(a, self.any_live(group, a)))
                ):
                    total += b - a
        return total

    def idle_member_ms(self, group: str) -> int:
        if group in self.server_assigned:
            return 0  # the broker, not the members, decides who holds what
        liveness = self.liveness_times(group)
        members = sorted(c for (g, c) in self.starts.ts if g == group)
        total = 0
        for topic in sorted(self.group_topics[group]):
            queues = sum(1 for t, _q in self.universe[group] if t == topic)
            if not queues:
                continue
            for client in members:
                rebalanced = self.rebalances.ts.get((group, client, topic))
                if not rebalanced:
                    continue
                first = rebalanced[0]
                held = [
                    iv
                    for iv in self.intervals
                    if iv.group == group and iv.client == client and iv.topic == topic
                ]
                bounds = sorted(
                    {first, self.run_end} | liveness | {x for iv in held for x in (iv.start, iv.end)}
                )
                for a, b in itertools.pairwise(bounds):
                    if (
                        first <= a
                        and b <= self.run_end
                        and self.is_live(group, client, a)
                        and not any(iv.start <= a < iv.end for iv in held)
                        and len(self.live_set(group, a)) <= queues
                    ):
                        total += b - a
        return total

    def stalled_ms(self, group: str) -> int:
        nemesis_times = {e.ts for e in self.events if e.event == "nemesis"}
        total = 0
        for queue in self.group_queues(group):
            ivs = self.intervals_by_queue[(group, *queue)]
            bounds = sorted(nemesis_times | {x for iv in ivs for x in (iv.start, iv.end)})
            for a, b in itertools.pairwise(bounds):
                owners = [iv.client for iv in ivs if iv.start <= a < iv.end]
                if owners and all(self.client_paused(c, a) for c in owners):
                    total += b - a
        return total

    def consumption_topics(self, group: str) -> set[str]:
        """The topics of the group's consumption lines: its group topics, and for a server-assigned
        group their pop retry topics (a revived copy is consumed from there)."""
        own = self.group_topics.get(group, set())
        if group not in self.server_assigned:
            return own
        return own | {f"{RETRY_PREFIX}{group}_{t}" for t in own if not t.startswith(RETRY_PREFIX)}

    def consumed_lines(self, group: str) -> list[Event]:
        """The group's consumption lines, in event order (found once: four metrics read them)."""
        lines = self._consumed.get(group)
        if lines is None:
            topics = self.consumption_topics(group)
            lines = self._consumed[group] = [
                e
                for e in self.events
                if e.event == "message_consumed" and e.get("group") == group and e.get("topic") in topics
            ]
        return lines

    def consumers_without_messages(self, group: str) -> int:
        """The group's clients (of its consumer events) without a `message_consumed` line of the group."""
        if self._consuming is None:
            self._consuming = defaultdict(set)
            for e in self.events:
                if e.event == "message_consumed":
                    self._consuming[e.get("group")].add(e.get("client_id"))
        return len(self.group_clients[group] - self._consuming[group])

    def concurrent_consume_ms(self, group: str) -> int:
        per_queue: dict[Queue, dict[str, list[tuple[int, int]]]] = defaultdict(lambda: defaultdict(list))
        for e in self.consumed_lines(group):
            if e.get("started_ms") < e.ts:
                queue = (e.get("topic"), queue_key(e.get("broker"), e.get("queue_id")))
                per_queue[queue][e.get("client_id")].append((e.get("started_ms"), e.ts))
        return sum(
            _covered_twice([_union(spans) for spans in clients.values()]) for clients in per_queue.values()
        )

    def order_violations(self, group: str) -> int:
        highest: dict[int, int] = {}
        violations = 0
        for e in self.consumed_lines(group):
            if e.get("mode") != ORDERLY:
                continue
            queue = (e.get("topic"), queue_key(e.get("broker"), e.get("queue_id")))
            inside = [iv for iv in self.open_intervals(group, queue, e.ts) if iv.client == e.get("client_id")]
            if not inside:
                continue
            slot = id(inside[0])
            offset = e.get("queue_offset")
            if slot in highest and offset <= highest[slot]:
                violations += 1
            highest[slot] = max(offset, highest.get(slot, offset))
        return violations

    def is_orderly(self, group: str) -> bool:
        return any(e.get("mode") == ORDERLY for e in self.consumed_lines(group))

    def message_counts(self, group: str) -> dict[str, int]:
        topics = self.group_topics[group]
        sent = {
            e.get("msg_id") for e in self.events if e.event == "message_sent" and e.get("topic") in topics
        }
        counts: dict[str, int] = defaultdict(int)
        for e in self.consumed_lines(group):
            counts[e.get("msg_id")] += 1
        return {
            "sent": len(sent),
            "consumed_unique": len(counts),
            "lost": len(sent - counts.keys()),
            "duplicates": sum(n - 1 for n in counts.values()),
            "duplicated_messages": sum(1 for n in counts.values() if n >= 2),
        }

    # -- offset regressions -------------------------------------------------------------------------

    def offset_regressions(self, group: str) -> list[dict[str, Any]]:
        """EVENTS.md's offset regressions of the group, in event order, each with the deliveries of its
        range after it that it explains (`redelivered`)."""
        topics = self.group_topics[group]
        last: dict[Queue, int] = {}
        found: list[tuple[tuple[int, str, int], Queue, dict[str, Any]]] = []  # (order, queue, entry)
        for e in self.events:
            field_name = OFFSET_OBSERVATIONS.get(e.event)
            if field_name is None or e.get("group") != group or e.get("topic") not in topics:
                continue
            broker = offset_queue_broker(e.event, e.rec["node"], e.get("broker"))
            queue = (e.get("topic"), queue_key(broker, e.get("queue_id")))
            offset = e.get(field_name)
            before = last.get(queue)
            if before is not None and offset < before:
                entry = {
                    "change_ms": e.ts,
                    "topic": queue[0],
                    "queue": queue[1],
                    "from": before,
                    "to": offset,
                    "event": e.event,
                    "node": e.rec["node"],
                    "redelivered": 0,
                }
                found.append(((e.ts, e.rel, e.line), queue, entry))
            last[queue] = offset
        if not found:
            return []
        by_queue: dict[Queue, list[tuple[int, dict[str, Any]]]] = defaultdict(list)
        for i, (_order, queue, entry) in enumerate(found):
            by_queue[queue].append((i, entry))
        seen: set[str] = set()  # msg ids the group consumed earlier: only a repeat is a redelivery
        for line in self.consumed_lines(group):
            msg = line.get("msg_id")
            repeat = msg in seen
            seen.add(msg)
            regs = by_queue.get((line.get("topic"), queue_key(line.get("broker"), line.get("queue_id"))))
            if not regs or not repeat:
                continue
            at, offset = (line.ts, line.rel, line.line), line.get("queue_offset")
            # the latest regression of the queue before the delivery whose range holds its offset
            latest = next(
                (i for i, r in reversed(regs) if found[i][0] < at and r["to"] <= offset < r["from"]),
                None,
            )
            if latest is not None:
                found[latest][2]["redelivered"] += 1
        return [entry for _o, _q, entry in found]

    def slave_offset_regressions(self, group: str) -> list[dict[str, Any]]:
        """EVENTS.md's slave offset regressions of the group, in event order: a slave's sync put an older
        committed offset over its own (apache/rocketmq#1094's mechanism, before any consumer reads it)."""
        topics = self.group_topics[group]
        out = []
        for e in self.events:
            if e.event != SLAVE_OFFSET_SYNC or e.get("group") != group or e.get("topic") not in topics:
                continue
            offset, before = e.get("offset"), e.get("prev_offset")
            if 0 <= offset < before:
                out.append(
                    {
                        "change_ms": e.ts,
                        "topic": e.get("topic"),
                        "queue": queue_key(e.get("broker"), e.get("queue_id")),
                        "from": before,
                        "to": offset,
                        "node": e.rec["node"],
                    }
                )
        return out

    # -- convergence ---------------------------------------------------------------------------------

    def converged(self, group: str, t: int) -> bool:
        key = (group, t)
        if key not in self._converged_cache:
            self._converged_cache[key] = self._converged(group, t)
        return self._converged_cache[key]

    def _converged(self, group: str, t: int) -> bool:
        live = self.live_set(group, t)
        if not live:
            return True  # an empty group has nothing to rebalance
        for queue in self.universe[group]:
            opened = self.open_intervals(group, queue, t)
            if len(opened) != 1 or opened[0].client not in live:
                return False
        if group in self.server_assigned:
            return True  # the broker, not the client, decides who owns what
        live_digest = members_digest(live)
        for client in live:
            if self.client_paused(client, t):
                continue
            for topic in self.group_topics[group]:
                latest = self.rebalances.latest((group, client, topic), t)
                if latest is None or latest[1] != live_digest:
                    return False
        return True

    def change_points(self, group: str) -> dict[int, list[str]]:
        clients = self.group_clients[group]
        nodes = {n for c in clients for n in self.client_nodes.get(c, ())}
        points: dict[int, list[str]] = defaultdict(list)
        for e in self.events:
            ev = e.event
            if ev in ("consumer_started", "consumer_stopped") and e.get("group") == group:
                points[e.ts].append(cause_text(ev, e.get("client_id"), e.rec["node"], None))
            elif ev == "nemesis" and e.get("action") == "kill" and e.get("target") in nodes:
                points[e.ts].append(cause_text(ev, None, None, e.get("target")))
        return points

    def convergence(self, group: str) -> list[dict[str, Any]]:
        entries = []
        for t0, causes in sorted(self.change_points(group).items()):
            i = bisect.bisect_right(self.event_times, t0)
            later = self.event_times[i:]  # up to and including run_end
            found = next((t for t in [t0, *later] if self.converged(group, t)), None)
            entries.append(
                {
                    "change_ms": t0,
                    "cause": join_causes(causes),
                    "converged": found is not None,
                    "convergence_ms": None if found is None else found - t0,
                }
            )
        return entries

    def group_summary(self, group: str) -> dict[str, Any]:
        out: dict[str, Any] = {"topics": sorted(self.group_topics[group])}
        out.update(self.message_counts(group))
        out["overlap_ms"] = self.overlap_ms(group)
        out["orphan_ms"] = self.orphan_ms(group)
        out["idle_member_ms"] = self.idle_member_ms(group)
        out["stalled_ms"] = self.stalled_ms(group)
        out["concurrent_consume_ms"] = self.concurrent_consume_ms(group)
        out["order_violations"] = self.order_violations(group)
        out["consumers_without_messages"] = self.consumers_without_messages(group)
        out["convergence"] = self.convergence(group)
        out["offset_regressions"] = self.offset_regressions(group)
        out["regression_redelivered"] = sum(r["redelivered"] for r in out["offset_regressions"])
        out["slave_offset_regressions"] = self.slave_offset_regressions(group)
        out["verdict"] = verdict(
            lost=out["lost"],
            orderly=self.is_orderly(group),
            concurrent_consume_ms=out["concurrent_consume_ms"],
            order_violations=out["order_violations"],
            convergence=out["convergence"],
            server_assigned=group in self.server_assigned,
        )
        return out


def _measure(intervals: list[Interval], pred: Any) -> int:
    """Total length of the elementary segments between interval bounds where pred(segment start) holds."""
    bounds = sorted({x for iv in intervals for x in (iv.start, iv.end)})
    return sum(b - a for a, b in itertools.pairwise(bounds) if pred(a))


def _union(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    merged: list[tuple[int, int]] = []
    for s, e in sorted(spans):
        if merged and s <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], e))
        else:
            merged.append((s, e))
    return merged


def _covered_twice(unions: list[list[tuple[int, int]]]) -> int:
    """Total length of the elementary segments between the spans' bounds that at least two of the unions
    cover (each union's spans disjoint): the number covering a segment is the sum of +1 at each span's
    start and -1 at each span's end up to the segment's start."""
    delta: dict[int, int] = defaultdict(int)
    for spans in unions:
        for start, end in spans:
            delta[start] += 1
            delta[end] -= 1
    total = busy = 0
    for a, b in itertools.pairwise(sorted(delta)):
        busy += delta[a]
        if busy >= 2:
            total += b - a
    return total


def summarize(events: list[Event], malformed: int, model: RunModel | None = None) -> dict[str, Any]:
    """summary.json of EVENTS.md for an ordered list of well-formed events (`model`: theirs, when the
    caller has built it already)."""
    model = RunModel(events) if model is None else model
    return {
        "run": {
            "events": len(events),
            "malformed_lines": malformed,
            "start_ms": min((e.ts for e in events), default=None),
            "end_ms": max((e.ts for e in events), default=None),
        },
        "groups": {g: model.group_summary(g) for g in sorted(model.groups)},
    }


def summarize_run(run_dir: str | os.PathLike[str]) -> dict[str, Any]:
    events, malformed = load_run(run_dir)
    return summarize(events, malformed)
