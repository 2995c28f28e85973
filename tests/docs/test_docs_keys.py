"""The key reference pages name every key the experiment and sweep parsers accept, and no other.

The experiment parser reads its keys one call at a time (``table.get("key", "kind", default)``,
``table.table("key")``, ``table.tables("key")``), so the keys are found in its source; the simulator's
and the sweep parser's keys are tables in their modules. The pages list keys in the first column of
their tables, as `` `key` ``; a key added to a parser and not to the page, or left on the page after
the parser dropped it, fails here.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import re
from pathlib import Path

import pytest
from kit.docs import ROOT, sibling_module

KINDS = {"int", "number", "str", "bool", "str-list", "number-list", "any"}
EXPERIMENT_PAGE = ROOT / "docs" / "reference" / "experiment-file.md"
SWEEP_PAGE = ROOT / "docs" / "reference" / "sweep-file.md"


def experiment_keys(source: str) -> set[str]:
    """Every key the experiment parser's ``get``/``table``/``tables`` calls name, loops included."""
    tree = ast.parse(source)
    loops: dict[str, set[str]] = {}
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.For)
            and isinstance(node.target, ast.Name)
            and isinstance(node.iter, ast.Tuple | ast.List)
        ):
            consts = [e for e in node.iter.elts if isinstance(e, ast.Constant)]
            names = {e.value for e in consts if isinstance(e.value, str)}
            loops.setdefault(node.target.id, set()).update(names)
    keys: set[str] = set()
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args):
            continue
        method, first = node.func.attr, node.args[0]
        if method == "get":
            kind = node.args[1] if len(node.args) > 1 else None
            if not (isinstance(kind, ast.Constant) and kind.value in KINDS):
                continue  # a dict's get, not a table's
        elif method not in ("table", "tables"):
            continue
        if isinstance(first, ast.Constant) and isinstance(first.value, str):
            keys.add(first.value)
        elif isinstance(first, ast.Name) and first.id in loops:
            keys |= loops[first.id]
    return keys


def page_keys(path: Path) -> set[str]:
    """The `` `key` `` names in the first cell of every table row of a page."""
    keys: set[str] = set()
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.startswith("|") or set(line) <= set("|-: "):
            continue
        first = line.split("|")[1]
        keys |= set(re.findall(r"`([A-Za-z_][A-Za-z0-9_.\-]*)`", first))
    return keys


def parser_keys() -> set[str]:
    exp = importlib.import_module("rmqlab.lab.experiment")
    sim = sibling_module("rmq-sim", "sim_table")
    dist = sibling_module("rmq-sim", "dist")
    keys = experiment_keys(inspect.getsource(exp))
    keys |= set(sim._SIM_KEYS) | set(sim._GC_KEYS) | {"sim", "dist"}
    for params in dist._PARAMS.values():
        keys |= set(params)
    return keys


def sweep_keys() -> set[str]:
    sweep = sibling_module("rmq-sim", "sweep")
    return set(sweep._SWEEP_KEYS) | set(sweep._RANGE_KEYS)


def test_the_parser_scan_finds_the_keys() -> None:
    keys = experiment_keys(inspect.getsource(importlib.import_module("rmqlab.lab.experiment")))
    # a few of every kind: top level, tables, arrays of tables, nemesis parameters, a loop's keys
    assert {"duration", "cluster", "consumers", "nemesis", "jitter_ms", "release_locks_on_close"} <= keys
    assert len(keys) >= 50


def test_the_experiment_page_names_every_key() -> None:
    on_page, accepted = page_keys(EXPERIMENT_PAGE), parser_keys()
    assert not accepted - on_page, f"keys the parsers accept that {EXPERIMENT_PAGE.name} does not name"
    assert not on_page - accepted, f"keys on {EXPERIMENT_PAGE.name} that no parser accepts"


def test_the_sweep_page_names_every_key() -> None:
    on_page, accepted = page_keys(SWEEP_PAGE), sweep_keys()
    assert not accepted - on_page, f"keys the sweep parser accepts that {SWEEP_PAGE.name} does not name"
    assert not on_page - accepted, f"keys on {SWEEP_PAGE.name} that the sweep parser does not accept"


@pytest.mark.parametrize("drop", ["jitter_ms", "pause_s", "drain_timeout"])
def test_a_key_missing_from_the_page_is_caught(tmp_path: Path, drop: str) -> None:
    text = EXPERIMENT_PAGE.read_text(encoding="utf-8")
    kept = [
        line for line in text.splitlines() if not (line.startswith("|") and f"`{drop}`" in line.split("|")[1])
    ]
    page = tmp_path / "page.md"
    page.write_text("\n".join(kept), encoding="utf-8")
    assert drop in parser_keys() - page_keys(page)


def test_the_pytest_plugin_page_names_every_fixture() -> None:
    import importlib

    from kit.docs import pyproject

    plugins = pyproject()["project"]["entry-points"]["pytest11"]
    text = (ROOT / "docs" / "reference" / "pytest-plugin.md").read_text(encoding="utf-8")
    for module_name in plugins.values():
        module = importlib.import_module(module_name)
        fixtures = [n for n in getattr(module, "__all__", []) if n.startswith("rmq_")]
        assert fixtures, f"{module_name} exports no fixtures"
        missing = [f for f in fixtures if f"`{f}`" not in text]
        assert not missing, f"fixtures the plugin has and pytest-plugin.md does not name: {missing}"
