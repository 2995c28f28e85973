"""The role packages import each other one way only: the broker and the client share only the layer below
them (``protocol``), and no package has a circle among its modules. Imports made for type checking count
too (a circle there still ties the modules' designs together)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def module_imports(package: str) -> dict[str, set[str]]:
    """Module -> the modules of ``package`` it imports (absolute or relative, at any depth)."""
    files = {}
    for path in (ROOT / package).rglob("*.py"):
        parts = ("rmqlab", *path.relative_to(ROOT).with_suffix("").parts)
        files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        is_pkg = path.name == "__init__.py"
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = name.split(".")[: len(name.split(".")) - node.level + (1 if is_pkg else 0)]
                    base = ".".join([*anchor, base] if base else anchor)
                targets = [f"{base}.{a.name}" for a in node.names] + [base]
            else:
                continue
            for target in targets:
                while target and target not in files:
                    target = target.rpartition(".")[0]
                if target and target != name:
                    found.add(target)
        graph[name] = found
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp: list[str] = []
            while not comp or comp[-1] != v:
                comp.append(stack.pop())
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_detector_finds_a_circle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


@pytest.mark.parametrize(
    "package", ["protocol", "broker", "client", "chaos", "sim", "pipeline", "interop", "proxy", "sweeps"]
)
def test_no_import_circle(package: str) -> None:
    assert cycles(module_imports(package)) == []


ROLES = ("protocol", "broker", "client", "chaos", "sim", "pipeline", "interop", "proxy", "sweeps")
# The role packages each role may import; shared helpers outside the roles (``rmqlab.cli``) are free.
MAY_IMPORT = {
    "protocol": set(),
    "broker": {"protocol"},
    "client": {"protocol"},
    "proxy": {"protocol", "client"},
}


def role_imports(package: str, root: Path = ROOT) -> dict[str, set[str]]:
    """Other role -> the files of ``package`` that import it (any import statement, at any depth)."""
    out: dict[str, set[str]] = {}
    for path in sorted((root / package).rglob("*.py")):
        module = str(path.relative_to(root))
        for node in ast.walk(ast.parse(path.read_text(), module)):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            else:
                continue
            for name in names:
                parts = name.split(".")
                role = parts[1] if parts[0] == "rmqlab" and len(parts) > 1 else None
                if role in ROLES and role != package:
                    out.setdefault(role, set()).add(module)
    return out


def test_role_imports_finds_a_type_checking_import(tmp_path: Path) -> None:
    pkg = tmp_path / "broker"
    pkg.mkdir()
    (pkg / "x.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from rmqlab.client.route import A\n"
        "def f():\n    import rmqlab.sim\n    from rmqlab import client\n"
    )
    assert role_imports("broker", tmp_path) == {"client": {"broker/x.py"}, "sim": {"broker/x.py"}}


@pytest.mark.parametrize("package", sorted(MAY_IMPORT))
def test_roles_import_only_the_layers_below(package: str) -> None:
    found = role_imports(package)
    assert {role: sorted(mods) for role, mods in found.items() if role not in MAY_IMPORT[package]} == {}
