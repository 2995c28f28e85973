"""What the master-slave experiments leave in a run directory, read the same way for every backend:
deliveries per message, the offsets slaves took from commits and syncs, the offsets consumers started
from."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SHIPPED = Path(__file__).resolve().parents[2] / "chaos" / "experiments"


def lines(run_dir: Path, pattern: str) -> list[dict[str, Any]]:
    out = []
    for path in sorted(run_dir.glob(pattern)):
        for line in path.read_text().splitlines():
            if line.startswith("{"):
                out.append(json.loads(line))
    return out


@dataclass
class HaRun:
    """One run's master-slave story."""

    sent: dict[str, str] = field(default_factory=dict)  # msg id -> broker name
    deliveries: Counter[str] = field(default_factory=Counter)  # msg id -> times consumed
    slave_commits: int = 0  # offsets consumers committed to a slave
    regressions: list[tuple[int, int, int]] = field(default_factory=list)  # slave sync: (queue, prev, new)
    restart_offsets: dict[tuple[str, int], int] = field(default_factory=dict)  # restarted consumers
    nemeses: list[tuple[str, str]] = field(default_factory=list)
    skipped: list[dict[str, Any]] = field(default_factory=list)

    @property
    def duplicates(self) -> int:
        return sum(n - 1 for n in self.deliveries.values() if n > 1)

    def duplicates_of(self, broker: str) -> int:
        return sum(n - 1 for mid, n in self.deliveries.items() if n > 1 and self.sent.get(mid) == broker)

    def sent_to(self, broker: str) -> int:
        return sum(1 for b in self.sent.values() if b == broker)

    @property
    def lost(self) -> int:
        return sum(1 for mid in self.sent if not self.deliveries[mid])


def read_run(run_dir: Path, topic: str) -> HaRun:
    run = HaRun()
    for e in lines(run_dir, "producer-*.jsonl"):
        if e["event"] == "message_sent" and e.get("topic") == topic:
            run.sent[e["msg_id"]] = e["broker"]
    for e in lines(run_dir, "consumer-*.jsonl"):
        if e["event"] == "message_consumed" and e.get("topic") == topic:
            run.deliveries[e["msg_id"]] += 1
    # where each queue was first taken after the restart, by whichever consumer took it first: a queue the
    # first one to start took over, and handed on at the second's rebalance, starts where it was first taken
    added = [
        e
        for e in lines(run_dir, "consumer-*.2.jsonl")
        if e["event"] == "mq_added" and e.get("topic") == topic
    ]
    for e in sorted(added, key=lambda e: e["ts_ms"]):
        run.restart_offsets.setdefault((e["broker"], e["queue_id"]), e["next_offset"])
    for e in lines(run_dir, "broker-*-s*.jsonl"):
        if e["event"] == "offset_committed" and e.get("topic") == topic:
            run.slave_commits += 1
        if e["event"] == "offset_synced" and e.get("topic") == topic and 0 <= e["offset"] < e["prev_offset"]:
            run.regressions.append((e["queue_id"], e["prev_offset"], e["offset"]))
    for e in lines(run_dir, "chaos.jsonl"):
        if e["event"] == "nemesis":
            run.nemeses.append((e["action"], e["target"]))
        if e["event"] == "nemesis_skipped":
            run.skipped.append(e)
    return run
