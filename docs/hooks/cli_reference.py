"""MkDocs hook: a reference page per console script, generated from its argparse parser at build time.

The scripts come from ``[project.scripts]`` in pyproject.toml, so a new script, a renamed module or a
changed flag shows up in the site without anyone editing a page. For each script the hook imports the
entry point's module and calls its ``build_parser()``; any other ``build_<name>_parser()`` in the same
module (``rmq-analyze ingest``) gets a section of its own. Subcommands, nested ones included, each get
a section. The project must be installed in the environment that runs ``mkdocs``.

The nav entry ``reference/cli/index.md`` becomes a section listing every generated page, and that
index page gets the table of commands appended to its hand-written introduction; the exit-codes page
gets every command's exit codes, as its ``--help`` ends with them.
"""

from __future__ import annotations

import argparse
import html
import importlib
import inspect
import os
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files
from mkdocs.structure.pages import Page

CLI_DIR = "reference/cli"
INDEX = f"{CLI_DIR}/index.md"
EXIT_CODES = "reference/exit-codes.md"
EXIT_CODES_MARKER = "<!-- exit codes of every command: generated at build time -->"
WIDTH = "72"  # argparse wraps usage lines to this (the page's code width), fixed so builds are reproducible


@dataclass(frozen=True)
class Script:
    name: str
    target: str  # "module:function"

    @property
    def module(self) -> str:
        return self.target.partition(":")[0]

    @property
    def page(self) -> str:
        return f"{CLI_DIR}/{self.name}.md"


def project_root(config: MkDocsConfig) -> Path:
    return Path(config.config_file_path).resolve().parent


def console_scripts(root: Path) -> list[Script]:
    """``[project.scripts]`` of the project's pyproject.toml, sorted by name."""
    with (root / "pyproject.toml").open("rb") as f:
        data = tomllib.load(f)
    scripts = data.get("project", {}).get("scripts", {})
    return [Script(name, target) for name, target in sorted(scripts.items())]


def parsers_of(script: Script) -> list[argparse.ArgumentParser]:
    """The script's ``build_parser()`` and every other ``build_<name>_parser()`` of its module."""
    module = importlib.import_module(script.module)
    builders = [getattr(module, "build_parser", None)]
    builders += [
        fn
        for name, fn in sorted(inspect.getmembers(module, inspect.isfunction))
        if re.fullmatch(r"build_\w+_parser", name) and fn.__module__ == module.__name__
    ]
    parsers = []
    for build in builders:
        if build is None:
            continue
        parser = build()
        if not isinstance(parser, argparse.ArgumentParser):
            raise TypeError(f"{script.module}.{build.__name__}() did not return an ArgumentParser")
        parsers.append(parser)
    if not parsers:
        raise LookupError(f"{script.name}: {script.module} has no build_parser()")
    return parsers


# --------------------------------------------------------------------------------------------------
# Markdown from a parser


def _text(s: str | None) -> str:
    """Help text as Markdown text: no HTML, no emphasis or links by accident."""
    if not s:
        return ""
    s = html.escape(" ".join(s.split()), quote=False)
    return re.sub(r"([\\*_\[\]])", r"\\\1", s)


