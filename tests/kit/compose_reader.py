"""A reader for the small YAML subset docker-compose.yml is written in (no PyYAML needed).

Why a subset instead of YAML: the tests must parse the file without a YAML library, and a reader that
accepted "YAML-ish" input could read a file differently from Docker. So this one accepts exactly:
block mappings (``key: value`` / ``key:`` + a deeper block), block lists of scalars (``- scalar``),
scalars that are double-quoted JSON strings, integers, ``true``/``false`` or plain one-word tokens, and
whole-line comments. Anything else (tabs, flow ``[]``/``{}``, anchors, multi-line strings, inline
comments, plain scalars YAML 1.1 would read as something else such as ``yes`` or ``80:80``) is an
error naming the line, so the file cannot drift into YAML this reader would misread.

``interpolate`` applies compose's variable substitution (``${VAR:-default}``, ``${VAR}``, ``$VAR``,
``$$``) to every string.
"""

from __future__ import annotations

import json
import re
from typing import Any

_KEY = re.compile(r"[A-Za-z0-9_.-]+")
_PLAIN = re.compile(r"[A-Za-z_./][A-Za-z0-9_./-]*")
# Plain words YAML 1.1 (PyYAML, docker-compose 1.29) reads as booleans or null.
_YAML11_SPECIAL = {"y", "n", "yes", "no", "on", "off", "null", "none", "~"}


class SubsetError(ValueError):
    def __init__(self, line: int, msg: str) -> None:
        super().__init__(f"line {line}: {msg}")
        self.line = line


def _scalar(text: str, line: int) -> Any:
    if text.startswith('"'):
        try:
            value, end = json.JSONDecoder().raw_decode(text)
        except ValueError:
            raise SubsetError(line, f"bad double-quoted string {text!r}") from None
        if not isinstance(value, str) or text[end:].strip():
            raise SubsetError(line, f"only a quoted string may stand here: {text!r}")
        return value
    if re.fullmatch(r"-?[0-9]+", text):
        return int(text)
    if text in ("true", "false"):
        return text == "true"
    if _PLAIN.fullmatch(text) and text.lower() not in _YAML11_SPECIAL:
        return text
    raise SubsetError(line, f"plain scalar {text!r} is outside the subset: double-quote it")


def load(text: str) -> Any:
    rows: list[tuple[int, int, str]] = []
    for n, raw in enumerate(text.splitlines(), 1):
        if "\t" in raw:
            raise SubsetError(n, "tab character")
        stripped = raw.strip()
        if not stripped or stripped.startswith("#"):
            continue
        indent = len(raw) - len(raw.lstrip(" "))
        if indent % 2:
            raise SubsetError(n, "indentation must be a multiple of two spaces")
        if raw.rstrip() != raw:
            raise SubsetError(n, "trailing white space")
        if stripped[0] in "[{&*!|>%@`'" or stripped.startswith("---"):
            raise SubsetError(n, f"{stripped[0]!r} starts a construct outside the subset")
        rows.append((n, indent, stripped))
    if not rows:
        raise SubsetError(1, "empty document")
    value, i = _block(rows, 0, rows[0][1])
    if i != len(rows):
        raise SubsetError(rows[i][0], "unexpected indentation")
    return value


def _block(rows: list[tuple[int, int, str]], i: int, indent: int) -> tuple[Any, int]:
    if rows[i][2].startswith("- ") or rows[i][2] == "-":
        items = []
        while i < len(rows) and rows[i][1] == indent and rows[i][2].startswith("-"):
            n, _, content = rows[i]
            item = content[1:].strip()
            if not item or ": " in item or item.endswith(":"):
                raise SubsetError(n, "list items must be scalars")
            items.append(_scalar(item, n))
            i += 1
        return items, i
    out: dict[str, Any] = {}
    while i < len(rows) and rows[i][1] == indent:
        n, _, content = rows[i]
        key, sep, rest = content.partition(":")
        if not sep or not _KEY.fullmatch(key):
            raise SubsetError(n, f"expected 'key: value', got {content!r}")
        if key in out:
            raise SubsetError(n, f"duplicate key {key!r}")
        rest = rest.strip()
        if rest:
            if not content[len(key) + 1 :].startswith(" "):
                raise SubsetError(n, "a space must follow ':'")
            out[key] = _scalar(rest, n)
            i += 1
            continue
        i += 1
        if i >= len(rows) or rows[i][1] <= indent:
            raise SubsetError(n, f"key {key!r} has no value")
        if rows[i][1] != indent + 2:
            raise SubsetError(rows[i][0], "nested blocks are indented by two spaces")
        out[key], i = _block(rows, i, indent + 2)
    if i < len(rows) and rows[i][1] > indent:
        raise SubsetError(rows[i][0], "unexpected indentation")
    return out, i


_VAR = re.compile(r"\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?-)([^}]*))?\}|\$([A-Za-z_][A-Za-z0-9_]*)")


def interpolate(value: Any, env: dict[str, str]) -> Any:
    """Compose's variable substitution over every string of a parsed document."""
    if isinstance(value, dict):
        return {k: interpolate(v, env) for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v, env) for v in value]
    if not isinstance(value, str):
        return value

    def sub(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        name = m.group(1) or m.group(4)
        if m.group(2) == ":-":
            return env.get(name) or m.group(3)
        if m.group(2) == "-":
            return env.get(name, m.group(3))
        return env.get(name, "")

    return _VAR.sub(sub, value)
