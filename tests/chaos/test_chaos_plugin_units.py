"""The plugin's event checks on hand-written runs (no processes), and its registration."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from rmqlab.chaos.pytest_plugin import LabTimeout, RmqLab


def write(run: Path, name: str, events: list[dict]) -> None:
    with open(run / name, "a") as f:
        for e in events:
            f.write(json.dumps(e) + "\n")


@pytest.fixture
def lab(tmp_path: Path):
    lab = RmqLab(tmp_path / "run")
    yield lab
    lab.close()


def consumed(ts: int, cid: str, q: int, off: int, msg: str) -> dict:
    return {
        "ts_ms": ts,
        "event": "message_consumed",
        "node": "n",
        "role": "consumer",
        "group": "g",
        "client_id": cid,
        "msg_id": msg,
        "topic": "T",
        "broker": "b",
        "queue_id": q,
        "queue_offset": off,
        "mode": "ORDERLY",
    }


def added(ts: int, cid: str, q: int) -> dict:
    return {
        "ts_ms": ts,
        "event": "mq_added",
        "group": "g",
        "client_id": cid,
        "topic": "T",
        "broker": "b",
        "queue_id": q,
    }


def test_plugin_is_registered_through_its_entry_point(pytestconfig: pytest.Config) -> None:
    assert pytestconfig.pluginmanager.hasplugin("rmqlab")


def test_rmq_time_scale_defaults_to_the_ini_value(rmq_time_scale: float) -> None:
    assert rmq_time_scale == 0.05


@pytest.mark.rmq_time_scale(0.2)
def test_rmq_time_scale_marker(rmq_time_scale: float) -> None:
    assert rmq_time_scale == 0.2


def test_order_violations_reset_at_each_new_ownership(lab: RmqLab) -> None:
    write(
        lab.run_dir,
        "c.jsonl",
        [
            added(1, "c1", 0),
            consumed(2, "c1", 0, 0, "m0"),
            consumed(3, "c1", 0, 1, "m1"),
            added(4, "c1", 0),  # the queue came back: consuming again from the committed offset is fine
            consumed(5, "c1", 0, 1, "m1"),
            consumed(6, "c1", 0, 2, "m2"),
            consumed(7, "c1", 0, 2, "m2"),  # a repeat inside one ownership: a violation
            consumed(8, "c2", 1, 5, "m5"),
        ],
    )
    bad = lab.order_violations("g")
    assert [(e["ts_ms"], e["msg_id"]) for e in bad] == [(7, "m2")]
    with pytest.raises(AssertionError, match="1 message"):
        lab.assert_ordered("g")
    assert lab.duplicates("g") == {"m1": 2, "m2": 2}
    with pytest.raises(AssertionError, match="never consumed 1 of 3"):
        lab.assert_no_loss("g", ["m0", "m1", "m9"])
    with pytest.raises(AssertionError, match="more than once"):
        lab.assert_no_duplicates("g")


def test_events_skip_hidden_files_and_come_in_pipeline_order(lab: RmqLab) -> None:
    write(lab.run_dir, "b.jsonl", [{"ts_ms": 5, "event": "x", "k": 1}, {"ts_ms": 1, "event": "x", "k": 2}])
    write(lab.run_dir, "a.jsonl", [{"ts_ms": 5, "event": "x", "k": 3}])
    write(lab.run_dir, "_hidden.jsonl", [{"ts_ms": 0, "event": "x", "k": 4}])
    (lab.run_dir / "c.jsonl").write_text("not json\n")
    assert [e["k"] for e in lab.events("x")] == [2, 3, 1]
    assert [e["k"] for e in lab.events("x", k=1)] == [1]


def fake_member(lab: RmqLab, node: str, cid: str, state: str = "running") -> None:
    m = lab.sup.add(node, "consumer", "unused", [], group="g")
    m.client_ids.append(cid)
    m.state = state


def rebalance(ts: int, cid: str, cids: list[str], allocated: list[str]) -> dict:
    return {
        "ts_ms": ts,
        "event": "rebalance",
        "group": "g",
        "client_id": cid,
        "topic": "T",
        "strategy": "AVG",
        "cid_all": cids,
        "allocated": allocated,
        "changed": True,
    }


def test_convergence_needs_agreement_and_exclusive_full_coverage(lab: RmqLab) -> None:
    fake_member(lab, "consumer-1", "c1")
    fake_member(lab, "consumer-2", "c2")
    route = {"ts_ms": 1, "event": "topic_route", "client_id": "c1", "topic": "T", "queues": ["b:0", "b:1"]}
    write(lab.run_dir, "x.jsonl", [route, rebalance(2, "c1", ["c1", "c2"], ["b:0"])])
    assert lab.convergence_problem("g") == "consumer-2 has not rebalanced T yet"
    write(lab.run_dir, "x.jsonl", [rebalance(3, "c2", ["c2"], ["b:0", "b:1"])])
    assert lab.convergence_problem("g") == "consumer-2 still sees ['c2'] in T"
    write(lab.run_dir, "x.jsonl", [rebalance(4, "c2", ["c1", "c2"], ["b:0", "b:1"])])
    assert lab.convergence_problem("g") == "queues of T owned twice: ['b:0']"
    write(lab.run_dir, "x.jsonl", [rebalance(5, "c2", ["c1", "c2"], [])])
    assert lab.convergence_problem("g") == "queues of T without an owner: ['b:1']"
    write(lab.run_dir, "x.jsonl", [rebalance(6, "c2", ["c1", "c2"], ["b:1"])])
    assert lab.convergence_problem("g") is None
    lab.wait_converged("g", timeout_s=1)
    lab.sup.member("consumer-2").state = "paused"  # paused members still count as live, not asked
    assert lab.convergence_problem("g") is None
    lab.sup.member("consumer-2").state = "stopped"
    with pytest.raises(LabTimeout, match="still sees"):
        lab.wait_converged("g", timeout_s=0.3)


def _pytest_in(project: Path, *extra: str, expect: int = 0) -> str:
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-s", "-p", "no:cacheprovider", *extra],
        cwd=project, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == expect, done.stdout + done.stderr
    return done.stdout + done.stderr


def test_the_plugin_leaves_other_plugins_settings_alone(tmp_path: Path) -> None:
    (tmp_path / "test_user.py").write_text(
        "def test_scope(request):\n"
        "    print('SCOPE=' + repr(request.config.getini('asyncio_default_fixture_loop_scope')))\n"
    )
    with_lab, without = _pytest_in(tmp_path), _pytest_in(tmp_path, "-p", "no:rmqlab")
    scope = re.findall(r"SCOPE=\S+", with_lab)
    assert scope and scope == re.findall(r"SCOPE=\S+", without)
    assert "SCOPE='module'" in _pytest_in(tmp_path, "-o", "asyncio_default_fixture_loop_scope=module")


def test_module_and_session_factories_share_labs_and_a_failure_names_the_run(tmp_path: Path) -> None:
    (tmp_path / "test_user.py").write_text(
        "import pytest\n"
        "from rmqlab.chaos.pytest_plugin import RmqLab\n"
        "SEEN = []\n"
        "@pytest.fixture(scope='module')\n"
        "def shared(rmq_lab_module_factory):\n"
        "    return rmq_lab_module_factory('orders', time_scale=0.1)\n"
        "def test_one(shared, rmq_lab_session_factory):\n"
        "    SEEN.append(shared)\n"
        "    assert shared.time_scale == 0.1 and shared.run_dir.name == 'orders-1'\n"
        "    assert rmq_lab_session_factory('s').time_scale == 0.05\n"
        "def test_two(shared):\n"
        "    assert SEEN == [shared]\n"
        "def test_context_manager(tmp_path):\n"
        "    with RmqLab(tmp_path / 'run') as lab:\n"
        "        pass\n"
        "    assert lab.log._closed\n"
        "def test_fails(rmq_lab):\n"
        "    assert False, 'the user test failed'\n"
    )
    out = _pytest_in(tmp_path, "-rN", expect=1)
    assert "1 failed, 3 passed" in out
    section = out.split("rmqlab", 1)[1] if "- rmqlab -" in out else ""
    assert "run directory:" in section and "analyse it:    rmq-analyze " in section
    assert section.count("rmq-run") >= 2  # the failing test's own lab, not the shared ones
