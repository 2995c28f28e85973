"""rmq-analyze ROOT's runs table and index on hand-made runs: a manifest's descriptive text (the
experiment's question, its source file) is kept beside the run, never taken for a parameter."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rmqlab.lab.experiment import parse
from rmqlab.pipeline.contract import GROUP_METRICS
from rmqlab.pipeline.discover import RunDir
from rmqlab.pipeline.runs import RootResult, metric_plots, render_index, table_rows

TOML = """
name = "{name}"
question = "{question}"
time_scale = 0.05
duration = 60
seed = 1

[[topics]]
name = "T"
queues = 4

[[consumers]]
group = "G"
topic = "T"
count = {count}
"""


def _manifest(tmp_path: Path, name: str, question: str, count: int) -> dict[str, Any]:
    """The manifest fields rmq-chaos run and rmq-sim run write about the experiment."""
    path = tmp_path / f"{name}.toml"
    path.write_text(TOML.format(name=name, question=question, count=count), encoding="utf-8")
    exp = parse(path.read_text(encoding="utf-8"), source=str(path), default_name=name)
    return {"experiment": exp.to_dict(), "name": exp.name, "question": exp.question, "seed": exp.seed}


def _summary(lost: int) -> dict[str, Any]:
    group = {m: 0 for m in GROUP_METRICS} | {"sent": 10, "consumed_unique": 10 - lost, "lost": lost}
    group |= {"convergence": [], "verdict": "fail" if lost else "ok"}
    return {"run": {"events": 20, "malformed_lines": 0, "time_scale": 0.05}, "groups": {"G": group}}


def test_the_question_and_source_are_text_beside_the_run_not_parameters(tmp_path: Path) -> None:
    asks = {"two": "Do two consumers share 4 queues?", "three": "And three <of them>?"}
    runs = [
        RunDir(name, str(tmp_path / name), [], _manifest(tmp_path, name, asks[name], count))
        for name, count in (("two", 2), ("three", 3))
    ]
    result = RootResult(runs, [])
    result.summaries = {"two": _summary(0), "three": _summary(1)}
    columns, rows = table_rows(result)
    params = [c for c in columns if c.startswith("param.")]
    # each run's experiment file and question differ, yet neither is something the runs vary by
    assert "param.question" not in params and "param.source" not in params
    assert "param.time_scale" in params and "param.duration" in params
    assert columns[:4] == ["run", "experiment", "question", "seed"]
    assert [r["question"] for r in rows] == [asks["two"], asks["three"]]
    for param in params:  # the rest are settings: numbers, booleans or short names, never a sentence
        assert all(" " not in str(r[param]) for r in rows), param
    # the index shows the question as the run's and experiment's title, not as a column or a plot
    page = render_index(result, columns, rows, "runs")
    assert "<th>question</th>" not in page and "<th>source</th>" not in page
    assert "<td title='And three &lt;of them&gt;?'><a href='three/report.html'>three</a></td>" in page
    assert "<li><b>two</b>: Do two consumers share 4 queues?</li>" in page
    # no parameter varies (the consumers' count is in a list): the metrics are plotted by run, those
    # that differ between the runs; the others are named with their one value
    titles = [t for t, _png in metric_plots(columns, rows)]
    assert titles == ["consumed_unique by run", "lost by run"]
    assert "<p>The same in every run and group, so not plotted: sent 10, duplicates 0," in page
    assert "<div class='wide'><table>" in page  # a wide table scrolls inside the page


def test_a_plot_by_run_names_its_runs_only_when_they_are_few(monkeypatch: Any) -> None:
    from matplotlib.axes import Axes

    from rmqlab.pipeline.runs import MAX_TICK_LABELS

    labelled: list[int] = []
    set_xticks = Axes.set_xticks

    def spy(self: Axes, ticks: Any, labels: Any = None, **kw: Any) -> Any:
        labelled.append(len(labels or []))
        return set_xticks(self, ticks, labels, **kw)

    monkeypatch.setattr(Axes, "set_xticks", spy)
    columns = ["run", "group", *GROUP_METRICS, "max_convergence_ms"]

    def rows(n: int) -> list[dict[str, Any]]:
        return [{c: None for c in columns} | {"run": f"r{i}", "group": "G", "lost": i} for i in range(n)]

    assert [t for t, _ in metric_plots(columns, rows(3))] == ["lost by run"]
    assert labelled == [3]
    # a thousand runs (a sweep of one point): no tick labels, whose layout cost seconds per plot
    assert [t for t, _ in metric_plots(columns, rows(MAX_TICK_LABELS + 1))] == ["lost by run"]
    assert labelled == [3]


def test_the_offset_regressions_are_counted_beside_the_metrics_and_absent_from_an_older_summary(
    tmp_path: Path,
) -> None:
    regressed = _summary(0)
    regressed["groups"]["G"] |= {
        "offset_regressions": [
            {"change_ms": 5, "topic": "T", "queue": "b:0", "from": 9, "to": 4, "event": "mq_added",
             "node": "consumer-1", "redelivered": 5},
            {"change_ms": 7, "topic": "T", "queue": "b:1", "from": 3, "to": 2, "event": "offset_committed",
             "node": "b", "redelivered": 0},
        ],
        "regression_redelivered": 5,
    }  # fmt: skip
    runs = [RunDir(name, str(tmp_path / name), [], {}) for name in ("new", "old")]
    result = RootResult(runs, [])
    result.summaries = {"new": regressed, "old": _summary(0)}
    columns, rows = table_rows(result)
    assert columns.index("offset_regressions") + 1 == columns.index("regression_redelivered")
    assert [(r["offset_regressions"], r["regression_redelivered"]) for r in rows] == [(2, 5), (None, None)]
