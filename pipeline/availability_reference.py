"""The inputs of `pipeline.unavailability` computed in plain Python from an ordered event list: the
reference the Spark code (`pipeline.availability_spark`) is checked against."""

from __future__ import annotations

import os
from collections import defaultdict
from typing import Any

from rmqlab.pipeline.contract import queue_key
from rmqlab.pipeline.metrics_reference import Event, RunModel, load_run, summarize
from rmqlab.pipeline.pop_reference import add_modes, mode_metrics
from rmqlab.pipeline.unavailability import (
    SIDE_EVENTS,
    GroupInputs,
    QueueInputs,
    RunClock,
    broker_markers,
    classify_group,
    extend_summary,
    quiet_spans,
    run_clock,
    waiting_spans,
)


def group_inputs(
    model: RunModel, clock: RunClock
) -> tuple[dict[str, dict[tuple[str, str], QueueInputs]], dict[str, GroupInputs]]:
    threshold = clock.idle_threshold_ms
    sent: dict[tuple[str, str], tuple[int, str, str]] = {}  # (group, msg) -> (ts, topic, queue)
    first: dict[tuple[str, str], int] = {}
    consumed: dict[tuple[str, str, str], list[int]] = defaultdict(list)
    topic_groups: dict[str, list[str]] = defaultdict(list)
    for g, topics in model.group_topics.items():
        for topic in topics:
            topic_groups[topic].append(g)
    for e in model.events:
        if e.event == "message_sent":
            for g in topic_groups.get(e.get("topic"), ()):
                key = (g, e.get("msg_id"))
                if key not in sent:
                    sent[key] = (e.ts, e.get("topic"), queue_key(e.get("broker"), e.get("queue_id")))
        elif e.event == "message_consumed" and e.get("topic") in model.consumption_topics(e.get("group")):
            g = e.get("group")
            first.setdefault((g, e.get("msg_id")), e.ts)
            consumed[(g, e.get("topic"), queue_key(e.get("broker"), e.get("queue_id")))].append(e.ts)
    waits: dict[tuple[str, str, str], list[tuple[int, int]]] = defaultdict(list)
    for (g, msg), (ts, topic, queue) in sent.items():
        waits[(g, topic, queue)].append((ts, first.get((g, msg), model.run_end)))
    queues: dict[str, dict[tuple[str, str], QueueInputs]] = defaultdict(dict)
    for (g, topic, queue), spans in waits.items():
        waiting = waiting_spans(spans, threshold)
        if not waiting:
            continue
        q = QueueInputs(waiting=waiting)
        q.quiet = quiet_spans(waiting, sorted(consumed.get((g, topic, queue), [])), threshold)
        q.owners = [
            (iv.client, iv.start, iv.end)
            for iv in model.intervals_by_queue.get((g, topic, queue), [])
            if iv.end > iv.start
        ]
        queues[g][(topic, queue)] = q
    groups = {g: _group_facts(model, g) for g in queues}
    return queues, groups


def _group_facts(model: RunModel, group: str) -> GroupInputs:
    out = GroupInputs()
    clients = model.group_clients[group]
    state: dict[str, int | None] = {}
    live: dict[str, list[tuple[int, int]]] = defaultdict(list)
    paused_nodes: dict[str, int | None] = {}
    node_pauses: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for e in model.events:
        ev = e.event
        if ev == "consumer_started" and e.get("group") == group:
            c = e.get("client_id")
            if state.get(c) is None:
                state[c] = e.ts
        elif ev == "consumer_stopped" or (ev == "nemesis" and e.get("action") in ("kill", "stop")):
            dead = (
                [e.get("client_id")]
                if ev == "consumer_stopped"
                else [c for c in clients if e.get("target") in model.client_nodes.get(c, ())]
            )
            for c in dead:
                if state.get(c) is not None:
                    live[c].append((state[c], e.ts))
                    state[c] = None
        if ev == "nemesis":
            node, action = e.get("target"), e.get("action")
            if action == "pause" and paused_nodes.get(node) is None:
                paused_nodes[node] = e.ts
            elif action in ("resume", "kill", "stop") and paused_nodes.get(node) is not None:
                node_pauses[node].append((paused_nodes[node], e.ts))  # type: ignore[arg-type]
                paused_nodes[node] = None
        if ev == "rebalance" and e.get("group") == group:
            out.rebalances.setdefault((e.get("client_id"), e.get("topic")), []).append(
                (e.ts, frozenset(e.get("allocated")))
            )
    never = 2**63 - 1
    for c, since in state.items():
        if since is not None:
            live[c].append((since, never))
    for node, since in paused_nodes.items():
        if since is not None:
            node_pauses[node].append((since, never))
    out.live = {c: v for c, v in live.items() if c in clients}
    for c in clients:
        spans = [s for n in model.client_nodes.get(c, ()) for s in node_pauses.get(n, [])]
        if spans:
            out.pauses[c] = sorted(spans)
    return out


def side_events(events: list[Event]) -> list[dict[str, Any]]:
    return [e.rec for e in events if e.event in SIDE_EVENTS]


def summarize_with_rocketmq_time(
    events: list[Event], malformed: int, time_scale: float | None = None, model: RunModel | None = None
) -> dict[str, Any]:
    """summary.json with the RocketMQ-time additions, as `rmq-analyze` writes it (`model`: the events'
    model, when the caller has built it already)."""
    model = RunModel(events) if model is None else model
    summary = summarize(events, malformed, model)
    side = side_events(events)
    start = min((e.ts for e in events), default=None)
    clock = run_clock(side, start, time_scale)
    queues, groups = group_inputs(model, clock)
    availability = {g: classify_group(queues[g], groups[g], clock.idle_threshold_ms) for g in queues}
    node_of = {c: min(nodes) for c, nodes in model.client_nodes.items() if nodes}
    markers = {g: broker_markers(side, g, node_of) for g in summary["groups"]}
    extended = extend_summary(summary, clock, availability, markers)
    pop = mode_metrics(e.rec for e in events) if model.server_assigned & model.groups else None
    add_modes(extended, {g: model.mode(g) for g in model.groups}, pop)
    return extended


def summarize_run(run_dir: str | os.PathLike[str], time_scale: float | None = None) -> dict[str, Any]:
    events, malformed = load_run(run_dir)
    return summarize_with_rocketmq_time(events, malformed, time_scale)
