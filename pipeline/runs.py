"""Many runs in one Spark application: every run's summary from one set of jobs (the run is part of
every key, see `pipeline.ingest.RUN_SEP`), the plot data of every run in one pass, a table of every run
and group (Parquet and CSV) and an index page that compares runs."""

from __future__ import annotations

import csv
import html
import json
import math
import os
from collections import defaultdict
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rmqlab.pipeline.availability_spark import AVAILABILITY_COLUMNS, add_rocketmq_time_of_runs
from rmqlab.pipeline.contract import GROUP_METRICS
from rmqlab.pipeline.discover import BadRun, RunDir, clock_word
from rmqlab.pipeline.ingest import RUN_SEP, load_json_runs, run_prefix
from rmqlab.pipeline.metrics_spark import Analysis
from rmqlab.pipeline.pop_spark import add_pop_metrics_of_runs
from rmqlab.pipeline.report_data import MAX_INTERVALS, PlotData, plot_data_by_run
from rmqlab.pipeline.report_story import answers, manifest_engine
from rmqlab.pipeline.unavailability import CAUSES

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from rmqlab.cli import Progress

RUNS_TABLE = "runs"  # runs.parquet/ and runs.csv
INDEX = "index.html"
# Columns of the runs table besides the parameters and the metrics.
CONVERGENCE_COLUMNS = ("changes", "not_converged", "max_convergence_ms")
REGRESSION_COLUMNS = ("offset_regressions", "regression_redelivered")  # a count, and their deliveries
# Unavailability (pipeline.unavailability) in RocketMQ milliseconds: in all, then by cause.
UNAVAILABILITY_COLUMNS = ("unavailable_rocketmq_ms", *(f"unavailable_{c}_rocketmq_ms" for c in CAUSES))


@dataclass
class RootResult:
    """What one analysis of a root of runs produced."""

    runs: list[RunDir]
    bad: list[BadRun]
    summaries: dict[str, dict[str, Any]] = field(default_factory=dict)  # by run's relative path
    plot_data: dict[str, PlotData] = field(default_factory=dict)
    extra: Any = None  # what analyse_runs' `extra` returned


# A manifest's (and its experiment table's) fields that describe the run rather than set it up: text
# for a person (the experiment's question, the file it came from), never a parameter to compare by.
DESCRIPTIVE_FIELDS = ("name", "seed", "question", "source")


def experiment_of(manifest: dict[str, Any]) -> tuple[str | None, Any, dict[str, Any]]:
    """(experiment name, seed, parameters) of a run's manifest: the parameters are the scalar values of
    its `params` (a sweep's), else of its `experiment` table, flattened with dotted names, without the
    descriptive fields (`DESCRIPTIVE_FIELDS`)."""
    name = manifest.get("name")
    exp = manifest.get("experiment") if isinstance(manifest.get("experiment"), dict) else {}
    if name is None:
        name = exp.get("name")
    seed = manifest.get("seed", exp.get("seed"))
    source = manifest.get("params") if isinstance(manifest.get("params"), dict) else exp
    params: dict[str, Any] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, dict):
            for key, item in value.items():
                walk(f"{prefix}{key}.", item)
        elif isinstance(value, bool | int | float | str) and prefix[:-1] not in DESCRIPTIVE_FIELDS:
            params[prefix[:-1]] = value

    walk("", source)
    return (None if name is None else str(name)), seed, params


def question_of(manifest: dict[str, Any]) -> str | None:
    """The question a run's experiment asks (its TOML's `question`), None when it has none."""
    exp = manifest.get("experiment") if isinstance(manifest.get("experiment"), dict) else {}
    question = manifest.get("question") or exp.get("question")
    return str(question) if question else None


