"""The known problems that run as real processes, with both variants (slow: 20 to 30 s a run): the
problem shows with the affected behaviour and not with the fix, as simulated.

Every entry runs simulated with both variants in tests/sim; here, by default, two entries stand for the
rest on processes, one switch of the client and one of the broker, so that the whole suite stays within
its time. ``RMQ_EXHAUSTIVE=1`` runs every entry that runs on processes (about 10 minutes), as was done
for the numbers of the catalogue page."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest
from kit import exhaustive

from rmqlab.chaos.__main__ import main
from rmqlab.lab import known
from rmqlab.pipeline.quick import quick_summary
from rmqlab.pipeline.report_story import known_figure

pytestmark = pytest.mark.slow

ON_PROCESSES = [e.name for e in known.CATALOGUE if "processes" in e.needs]
# A client's switch (RemoteBrokerOffsetStore.readOffset) and a broker's (brokerPermission).
REPRESENTATIVES = ["offset-query-error-skips-backlog", "read-only-broker-idles-a-consumer"]


@pytest.mark.parametrize("name", exhaustive(ON_PROCESSES, REPRESENTATIVES))
def test_with_processes_the_problem_shows_only_with_the_affected_behaviour(tmp_path: Path, name: str) -> None:
    entry = known.find(name)
    seen = {}
    for variant in known.VARIANTS:
        out = tmp_path / variant
        with contextlib.redirect_stdout(io.StringIO()) as printed:
            rc = main(["run", f"known/{name}", "--variant", variant, "--out", str(out), "--no-analyze", "-q"])
        assert rc in (0, 1), printed.getvalue()
        assert json.loads((out / "manifest.json").read_text())["known"]["variant"] == variant
        summary = quick_summary(out)
        assert summary is not None
        seen[variant] = known_figure(summary, entry.figure)
        assert summary["answer"][0].startswith("Yes:" if variant == "affected" else "No:")
    assert entry.shows(seen["affected"]) and not entry.shows(seen["fixed"]), seen
