"""Finding the event files of a run directory (EVENTS.md: recursive `*.jsonl`, skipping `.`/`_` names)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


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
