"""The known-problems catalogue as shipped: every entry complete and runnable, one scenario file each,
listed by ``rmq-chaos known``; the first answer of an entry's report."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from rmqlab.chaos.__main__ import main
from rmqlab.cli import UnknownName
from rmqlab.client.client_config import ConsumerConfig
from rmqlab.client.versions import BEHAVIOURS
from rmqlab.lab import known
from rmqlab.pipeline.report_story import known_answer
from rmqlab.sim.__main__ import resolve

ISSUE = re.compile(r"^[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+#\d+$")


def switches(variant: known.Variant) -> dict[str, object]:
    """The behaviour switches a variant's settings give a consumer (a client_version's, then those named)."""
    cfg = ConsumerConfig.from_mapping(variant.consumer_settings())
    names = {b.field for b in BEHAVIOURS} | set(variant.settings) - {"client_version"}
    return {name: getattr(cfg, name) for name in sorted(names)}


@pytest.mark.parametrize("entry", known.CATALOGUE, ids=lambda e: e.name)
def test_an_entry_is_complete_and_its_variants_are_switches(entry: known.KnownProblem) -> None:
    assert all(ISSUE.match(i) for i in entry.issues), entry.issues
    assert set(entry.needs) <= set(known.NEEDS) and entry.needs
    assert tuple(entry.variants) == known.VARIANTS
    affected, fixed = (entry.variant(v) for v in known.VARIANTS)
    # the fix is a client or broker switch, or (a problem no release fixed) its remedy is another scenario
    assert (
        switches(affected) != switches(fixed)
        or affected.policies != fixed.policies
        or affected.scenario != fixed.scenario
    )
    # the scenario leaves name and question to the catalogue, and runs with each variant
    for v in known.VARIANTS:
        assert not {"name", "question"} & known.scenario_keys(known.scenario_text(entry, v))
    for v in known.VARIANTS:
        sx = resolve(f"known/{entry.name}", v)
        assert (sx.exp.name, sx.exp.question) == (entry.name, entry.question)


def test_the_shelf_holds_exactly_the_catalogue() -> None:
    assert sorted(known.KNOWN.entries()) == sorted(known.scenario_files())
    assert set(known.entries()) <= known.scenario_files()


def test_unknown_names_and_variants_list_what_exists() -> None:
    with pytest.raises(
        UnknownName, match=r"did you mean known/offset-query-error-\w+-\w+-\w+ or known/offset-query-error-"
    ):
        known.find("known/offset-query-error")
    entry = known.CATALOGUE[0]
    with pytest.raises(UnknownName, match=r"has no variant 'patched' \(variants: affected, fixed\)"):
        entry.variant("patched")


def test_rmq_chaos_known_lists_the_catalogue(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["known", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["name"] for r in rows] == [e.name for e in known.CATALOGUE]
    for row in rows:
        assert {"name", "issues", "affected", "fixed_in", "question", "figure", "needs"} <= set(row)
        assert isinstance(row["issues"], list) and isinstance(row["needs"], list)
    assert main(["known"]) == 0
    text = capsys.readouterr().out
    for e in known.CATALOGUE:
        assert f"known/{e.name}\n  {e.question}\n" in text


KNOWN = {
    "name": "x",
    "variant": "affected",
    "issues": ["apache/rocketmq#1"],
    "affected": "4.9.4 and earlier",
    "fixed_in": "4.9.5",
    "figure": "unavailability.by_cause_rocketmq_ms.owner_idle",
    "shows_above": 1000,
    "unit": "ms",
    "change": "the change",
}


def summary(*idle: float) -> dict[str, object]:
    groups = {
        f"g{i}": {"unavailability": {"by_cause_rocketmq_ms": {"owner_idle": v}}} for i, v in enumerate(idle)
    }
    return {"groups": groups}


def test_the_first_answer_says_whether_the_problem_appeared_and_what_fixes_it() -> None:
    figure = "unavailability.by_cause_rocketmq_ms.owner_idle"
    assert known_answer(KNOWN, summary(600, 500)) == (
        f"Yes: the problem of known/x (apache/rocketmq#1) appeared, {figure} = 1100 ms "
        "(the problem: more than 1000), with the behaviour of 4.9.4 and earlier; RocketMQ 4.9.5 removes it "
        "(the change)."
    )
    assert known_answer(KNOWN, summary(1000)) == (
        f"No: the problem of known/x (apache/rocketmq#1) did not appear, {figure} = 1000 ms "
        "(the problem: more than 1000), with the behaviour of 4.9.4 and earlier."
    )
    fixed = {**KNOWN, "variant": "fixed", "issues": [], "shows_above": 0}
    assert known_answer(fixed, summary(0)) == (
        f"No: the problem of known/x did not appear, {figure} = 0 ms, with the fix of 4.9.5 (the change)."
    )
    assert known_answer(fixed, summary(2000)).startswith(
        f"Yes: the problem of known/x appeared, {figure} = 2000"
    )


def test_rmq_chaos_runs_an_entry_with_its_variant_given_to_every_consumer() -> None:
    from rmqlab.chaos.__main__ import resolve as chaos_resolve

    for entry in (e for e in known.CATALOGUE if "processes" in e.needs):
        for v in known.VARIANTS:
            exp = chaos_resolve(f"known/{entry.name}", v)
            flags = [
                f"{k}={str(x).lower() if isinstance(x, bool) else x}"
                for k, x in sorted(entry.variant(v).settings.items())
            ]
            # a consumer's own settings (client_rebalance=false of a POP consumer) are not the variant's
            switches = {b.field for b in BEHAVIOURS} | {"client_version"}
            for c in exp.consumers:
                args = c.client_args()
                sets = [args[i + 1] for i, a in enumerate(args) if a == "--set"]
                assert [s for s in sets if s.split("=")[0] in switches] == flags
                # a client_version's switches stand for --rocketmq5's
                assert ("--rocketmq5" in args) == (
                    c.rocketmq5 and "client_version" not in entry.variant(v).settings
                )
            # the variant's broker flags go to every broker
            flags = exp.broker_flags()
            pop_offset = entry.variant(v).policies.get("init_pop_offset_by_check_msg_in_mem", True)
            assert ("--no-init-pop-offset-by-check-msg-in-mem" in flags) == (not pop_offset)


def test_rmq_chaos_refuses_what_only_the_simulator_runs_and_a_variant_without_an_entry(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["run", "known/duplicate-client-id-in-docker", "--out", str(tmp_path / "a")]) == 2
    assert (
        "runs simulated only (sim): rmq-sim run known/duplicate-client-id-in-docker"
        in capsys.readouterr().err
    )
    assert main(["run", "kill-one-of-four", "--variant", "fixed", "--out", str(tmp_path / "b")]) == 2
    assert "--variant goes with a catalogue entry (known/NAME)" in capsys.readouterr().err
    assert main(["run", "known/nope", "--out", str(tmp_path / "c")]) == 2
    assert "(the catalogue: known/different-subscriptions-in-one-group, " in capsys.readouterr().err


def test_rmq_consumer_runs_the_switches_of_its_tables_client_version() -> None:
    """What rmq-chaos gives each consumer process (ConsumerSpec.client_args) makes rmq-consumer's config
    the switches of the table's client_version: 4.9.8 by default, the newest 5.x with rocketmq5."""
    from rmqlab.client.consumer_main import build_parser, make_config
    from rmqlab.client.versions import settings_for_version
    from rmqlab.lab.experiment import parse

    text = 'duration = 60\n\n[[topics]]\nname = "T"\nqueues = 4\n'
    tables = {
        "G_old": 'client_version = "4.9.0"',
        "G_today": "",
        "G_five": "rocketmq5 = true",
        "G_pop": 'assignment = "server-pop"\nclient_version = "5.1.0"',
    }
    for group, keys in tables.items():
        text += f'\n[[consumers]]\ngroup = "{group}"\ntopic = "T"\n{keys}\n'
    got = {}
    for spec in parse(text).consumers:
        base = ["--namesrv", "127.0.0.1:9876", "--group", spec.group, "--topic", "T"]
        cfg = make_config(build_parser().parse_args(base + spec.client_args()))
        switches = settings_for_version(spec.effective_client_version)
        assert {b.field: getattr(cfg, b.field) for b in BEHAVIOURS} == switches, spec.group
        got[spec.group] = spec.effective_client_version
    assert got == {"G_old": "4.9.0", "G_today": "4.9.8", "G_five": "5.3.3", "G_pop": "5.1.0"}


def test_read_only_brokers_name_brokers_of_the_cluster() -> None:
    from rmqlab.lab.experiment import ExperimentError, parse

    text = known.scenario_text(known.find("read-only-broker-idles-a-consumer"))
    assert parse(text, default_name="x").read_only_brokers == ("broker-c",)
    bad = text.replace('read_only_brokers = ["broker-c"]', 'read_only_brokers = ["broker-d"]')
    line = bad.splitlines().index('read_only_brokers = ["broker-d"]') + 1
    with pytest.raises(
        ExperimentError,
        match=rf":{line}: cluster\.read_only_brokers: 'broker-d' is not a broker \(brokers: broker-a, "
        r"broker-b, broker-c\)",
    ):
        parse(bad, default_name="x")