def analyse_runs(
    spark: SparkSession,
    runs: list[RunDir],
    bad: list[BadRun],
    *,
    plots: bool = True,
    progress: Progress | None = None,
    extra: Callable[[Analysis], Any] | None = None,
) -> RootResult:
    """Analyse every run in one Spark application; one set of jobs for all of them. `extra`, when
    given, computes more from the same analysis before it is released (into `result.extra`)."""
    result = RootResult(runs, bad)
    if not runs:
        return result

    def stage(name: str) -> Any:
        from contextlib import nullcontext

        return progress.stage(name) if progress is not None else nullcontext({})

    with stage("read events") as info:
        # the rebalances' allocations too: a queue allocated to a live consumer but not yet taken is
        # waiting for its lock, not ownerless (as in a single run's analysis)
        loaded = load_json_runs(spark, runs, AVAILABILITY_COLUMNS)
        info["info"] = (
            f"{len(runs)} runs, {sum(s.events for s in loaded.stats.values())} events, "
            f"{sum(s.malformed_lines for s in loaded.stats.values())} malformed lines"
        )
    analysis = Analysis(loaded.events, next(iter(loaded.stats.values())), runs=loaded.stats)
    try:
        with stage("metrics") as info:
            by_prefix = analysis.summaries()
            info["info"] = f"{sum(len(s['groups']) for s in by_prefix.values())} group(s) in {len(runs)} runs"
        with stage("unavailability"):
            clocks = add_rocketmq_time_of_runs(by_prefix, analysis, runs)
        with stage("pop metrics"):
            add_pop_metrics_of_runs(by_prefix, analysis, runs)
        result.summaries = {run.rel: by_prefix[run_prefix(i)] for i, run in enumerate(runs)}
        data = None
        if plots:
            with stage("plot data"):
                data = collect_plot_data_of_runs(analysis, loaded.stats)
        for i, run in enumerate(runs):
            prefix = run_prefix(i)
            summary = by_prefix[prefix]
            if data is not None:
                data[prefix].clock = clocks[prefix]
                result.plot_data[run.rel] = data[prefix]
            known = run.manifest.get("known")
            summary["answer"] = answers(
                summary,
                None if data is None else data[prefix],
                known if isinstance(known, dict) else None,
                manifest_engine(run.manifest),
            )
        if extra is not None:
            result.extra = extra(analysis)
    finally:
        analysis.close()
        loaded.release()
    return result


def split_qualified(name: str) -> tuple[str, str]:
    """(run prefix, name) of a name qualified by its run (`pipeline.ingest.RUN_SEP`)."""
    cut = name.index(RUN_SEP) + 1
    return name[:cut], name[cut:]


def collect_plot_data_of_runs(
    analysis: Analysis, stats: dict[str, Any], max_intervals: int = MAX_INTERVALS
) -> dict[str, PlotData]:
    """The report's plot data of every run by run prefix (the single-run report's implementation, with
    buckets per run)."""
    spans = {p: (s.start_ms or 0, s.end_ms or 0) for p, s in stats.items()}
    return plot_data_by_run(analysis, spans, max_intervals)


# -- the runs table ----------------------------------------------------------------------------------------


def table_rows(result: RootResult) -> tuple[list[str], list[dict[str, Any]]]:
    """(columns, rows) of the runs table: one row per run and group (a run without groups gets one row
    with an empty group), with the run's experiment, its question (text, not a parameter), seed,
    parameters, every metric and the verdict."""
    params_seen: dict[str, None] = {}
    rows: list[dict[str, Any]] = []
    for run in result.runs:
        experiment, seed, params = experiment_of(run.manifest)
        for key in params:
            params_seen.setdefault(f"param.{key}", None)
        summary = result.summaries[run.rel]
        base: dict[str, Any] = {
            "run": run.rel,
            "experiment": experiment,
            "question": question_of(run.manifest),
            "seed": None if seed is None else str(seed),
            **{f"param.{k}": v for k, v in params.items()},
            "events": summary["run"]["events"],
            "malformed_lines": summary["run"]["malformed_lines"],
            "time_scale": summary["run"].get("time_scale"),
        }
        groups = summary["groups"] or {None: None}
        for name, g in groups.items():
            row = dict(base, group=name)
            if g is not None:
                conv = g["convergence"]
                row.update({m: g[m] for m in GROUP_METRICS})
                row["changes"] = len(conv)
                row["not_converged"] = sum(1 for c in conv if not c["converged"])
                row["max_convergence_ms"] = max(
                    (c["convergence_ms"] for c in conv if c["converged"]), default=None
                )
                # absent from a summary.json written before them (a resumed sweep reads its runs')
                regressions = g.get("offset_regressions")
                row["offset_regressions"] = None if regressions is None else len(regressions)
                row["regression_redelivered"] = g.get("regression_redelivered")
                un = g.get("unavailability")
                if un is not None:
                    row["unavailable_rocketmq_ms"] = un["total_rocketmq_ms"]
                    for cause, ms in un["by_cause_rocketmq_ms"].items():
                        row[f"unavailable_{cause}_rocketmq_ms"] = ms
                row["verdict"] = g["verdict"]
            rows.append(row)
    columns = [
        "run", "experiment", "question", "seed", *params_seen, "group", "events", "malformed_lines",
        "time_scale", *GROUP_METRICS, *CONVERGENCE_COLUMNS, *REGRESSION_COLUMNS, *UNAVAILABILITY_COLUMNS,
        "verdict",
    ]  # fmt: skip
    return columns, [{c: row.get(c) for c in columns} for row in rows]


