"""Every entry of the known-problems catalogue simulated with both variants: the problem shows with the
affected behaviour and not with the fix, and the run's first answer says so."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest

from rmqlab.lab import known
from rmqlab.pipeline.quick import quick_summary
from rmqlab.pipeline.report_story import known_figure
from rmqlab.sim.__main__ import main, resolve
from rmqlab.sim.rundir import read_sim_run

SIMULATED = [e.name for e in known.CATALOGUE if "sim" in e.needs]


def simulate(tmp_path: Path, name: str, variant: str) -> tuple[int, Path, str]:
    out = tmp_path / f"{name}-{variant}"
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        rc = main(["run", f"known/{name}", "--variant", variant, "--out", str(out), "--no-analyze", "-q"])
    return rc, out, printed.getvalue()


@pytest.mark.parametrize("name", SIMULATED)
def test_the_problem_shows_with_the_affected_behaviour_and_not_with_the_fix(
    tmp_path: Path, name: str
) -> None:
    entry = known.find(name)
    seen = {}
    for variant in known.VARIANTS:
        rc, run_dir, printed = simulate(tmp_path, name, variant)
        assert rc in (0, 1), printed
        summary = quick_summary(run_dir)
        assert summary is not None
        seen[variant] = known_figure(summary, entry.figure)
        manifest = json.loads((run_dir / "manifest.json").read_text())
        assert manifest["known"] == entry.manifest(variant)
        first = summary["answer"][0]
        assert first.startswith("Yes:" if variant == "affected" else "No:"), first
        assert f"{entry.figure} = {seen[variant]:g}" in first
    assert entry.shows(seen["affected"]), seen
    assert not entry.shows(seen["fixed"]), seen


def test_a_variant_is_replayed_from_its_run_directory(tmp_path: Path) -> None:
    name = SIMULATED[0]
    for variant in known.VARIANTS:
        _, run_dir, _ = simulate(tmp_path, name, variant)
        sx, _seed = read_sim_run(run_dir)
        assert sx.sim.consumer_settings() == known.find(name).variant(variant).consumer_settings()
    assert resolve(f"known/{name}", "fixed").sim.client != resolve(f"known/{name}").sim.client


def test_unknown_entries_and_variants_name_what_exists(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["run", "known/orderly-new-queue-wait", "--out", str(tmp_path / "a")]) == 2
    err = capsys.readouterr().err
    assert "did you mean known/orderly-new-queue-waits-for-lock" in err
    assert all(f"known/{n}" in err for n in SIMULATED)
    assert main(["run", "kill-one-of-four", "--variant", "fixed", "--out", str(tmp_path / "b")]) == 2
    assert "--variant goes with a catalogue entry (known/NAME)" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        main(["run", f"known/{SIMULATED[0]}", "--variant", "patched"])
    assert exc.value.code == 2
    assert "invalid choice: 'patched' (choose from 'affected', 'fixed')" in capsys.readouterr().err


def test_an_experiment_may_name_a_client_version_and_an_unknown_one_is_refused_with_its_line() -> None:
    from rmqlab.lab.experiment import ExperimentError
    from rmqlab.sim.sim_table import parse

    base = known.scenario_text(known.find(SIMULATED[0]))
    sx = parse(base + '\n[sim.client]\nclient_version = "4.9.4"\n')
    assert sx.sim.consumer_settings() == {"client_version": "4.9.4"}
    text = base + '\n[sim.client]\nclient_version = "4.8"\n'
    line = text.splitlines().index('client_version = "4.8"') + 1
    with pytest.raises(
        ExperimentError,
        match=rf":{line}: sim.client.client_version: unknown client_version '4\.8'; known: 4\.7\.0, ",
    ):
        parse(text)
