"""Live counts from a run's JSON-lines logs: what the progress line and the drain check need.

``LogTailer`` reads whatever complete lines were appended to the run's ``*.jsonl`` files since the last
call (a half-written last line waits for its newline). ``RunTally`` folds events into counts. Both are
plain classes: the runner calls them from a worker thread so file reads never block its loop.
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


class LogTailer:
    """Incremental reader of every ``*.jsonl`` file under a run directory (skipping ``.``/``_`` names)."""

    def __init__(self, run_dir: str | Path) -> None:
        self.run_dir = Path(run_dir)
        self._offsets: dict[Path, int] = {}
        self._partial: dict[Path, bytes] = {}
        self.malformed = 0

    def _files(self) -> list[Path]:
        out = []
        for root, dirs, files in os.walk(self.run_dir):
            dirs[:] = [d for d in dirs if not d.startswith((".", "_"))]
            for f in files:
                if f.endswith(".jsonl") and not f.startswith((".", "_")):
                    out.append(Path(root) / f)
        return sorted(out)

    def poll(self) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        for path in self._files():
            try:
                with open(path, "rb") as f:
                    f.seek(self._offsets.get(path, 0))
                    data = f.read()
                    self._offsets[path] = f.tell()
            except OSError:
                continue
            if not data:
                continue
            data = self._partial.pop(path, b"") + data
            lines = data.split(b"\n")
            if lines[-1]:
                self._partial[path] = lines[-1]
            for line in lines[:-1]:
                if not line.strip():
                    continue
                try:
                    obj = json.loads(line)
                except ValueError:
                    self.malformed += 1
                    continue
                if isinstance(obj, dict):
                    events.append(obj)
                else:
                    self.malformed += 1
        return events


@dataclass
class GroupTally:
    """Live counts of one consumer group, read from its processes' events during a run."""

    topics: set[str] = field(default_factory=set)
    consumed: set[str] = field(default_factory=set)
    consumed_lines: int = 0
    live_clients: set[str] = field(default_factory=set)
    rebalances: int = 0

    @property
    def duplicates(self) -> int:
        return self.consumed_lines - len(self.consumed)


