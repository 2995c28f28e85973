"""Apache RocketMQ's own name server and broker (the apache-4.9.7 engine) with Apache's C++ clients.

Needs a JDK and the engine's jars (scripts/setup_apache_engine.sh, tried once here when Maven is there),
and the C++ client's environment (scripts/setup_real_clients.sh); skipped with the reason otherwise.
Our own producer speaks only the lab's protocol to a broker (the native codec is the brokers' side), so
Apache's C++ producer sends the messages.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kit.interop import (
    ROOT,
    Lab,
    averagely,
    consumed_positions,
    cpp_client_missing,
    max_offsets,
    ownership,
    wait_for,
)

from rmqlab.interop.apache.engine import (
    BROKER_READY,
    SETUP_SCRIPT,
    AdminError,
    Engine,
    EngineUnavailable,
    Environment,
    Heaps,
    broker_properties,
    check_environment,
    cluster_brokers,
    create_topic,
    free_port,
    jvm_options,
    namesrv_properties,
    resolve_engine,
    route_brokers,
    wait_topic,
)

ENGINES = ["apache-4.9.7", "apache-5"]


def engine_missing(engine: str) -> str | None:
    """Why ``engine`` cannot run here, or None; sets its jars up first when only they are missing."""
    try:
        check_environment(engine)
        return None
    except EngineUnavailable as exc:
        first = str(exc)
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        return first
    if shutil.which("mvn") is None:
        return f"{first} (and Maven is not installed to set them up)"
    version = ENGINES_VERSIONS[engine]
    setup = subprocess.run(
        ["bash", SETUP_SCRIPT],
        cwd=ROOT,
        env={**os.environ, "APACHE_VERSIONS": version},
        capture_output=True,
        text=True,
        timeout=900,
    )
    if setup.returncode != 0:
        return f"{first}; {SETUP_SCRIPT} failed: {(setup.stderr or setup.stdout)[-500:]}"
    try:
        check_environment(engine)
    except EngineUnavailable as exc:
        return str(exc)
    return None


ENGINES_VERSIONS = {name: resolve_engine(name).version for name in ENGINES}
_missing: dict[str, str | None] = {}


@pytest.fixture(params=ENGINES)
def engine(request: pytest.FixtureRequest) -> str:
    """An engine that can run here (set up on first use, so that a run without the slow tests never
    starts Maven); the test is skipped with the reason otherwise."""
    name: str = request.param
    if name not in _missing:
        _missing[name] = engine_missing(name)
    if _missing[name] is not None:
        pytest.skip(_missing[name])
    return name


@pytest.fixture
def cpp_client() -> None:
    why = cpp_client_missing()
    if why is not None:
        pytest.skip(why)


class EngineProcess:
    """``python -m rmqlab.interop.apache.engine start`` as a child process, with its READY lines."""

    def __init__(self, engine: str, run_dir: Path, brokers: int = 1) -> None:
        self.dir = run_dir
        self.err_path = run_dir.parent / "engine.err"
        self._err = open(self.err_path, "w")  # noqa: SIM115 (closed in stop)
        argv = [sys.executable, "-m", "rmqlab.interop.apache.engine", "start", "--engine", engine]
        argv += ["--run-dir", str(run_dir), "--brokers", str(brokers)]
        self.popen = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=self._err, cwd=ROOT, start_new_session=True, text=True
        )
        self.addrs: dict[str, str] = {}

    def wait_ready(self, members: int, timeout: float = 90.0) -> dict[str, str]:
        deadline = time.monotonic() + timeout
        assert self.popen.stdout is not None
        while len(self.addrs) < members and time.monotonic() < deadline:
            line = self.popen.stdout.readline()
            if not line and self.popen.poll() is not None:
                break
            if line.startswith("READY "):
                _, name, addr = line.split()
                self.addrs[name] = addr
        assert len(self.addrs) == members, f"engine not ready: {self.err_path.read_text()[-3000:]}"
        return self.addrs

    def stop(self, timeout: float = 60.0) -> int | None:
        try:
            if self.popen.poll() is None:
                os.killpg(self.popen.pid, signal.SIGTERM)
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.popen.pid, signal.SIGKILL)
            self.popen.wait(5)
            return None
        finally:
            self._err.close()
            # The JVMs die with their supervisor (PR_SET_PDEATHSIG); make sure of it by their pid files.
            for pid_file in self.dir.glob("*/pid"):
                pid = int(pid_file.read_text())
                if Path(f"/proc/{pid}").exists() and str(self.dir) in _cmdline(pid):
                    os.kill(pid, signal.SIGKILL)


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[Lab]:
    lab = Lab(tmp_path)
    try:
        yield lab
    finally:
        lab.close()


@pytest.mark.slow
def test_engine_starts_registers_creates_a_topic_and_stops_cleanly(tmp_path: Path, engine: str) -> None:
    cluster = EngineProcess(engine, tmp_path / "engine", brokers=2)
    try:
        addrs = cluster.wait_ready(3)
        known = cluster_brokers(addrs["namesrv"])
        assert {name: ids[0] for name, ids in known.items()} == {
            "broker-a": addrs["broker-a"],
            "broker-b": addrs["broker-b"],
        }
        for broker in ("broker-a", "broker-b"):
            create_topic(addrs[broker], "TE", 4)
        wait_topic(addrs["namesrv"], "TE", ["broker-a", "broker-b"])
        assert route_brokers(addrs["namesrv"], "TE") == {b: addrs[b] for b in ("broker-a", "broker-b")}
    finally:
        code = cluster.stop()
    assert code == 0, cluster.err_path.read_text()
    # The brokers' shutdown hooks ran to the end: no abort file, the broker unregistered.
    for broker in ("broker-a", "broker-b"):
        store = tmp_path / "engine" / broker / "store"
        assert (store / "checkpoint").exists() and not (store / "abort").exists()
        assert "unregisterBroker OK" in (tmp_path / "engine" / broker / "rocketmq.log").read_text()


@pytest.mark.slow
@pytest.mark.usefixtures("cpp_client")
def test_cpp_clients_share_a_group_on_apaches_broker(lab: Lab, tmp_path: Path, engine: str) -> None:
    group, topic, queues, count = "GA", "TA", 4, 40
    cluster = EngineProcess(engine, tmp_path / "engine")
    try:
        addrs = cluster.wait_ready(2)
        lab.native = addrs["namesrv"]  # the C++ drivers look routes up here
        create_topic(addrs["broker-a"], topic, queues)
        wait_topic(addrs["namesrv"], topic, ["broker-a"])

        ids = {name: lab.cpp_consumer(name, group, topic).wait_ready() for name in ("cpp-1", "cpp-2")}
        clients = sorted(ids.values())
        held = wait_for(
            "two C++ consumers to split the four queues",
            lambda: (
                (h := {c: q for c, q in ownership(lab, group, topic).items() if c in clients})
                == averagely(clients, queues)
                and h
            ),
            40,
            lab,
        )

        producer = lab.cpp_producer("cpp-producer", topic, count, "apache")
        code = producer.popen.wait(60)
        # The C++ 2.1.0 producer's first sends can race the route it is fetching for the topic ("No route
        # info of this topic" although the route came back a millisecond earlier): seen on a busy machine
        # for the first 3 sends. Those are not sent; every acknowledged send must be consumed.
        failed = lab.events("cpp-producer", "send_failed")
        assert all("No route info" in e["error"] for e in failed), failed
        assert code == (1 if failed else 0), producer.out_path.read_text()
        sent = max_offsets(lab, topic)
        positions = {(q, o) for q, top in sent.items() for o in range(top)}
        assert len(positions) == count - len(failed) >= count // 2
        got = wait_for(
            f"all {count} messages consumed",
            lambda: (c := consumed_positions(lab, group, topic)) and positions <= set(c) and c,
            40,
            lab,
        )
        # Every message consumed once, by the consumer that owns its queue; both consumed some.
        owner = {q: cid for cid, qs in held.items() for q in qs}
        for pos in positions:
            assert got[pos] == {owner[pos[0]]}, f"{pos} consumed by {got[pos]}, owner {owner[pos[0]]}"
        assert {c for cs in got.values() for c in cs} == set(clients)
        sent_ids = {e["msg_id"] for e in lab.events("cpp-producer", "message_sent")}
        consumed_ids = {e["msg_id"] for e in lab.events(event="message_consumed") if e["group"] == group}
        assert sent_ids == consumed_ids

        # Both consumers' own rebalance events (from the client's log) name both members.
        for name, cid in ids.items():
            rounds = [e for e in lab.events(name, "rebalance") if e["topic"] == topic]
            latest = rounds[-1]
            assert sorted(latest["cid_all"]) == clients
            assert sorted(latest["allocated"]) == sorted(f"broker-a:{q}" for q in held[cid])

        for proc in [p for p in lab.procs if p.name in ids]:
            assert proc.stop(20) == 0
        assert {e["client_id"] for e in lab.events(event="consumer_stopped")} == set(clients)
    finally:
        lab.close()
        code = cluster.stop()
    assert code == 0, cluster.err_path.read_text()


def test_unserved_release_is_refused_with_the_reason() -> None:
    with pytest.raises(EngineUnavailable, match="no rocketmq-broker"):
        check_environment("apache-4.9.8")
    with pytest.raises(EngineUnavailable, match="unknown engine"):
        resolve_engine("apache-3")


# -- without a JVM -------------------------------------------------------------------------------------


def test_broker_configuration_scales_what_rocketmq_lets_a_file_set(tmp_path: Path) -> None:
    props = broker_properties(
        "broker-b", 20911, "127.0.0.1:9876", tmp_path / "store", 0.5, engine="apache-4.9.7"
    )
    assert props["brokerName"] == "broker-b" and props["brokerId"] == "0" and props["listenPort"] == "20911"
    assert props["namesrvAddr"] == "127.0.0.1:9876" and props["autoCreateTopicEnable"] == "true"
    assert props["storePathRootDir"] == str(tmp_path / "store")
    assert props["storePathCommitLog"] == str(tmp_path / "store" / "commitlog")
    # The setters' names (setMappedFileSizeCommitLog), not the old "maped" spelling a file would ignore.
    assert int(props["mappedFileSizeCommitLog"]) == 32 * 1024 * 1024
    assert int(props["mappedFileSizeConsumeQueue"]) % 20 == 0
    assert props["registerNameServerPeriod"] == "15000"  # 30 s x 0.5 (the broker clamps to 10..60 s)
    assert props["flushConsumerOffsetInterval"] == "2500"
    assert props["serverChannelMaxIdleTimeSeconds"] == "60"
    assert "channelExpiredTimeout" not in props  # a constant of 4.9's code
    five = broker_properties("b", 1, "n:1", tmp_path, 0.5, engine="apache-5")
    assert five["channelExpiredTimeout"] == "60000" and five["timerWheelEnable"] == "false"
    assert namesrv_properties(9876, tmp_path, 0.5, engine="apache-5")["scanNotActiveBrokerInterval"] == "2500"


def test_jvm_options_on_java_17(tmp_path: Path) -> None:
    def options(engine: Engine, role: str) -> list[str]:
        env = Environment(engine, "java", 17, tmp_path / "lib", "17.0.15")
        return jvm_options(
            env, role, member_dir=tmp_path, home=tmp_path, log_file=tmp_path / "x.log", heap_mb=128
        )

    broker49 = options(Engine("apache-4.9.7", "4.9.7"), "broker")
    assert "--add-opens=java.base/java.nio=ALL-UNNAMED" in broker49
    assert "--add-exports=java.base/jdk.internal.ref=ALL-UNNAMED" in broker49
    assert "-Xmx128m" in broker49 and f"-Xms{Heaps().initial_mb}m" in broker49
    assert "-Drocketmq.broker.rebalance.lockMaxLiveTime=60000" in broker49
    assert not any(o.startswith("--add-") for o in options(Engine("apache-5", "5.5.0"), "broker"))
    assert not any(o.startswith("--add-") for o in options(Engine("apache-4.9.7", "4.9.7"), "namesrv"))


def test_ready_line_and_ports() -> None:
    m = BROKER_READY.search("The broker[broker-a, 127.0.0.1:10911] boot success. serializeType=JSON")
    assert m is not None and m["name"] == "broker-a" and m["addr"] == "127.0.0.1:10911"
    taken: set[int] = set()
    port = free_port(also=(-2, 1), taken=taken)
    assert {port - 2, port, port + 1} <= taken


def test_admin_request_to_a_closed_port_fails_clearly() -> None:
    port = free_port()
    with pytest.raises(AdminError, match="failed"):
        cluster_brokers(f"127.0.0.1:{port}", timeout=1.0)
