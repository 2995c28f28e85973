"""The documentation site builds strictly, and every console script has its generated reference page."""

from __future__ import annotations

import argparse
import importlib
import re
from pathlib import Path

from kit.docs import ROOT, Build, console_scripts

README_MAX_LINES = 300
FIRST_SCREEN = 40  # lines a reader sees before scrolling
FRESH_MACHINE = ("bash scripts/demo.sh", "bash scripts/test.sh")


def _subcommand_paths(parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    out = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            seen: set[int] = set()
            for name, child in action.choices.items():
                if id(child) in seen:
                    continue
                seen.add(id(child))
                out.append((*prefix, name))
                out += _subcommand_paths(child, (*prefix, name))
    return out


def _options(parser: argparse.ArgumentParser) -> list[str]:
    return [a.option_strings[-1] for a in parser._actions if a.option_strings and a.help != argparse.SUPPRESS]


def test_mkdocs_build_strict_passes(built_site: Build) -> None:
    assert built_site.returncode == 0, built_site.output[-4000:]
    assert (built_site.site / "index.html").is_file()


def test_every_console_script_has_a_generated_page(built_site: Build) -> None:
    assert built_site.returncode == 0, built_site.output[-4000:]
    scripts = console_scripts()
    assert len(scripts) >= 10
    index = (built_site.site / "reference" / "cli" / "index.html").read_text(encoding="utf-8")
    for s in scripts:
        page = built_site.site / "reference" / "cli" / f"{s.name}.html"
        assert page.is_file(), f"no generated page for {s.name}"
        html = page.read_text(encoding="utf-8")
        assert f"{s.name}.html" in index, f"the command index does not link {s.name}"
        parser = importlib.import_module(s.module).build_parser()
        for option in _options(parser):
            assert option in html, f"{s.name}: {option} is missing from its page"
        for path in _subcommand_paths(parser):
            anchor = "-".join([s.name, *path]).lower()
            assert f'id="{anchor}"' in html, f"{s.name}: no section for '{' '.join(path)}'"
            child = parser
            for part in path:
                child = next(a for a in child._actions if isinstance(a, argparse._SubParsersAction)).choices[
                    part
                ]
            for option in _options(child):
                assert option in html, f"{s.name} {' '.join(path)}: {option} is missing from its page"


def test_the_contracts_and_the_benchmarks_are_pages(built_site: Build) -> None:
    assert built_site.returncode == 0, built_site.output[-4000:]
    for page in ("EVENTS.html", "PROTOCOL.html", "benchmarks.html"):
        assert (built_site.site / page).is_file(), page
    bench = (built_site.site / "benchmarks.html").read_text(encoding="utf-8")
    assert "generated at build time" in bench
    assert re.search(r"\d{4}-\d{2}-\d{2}", bench)


def test_readme_is_short_and_starts_with_the_two_commands() -> None:
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines (at most {README_MAX_LINES})"
    first = "\n".join(lines[:FIRST_SCREEN])
    for command in FRESH_MACHINE:
        assert command in first, f"{command!r} is not on the README's first screen"


def test_readme_links_into_the_docs_resolve() -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text) + re.findall(r'src="([^"]+)"', text)
    local = [link for link in links if "://" not in link and not link.startswith("mailto:")]
    assert any(link.startswith("docs/") for link in local), "the README links nowhere into docs/"
    missing = [link for link in local if not (ROOT / link).exists()]
    assert not missing, f"README.md links to files that do not exist: {missing}"


def test_docs_sources_are_in_the_nav() -> None:
    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    pages = [p.relative_to(ROOT / "docs").as_posix() for p in (ROOT / "docs").rglob("*.md")]
    pages = [p for p in pages if not p.startswith("hooks/")]
    assert pages
    missing = [p for p in pages if p not in nav]
    assert not missing, f"pages not in mkdocs.yml's nav: {missing}"


def test_generated_pages_are_not_committed() -> None:
    cli = Path(ROOT / "docs" / "reference" / "cli")
    stale = [p.name for p in cli.glob("rmq-*.md")]
    assert not stale, f"generated pages must not be written by hand: {stale}"
    assert not (ROOT / "docs" / "benchmarks.md").exists(), "benchmarks.md is generated from docs/benchmarks/"