class RunTally:
    """Counts from events: messages sent per topic, consumed per group, live clients, the last nemesis."""

    def __init__(self, group_topics: dict[str, set[str]] | None = None) -> None:
        self.sent: dict[str, set[str]] = defaultdict(set)
        # Where each sent message went ("broker:queue_id"), to say which queues hold what is missing.
        self.sent_queue: dict[str, str] = {}
        # Pull answers a client ignored (the C++ driver's pull_answer_ignored) for a queue it holds, per
        # queue: its current pull request got no answer, so nothing pulls that queue any more. (An
        # answer ignored after the client gave the queue up is the normal end of an old request.)
        self.ignored_pulls: dict[str, int] = defaultdict(int)
        self._held: set[tuple[str, str]] = set()  # (client id, queue) from mq_added / mq_removed
        self.groups: dict[str, GroupTally] = defaultdict(GroupTally)
        for g, topics in (group_topics or {}).items():
            self.groups[g].topics |= topics
        self.last_nemesis: dict[str, Any] | None = None
        self.nemeses = 0
        self.events = 0
        self.send_failures = 0
        self.errors: list[str] = []

    def feed(self, events: list[dict[str, Any]]) -> None:
        for ev in events:
            self.events += 1
            name = ev.get("event")
            if name == "message_sent":
                topic, msg_id = ev.get("topic"), ev.get("msg_id")
                if isinstance(topic, str) and isinstance(msg_id, str):
                    self.sent[topic].add(msg_id)
                    queue = _queue(ev)
                    if queue is not None:
                        self.sent_queue[msg_id] = queue
            elif name in ("mq_added", "mq_removed", "pull_answer_ignored"):
                queue, cid = _queue(ev), ev.get("client_id")
                if queue is None or not isinstance(cid, str):
                    continue
                if name == "mq_added":
                    self._held.add((cid, queue))
                elif name == "mq_removed":
                    self._held.discard((cid, queue))
                elif (cid, queue) in self._held:
                    self.ignored_pulls[queue] += 1
            elif name == "message_consumed":
                group, msg_id = ev.get("group"), ev.get("msg_id")
                if isinstance(group, str) and isinstance(msg_id, str):
                    g = self.groups[group]
                    g.consumed.add(msg_id)
                    g.consumed_lines += 1
                    if isinstance(ev.get("topic"), str):
                        g.topics.add(ev["topic"])
            elif name == "consumer_started":
                if isinstance(ev.get("group"), str) and isinstance(ev.get("client_id"), str):
                    self.groups[ev["group"]].live_clients.add(ev["client_id"])
            elif name == "consumer_stopped":
                if isinstance(ev.get("group"), str) and isinstance(ev.get("client_id"), str):
                    self.groups[ev["group"]].live_clients.discard(ev["client_id"])
            elif name == "rebalance":
                if isinstance(ev.get("group"), str):
                    self.groups[ev["group"]].rebalances += 1
            elif name == "nemesis":
                self.nemeses += 1
                self.last_nemesis = ev
                if ev.get("action") == "kill" and isinstance(ev.get("client_id"), str):
                    for g in self.groups.values():
                        g.live_clients.discard(ev["client_id"])
            elif name in ("send_failed", "message_send_failed"):
                self.send_failures += 1

    @property
    def sent_total(self) -> int:
        return sum(len(v) for v in self.sent.values())

    def sent_for(self, topics: set[str]) -> set[str]:
        out: set[str] = set()
        for t in topics:
            out |= self.sent.get(t, set())
        return out

    def missing(self) -> dict[str, int]:
        """Per group: sent messages of its topics it has not consumed yet."""
        return {g: len(self.sent_for(t.topics) - t.consumed) for g, t in self.groups.items() if t.topics}

    def missing_by_queue(self, group: str) -> dict[str, int]:
        """Where the group's missing messages wait: "topic/broker:queue_id" -> count."""
        t = self.groups.get(group)
        if t is None:
            return {}
        out: dict[str, int] = defaultdict(int)
        for msg_id in self.sent_for(t.topics) - t.consumed:
            out[self.sent_queue.get(msg_id, "?")] += 1
        return dict(sorted(out.items()))

    def drained(self) -> bool:
        return all(n == 0 for n in self.missing().values())

    def summary(self) -> dict[str, Any]:
        return {
            "events": self.events,
            "sent": {t: len(ids) for t, ids in sorted(self.sent.items())},
            "groups": {
                g: {
                    "topics": sorted(t.topics),
                    "consumed_unique": len(t.consumed),
                    "duplicates": t.duplicates,
                    "missing": len(self.sent_for(t.topics) - t.consumed),
                    "missing_by_queue": self.missing_by_queue(g),
                }
                for g, t in sorted(self.groups.items())
            },
            "nemeses": self.nemeses,
            "pull_answers_ignored": dict(sorted(self.ignored_pulls.items())),
        }


def _queue(ev: dict[str, Any]) -> str | None:
    topic, broker, qid = ev.get("topic"), ev.get("broker"), ev.get("queue_id")
    if isinstance(topic, str) and isinstance(broker, str) and isinstance(qid, int):
        return f"{topic}/{broker}:{qid}"
    return None


def progress_line(
    elapsed_s: float,
    total_s: float,
    tally: RunTally,
    consumers: tuple[int, int, int],
    phase: str = "run",
    time_scale: float = 1.0,
) -> str:
    """``[t= 246s/1200s  12.3s/60.0s wall run] sent 1200 | consumed g1 1150 (+3 dup) | ...``: RocketMQ
    seconds since the experiment's t = 0 (the experiment file's clock), then wall seconds."""
    live, paused, total = consumers
    rmq = f"t={elapsed_s / time_scale:5.0f}s/{total_s / time_scale:.0f}s"
    head = f"[{rmq}  {elapsed_s:5.1f}s/{total_s:.1f}s wall {phase}] "
    parts = [f"sent {tally.sent_total}"]
    cons = []
    for g, t in sorted(tally.groups.items()):
        dup = f" (+{t.duplicates} dup)" if t.duplicates else ""
        cons.append(f"{g} {len(t.consumed)}{dup}")
    parts.append("consumed " + (", ".join(cons) if cons else "0"))
    parts.append(f"consumers {live}/{total}" + (f" ({paused} paused)" if paused else ""))
    if tally.last_nemesis:
        n = tally.last_nemesis
        parts.append(f"last: {n.get('action')} {n.get('target')}")
    return head + " | ".join(parts)
