"""Finding the event files of a run directory (EVENTS.md: recursive `*.jsonl`, skipping `.`/`_` names),
and the run directories under a root of many runs."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any


class RunDirError(Exception):
    """The run directory cannot be analysed (missing, not a directory, no event files)."""


@dataclass(frozen=True, order=True)
class RunFile:
    """One event file: its path relative to the run directory (the order key) and its absolute path."""

    rel: str
    path: str


def _hidden(name: str) -> bool:
    return name.startswith((".", "_"))


def discover(run_dir: str | os.PathLike[str], *, suffix: str = ".jsonl") -> list[RunFile]:
    """Event files of a run, sorted by relative path (compared as a string, '/' separated)."""
    root = Path(run_dir)
    if not root.exists():
        raise RunDirError(f"run directory {str(root)!r} does not exist")
    if not root.is_dir():
        raise RunDirError(f"{str(root)!r} is not a directory")
    found: list[RunFile] = []
    for current, dirs, files in os.walk(root, followlinks=True):
        # Pruning here keeps whole hidden sub-trees out, as Spark's file listing does.
        dirs[:] = sorted(d for d in dirs if not _hidden(d))
        for name in files:
            if _hidden(name) or not name.endswith(suffix):
                continue
            full = Path(current) / name
            if not full.is_file():
                continue
            rel = full.relative_to(root).as_posix()
            found.append(RunFile(rel=rel, path=str(full.resolve())))
    found.sort()
    return found


MANIFEST = "manifest.json"


@dataclass
class RunDir:
    """One run under a root of runs: its path relative to the root, its event files, its manifest."""

    rel: str
    path: str
    files: list[RunFile]
    manifest: dict[str, Any]


@dataclass
class BadRun:
    """A run directory that cannot be analysed, and why (reported and skipped, never fatal)."""

    rel: str
    problem: str


def is_run_dir(path: str | os.PathLike[str]) -> bool:
    """A run directory has a manifest.json or event files of its own (not only in sub-folders)."""
    root = Path(path)
    if (root / MANIFEST).is_file():
        return True
    try:
        return any(
            e.is_file() and e.name.endswith(".jsonl") and not _hidden(e.name) for e in os.scandir(root)
        )
    except OSError:
        return False


def discover_runs(root_dir: str | os.PathLike[str]) -> tuple[list[RunDir], list[BadRun]]:
    """The run directories under a root (any depth; a run's own sub-folders belong to it), sorted by
    relative path, and the ones that cannot be analysed."""
    root = Path(root_dir)
    if not root.is_dir():
        raise RunDirError(f"{str(root)!r} is not a directory")
    runs: list[RunDir] = []
    bad: list[BadRun] = []
    for current, dirs, _files in os.walk(root, followlinks=True):
        dirs[:] = sorted(d for d in dirs if not _hidden(d))
        here = Path(current)
        if here == root or not is_run_dir(here):
            continue
        dirs[:] = []  # everything below belongs to this run
        rel = here.relative_to(root).as_posix()
        try:
            manifest = read_manifest(here)
            files = discover(here)
        except (RunDirError, OSError) as exc:
            bad.append(BadRun(rel, str(exc)))
            continue
        if not files:
            bad.append(BadRun(rel, "no *.jsonl event files"))
            continue
        runs.append(RunDir(rel, str(here.resolve()), files, manifest))
    runs.sort(key=lambda r: r.rel)
    return runs, bad


def read_manifest(run: str | os.PathLike[str]) -> dict[str, Any]:
    """A run directory's manifest.json ({} when it has none); RunDirError when it is not a JSON object."""
    path = Path(run) / MANIFEST
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise RunDirError(f"{MANIFEST} is not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise RunDirError(f"{MANIFEST} is not a JSON object")
    return data


def is_simulated(run_dir: str | os.PathLike[str]) -> bool:
    """Whether the run was simulated (its manifest says ``mode = sim``): its times are virtual, not wall."""
    try:
        manifest = json.loads((Path(run_dir) / "manifest.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(manifest, dict) and manifest.get("mode") == "sim"


def clock_word(run_dir: str | os.PathLike[str] | None) -> str:
    """How a run's durations are told: ``simulated`` for a simulated run, else ``wall``."""
    return "simulated" if run_dir is not None and is_simulated(run_dir) else "wall"