def _help(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    if action.help is None or action.help == argparse.SUPPRESS:
        return ""
    formatter = parser._get_formatter()
    try:
        return formatter._expand_help(action)
    except (KeyError, TypeError, ValueError):
        return action.help


def _flag(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    formatter = parser._get_formatter()
    if action.option_strings:
        return formatter._format_action_invocation(action)
    return formatter._metavar_formatter(action, action.dest)(1)[0]


def _default(action: argparse.Action) -> str:
    d = action.default
    quiet = (argparse._StoreTrueAction, argparse._StoreFalseAction, argparse._HelpAction)
    quiet += (argparse._VersionAction,)
    if d is None or d is argparse.SUPPRESS or isinstance(action, quiet) or d in ([], ""):
        return ""
    return f" (default: `{d}`)"


def _subactions(parser: argparse.ArgumentParser) -> list[argparse._SubParsersAction]:
    return [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]


def _usage(parser: argparse.ArgumentParser) -> str:
    old = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = WIDTH
    try:
        return parser.format_usage().strip()
    finally:
        if old is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = old


def _epilog(parser: argparse.ArgumentParser) -> str:
    return (parser.epilog or "").strip()


def _section(parser: argparse.ArgumentParser, title: str, level: int, summary: str | None) -> list[str]:
    return [f"{'#' * level} {title}", "", *_body(parser, title, level, summary)]


def _body(parser: argparse.ArgumentParser, title: str, level: int, summary: str | None) -> list[str]:
    out: list[str] = []
    description = parser.description or summary
    if description:
        out += [_text(description), ""]
    out += ["```text", _usage(parser), "```", ""]
    positionals = [
        a for a in parser._actions if not a.option_strings and not isinstance(a, argparse._SubParsersAction)
    ]
    options = [a for a in parser._actions if a.option_strings and a.help != argparse.SUPPRESS]
    if positionals:
        out += ["**Arguments**", ""]
        out += [f"- `{_flag(parser, a)}`: {_text(_help(parser, a))}{_default(a)}" for a in positionals]
        out.append("")
    if options:
        out += ["**Options**", ""]
        for a in options:
            choices = f" (one of {', '.join(f'`{c}`' for c in a.choices)})" if a.choices and a.metavar else ""
            text = _help(parser, a)
            default = "" if "default" in text.lower() else _default(a)
            out.append(f"- `{_flag(parser, a)}`: {_text(text)}{choices}{default}")
        out.append("")
    for sub in _subactions(parser):
        helps = {c.dest: c.help for c in sub._choices_actions}
        out += ["**Subcommands**", ""]
        out += [f"- [`{n}`](#{_slug(f'{title} {n}')}): {_text(helps.get(n))}" for n in _unique(sub)]
        out.append("")
    epilog = _epilog(parser)
    if epilog:
        out += ["```text", epilog, "```", ""]
    for sub in _subactions(parser):
        helps = {c.dest: c.help for c in sub._choices_actions}
        for name in _unique(sub):
            out += _section(sub.choices[name], f"{title} {name}", min(level + 1, 4), helps.get(name))
    return out


def _unique(sub: argparse._SubParsersAction) -> list[str]:
    """Subcommand names without their aliases."""
    seen: set[int] = set()
    names = []
    for name, child in sub.choices.items():
        if id(child) not in seen:
            seen.add(id(child))
            names.append(name)
    return names


def _slug(title: str) -> str:
    """The id MkDocs' table of contents gives a heading (its default slugify)."""
    s = re.sub(r"[^\w\s-]", "", title).strip().lower()
    return re.sub(r"[-\s]+", "-", s)


def render(script: Script) -> str:
    parsers = parsers_of(script)
    lines = [
        f"# {script.name}",
        "",
        f"<!-- generated at build time from {script.module}'s parser: edit the parser, not this page -->",
        "",
        f"Generated from the command's own parser when the site is built, so it always says what "
        f"`{script.name} --help` says. Entry point: `{script.target}`.",
        "",
        *_body(parsers[0], script.name, 2, None),
    ]
    for extra in parsers[1:]:
        lines += _section(extra, extra.prog, 2, None)
    return "\n".join(lines).rstrip() + "\n"


def index_table(scripts: list[Script]) -> str:
    rows = ["| command | what it does |", "|---|---|"]
    for s in scripts:
        description = parsers_of(s)[0].description or ""
        first = description.strip().split("\n")[0]
        rows.append(f"| [`{s.name}`]({s.name}.md) | {_text(first)} |")
    return "\n".join(rows) + "\n"


# --------------------------------------------------------------------------------------------------
# MkDocs events


def _expand_nav(nav: Any, scripts: list[Script]) -> Any:
    if isinstance(nav, list):
        return [_expand_nav(item, scripts) for item in nav]
    if isinstance(nav, dict):
        out = {}
        for title, value in nav.items():
            if value == INDEX:
                out[title] = [INDEX] + [{s.name: s.page} for s in scripts]
            else:
                out[title] = _expand_nav(value, scripts)
        return out
    return nav


def on_config(config: MkDocsConfig) -> MkDocsConfig:
    if config.nav is not None:
        config.nav = _expand_nav(config.nav, console_scripts(project_root(config)))
    return config


def on_files(files: Files, config: MkDocsConfig) -> Files:
    for script in console_scripts(project_root(config)):
        files.append(File.generated(config, script.page, content=render(script)))
    return files


def exit_codes(scripts: list[Script]) -> str:
    """Every command's and subcommand's exit codes, as their --help ends with them."""
    out = []
    for s in scripts:
        for parser in parsers_of(s):
            for title, p in _walk(parser, parser.prog):
                epilog = _epilog(p)
                if "exit codes:" in epilog:
                    codes = epilog[epilog.index("exit codes:") :]
                    page = f"cli/{s.name}.md#{_slug(title)}" if title != s.name else f"cli/{s.name}.md"
                    out += [f"### {title}", "", f"[Reference]({page})", "", "```text", codes, "```", ""]
    return "\n".join(out)


def _walk(parser: argparse.ArgumentParser, title: str) -> list[tuple[str, argparse.ArgumentParser]]:
    found = [(title, parser)]
    for sub in _subactions(parser):
        for name in _unique(sub):
            found += _walk(sub.choices[name], f"{title} {name}")
    return found


def on_page_markdown(markdown: str, page: Page, config: MkDocsConfig, files: Files) -> str:
    if page.file.src_uri == INDEX:
        return markdown.rstrip() + "\n\n" + index_table(console_scripts(project_root(config)))
    if page.file.src_uri == EXIT_CODES:
        generated = exit_codes(console_scripts(project_root(config)))
        return markdown.replace(EXIT_CODES_MARKER, generated)
    return markdown
