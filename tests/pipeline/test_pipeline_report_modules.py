"""The report's parts: the data and the written account import without matplotlib, the page is imported
by nobody it imports, and drawing a report leaves the caller's matplotlib as it was (its backend, its
pyplot figures)."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from rmqlab.pipeline import report_page
from rmqlab.pipeline.report_data import PlotData
from rmqlab.pipeline.unavailability import RunClock

PIPELINE = Path(report_page.__file__).parent
END = 60_000


def imported(module: str) -> set[str]:
    """The rmqlab.pipeline.report_* modules `module` imports (at the top or inside a function)."""
    tree = ast.parse((PIPELINE / f"{module}.py").read_text(encoding="utf-8"))
    names = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    names |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    return {n.rsplit(".", 1)[-1] for n in names if re.fullmatch(r"rmqlab\.pipeline\.report_\w+", n)}


def test_imports_go_one_way_from_the_page_to_the_plots_and_the_story() -> None:
    assert imported("report_data") == set()
    assert imported("report_plots") == {"report_data"}
    assert imported("report_story") == {"report_data"}
    assert imported("report_page") == {"report_data", "report_plots", "report_story"}


def test_the_plot_data_and_the_written_account_import_without_matplotlib() -> None:
    """What the Spark tasks and the plain-Python reference import (plot data, answer) stays light."""
    code = (
        "import sys\n"
        "import rmqlab.pipeline.report_data, rmqlab.pipeline.report_story\n"
        "import rmqlab.pipeline.small_runs, rmqlab.pipeline.runs, rmqlab.pipeline.metrics_reference\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'matplotlib'))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def small_run() -> tuple[dict[str, Any], PlotData]:
    """A group of four queues and two consumers, one killed at t = 20 s and one paused, with rates,
    sends, duplicates and a convergence entry: every picture of the page is drawn."""
    data = PlotData(0, END, 1000, clock=RunClock(0, 1.0))
    for q in range(4):
        owner = f"consumer-{q % 2 + 1}"
        end = 20_000 if owner == "consumer-1" else END
        data.intervals.append(
            {"group": "G", "client_id": owner, "node": owner, "topic": "T", "queue": f"broker-a:{q}",
             "start": 0, "end": end}
        )  # fmt: skip
        if end < END:
            data.intervals.append(
                {"group": "G", "client_id": "consumer-2", "node": "consumer-2", "topic": "T",
                 "queue": f"broker-a:{q}", "start": 20_005, "end": END}
            )  # fmt: skip
    data.nemeses = [
        {"ts_ms": 20_000, "action": "kill", "target": "consumer-1"},
        {"ts_ms": 40_000, "action": "pause", "target": "consumer-2"},
        {"ts_ms": 45_000, "action": "resume", "target": "consumer-2"},
    ]
    data.rates = [{"group": "G", "node": "consumer-2", "bucket": b, "n": 10} for b in range(60)]
    data.sends = [{"group": "G", "bucket": b, "n": 10} for b in range(60)]
    data.duplicates = [{"group": "G", "bucket": 21, "n": 3}]
    summary = {
        "run": {"events": 1, "malformed_lines": 0, "start_ms": 0, "end_ms": END, "t0_ms": 0,
                "time_scale": 1.0},
        "groups": {"G": {
            "topics": ["T"], "sent": 600, "consumed_unique": 600, "lost": 0, "duplicates": 3,
            "duplicated_messages": 3, "overlap_ms": 0, "orphan_ms": 20, "stalled_ms": 5000,
            "concurrent_consume_ms": 0, "order_violations": 0, "verdict": "ok", "mode": "client",
            "convergence": [{"change_ms": 20_000, "cause": "kill 1.2.3.4@1#1 on consumer-1",
                             "converged": True, "convergence_ms": 5}],
        }},
    }  # fmt: skip
    return summary, data


def test_write_report_leaves_the_callers_backend_and_pyplot_figures_alone(tmp_path: Path) -> None:
    import matplotlib
    import matplotlib.pyplot as plt

    from rmqlab.pipeline.sweep_report import sweep_plots

    before = matplotlib.get_backend()
    matplotlib.use("svg")  # not Agg, so a switch to Agg would show
    mine = plt.figure()  # the caller's own figure: a backend switch would close it
    try:
        summary, data = small_run()
        report_page.write_report(tmp_path / "report.html", summary, data, "Run x")
        page = (tmp_path / "report.html").read_text(encoding="utf-8")
        assert page.count("data:image/png;base64,") == 4  # ownership, rates, duplicates, convergence
        rows = [{"param.n": n, "group": "G", "lost_median": n, "lost_p90": n + 1} for n in (1, 2, 3)]
        assert len(sweep_plots(["param.n"], rows)) == 1
        assert matplotlib.get_backend() == "svg"
        assert plt.get_fignums() == [mine.number]  # none of the report's, and the caller's still open
    finally:
        plt.close(mine)
        matplotlib.use(before)
    assert plt.get_fignums() == []


@pytest.mark.parametrize("queues", [4, 100])
def test_a_plot_leaves_no_pyplot_figure_open(queues: int) -> None:
    """The Gantt chart and the health map (past 64 queues) are drawn on figures pyplot never sees."""
    import matplotlib.pyplot as plt

    from rmqlab.pipeline.report_data import group_markers
    from rmqlab.pipeline.report_plots import plot_ownership

    open_before = plt.get_fignums()
    data = PlotData(0, END, 1000, clock=RunClock(0, 1.0))
    data.intervals = [
        {"group": "G", "client_id": f"c{q % 3}", "node": f"c{q % 3}", "topic": "T", "queue": f"b:{q}",
         "start": 0, "end": END}
        for q in range(queues)
    ]  # fmt: skip
    data.nemeses = [{"ts_ms": 30_000, "action": "pause", "target": "c1"}]
    assert plot_ownership(data, "G", group_markers(data, "G", None), None)
    assert plt.get_fignums() == open_before