def write_table(
    spark: SparkSession, columns: list[str], rows: list[dict[str, Any]], out: Path, name: str = RUNS_TABLE
) -> None:
    """NAME.csv (one file) and NAME.parquet (a Spark folder, readable by any Parquet reader); a column's
    type is boolean, long or double when all its values are, else string."""
    with open(out / f"{name}.csv", "w", encoding="utf-8", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)
    from pyspark.sql.types import BooleanType, DoubleType, LongType, StringType, StructField, StructType

    def kind(column: str) -> Any:
        values = [r[column] for r in rows if r[column] is not None]
        if values and all(isinstance(v, bool) for v in values):
            return BooleanType()
        if values and all(isinstance(v, int) and not isinstance(v, bool) for v in values):
            return LongType()
        if values and all(isinstance(v, int | float) and not isinstance(v, bool) for v in values):
            return DoubleType()
        return StringType()

    schema = StructType([StructField(c, kind(c)) for c in columns])

    def typed_value(column: str, value: Any) -> Any:
        data_type = schema[column].dataType
        if value is None or isinstance(data_type, LongType | BooleanType):
            return value
        return float(value) if isinstance(data_type, DoubleType) else str(value)

    typed = [tuple(typed_value(c, r[c]) for c in columns) for r in rows]
    frame = spark.createDataFrame(typed, schema)
    frame.coalesce(1).write.mode("overwrite").parquet(os.fspath(out / f"{name}.parquet"))


# -- index.html --------------------------------------------------------------------------------------------

_SORT_JS = """
document.querySelectorAll('th').forEach((th, i) => th.addEventListener('click', () => {
  const body = th.closest('table').tBodies[0];
  const asc = th.dataset.dir !== 'asc'; th.dataset.dir = asc ? 'asc' : 'desc';
  const key = r => { const t = r.cells[i].textContent; const n = parseFloat(t);
                     return t !== '' && !isNaN(n) && isFinite(t) ? n : t; };
  [...body.rows].sort((a, b) => { const x = key(a), y = key(b);
    return (x < y ? -1 : x > y ? 1 : 0) * (asc ? 1 : -1); }).forEach(r => body.appendChild(r));
}));
"""


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


MAX_TICK_LABELS = 60  # categories named under a plot of index.html; more are only counted


PLOTTED_METRICS = (*GROUP_METRICS, "max_convergence_ms")


def constant_metrics(rows: list[dict[str, Any]]) -> list[tuple[str, Any]]:
    """The metrics with one and the same value in every run and group (a plot of them says nothing)."""
    out = []
    for m in PLOTTED_METRICS:
        values = {r.get(m) for r in rows if r.get(m) is not None}
        if len(values) == 1:
            out.append((m, values.pop()))
    return out


