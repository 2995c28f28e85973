"""A run's explorable timeline: ``timeline.html`` (one row per queue, zoom, pan, hover, a filter by
consumer) and ``trace.json`` (the Chrome trace event format, for Perfetto or chrome://tracing).

Both are made from the report's plot data (ownership intervals and nemesis actions, as the Spark
analysis and the plain-Python reference collect them) and one streaming pass over the run's event
files for what the plot data leaves out: the messages consumed and the offsets of each ownership
interval, the consumers' rebalances, and broker starts and stops. Times are the experiment's clock:
RocketMQ seconds since t = 0 (wall seconds divided by the run's time scale).
"""

from __future__ import annotations

import bisect
import json
import os
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rmqlab.pipeline.discover import RunFile, discover, is_simulated

TIMELINE_HTML = "timeline.html"
TRACE_JSON = "trace.json"
# Rebalances kept for the markers and the trace (a 1,000-consumer hour has hundreds of thousands).
MAX_REBALANCES = 50_000
_SCANNED = ('"message_consumed"', '"rebalance"', '"broker_started"', '"broker_stopped"')


@dataclass
class _Owner:
    """One ownership interval's extra figures from the event files."""

    consumed: int = 0
    first_offset: int | None = None
    last_offset: int | None = None


def _key(group: str, topic: str, queue: str) -> tuple[str, str, str]:
    return (group, topic, queue)


class _IntervalIndex:
    """Ownership intervals of each (group, topic, queue), by start, to find the one a line falls in."""

    def __init__(self, intervals: list[dict[str, Any]]) -> None:
        by_queue: dict[tuple[str, str, str], list[int]] = defaultdict(list)
        for i, iv in enumerate(intervals):
            by_queue[_key(iv["group"], iv["topic"], iv["queue"])].append(i)
        self.intervals = intervals
        self.rows = {k: sorted(v, key=lambda i: intervals[i]["start"]) for k, v in by_queue.items()}
        self.starts = {k: [intervals[i]["start"] for i in v] for k, v in self.rows.items()}
        self.owners = [_Owner() for _ in intervals]

    def find(self, group: str, topic: str, queue: str, client: str, ts: int) -> _Owner | None:
        k = _key(group, topic, queue)
        starts = self.starts.get(k)
        if not starts:
            return None
        j = bisect.bisect_right(starts, ts) - 1
        # Intervals of one queue may overlap (two owners at once): look back over those still open.
        while j >= 0:
            i = self.rows[k][j]
            iv = self.intervals[i]
            if iv["client_id"] == client and iv["start"] <= ts <= iv["end"]:
                return self.owners[i]
            if ts - iv["start"] > 10 * 60 * 1000 and iv["end"] < ts:
                break
            j -= 1
        return None


def scan_events(files: Iterable[RunFile], index: _IntervalIndex) -> tuple[list[list[Any]], list[list[Any]]]:
    """One pass over the event files: each consumed line counted into its ownership interval; the
    rebalances that changed an allocation (ts, node, client, group, topic, queues held); broker starts
    and stops (ts, event, node). Lines that do not parse are skipped: the analysis reports them."""
    rebalances: list[list[Any]] = []
    brokers: list[list[Any]] = []
    for f in files:
        try:
            fh = open(f.path, encoding="utf-8", errors="replace")  # noqa: SIM115
        except OSError:
            continue
        with fh:
            for text in fh:
                if not any(s in text for s in _SCANNED):
                    continue
                try:
                    e = json.loads(text)
                except ValueError:
                    continue
                if not isinstance(e, dict):
                    continue
                ev, ts = e.get("event"), e.get("ts_ms")
                if not isinstance(ts, int):
                    continue
                if ev == "message_consumed":
                    queue = f"{e.get('broker')}:{e.get('queue_id')}"
                    owner = index.find(
                        str(e.get("group")), str(e.get("topic")), queue, str(e.get("client_id")), ts
                    )
                    if owner is not None:
                        owner.consumed += 1
                        off = e.get("queue_offset")
                        if isinstance(off, int):
                            owner.first_offset = (
                                off if owner.first_offset is None else min(owner.first_offset, off)
                            )
                            owner.last_offset = (
                                off if owner.last_offset is None else max(owner.last_offset, off)
                            )
                elif ev == "rebalance":
                    if e.get("changed") is False or len(rebalances) >= MAX_REBALANCES:
                        continue
                    held = e.get("allocated")
                    rebalances.append(
                        [ts, e.get("node"), e.get("client_id"), e.get("group"), e.get("topic"),
                         len(held) if isinstance(held, list) else None]
                    )  # fmt: skip
                elif ev in ("broker_started", "broker_stopped"):
                    brokers.append([ts, ev, e.get("node")])
    rebalances.sort(key=lambda r: (r[0], str(r[1])))
    brokers.sort(key=lambda b: (b[0], str(b[2])))
    return rebalances, brokers


