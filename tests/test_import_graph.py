"""The packages import each other one way only, along the arrows ``MAY_IMPORT`` states (the
architecture page draws the same): the broker and the client share only the layer below them
(``protocol``), the lab core knows no backend, the simulator nothing of the process lab; no package has a
circle among its modules, and no module imports a command's ``__main__``. Imports made for type checking
count too (a circle there still ties the modules' designs together)."""

from __future__ import annotations

import ast
import functools
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


PYPROJECT_PACKAGES = sorted(
    {
        p.split("/")[0]
        for p in tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"][
            "package-dir"
        ].values()
    }
)
PACKAGES = ["protocol", "broker", "client", "lab", "chaos", "sim", "pipeline", "interop", "proxy", "sweeps"]


def _files(packages: list[str]) -> dict[str, Path]:
    files = {}
    for package in packages:
        for path in (ROOT / package).rglob("*.py"):
            parts = ("rmqlab", *path.relative_to(ROOT).with_suffix("").parts)
            files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return files


@functools.cache
def _nodes(path: Path) -> list[ast.AST]:
    return list(ast.walk(ast.parse(path.read_text(), str(path))))


def module_imports(package: str, *, every_package: bool = False) -> dict[str, set[str]]:
    """Module -> the modules of ``package`` it imports (absolute or relative, at any depth); with
    ``every_package``, the modules of every package of the lab it imports."""
    files = _files(PACKAGES if every_package else [package])
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        if every_package and not (name == f"rmqlab.{package}" or name.startswith(f"rmqlab.{package}.")):
            continue
        is_pkg = path.name == "__init__.py"
        found: set[str] = set()
        for node in _nodes(path):
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


@pytest.mark.parametrize("package", PACKAGES)
def test_no_import_circle(package: str) -> None:
    assert cycles(module_imports(package)) == []


# The arrows: the packages each package may import (``rmqlab.cli``, the commands' shared helpers, is free).
MAY_IMPORT: dict[str, set[str]] = {
    "protocol": set(),  # wire types, codecs, allocation, clocks and events: the layer below every role
    "broker": {"protocol"},
    "client": {"protocol"},
    "proxy": {"protocol", "client"},  # the v5 gRPC endpoint consumes through our client
    "interop": {"protocol"},
    "pipeline": set(),  # the analysis reads files only
    "sweeps": set(),
    "lab": {"protocol", "broker", "client"},  # experiment files are checked with the broker's own ACL
    # parser, and client_version with the client's release table (client.versions)
    "sim": {"protocol", "broker", "client", "lab", "pipeline"},
    "chaos": {"protocol", "broker", "client", "proxy", "lab", "pipeline"},
}


def package_arrows(package: str) -> dict[str, list[str]]:
    """Other package -> the modules of ``package`` that import it (at any depth, type checking too)."""
    out: dict[str, set[str]] = {}
    for module, targets in module_imports(package, every_package=True).items():
        for target in targets:
            other = target.split(".")[1]
            if other != package:
                out.setdefault(other, set()).add(module)
    return {other: sorted(modules) for other, modules in sorted(out.items())}


def test_every_package_states_its_arrows() -> None:
    """A package the wheel ships is in this test, and so in the rules below."""
    mapped = set(PYPROJECT_PACKAGES) - {"rmqlab"}
    assert sorted(mapped) == sorted(PACKAGES) == sorted(MAY_IMPORT)


@pytest.mark.parametrize("package", PACKAGES)
def test_packages_import_only_along_the_arrows(package: str) -> None:
    found = package_arrows(package)
    assert {other: mods for other, mods in found.items() if other not in MAY_IMPORT[package]} == {}


def arrows(package: str, into: tuple[str, ...]) -> list[str]:
    """The imports of ``package``'s modules that reach one of the packages ``into``."""
    names = tuple(f"rmqlab.{p}" for p in into)
    return sorted(
        f"{module} -> {target}"
        for module, targets in module_imports(package, every_package=True).items()
        for target in targets
        if target in names or target.startswith(tuple(f"{n}." for n in names))
    )


def test_the_lab_core_imports_no_backend() -> None:
    """Processes, containers and the simulator plug into lab; lab knows none of them."""
    assert arrows("lab", ("chaos", "sim")) == []


def test_the_simulator_imports_nothing_of_the_process_lab() -> None:
    assert arrows("sim", ("chaos",)) == []


def test_no_module_imports_a_command_line_module() -> None:
    """A ``__main__`` module is a command's; what two commands share lives in a library module."""
    found = sorted(
        f"{module} -> {target}"
        for package in PACKAGES
        for module, targets in module_imports(package, every_package=True).items()
        for target in targets
        if target.endswith(".__main__")
    )
    assert found == []