def metric_plots(
    columns: list[str], rows: list[dict[str, Any]], limit: int = 24, clock: str = "wall"
) -> list[tuple[str, str]]:
    """(title, png) per metric and experiment parameter that varies across runs: the metric of every
    group of every run against the parameter (numbers on an axis, other values as categories). Without
    a varying parameter, each metric by run. ``clock`` names the time of the durations (`runs_clock`)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from rmqlab.pipeline.report_plots import figure_png as _png

    params = [c for c in columns if c.startswith("param.") and len({str(r[c]) for r in rows}) > 1]
    same = {m for m, _ in constant_metrics(rows)}
    metrics = [m for m in PLOTTED_METRICS if m not in same and any(r[m] is not None for r in rows)]
    by = params or ["run"]
    plots: list[tuple[str, str]] = []
    for metric in metrics:
        for param in by:
            if len(plots) >= limit:
                return plots
            points = [(r[param], r[metric], r["group"]) for r in rows if r[metric] is not None]
            fig, ax = plt.subplots(figsize=(5.5, 3.2))
            series: dict[Any, list[tuple[Any, Any]]] = defaultdict(list)
            numeric = all(_is_number(x) for x, _, _ in points)
            cats = sorted({str(x) for x, _, _ in points})
            for x, y, group in points:
                series[group].append((x if numeric else cats.index(str(x)), y))
            for group, xy in sorted(series.items(), key=lambda kv: str(kv[0])):
                ax.scatter([p[0] for p in xy], [p[1] for p in xy], s=14, label=str(group), alpha=0.75)
            name = param.removeprefix("param.")
            if not numeric and len(cats) <= MAX_TICK_LABELS:
                ax.set_xticks(range(len(cats)), cats, rotation=45, ha="right", fontsize=7)
                ax.set_xlabel(name)
            elif not numeric:  # unreadable as labels, and laying them out costs seconds per plot
                ax.set_xlabel(f"{name} (its {len(cats)} values in sorted order)")
            else:
                ax.set_xlabel(name)
            ax.set_ylabel(f"{metric} ({clock})" if metric.endswith("_ms") else metric)
            ax.set_title(f"{metric} by {name}", fontsize=10)
            if len(series) > 1:
                ax.legend(fontsize=7)
            plots.append((f"{metric} by {name}", _png(fig)))
    return plots


def modes_section(result: RootResult) -> list[str]:
    """index.html's comparison of the runs that put a RocketMQ 5 group (the broker assigns its queues)
    beside others, such as the pop-vs-classic experiments: per group its mode, lost, duplicates,
    longest wait and time to drain (RocketMQ seconds). None when no run has such a group."""
    esc = html.escape
    body: list[str] = []
    for run in result.runs:
        summary = result.summaries[run.rel]
        groups = summary["groups"]
        if not any(g.get("mode", "client") != "client" for g in groups.values()):
            continue
        scale = summary["run"].get("time_scale") or 1.0
        experiment, _seed, _params = experiment_of(run.manifest)

        def secs(ms: int | None, scale: float = scale) -> str:
            return "-" if ms is None else f"{ms / 1000 / scale:.1f}"

        # every row names its run (the index's tables sort by any column)
        link = f"<a href='{esc(run.rel)}/report.html'>{esc(run.rel)}</a>"
        lead = f"<td>{link}</td><td>{esc(experiment or '')}</td>"
        for name, g in groups.items():
            pop = g.get("pop") or {}
            revived = pop.get("revived", "-") if g.get("mode") == "server-pop" else "-"  # POP only
            body.append(
                f"<tr>{lead}<td>{esc(name)}</td><td>{esc(g.get('mode', 'client'))}</td><td>{g['lost']}</td>"
                f"<td>{g['duplicates']}</td><td>{secs(pop.get('longest_wait_ms'))}</td>"
                f"<td>{secs(pop.get('time_to_drain_ms'))}</td><td>{revived}</td>"
                f"<td class='{g['verdict']}'>{g['verdict']}</td></tr>"
            )
    if not body:
        return []
    head = (
        "run", "experiment", "group", "mode", "lost", "duplicates", "longest wait (s)", "time to drain (s)",
        "revived", "verdict",
    )  # fmt: skip
    return [
        "<h2>Client-side balancing and RocketMQ 5 side by side</h2>",
        "<p>Runs with a group whose queues the broker assigns (RocketMQ 5), each group of the run under "
        "the same schedule. Longest wait: a message's send to its group's first consumption; time to "
        "drain: the last send until every message was consumed (- when one was lost); RocketMQ seconds."
        "</p><table class='modes'><thead><tr>",
        *(f"<th>{h}</th>" for h in head),
        "</tr></thead><tbody>",
        *body,
        "</tbody></table>",
    ]


def runs_clock(runs: list[RunDir]) -> str:
    """The time the runs' durations were measured in: ``wall``, ``simulated``, or both when mixed."""
    kinds = sorted({clock_word(run.path) for run in runs}, reverse=True)
    return " or ".join(kinds) if kinds else "wall"