def build(data: Any, summary: dict[str, Any], files: Iterable[RunFile] = ()) -> dict[str, Any]:
    """The timeline document: what timeline.html draws and trace.json exports."""
    run = summary.get("run") or {}
    clock = getattr(data, "clock", None)
    t0 = int(getattr(clock, "t0_ms", None) or run.get("t0_ms") or data.run_start)
    scale = float(getattr(clock, "time_scale", None) or run.get("time_scale") or 1.0)
    index = _IntervalIndex(data.intervals)
    rebalances, brokers = scan_events(files, index)
    consumers: dict[str, int] = {}
    people: list[dict[str, Any]] = []
    queues: dict[tuple[str, str, str], dict[str, Any]] = {}
    for i, iv in enumerate(data.intervals):
        cid = iv["client_id"]
        if cid not in consumers:
            consumers[cid] = len(people)
            people.append({"client_id": cid, "node": iv.get("node") or cid, "group": iv["group"]})
        k = _key(iv["group"], iv["topic"], iv["queue"])
        row = queues.get(k)
        if row is None:
            broker, _, qid = iv["queue"].rpartition(":")
            row = queues[k] = {
                "group": iv["group"], "topic": iv["topic"], "broker": broker, "queue": qid, "iv": []
            }  # fmt: skip
        o = index.owners[i]
        row["iv"].append([iv["start"], iv["end"], consumers[cid], o.consumed, o.first_offset, o.last_offset])
    rows = sorted(queues.values(), key=lambda r: (r["group"], r["topic"], r["broker"], _qnum(r["queue"])))
    for r in rows:
        r["iv"].sort()
    return {
        "run": {
            "start_ms": data.run_start,
            "end_ms": data.run_end,
            "t0_ms": t0,
            "time_scale": scale,
            "simulated": False,
            "intervals_cut_at": getattr(data, "intervals_cut_at", None),
        },
        "consumers": people,
        "queues": rows,
        "nemeses": [[n["ts_ms"], n.get("action"), n.get("target")] for n in data.nemeses],
        "rebalances": rebalances,
        "brokers": brokers,
    }


def _qnum(q: str) -> tuple[int, str]:
    return (int(q), "") if q.isdigit() else (1 << 30, q)


# --------------------------------------------------------------------------------------------------
# trace.json


