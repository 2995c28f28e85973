"""Supervisor lifecycle with stand-in processes: READY, signals, restarts, failures and cleanup."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from kit.chaos import Events, gone, proc_state

from rmqlab.chaos.supervisor import ProcessFailed, Supervisor, SupervisorError


@pytest.fixture
def sup(tmp_path: Path, standin: dict[str, str]) -> Supervisor:
    events = Events()
    s = Supervisor(tmp_path / "run", time_scale=0.05, log=events, env=standin, ready_timeout_s=10)
    s.events = events  # type: ignore[attr-defined]
    yield s
    s.close(timeout_s=2)


def log_lines(path: str) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def test_start_waits_for_ready_and_passes_common_flags(sup: Supervisor) -> None:
    sup.add("consumer-1", "consumer", "standin_role", ["--ready", "cid", "--delay", "0.3"], group="g1")
    m = sup.start("consumer-1")
    assert m.state == "running" and m.alive
    assert m.ready_info == f"consumer-1@{m.pid}" and m.client_ids == [m.ready_info]
    assert os.getpgid(m.pid) == m.pid  # its own process group
    [started] = [e for e in log_lines(m.log_files[0]) if e["event"] == "started"]
    assert started["node"] == "consumer-1" and started["time_scale"] == 0.05
    assert Path(m.log_files[0]).name == "consumer-1.jsonl"
    assert sup.events.named("nemesis") == []  # the initial start is not a nemesis


def test_ready_printed_before_popen_returns_is_seen(sup: Supervisor, monkeypatch: pytest.MonkeyPatch) -> None:
    # On a loaded machine the supervisor may get the CPU back only after the child has printed READY:
    # the line must still come after the incarnation header and the offset check_ready reads from.
    popen = subprocess.Popen

    def popen_returning_after_ready(*args: object, **kwargs: object) -> subprocess.Popen[bytes]:
        proc = popen(*args, **kwargs)  # type: ignore[call-overload]
        out = Path(kwargs["stdout"].name)  # type: ignore[union-attr]
        deadline = time.monotonic() + 10
        while b"READY" not in out.read_bytes() and time.monotonic() < deadline:
            time.sleep(0.01)
        return proc

    monkeypatch.setattr("rmqlab.chaos.supervisor.subprocess.Popen", popen_returning_after_ready)
    sup.add("consumer-1", "consumer", "standin_role", ["--ready", "cid"], group="g1")
    m = sup.start("consumer-1", timeout_s=5)
    assert m.state == "running" and m.ready_info == f"consumer-1@{m.pid}"
    assert Path(m.out_file).read_text().startswith("--- incarnation 1 ---\nREADY ")


def test_pause_resume_kill_write_nemesis_events(sup: Supervisor) -> None:
    sup.add("consumer-1", "consumer", "standin_role", ["--ready", "cid"], group="g1")
    pid = sup.start("consumer-1").pid
    sup.pause("consumer-1")
    deadline = time.monotonic() + 3
    while proc_state(pid) != "T" and time.monotonic() < deadline:
        time.sleep(0.01)
    assert proc_state(pid) == "T"
    with pytest.raises(SupervisorError, match="paused, not running"):
        sup.pause("consumer-1")
    sup.resume("consumer-1")
    deadline = time.monotonic() + 3
    while proc_state(pid) == "T" and time.monotonic() < deadline:
        time.sleep(0.01)
    assert proc_state(pid) in ("S", "R")
    sup.kill("consumer-1")
    assert gone(pid)
    assert sup.member("consumer-1").state == "stopped"
    nem = sup.events.named("nemesis")
    assert [e["action"] for e in nem] == ["pause", "resume", "kill"]
    assert {(e["target"], e["target_role"], e["group"]) for e in nem} == {("consumer-1", "consumer", "g1")}
    # no shutdown handler ran on SIGKILL
    assert "graceful_stop" not in {e["event"] for e in log_lines(sup.member("consumer-1").log_files[0])}


def test_stop_is_graceful_and_restart_makes_a_new_incarnation(sup: Supervisor) -> None:
    sup.add("broker-a", "broker", "standin_role", [])
    first = sup.start("broker-a").pid
    sup.restart("broker-a")
    m = sup.member("broker-a")
    assert m.incarnation == 2 and m.pid != first and m.state == "running"
    assert gone(first)
    assert [Path(p).name for p in m.log_files] == ["broker-a.jsonl", "broker-a.2.jsonl"]
    assert "graceful_stop" in {e["event"] for e in log_lines(m.log_files[0])}
    assert [(e["action"], e["target_role"]) for e in sup.events.named("nemesis")] == [
        ("stop", "broker"),
        ("start", "broker"),
    ]
    assert "group" not in sup.events.named("nemesis")[0]


def test_stop_escalates_to_sigkill_after_timeout(sup: Supervisor) -> None:
    sup.add("x", "consumer", "standin_role", ["--ignore-term"])
    pid = sup.start("x").pid
    t0 = time.monotonic()
    m = sup.stop("x", timeout_s=0.5)
    assert time.monotonic() - t0 < 5
    assert m.returncode == -signal.SIGKILL and gone(pid)
    assert sup.events.named("process_stop_forced")


def test_stop_of_a_paused_process_still_completes(sup: Supervisor) -> None:
    sup.add("x", "consumer", "standin_role", [])
    pid = sup.start("x").pid
    sup.pause("x")
    m = sup.stop("x", timeout_s=5)
    assert m.returncode == 0 and gone(pid)


def test_process_that_exits_before_ready_reports_its_output(sup: Supervisor) -> None:
    sup.add("bad", "broker", "standin_role", ["--fail"])
    with pytest.raises(ProcessFailed, match=r"exited with code 3 before it was ready(.|\n)*boom"):
        sup.start("bad")
    assert sup.member("bad").state == "exited"


def test_ready_timeout_kills_the_process(sup: Supervisor) -> None:
    sup.add("slow", "broker", "standin_role", ["--ready", "none"])
    with pytest.raises(ProcessFailed, match="did not print READY in time"):
        sup.start("slow", timeout_s=0.5)
    assert gone(sup.member("slow").pid)


def test_producer_that_finishes_is_seen_as_exited(sup: Supervisor) -> None:
    sup.add("producer-1", "producer", "standin_role", ["--exit-after", "0.1"], expect_exit=True)
    sup.start("producer-1")
    assert sup.wait_exit("producer-1", 5) == 0
    assert sup.member("producer-1").state == "exited"
    with pytest.raises(SupervisorError, match="exited, not"):
        sup.kill("producer-1")


def test_close_stops_everything_including_grandchildren(sup: Supervisor) -> None:
    sup.add("a", "consumer", "standin_role", ["--spawn-child"])
    sup.add("b", "consumer", "standin_role", [])
    a, b = sup.start("a"), sup.start("b")
    sup.pause("b")
    child = next(e["child_pid"] for e in log_lines(a.log_files[0]) if e["event"] == "child")
    sup.close(timeout_s=3)
    assert gone(a.pid) and gone(b.pid) and gone(child)
    assert {m.state for m in sup} == {"stopped"}
    with pytest.raises(SupervisorError, match="closed"):
        sup.spawn("a")


def test_async_start_and_stop(sup: Supervisor) -> None:
    import asyncio

    sup.add("c", "consumer", "standin_role", ["--ready", "cid"], group="g")

    async def go() -> None:
        m = await sup.astart("c")
        assert m.state == "running"
        await sup.arestart("c", mode="kill", down_s=0.05)
        assert sup.member("c").incarnation == 2
        await sup.astop("c")

    asyncio.run(go())
    assert [e["action"] for e in sup.events.named("nemesis")] == ["kill", "start", "stop"]


HOST = textwrap.dedent(
    """
    import sys, time
    from rmqlab.chaos.supervisor import Supervisor
    s = Supervisor(sys.argv[1], env={"PYTHONPATH": sys.argv[2]})
    s.add("a", "consumer", "standin_role", [])
    s.add("b", "consumer", "standin_role", [])
    print(s.start("a").pid, s.start("b").pid, flush=True)
    s.pause("b")
    print("up", flush=True)
    time.sleep(60)
    """
)


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM, signal.SIGINT])
def test_supervisor_death_leaves_no_orphans(tmp_path: Path, standin: dict[str, str], sig: int) -> None:
    env = {**os.environ, "PYTHONPATH": standin["PYTHONPATH"]}
    host = subprocess.Popen(
        [sys.executable, "-c", HOST, str(tmp_path / "run"), standin["PYTHONPATH"]],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert host.stdout is not None
        pids = [int(x) for x in host.stdout.readline().split()]
        assert host.stdout.readline().strip() == "up"
        assert all(proc_state(p) is not None for p in pids)
        host.send_signal(sig)
        host.wait(timeout=15)
        assert all(gone(p, 10) for p in pids), [proc_state(p) for p in pids]
    finally:
        if host.poll() is None:
            host.kill()
            host.wait()


def test_a_relative_run_directory_keeps_every_file_one_level_deep(
    tmp_path: Path, standin: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Children run with the run directory as their working directory: a relative path handed to them
    # would be resolved a second time, inside it.
    monkeypatch.chdir(tmp_path)
    s = Supervisor("runs/rel", time_scale=0.05, env=standin, ready_timeout_s=10)
    try:
        s.add("consumer-1", "consumer", "standin_role", ["--ready", "cid"], group="g1")
        m = s.start("consumer-1")
        log = Path(m.log_files[0])
        assert log.is_absolute() and log == tmp_path / "runs" / "rel" / "consumer-1.jsonl"
        assert log.is_file() and Path(m.out_file).is_file()
        assert not (tmp_path / "runs" / "rel" / "runs").exists()
    finally:
        s.close(timeout_s=2)


def test_a_durable_broker_of_a_relative_run_directory_gets_an_absolute_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rmqlab.chaos.process_cluster import LocalCluster

    monkeypatch.chdir(tmp_path)
    cluster = LocalCluster("runs/rel", time_scale=0.05)
    try:
        m = cluster.add_broker("broker-a", durable=True)
        store = Path(m.args[m.args.index("--store-dir") + 1])
        assert store == tmp_path / "runs" / "rel" / "store" / "broker-a" and store.is_dir()
        assert cluster.run_dir == tmp_path / "runs" / "rel"
    finally:
        cluster.sup.close(timeout_s=2)


def test_hang_is_for_the_labs_own_consumers(sup: Supervisor) -> None:
    sup.add("consumer-1", "consumer", "standin_role", ["--ready", "cid"], group="g1")
    sup.add("producer-1", "producer", "standin_role", ["--ready", "p"])
    sup.start("consumer-1")
    sup.start("producer-1")
    with pytest.raises(SupervisorError, match="not one of the lab's own consumers"):
        sup.hang("producer-1")
    with pytest.raises(SupervisorError, match="not hung"):
        sup.unhang("consumer-1")
    m = sup.hang("consumer-1")  # SIGUSR1 (the stand-in has no handler for it and ends)
    assert m.hung
    assert [e["action"] for e in sup.events.named("nemesis")] == ["hang"]
