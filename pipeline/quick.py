"""The verdict the moment a run ends: the exact plain-Python analysis (the reference: the same
EVENTS.md definitions as the Spark analysis, which sweeps and small runs already use) of a run of up
to `QUICK_RUN_EVENTS` event lines, its verdict lines, and the check that the Spark analysis, which
writes summary.json and the report afterwards, agrees with it field by field."""

from __future__ import annotations

import os
from typing import Any

from rmqlab.pipeline.discover import RunDir, RunDirError, discover, read_manifest
from rmqlab.pipeline.small_runs import analyse_run

# The largest run answered at once, in event lines (what the analysis's time and memory grow with; bytes
# an event vary 2.5-fold between runs). Measured (scripts/bench/verdict.py and docs, "Quick verdict"):
# 168,050 events of `rmq-sim run sim-1000` take about 6 s and 0.6 GiB, 245,706 smaller synthetic events
# about 9 s and 0.5 GiB. Larger runs go to the Spark analysis only.
QUICK_RUN_EVENTS = 250_000


class RunTooLarge(Exception):
    """The run has more event lines than the quick verdict reads; the Spark analysis answers alone."""


def count_lines(run: RunDir, stop_after: int) -> int:
    """Lines of a run's event files (a last line without its newline counts), counted only until
    they pass ``stop_after``."""
    lines = 0
    for f in run.files:
        last = b"\n"
        with open(f.path, "rb") as fh:
            while chunk := fh.read(1 << 20):
                lines += chunk.count(b"\n")
                last = chunk[-1:]
                if lines > stop_after:
                    return lines
        lines += last != b"\n"
    return lines


def quick_summary(run_dir: str | os.PathLike[str], max_events: int | None = None) -> dict[str, Any] | None:
    """summary.json (with its answer) of a run by the reference, or None for a run without event files
    (there is nothing to say at once). Raises RunTooLarge past ``max_events`` event lines (default
    QUICK_RUN_EVENTS)."""
    cap = QUICK_RUN_EVENTS if max_events is None else max_events
    try:
        manifest = read_manifest(run_dir)
    except RunDirError:  # the runner's own file: nothing in it that the verdict needs
        manifest = {}
    run = RunDir(".", str(run_dir), discover(run_dir), manifest)
    if not run.files:
        return None
    if count_lines(run, cap) > cap:
        raise RunTooLarge(
            f"the run has more than {cap:,} event lines, the most the quick verdict reads; "
            "the Spark analysis (rmq-analyze) gives the verdict alone"
        )
    summary, _data = analyse_run(run, plots=True)
    return summary


def group_line(group: str, g: dict[str, Any], clock: str = "wall") -> str:
    """One group's verdict line, the one ``rmq-chaos``, ``rmq-sim`` and ``rmq-analyze`` print; ``clock``
    names the time of the durations (``wall`` or ``simulated``), given in RocketMQ seconds beside it where
    the run was time-scaled. Figures a summary lacks are left out."""
    conv = g.get("convergence") or []
    converged = [c for c in conv if c.get("converged")]
    worst = max((c.get("convergence_ms") or 0 for c in converged), default=0)
    rmq_conv = [
        c["convergence_rocketmq_ms"] for c in converged if c.get("convergence_rocketmq_ms") is not None
    ]
    slowest = (
        f"{max(rmq_conv) / 1000:.1f} s RocketMQ ({worst} ms {clock})" if rmq_conv else f"{worst} ms {clock}"
    )
    not_conv = len(conv) - len(converged)
    rmq = g.get("rocketmq_time")
    if rmq is not None:
        times = (
            f"  RocketMQ s summed over queues: overlap {rmq['overlap_ms'] / 1000:.1f}"
            f"  orphan {rmq['orphan_ms'] / 1000:.1f}  stalled {rmq['stalled_ms'] / 1000:.1f}"
            f"  unavailable {rmq['unavailable_ms'] / 1000:.1f}"
        )
    elif "overlap_ms" in g:
        times = f"  overlap {g['overlap_ms']} ms  orphan {g['orphan_ms']} ms  stalled {g['stalled_ms']} ms"
    else:
        times = ""
    regressions = g.get("offset_regressions") or []
    return (
        f"{group}: {g['verdict'].upper()}  sent {g['sent']}  consumed {g['consumed_unique']}"
        f"  lost {g['lost']}  duplicates {g['duplicates']}{times}  slowest convergence {slowest}"
        + (f"  never converged {not_conv}" if not_conv else "")
        + (
            f"  offsets moved back {len(regressions)}x ({g['regression_redelivered']} delivered again)"
            if regressions
            else ""
        )
        + (
            f"  slave offsets moved back {len(g['slave_offset_regressions'])}x"
            if g.get("slave_offset_regressions")
            else ""
        )
    )


def failed_groups(summary: dict[str, Any]) -> list[str]:
    return [group for group, g in summary["groups"].items() if g["verdict"] != "ok"]


def verdict_lines(summary: dict[str, Any], clock: str = "wall") -> list[str]:
    """Each group's line, the answer's sentences and the verdict."""
    lines = [group_line(group, g, clock) for group, g in summary["groups"].items()]
    if not summary["groups"]:
        lines.append("no consumer group in this run")
    lines += [f"answer: {sentence}" for sentence in summary.get("answer") or []]
    failed = failed_groups(summary)
    lines.append(f"verdict: {'FAIL (' + ', '.join(failed) + ')' if failed else 'OK'}")
    return lines


def first_difference(a: Any, b: Any, path: str = "") -> str | None:
    """Where two summaries first differ (the first's value, then the second's), or None."""
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b)):
            found = first_difference(a.get(key, "<missing>"), b.get(key, "<missing>"), f"{path}.{key}")
            if found:
                return found
        return None
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            found = first_difference(x, y, f"{path}[{i}]")
            if found:
                return found
        return None
    return None if a == b else f"{path}: {a!r} != {b!r}"


def disagreement(quick: dict[str, Any], full: dict[str, Any]) -> str | None:
    """Where the quick verdict's summary and the Spark analysis's differ, or None when they agree.
    The analysis may add what the reference leaves out (``pop`` figures of a POP run, its modes);
    every field both have must be equal."""
    shared_full = {k: v for k, v in full.items() if k in quick}
    where = first_difference(quick, shared_full)
    return None if where is None else f"the quick verdict and the analysis disagree at {where}"


__all__ = [
    "QUICK_RUN_EVENTS",
    "RunTooLarge",
    "count_lines",
    "disagreement",
    "failed_groups",
    "first_difference",
    "group_line",
    "quick_summary",
    "verdict_lines",
]