def trace(doc: dict[str, Any]) -> dict[str, Any]:
    """The Chrome trace event format: a process per group with a thread per queue (ownership slices),
    a process of consumers (pauses as slices, rebalances as instants) and nemesis actions and broker
    starts and stops as global instants. Microseconds of RocketMQ time since t = 0."""
    t0, scale = doc["run"]["t0_ms"], doc["run"]["time_scale"] or 1.0
    out: list[dict[str, Any]] = []

    def us(ts: int) -> int:
        return round((ts - t0) * 1000 / scale)

    def name(kind: str, pid: int, tid: int, text: str) -> None:
        out.append({"ph": "M", "name": kind, "pid": pid, "tid": tid, "args": {"name": text}})

    def span(text: str, cat: str, pid: int, tid: int, start: int, end: int, **args: Any) -> None:
        out.append(
            {"ph": "X", "name": text, "cat": cat, "pid": pid, "tid": tid, "ts": us(start),
             "dur": max(1, us(end) - us(start)), "args": args}
        )  # fmt: skip

    def instant(text: str, cat: str, ts: int, pid: int = 0, tid: int = 0, **args: Any) -> None:
        scope = "t" if pid else "g"  # a consumer's own track, or across the whole trace
        out.append(
            {
                "ph": "i",
                "s": scope,
                "name": text,
                "cat": cat,
                "pid": pid,
                "tid": tid,
                "ts": us(ts),
                "args": args,
            }
        )

    groups = sorted({r["group"] for r in doc["queues"]})
    pid_of = {g: i + 1 for i, g in enumerate(groups)}
    consumers_pid = len(groups) + 1
    for g, pid in pid_of.items():
        name("process_name", pid, 0, f"group {g}")
    name("process_name", consumers_pid, 0, "consumers")
    for tid, r in enumerate(doc["queues"], start=1):
        pid = pid_of[r["group"]]
        name("thread_name", pid, tid, f"{r['topic']} {r['broker']}:{r['queue']}")
        for start, end, c, n, first, last in r["iv"]:
            who = doc["consumers"][c]
            span(who["node"], "ownership", pid, tid, start, end,
                 client_id=who["client_id"], consumed=n, first_offset=first, last_offset=last)  # fmt: skip
    node_tid: dict[str, int] = {}
    for c in doc["consumers"]:
        if c["node"] not in node_tid:
            node_tid[c["node"]] = len(node_tid) + 1
            name("thread_name", consumers_pid, node_tid[c["node"]], c["node"])
    for node, start, end in paused_spans(doc):
        if node in node_tid:
            span("paused", "nemesis", consumers_pid, node_tid[node], start, end)
    for ts, node, client, group, topic, held in doc["rebalances"]:
        tid = node_tid.get(str(node))
        if tid is not None:
            instant("rebalance", "rebalance", ts, consumers_pid, tid,
                    group=group, topic=topic, queues=held, client_id=client)  # fmt: skip
    for ts, action, target in doc["nemeses"]:
        instant(f"{action} {target}", "nemesis", ts)
    for ts, event, node in doc["brokers"]:
        instant(f"{event} {node}", "broker", ts)
    return {
        "traceEvents": out,
        "displayTimeUnit": "ms",
        "otherData": {"clock": "RocketMQ time since the experiment's t = 0", "time_scale": scale},
    }


def paused_spans(doc: dict[str, Any]) -> list[tuple[str, int, int]]:
    """(node, start, end) of each pause, from the nemesis actions (a pause that is never resumed lasts
    to the run's end)."""
    open_at: dict[str, int] = {}
    out: list[tuple[str, int, int]] = []
    for ts, action, target in doc["nemeses"]:
        node = str(target)
        if action == "pause":
            open_at.setdefault(node, ts)
        elif action in ("resume", "kill", "stop", "restart") and node in open_at:
            out.append((node, open_at.pop(node), ts))
    out.extend((node, start, doc["run"]["end_ms"]) for node, start in open_at.items())
    return sorted(out, key=lambda s: (s[1], s[0]))


# --------------------------------------------------------------------------------------------------
# timeline.html


def render_html(doc: dict[str, Any], title: str) -> str:
    page = (Path(__file__).with_name("timeline_page.html")).read_text(encoding="utf-8")
    data = json.dumps(doc, separators=(",", ":")).replace("</", "<\\/")
    esc = title.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return page.replace("__TITLE__", esc).replace("__DATA__", data)


def write(
    out_dir: str | os.PathLike[str], data: Any, summary: dict[str, Any], run_dir: str | None, title: str
) -> None:
    """Write timeline.html and trace.json into ``out_dir`` (``run_dir``'s event files give the counts;
    None, e.g. for a Parquet copy, leaves them out)."""
    files = discover(run_dir) if run_dir is not None else []
    doc = build(data, summary, files)
    doc["run"]["simulated"] = run_dir is not None and is_simulated(run_dir)
    out = Path(out_dir)
    (out / TIMELINE_HTML).write_text(render_html(doc, title), encoding="utf-8")
    with open(out / TRACE_JSON, "w", encoding="utf-8") as fh:
        json.dump(trace(doc), fh, separators=(",", ":"))
