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
    # a client_version in the consumer tables, and switches named one by one in [sim.client]
    for name in (SIMULATED[0], "reconnect-waits-for-heartbeat"):
        entry = known.find(name)
        for variant in known.VARIANTS:
            v = entry.variant(variant)
            _, run_dir, _ = simulate(tmp_path, name, variant)
            sx, _seed = read_sim_run(run_dir)
            assert sx.sim.consumer_settings() == v.named_settings()
            assert {c.client_version for c in sx.exp.consumers} == {v.client_version}
        assert resolve(f"known/{name}", "fixed").exp != resolve(f"known/{name}").exp


def test_a_broker_flag_of_a_variant_goes_to_the_simulated_brokers() -> None:
    entry = known.find("pop-max-start-skips-new-broker")
    for variant in known.VARIANTS:
        sx = resolve(f"known/{entry.name}", variant)
        wanted = entry.variant(variant).policies["init_pop_offset_by_check_msg_in_mem"]
        assert sx.exp.policies.init_pop_offset_by_check_msg_in_mem is wanted


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


def test_each_consumer_table_runs_the_switches_of_its_client_version() -> None:
    from rmqlab.client.client_config import ConsumerConfig
    from rmqlab.client.versions import BEHAVIOURS, settings_for_version
    from rmqlab.sim.sim_cluster import consumer_flags
    from rmqlab.sim.sim_table import parse

    text = """
duration = 60

[[topics]]
name = "T"
queues = 4

[[consumers]]
group = "G_old"
topic = "T"
client_version = "4.9.0"

[[consumers]]
group = "G_today"
topic = "T"

[[consumers]]
group = "G_five"
topic = "T"
rocketmq5 = true

[[consumers]]
group = "G_pop"
topic = "T"
assignment = "server-pop"
client_version = "5.1.0"
"""
    sx = parse(text)
    got = {}
    for spec in sx.exp.consumers:
        cfg = ConsumerConfig.from_mapping(consumer_flags(spec))
        switches = settings_for_version(spec.effective_client_version)
        assert {b.field: getattr(cfg, b.field) for b in BEHAVIOURS} == switches, spec.group
        got[spec.group] = spec.effective_client_version
    assert got == {"G_old": "4.9.0", "G_today": "4.9.8", "G_five": "5.3.3", "G_pop": "5.1.0"}
    assert sx.exp.to_dict()["consumers"][0]["client_version"] == "4.9.0"


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


@pytest.mark.parametrize(
    ("keys", "problem"),
    [
        (
            'client_version = "4.9"',
            r"consumers\[1\]\.client_version: unknown client_version '4\.9'; known: 4\.7\.0, ",
        ),
        (
            'client_version = "4.9.4"\nrocketmq5 = true',
            r"consumers\[1\]\.client_version: 4\.9\.4 is a 4\.x release: rocketmq5 and a server assignment "
            r"need a 5\.x client_version \(5\.0\.0, ",
        ),
        (
            'client_version = "5.1.0"\nclient = "go"',
            r"consumers\[1\]\.client_version: client_version selects the behaviour of the lab's own client",
        ),
    ],
)
def test_a_bad_client_version_in_a_consumer_table_is_refused_with_its_line(keys: str, problem: str) -> None:
    from rmqlab.lab.experiment import ExperimentError
    from rmqlab.sim.sim_table import parse

    text = 'duration = 60\n\n[[topics]]\nname = "T"\nqueues = 4\n\n'
    text += f'[[consumers]]\ngroup = "G"\ntopic = "T"\n{keys}\n'
    line = text.splitlines().index(keys.splitlines()[0]) + 1
    with pytest.raises(ExperimentError, match=rf":{line}: {problem}"):
        parse(text)