def render_index(result: RootResult, columns: list[str], rows: list[dict[str, Any]], title: str) -> str:
    esc = html.escape
    failed = sum(
        1 for s in result.summaries.values() if any(g["verdict"] == "fail" for g in s["groups"].values())
    )
    parts = [
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>",
        f"<title>{esc(title)}</title>",
        "<style>body{font-family:sans-serif;margin:2em;color:#222}table{border-collapse:collapse}"
        "td,th{border:1px solid #ccc;padding:2px 6px;font-size:13px}th{cursor:pointer;background:#f4f4f4}"
        ".ok{color:#060}.fail{color:#b00;font-weight:bold}img{border:1px solid #eee;margin:4px;"
        "vertical-align:top}.wide{overflow-x:auto;max-width:100%}</style>"
        "</head><body>",
        f"<h1>{esc(title)}</h1>",
        f"<p>{len(result.runs)} runs analysed, {failed} with a failed verdict"
        + (f", {len(result.bad)} skipped" if result.bad else "")
        + ". Click a column to sort; each run's name links to its report.</p>",
    ]
    if result.bad:
        parts.append("<h2>Skipped run directories</h2><ul>")
        parts += [f"<li>{esc(b.rel)}: {esc(b.problem)}</li>" for b in result.bad]
        parts.append("</ul>")
    asked = {(r["experiment"], r["question"]): None for r in rows if r.get("question")}
    if asked:  # what each experiment asks, in words (a column of sentences would crowd the table)
        parts.append("<h2>Experiments</h2><ul>")
        parts += [f"<li><b>{esc(str(name or ''))}</b>: {esc(q)}</li>" for name, q in asked]
        parts.append("</ul>")
    parts += modes_section(result)  # the question those runs answer comes before the long table
    # the question is a sentence: the title (tooltip) of the run and experiment cells, not a column
    shown = [c for c in columns if c != "question"]
    parts.append("<h2>Runs and groups</h2><div class='wide'><table><thead><tr>")
    parts += [f"<th>{esc(c.removeprefix('param.'))}</th>" for c in shown]
    parts.append("</tr></thead><tbody>")
    for row in rows:
        cells = []
        question = row.get("question")
        for c in shown:
            value = row[c]
            text = "" if value is None else esc(str(value))
            if c == "run":
                text = f"<a href='{esc(str(value))}/report.html'>{text}</a>"
            cls = f" class='{value}'" if c == "verdict" and value else ""
            title = f" title='{esc(question)}'" if question and c in ("run", "experiment") else ""
            cells.append(f"<td{cls}{title}>{text}</td>")
        parts.append("<tr>" + "".join(cells) + "</tr>")
    parts.append("</tbody></table></div>")
    plots = metric_plots(columns, rows, clock=runs_clock(result.runs)) if rows else []
    same = constant_metrics(rows) if len(rows) > 1 else []
    if plots or same:
        parts.append("<h2>Metrics by experiment parameter</h2>")
    if same:
        parts.append(
            "<p>The same in every run and group, so not plotted: "
            + ", ".join(f"{esc(m)} {esc(str(v))}" for m, v in same)
            + ".</p>"
        )
    parts += [f"<img alt='{esc(t)}' title='{esc(t)}' src='data:image/png;base64,{png}'>" for t, png in plots]
    parts.append(f"<script>{_SORT_JS}</script></body></html>")
    return "".join(parts)


def write_outputs(
    spark: SparkSession,
    result: RootResult,
    out: Path,
    *,
    reports: bool,
    title: str,
    written: Collection[str] = (),
) -> dict[str, str]:
    """Every run's summary.json (and report.html) under out/<run>, the runs table and index.html.
    Returns the runs whose report could not be written, with why (their summaries are written).
    `written`: runs whose summary.json is in out/<run> already, as this would write it (a sweep's
    tasks write theirs)."""
    from rmqlab.pipeline import timeline
    from rmqlab.pipeline.report_page import write_report

    failures: dict[str, str] = {}
    for run in result.runs:
        run_out = out / run.rel
        summary = result.summaries[run.rel]
        if run.rel not in written:
            run_out.mkdir(parents=True, exist_ok=True)
            (run_out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
        if reports:
            data = result.plot_data.get(run.rel)
            try:
                write_report(run_out / "report.html", summary, data, f"Run {run.rel}")
                if data is not None:
                    timeline.write(run_out, data, summary, run.path, f"Run {run.rel}")
            except (OSError, ValueError) as exc:
                failures[run.rel] = f"report.html not written: {exc}"
    columns, rows = table_rows(result)
    write_table(spark, columns, rows, out)
    (out / INDEX).write_text(render_index(result, columns, rows, title), encoding="utf-8")
    return failures
