"""MkDocs hook: the Benchmarks page, generated at build time from the data files in docs/benchmarks/.

Each ``docs/benchmarks/NAME.json`` holds one benchmark: its title, the command that measures it, what it
measures, and its measurements, each with the figure, its value and unit, the date it was measured, the
machine (a key of ``machines.json``), and where known the load average, the baseline measured in the
same run and a note. A benchmark script's JSON output can be summarised into such a file; the page is
never edited by hand, so a figure lives in one place.
"""

from __future__ import annotations

import html
import json
import re
from pathlib import Path
from typing import Any

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files

PAGE = "benchmarks.md"
DATA = "benchmarks"
REQUIRED = ("figure", "value", "unit", "date", "machine")


def _cell(value: Any) -> str:
    text = f"{value:,}" if isinstance(value, int | float) and not isinstance(value, bool) else str(value)
    text = html.escape(" ".join(text.split()), quote=False)
    return re.sub(r"([|*_\[\]\\])", r"\\\1", text)


def load(docs_dir: Path) -> tuple[dict[str, str], list[dict[str, Any]]]:
    folder = docs_dir / DATA
    machines = json.loads((folder / "machines.json").read_text(encoding="utf-8"))
    benchmarks = []
    for path in sorted(folder.glob("*.json")):
        if path.name == "machines.json":
            continue
        doc = json.loads(path.read_text(encoding="utf-8"))
        for i, m in enumerate(doc["measurements"]):
            missing = [k for k in REQUIRED if k not in m]
            if missing:
                raise ValueError(f"{path.name}: measurement {i + 1} lacks {', '.join(missing)}")
            if m["machine"] not in machines:
                raise ValueError(f"{path.name}: measurement {i + 1}: unknown machine {m['machine']!r}")
            if not re.fullmatch(r"\d{4}-\d{2}-\d{2}", m["date"]):
                raise ValueError(f"{path.name}: measurement {i + 1}: date {m['date']!r} is not YYYY-MM-DD")
        doc["file"] = path.name
        benchmarks.append(doc)
    return machines, benchmarks


def render(machines: dict[str, str], benchmarks: list[dict[str, Any]]) -> str:
    count = sum(len(b["measurements"]) for b in benchmarks)
    out = [
        "# Benchmarks",
        "",
        "<!-- generated at build time from docs/benchmarks/*.json: edit the data files, not this page -->",
        "",
        f"Every measured figure of the project, {count} of them from {len(benchmarks)} benchmarks, each "
        "with the date it was measured and the machine it ran on. The page is generated from the data "
        "files in `docs/benchmarks/` when the site is built. Benchmarks print JSON and measure a baseline "
        "in the same run where there is one; the tests never assert on speed. Figures vary from run to "
        "run by tens of percent, and this machine's speed drifts from day to day: compare figures measured "
        "back to back, and read wall times together with the load average beside them.",
        "",
        "## Machines",
        "",
    ]
    for key, text in machines.items():
        out += [f"`{key}`", f": {_cell(text)}", ""]
    for b in benchmarks:
        out += [f"## {_cell(b['title'])} {{#{b['benchmark']}}}", "", _cell(b["what"]), ""]
        out += ["```bash", b["command"], "```", ""]
        out += [
            "| figure | value | baseline (same run) | date | machine, load | note |",
            "|---|---|---|---|---|---|",
        ]
        for m in b["measurements"]:
            value = f"**{_cell(m['value'])}** {_cell(m['unit'])}".strip()
            where = m["machine"] + (f", load {m['load']}" if m.get("load") else "")
            note = _cell(m.get("note", ""))
            if m.get("command") and m["command"] != b["command"]:
                note = (note + "; " if note else "") + f"`{m['command']}`"
            out.append(
                f"| {_cell(m['figure'])} | {value} | {_cell(m.get('baseline', ''))} | {m['date']} "
                f"| {_cell(where)} | {note} |"
            )
        out += ["", f"Data: [`{DATA}/{b['file']}`]({DATA}/{b['file']})", ""]
    return "\n".join(out).rstrip() + "\n"


def on_files(files: Files, config: MkDocsConfig) -> Files:
    machines, benchmarks = load(Path(config.docs_dir))
    files.append(File.generated(config, PAGE, content=render(machines, benchmarks)))
    return files
