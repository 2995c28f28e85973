"""A sweep's report: every run of a sweep summarised (``summary.json``, as ``rmq-analyze ROOT`` writes it),
then per parameter point and group the distribution of each metric over the seeds (median, p90, p99, max;
runs that lost messages and runs that failed counted) as ``sweep.parquet``/``sweep.csv``, and
``sweep.html`` with each metric plotted against each varied parameter and the failing runs' replay
commands.

A sweep's runs are small, so each is analysed inside its own Spark task, right after its simulation, by
the plain-Python twin of the analysis (``pipeline.availability_reference``, which the twin tests hold
equal to the Spark analysis); the driver gathers the summaries. A run without one (a task whose analysis
failed, a run finished by an older sweep) is analysed by the Spark analysis of many runs
(``pipeline.runs``) in the same application.

Queue moves are counted from the ownership intervals: every interval of a queue after its first is a
move (to another consumer, or back to the same one after a drop); ``queues_moved_per_change`` divides
them by the group's change points.
"""

from __future__ import annotations

import html
import json
import math
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rmqlab.cli import Progress
from rmqlab.pipeline.discover import MANIFEST, RunDir, RunDirError, discover
from rmqlab.pipeline.ingest import run_prefix
from rmqlab.pipeline.runs import (
    RootResult,
    analyse_runs,
    split_qualified,
    table_rows,
    write_outputs,
    write_table,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from rmqlab.pipeline.metrics_spark import Analysis

SWEEP_TABLE = "sweep"  # sweep.parquet/ and sweep.csv
SWEEP_HTML = "sweep.html"
SUMMARY = "summary.json"  # written by each run's task, as rmq-analyze ROOT writes it
# Per-run figures summarised over the seeds of a point (the runs table's columns plus the moves).
SWEEP_METRICS = (
    "lost", "duplicates", "duplicated_messages", "overlap_ms", "orphan_ms", "stalled_ms",
    "concurrent_consume_ms", "order_violations", "changes", "not_converged", "max_convergence_ms",
    "queue_moves", "queues_moved_per_change", "offset_regressions", "regression_redelivered",
)  # fmt: skip
STATS = (("median", 0.5), ("p90", 0.9), ("p99", 0.99), ("max", 1.0))


def _moves(intervals: list[tuple[str, str, str]]) -> dict[str, int]:
    """Group -> ownership intervals beyond the first of each queue, from (group, topic, queue) triples."""
    count: dict[str, int] = defaultdict(int)
    queues: dict[str, set[tuple[str, str]]] = defaultdict(set)
    for group, topic, queue in intervals:
        count[group] += 1
        queues[group].add((topic, queue))
    return {g: n - len(queues[g]) for g, n in count.items()}


def queue_moves(analysis: Analysis) -> dict[tuple[str, str], int]:
    """(run prefix, group) -> queue moves, from a Spark analysis of many runs."""
    moves = _moves([(iv.group, iv.topic, iv.queue) for iv in analysis.control.intervals])
    return {split_qualified(g): n for g, n in moves.items()}


def summarize_sweep_run(run_dir: Path) -> dict[str, int]:
    """Analyse one finished run in plain Python (in its Spark task): write its summary.json as
    ``rmq-analyze ROOT`` does and return its queue moves by group."""
    from rmqlab.pipeline.availability_reference import summarize_with_rocketmq_time
    from rmqlab.pipeline.metrics_reference import RunModel, load_run
    from rmqlab.pipeline.report_story import answers

    events, malformed = load_run(run_dir)
    model = RunModel(events)
    summary = summarize_with_rocketmq_time(events, malformed, None, model)
    summary["answer"] = answers(summary, None)  # a root's analysis writes no plot data, so no answer
    (run_dir / SUMMARY).write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    # the control plane keeps the intervals that last (end > start); the reference keeps them all
    return _moves([(iv.group, iv.topic, iv.queue) for iv in model.intervals if iv.end > iv.start])


def sweep_runs(out: Path, rels: list[str]) -> list[RunDir]:
    """The sweep's runs by their manifests, sorted, without their event files: the driver knows where
    its runs are, and a run its task analysed needs no file listing (``discover_runs`` over 1,000 runs
    took 1.5 CPU s, nearly all of it listing and resolving the event files; the manifests alone 0.2 s).
    A run whose manifest cannot be read is left out, as ``discover_runs`` leaves it out (every run of a
    sweep has one)."""
    runs = []
    for rel in sorted(rels):
        path = out / rel
        try:
            manifest = json.loads((path / MANIFEST).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(manifest, dict):
            runs.append(RunDir(rel, str(path.resolve()), [], manifest))
    return runs


def _task_summary(run: RunDir, outcome: dict[str, Any]) -> dict[str, Any] | None:
    """The summary its task wrote, when the task analysed the run."""
    if not isinstance(outcome.get("queue_moves"), dict):
        return None
    try:
        summary = json.loads((Path(run.path) / SUMMARY).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return summary if isinstance(summary, dict) and "groups" in summary else None


def quantile(values: list[float], q: float) -> float:
    """Linear interpolation between the closest ranks (numpy's default), of sorted values."""
    pos = (len(values) - 1) * q
    lo = math.floor(pos)
    hi = min(lo + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (pos - lo)


def point_rows(
    params: list[str], rows: list[dict[str, Any]], failed: set[str]
) -> tuple[list[str], list[dict[str, Any]]]:
    """The sweep table: one row per point (its parameters) and group, the seeds' distributions."""
    by_point: dict[tuple[Any, ...], list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        by_point[(*(r.get(p) for p in params), r["group"])].append(r)
    columns = [*params, "group", "runs", "failed_runs", "lost_runs"]
    columns += [f"{m}_{name}" for m in SWEEP_METRICS for name, _ in STATS]
    out = []
    for key, group_rows in by_point.items():
        row: dict[str, Any] = dict(zip([*params, "group"], key, strict=True))
        row["runs"] = len(group_rows)
        row["failed_runs"] = sum(1 for r in group_rows if r["verdict"] == "fail" or r["run"] in failed)
        row["lost_runs"] = sum(1 for r in group_rows if (r.get("lost") or 0) > 0)
        for m in SWEEP_METRICS:
            values = sorted(float(r[m]) for r in group_rows if r.get(m) is not None)
            for name, q in STATS:
                row[f"{m}_{name}"] = round(quantile(values, q), 3) if values else None
        out.append(row)
    return columns, out


def analyse_sweep(
    spark: SparkSession,
    out: Path,
    sweep: dict[str, Any],
    outcomes: dict[str, dict[str, Any]],
    note: Callable[[str], None],
    show_progress: bool = True,
) -> list[dict[str, Any]]:
    """Analyse the sweep's finished runs under `out` and write every output; returns the failing runs."""
    finished = sweep_runs(out, [rel for rel, o in outcomes.items() if o.get("status") in ("ok", "error")])
    progress = Progress(prefix="rmq-sim sweep", enabled=show_progress)
    result = RootResult([], [])
    moves: dict[tuple[str, str], int] = {}  # (run, group) -> queue moves
    in_spark = []
    for run in finished:
        summary = _task_summary(run, outcomes[run.rel])
        if summary is None:
            try:  # the Spark analysis reads its event files
                run.files = discover(run.path)
            except RunDirError:
                continue
            if run.files:
                result.runs.append(run)
                in_spark.append(run)
            continue
        result.runs.append(run)
        result.summaries[run.rel] = summary
        moves.update(((run.rel, g), n) for g, n in outcomes[run.rel]["queue_moves"].items())
    note(
        f"{len(result.summaries)} run(s) analysed in their tasks"
        + (f"; analysing {len(in_spark)} in Spark" if in_spark else "")
    )
    if in_spark:
        by_spark = analyse_runs(spark, in_spark, [], plots=False, progress=progress, extra=queue_moves)
        result.summaries.update(by_spark.summaries)
        rel_of = {run_prefix(i): run.rel for i, run in enumerate(in_spark)}
        moves.update(((rel_of[p], g), n) for (p, g), n in (by_spark.extra or {}).items())
    with progress.stage("runs table"):
        written = set(result.summaries) - {run.rel for run in in_spark}  # read from the tasks' files
        write_outputs(
            spark, result, out, reports=False, title=f"Runs of sweep {sweep['name']}", written=written
        )
    _columns, rows = table_rows(result)
    for r in rows:
        if r["group"] is None:
            continue
        n = moves.get((r["run"], r["group"]), 0)
        r["queue_moves"] = n
        r["queues_moved_per_change"] = round(n / r["changes"], 3) if r.get("changes") else None
    failing = []
    for rel, o in sorted(outcomes.items()):
        groups = result.summaries.get(rel, {}).get("groups", {})
        bad_groups = sorted(g for g, s in groups.items() if s["verdict"] != "ok")
        if o.get("status") != "ok" or bad_groups:
            why = (
                f"simulation {o.get('status')}: {o.get('error')}"
                if o.get("status") != "ok"
                else f"verdict fail ({', '.join(bad_groups)})"
            )
            run_dir = out / rel
            command = (
                f"rmq-sim run {run_dir / 'experiment.toml'} --out {run_dir}-again"
                if o.get("status") == "crashed"
                else f"rmq-sim replay {run_dir}"
            )
            failing.append({"run": rel, "why": why, "command": command})
    params = [f"param.{k}" for k in sweep["vary"]]
    failed_rels = {f["run"] for f in failing}
    columns, table = point_rows(params, rows, failed_rels)
    with progress.stage("sweep table and report"):
        write_table(spark, columns, table, out, SWEEP_TABLE)
        (out / SWEEP_HTML).write_text(
            render_sweep(sweep, columns, table, failing, len(outcomes)), encoding="utf-8"
        )
    note(f"sweep table: {out / 'sweep.parquet'}, {out / 'sweep.csv'}; report: {out / SWEEP_HTML}")
    return failing


# -- sweep.html ----------------------------------------------------------------------------------------------


def _is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def sweep_plots(params: list[str], rows: list[dict[str, Any]], limit: int = 60) -> list[tuple[str, str]]:
    """(title, png) per metric and varied parameter: the median over seeds (line, dots) and p90 (dashed)
    against the parameter, one series per value of the other varied parameters (and group)."""
    from matplotlib.figure import Figure

    from rmqlab.pipeline.report_plots import figure_png

    plots: list[tuple[str, str]] = []
    metrics = [m for m in SWEEP_METRICS if any(r.get(f"{m}_median") for r in rows)]
    groups = sorted({str(r["group"]) for r in rows})
    for metric in metrics:
        for param in params:
            if len(plots) >= limit:
                return plots
            others = [p for p in params if p != param]
            xs = [r[param] for r in rows]
            numeric = all(_is_number(x) for x in xs)
            cats = sorted({str(x) for x in xs}) if not numeric else []
            series: dict[str, list[tuple[float, float, float]]] = defaultdict(list)
            for r in rows:
                if r.get(f"{metric}_median") is None:
                    continue
                label = ", ".join(f"{p.removeprefix('param.').split('.')[-1]}={r[p]}" for p in others)
                if len(groups) > 1:
                    label = f"{label}, {r['group']}" if label else str(r["group"])
                x = float(r[param]) if numeric else float(cats.index(str(r[param])))
                series[label or metric].append((x, r[f"{metric}_median"], r[f"{metric}_p90"]))
            fig = Figure(figsize=(5.6, 3.4))
            ax = fig.subplots()
            for i, (label, pts) in enumerate(sorted(series.items())):
                pts.sort()
                color = f"C{i % 10}"
                ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", color=color, label=label, ms=4)
                ax.plot([p[0] for p in pts], [p[2] for p in pts], "--", color=color, alpha=0.5, lw=1)
            if not numeric:
                ax.set_xticks(range(len(cats)), cats, rotation=20, ha="right", fontsize=8)
            elif len({float(x) for x in xs}) <= 12:
                ax.set_xticks(sorted({float(x) for x in xs}))
            name = param.removeprefix("param.")
            ax.set_xlabel(name)
            # a sweep's runs are simulated (rmq-sim sweep): their milliseconds are not wall time
            ax.set_ylabel(f"{metric} (simulated)" if metric.endswith("_ms") else metric)
            ax.set_title(f"{metric} by {name} (median, p90 dashed)", fontsize=9)
            if len(series) > 1:
                ax.legend(fontsize=7)
            plots.append((f"{metric} by {name}", figure_png(fig)))
    return plots


def render_sweep(
    sweep: dict[str, Any],
    columns: list[str],
    rows: list[dict[str, Any]],
    failing: list[dict[str, Any]],
    runs: int,
) -> str:
    esc = html.escape
    params = [c for c in columns if c.startswith("param.")]
    title = f"Sweep {sweep['name']}"
    parts = [
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>",
        f"<title>{esc(title)}</title>",
        "<style>body{font-family:sans-serif;margin:2em;color:#222}table{border-collapse:collapse}"
        "td,th{border:1px solid #ccc;padding:2px 5px;font-size:12px;text-align:right;white-space:nowrap}"
        "th{background:#f4f4f4;position:sticky;top:0}td.p{text-align:left}.fail{color:#b00;font-weight:bold}"
        "img{border:1px solid #eee;margin:4px;vertical-align:top}code{background:#f6f6f6;padding:1px 3px}"
        ".wrap{overflow-x:auto;max-height:40em}</style></head><body>",
        f"<h1>{esc(title)}</h1>",
    ]
    if sweep.get("question"):
        parts.append(f"<p><b>Question:</b> {esc(sweep['question'])}</p>")
    varied = "; ".join(f"{esc(k)} in {esc(json.dumps(v))}" for k, v in sweep["vary"].items()) or "nothing"
    parts.append(
        f"<p>Base experiment <code>{esc(sweep['base'])}</code>; varied: {varied}; seeds "
        f"{esc(', '.join(map(str, sweep['seeds'])))}; {len(sweep['points'])} point(s), {runs} run(s), "
        f"{len(failing)} failing. Every run's metrics: <a href='index.html'>index.html</a> and "
        "<code>runs.csv</code>. Times are ms of RocketMQ time summed over queues as in each run's "
        "summary; queue moves are ownership intervals of a queue beyond its first.</p>"
    )
    parts.append(
        "<h2>Per point: the distribution over seeds</h2><p>Each metric's cell is median / p90 / p99 / max "
        "over the point's runs (sweep.csv has them as columns).</p><div class='wrap'><table><thead><tr>"
    )
    counts = [*params, "group", "runs", "failed_runs", "lost_runs"]
    shown = [m for m in SWEEP_METRICS if any(r.get(f"{m}_max") is not None for r in rows)]
    parts += [f"<th>{esc(c.removeprefix('param.'))}</th>" for c in (*counts, *shown)]
    parts.append("</tr></thead><tbody>")

    def num(v: Any) -> str:
        return "" if v is None else f"{v:g}" if isinstance(v, float) else str(v)

    for row in rows:
        cells = []
        for c in counts:
            cls = " class='p'" if c in params or c == "group" else ""
            if c == "failed_runs" and row[c]:
                cls = " class='fail'"
            cells.append(f"<td{cls}>{esc(num(row[c]))}</td>")
        for m in shown:
            cells.append(f"<td>{esc(' / '.join(num(row[f'{m}_{name}']) for name, _ in STATS))}</td>")
        parts.append("<tr>" + "".join(cells) + "</tr>")
    parts.append("</tbody></table></div>")
    parts.append("<h2>Failing runs</h2>")
    if failing:
        parts.append("<p>Each reproduces byte for byte with its command.</p><ul>")
        parts += [
            f"<li>{esc(f['run'])}: {esc(f['why'])}<br><code>{esc(f['command'])}</code></li>" for f in failing
        ]
        parts.append("</ul>")
    else:
        parts.append("<p>None: every run's verdict is ok.</p>")
    plots = sweep_plots(params, rows) if rows and params else []
    if plots:
        parts.append("<h2>Metrics by varied parameter</h2>")
        parts += [f"<img alt='{esc(t)}' title='{esc(t)}' src='data:image/png;base64,{p}'>" for t, p in plots]
    parts.append("</body></html>")
    return "".join(parts)
