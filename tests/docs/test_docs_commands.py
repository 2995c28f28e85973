"""Every ``rmq-*`` command line the docs show as something to run parses with that command's own parser.

A fenced code block whose info string has ``title="Example`` (rendered as a block titled "Example...")
is an illustration, not a command to copy: its lines are not checked. Everything else in ``bash``,
``sh``, ``shell`` or ``console`` blocks of README.md and docs/**/*.md is: each ``rmq-NAME ...`` (or
``python -m MODULE ...`` of a console script's module) is split as the shell would split it and given
to the real parser, and a ``SystemExit`` other than 0 fails the test.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import inspect
import io
import re
import shlex
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from kit.docs import ROOT, console_scripts

SHELLS = {"bash", "sh", "shell", "console"}
EXAMPLE = re.compile(r'title="Example')
FENCE = re.compile(r"^(\s*)(```+|~~~+)\s*(.*)$")
SEPARATORS = {"&&", "||", ";", "|", "&"}


@dataclass(frozen=True)
class Command:
    source: str  # FILE:LINE
    argv: tuple[str, ...]


def doc_files() -> list[Path]:
    files = [ROOT / "README.md"]
    files += sorted(p for p in (ROOT / "docs").rglob("*.md") if "hooks" not in p.parts)
    return files


def shell_blocks(text: str) -> Iterator[tuple[int, str, list[str]]]:
    """(first line number, info string, lines) of each fenced block."""
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, fence, info = m.groups()
        body = []
        j = i + 1
        while j < len(lines) and not lines[j].strip().startswith(fence):
            body.append(lines[j][len(indent) :] if lines[j].startswith(indent) else lines[j])
            j += 1
        yield i + 2, info, body
        i = j + 1


def _logical_lines(body: list[str], first: int) -> Iterator[tuple[int, str]]:
    buf, start = "", first
    for k, line in enumerate(body):
        if not buf:
            start = first + k
        if line.rstrip().endswith("\\"):
            buf += line.rstrip()[:-1] + " "
            continue
        yield start, buf + line
        buf = ""
    if buf:
        yield start, buf


def _words(line: str) -> list[str]:
    line = re.sub(r"^\s*\$\s+", "", line)  # a prompt
    line = re.sub(r"\$\([^()]*\)", "X", line)  # a command substitution stands for one word
    lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|")
    lexer.whitespace_split = True
    lexer.commenters = "#"
    try:
        return list(lexer)
    except ValueError:  # an unbalanced quote: let the parser see the raw words
        return line.split()


def _module_scripts() -> dict[str, str]:
    """``python -m MODULE`` names of the console scripts' modules -> script name."""
    out = {}
    for s in console_scripts():
        out[s.module] = s.name
        if s.module.endswith(".__main__"):
            out[s.module.removesuffix(".__main__")] = s.name
    return out


def commands_in(text: str, source: str) -> Iterator[Command]:
    modules = _module_scripts()
    for first, info, body in shell_blocks(text):
        words = info.split()
        lang = words[0].lstrip(".{") if words else ""
        if lang not in SHELLS or EXAMPLE.search(info):
            continue
        for lineno, line in _logical_lines(body, first):
            tokens = _words(line)
            segment: list[str] = []
            for tok in [*tokens, ";"]:
                if tok not in SEPARATORS and not set(tok) <= set(";&|"):
                    segment.append(tok)
                    continue
                while segment and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", segment[0]):
                    segment.pop(0)  # VAR=value before the command
                if segment:
                    name = Path(segment[0]).name
                    if name.startswith("rmq-"):
                        yield Command(f"{source}:{lineno}", (name, *segment[1:]))
                    elif (
                        len(segment) > 2
                        and re.fullmatch(r"python3?(\.\d+)?", name)
                        and segment[1] == "-m"
                        and segment[2] in modules
                    ):
                        yield Command(f"{source}:{lineno}", (modules[segment[2]], *segment[3:]))
                segment = []


def parsers(name: str) -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    """The script's ``build_parser()`` and its module's other ``build_<word>_parser()`` by word."""
    target = next(s for s in console_scripts() if s.name == name)
    module = importlib.import_module(target.module)
    extra = {
        fn_name[len("build_") : -len("_parser")]: fn()
        for fn_name, fn in inspect.getmembers(module, inspect.isfunction)
        if re.fullmatch(r"build_\w+_parser", fn_name) and fn.__module__ == module.__name__
    }
    return module.build_parser(), extra


def parse_problem(command: Command) -> str | None:
    """None when the command line parses, else what its parser said."""
    names = {s.name for s in console_scripts()}
    name, *args = command.argv
    if name not in names:
        return f"{name} is not a console script of this project"
    parser, extra = parsers(name)
    if args and args[0] in extra:
        parser, args = extra[args[0]], args[1:]
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            parser.parse_args(args)
    except SystemExit as e:
        if e.code not in (0, None):
            return err.getvalue().strip().splitlines()[-1] if err.getvalue().strip() else f"exit {e.code}"
    return None


def all_commands() -> list[Command]:
    out = []
    for path in doc_files():
        out += commands_in(path.read_text(encoding="utf-8"), path.relative_to(ROOT).as_posix())
    return out


def test_every_command_shown_as_working_parses() -> None:
    commands = all_commands()
    assert len(commands) >= 30, f"only {len(commands)} command lines found: is the scanner broken?"
    problems = [f"{c.source}: {' '.join(c.argv)}\n    {p}" for c in commands if (p := parse_problem(c))]
    assert not problems, "command lines that do not parse (fix them or mark the block as an example):\n" + (
        "\n".join(problems)
    )


def test_every_console_script_is_shown_running_somewhere() -> None:
    shown = {c.argv[0] for c in all_commands()}
    missing = sorted({s.name for s in console_scripts()} - shown)
    assert not missing, f"no checked command line runs {missing}"


@pytest.mark.parametrize(
    ("block", "bad"),
    [
        ("```bash\nrmq-chaos run demo --no-such-flag\n```\n", True),
        ("```bash\nrmq-sim run demo --seed seven\n```\n", True),
        ("```bash\nrmq-chaos run demo [--out DIR]\n```\n", True),
        ("```bash\ncd x && rmq-allocate --queues 8 --consumers 3 --strategy NOPE  # comment\n```\n", True),
        ("```bash\nrmq-chaos run demo --out runs/x\n```\n", False),
        ('```bash title="Example"\nrmq-chaos run demo [--out DIR]\n```\n', False),
        ("```text\nrmq-chaos run demo [--out DIR]\n```\n", False),
    ],
)
def test_the_checker_catches_what_does_not_parse(block: str, bad: bool) -> None:
    commands = list(commands_in(block, "case.md"))
    problems = [parse_problem(c) for c in commands]
    assert any(problems) is bad, (commands, problems)


def test_the_checker_follows_continuations_substitutions_and_python_m() -> None:
    text = (
        "```bash\nrmq-chaos nemesis kill $(docker compose ps -q consumer | head -n 1) \\\n"
        "    --run-dir runs/compose\nRUN_ID=x python -m "
        + next(s.module for s in console_scripts() if s.name == "rmq-analyze").removesuffix(".__main__")
        + " runs/x\n```\n"
    )
    commands = list(commands_in(text, "case.md"))
    assert [c.argv[0] for c in commands] == ["rmq-chaos", "rmq-analyze"]
    assert commands[0].argv[-2:] == ("--run-dir", "runs/compose")
    assert all(parse_problem(c) is None for c in commands)
