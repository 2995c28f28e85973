"""The catalogue page shows every entry of the known-problems catalogue and every behaviour switch, from
the same sources the commands read (``chaos.known``, ``client.versions``)."""

from __future__ import annotations

from kit.docs import ROOT

from rmqlab.client.versions import BEHAVIOURS
from rmqlab.lab import known

PAGE = (ROOT / "docs" / "reference" / "known-problems.md").read_text(encoding="utf-8")


def rows() -> dict[str, str]:
    """The catalogue table's rows by the entry they name first."""
    out = {}
    for line in PAGE.splitlines():
        if line.startswith("| `known/"):
            out[line.split("`")[1].removeprefix("known/")] = line
    return out


def test_one_row_per_entry_with_its_issues_releases_and_figure() -> None:
    table = rows()
    assert sorted(table) == sorted(known.entries())
    for entry in known.CATALOGUE:
        row = table[entry.name]
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert all(issue in cells[1] for issue in entry.issues)
        assert cells[2:4] == [entry.affected, entry.fixed_in]
        threshold = f" (more than {entry.above:,.0f})" if entry.above else ""
        assert cells[4] == f"`{entry.figure}`{threshold}"
        # measured with every backend the entry runs on
        if "processes" in entry.needs:
            assert "processes" in cells[5] and "processes" in cells[6], entry.name


def test_every_switch_is_on_the_page_with_its_release() -> None:
    for b in BEHAVIOURS:
        line = next(x for x in PAGE.splitlines() if x.startswith(f"| `{b.field}` |"))
        assert f"| {b.since}" in line
