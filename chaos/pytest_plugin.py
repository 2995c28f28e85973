"""pytest plugin ``rmqlab``: fixtures that start a broker and consumer groups for users' own tests.

Fixtures (all prefixed ``rmq_`` so they never clash with a project's own):

- ``rmq_time_scale``: the lab's time scale (default 0.05: RocketMQ's 20 s rebalance runs every second);
  set the ini option ``rmq_time_scale``, mark a test ``@pytest.mark.rmq_time_scale(0.1)``, or override
  the fixture.
- ``rmq_lab``: an ``RmqLab`` with its run directory under ``tmp_path``; starts brokers (as processes or
  in-process), consumer groups whose listener is your function (one process per consumer, so they can
  be killed and paused), producers; kills/pauses/restarts members; waits for a rebalance to converge;
  asserts on the run's events (no loss, duplicates, order). Everything is stopped after the test.
- ``rmq_broker``: ``rmq_lab`` with one broker process already started (it is its own name server);
  the value is the broker's address.
- ``rmq_lab_module_factory`` / ``rmq_lab_session_factory``: callables ``factory(name="lab", *,
  time_scale=None)`` that make labs shared by a module's or the session's tests, closed at the end of
  that scope (``rmq_time_scale`` of the ini option, or the call's).

``RmqLab`` is a context manager too (``with RmqLab(dir) as lab: ...``). When a test that used a lab
fails, its report gets an ``rmqlab`` section with the run directory and the command that analyses it.

The run directory is a normal lab run: ``rmq-analyze RUN_DIR`` analyses it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from rmqlab.chaos.process_cluster import BROKER_MODULE
from rmqlab.chaos.supervisor import Supervisor, SupervisorError

T = TypeVar("T")
DEFAULT_TIME_SCALE = 0.05


class _LoopThread:
    """An event loop on a daemon thread, for the lab's async parts (admin requests, in-process brokers)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="rmq-lab-loop", daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout_s: float = 60.0) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout_s)

    def close(self) -> None:
        if self.loop.is_running():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(5)
        if not self.loop.is_running():
            self.loop.close()


class LabTimeout(AssertionError):
    """A wait of the lab ran out of time; the message says what was still missing."""


class RmqLab:
    """A small cluster for one test: see the module docstring. All methods are synchronous."""

    def __init__(
        self, run_dir: str | Path, *, time_scale: float = DEFAULT_TIME_SCALE, ready_timeout_s: float = 30
    ):
        from rmqlab.protocol.event_log import EventLog

        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.time_scale = time_scale
        self.log = EventLog("chaos", "chaos", str(self.run_dir / "chaos.jsonl"))
        self.sup = Supervisor(
            self.run_dir, time_scale=time_scale, log=self.log, ready_timeout_s=ready_timeout_s
        )
        self._loop: _LoopThread | None = None
        self._admin: Any = None
        self._in_process: dict[str, Any] = {}
        self.namesrv: str | None = None
        self.brokers: dict[str, str] = {}
        self._consumers = 0
        self._producers = 0
        self._broadcast_groups: set[str] = set()

    # -- plumbing --------------------------------------------------------------------------------

    def _run(self, coro: Coroutine[Any, Any, T], timeout_s: float = 60.0) -> T:
        if self._loop is None:
            self._loop = _LoopThread()
        return self._loop.run(coro, timeout_s)

    def _admin_client(self) -> Any:
        if self._admin is None:
            from rmqlab.lab.admin_client import AdminClient

            async def make() -> Any:
                return AdminClient(timeout_s=5.0)

            self._admin = self._run(make())
        return self._admin

    def __enter__(self) -> RmqLab:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        try:
            # Consumers leave first (all at once) so they can unregister while the broker is still up.
            stopping = []
            for m in self.sup:
                self.sup.refresh(m)
                if m.role == "consumer" and m.state in ("starting", "running", "paused") and m.proc:
                    with contextlib.suppress(Exception):
                        stopping.append(self.sup.begin_stop(m.node, nemesis=False))
            deadline = time.monotonic() + 10
            while any(m.proc is not None and m.proc.poll() is None for m in stopping):
                if time.monotonic() > deadline:
                    break
                time.sleep(0.02)
            self.sup.close()
            for b in list(self._in_process.values()):
                with contextlib.suppress(Exception):
                    self._run(b.stop(), 15)
            if self._admin is not None:
                with contextlib.suppress(Exception):
                    self._run(self._admin.close(), 5)
        finally:
            if self._loop is not None:
                self._loop.close()
            self.log.close()

    # -- cluster ---------------------------------------------------------------------------------

    def start_namesrv(self) -> str:
        """A standalone name server (only needed for several brokers; one broker is its own)."""
        m = self.sup.add(
            "namesrv", "namesrv", "rmqlab.broker.namesrv_main", ["--host", "127.0.0.1", "--port", "0"]
        )
        self.sup.start("namesrv")
        self.namesrv = f"127.0.0.1:{m.port}"
        return self.namesrv

    def start_broker(
        self,
        name: str = "broker-a",
        *,
        in_process: bool = False,
        durable: bool = False,
        release_locks_on_close: bool = False,
        notify_on_channel_expired: bool = False,
        extra_args: list[str] | None = None,
    ) -> str:
        """Start a broker; returns its address. The first broker without a name server becomes one."""
        namesrv = self.namesrv or "embedded"
        store = str(self.run_dir / "store" / name) if durable else None
        if in_process:
            addr = self._start_in_process(
                name, namesrv, store, release_locks_on_close, notify_on_channel_expired
            )
        else:
            args = ["--host", "127.0.0.1", "--port", "0", "--broker-name", name, "--namesrv", namesrv]
            if store:
                Path(store).mkdir(parents=True, exist_ok=True)
                args += ["--store-dir", store]
            if release_locks_on_close:
                args.append("--release-locks-on-close")
            if notify_on_channel_expired:
                args.append("--notify-on-channel-expired")
            m = self.sup.add(name, "broker", BROKER_MODULE, args + list(extra_args or []))
            self.sup.start(name)
            addr = f"127.0.0.1:{m.port}"
        self.brokers[name] = addr
        if self.namesrv is None:
            self.namesrv = addr
        return addr

    def _start_in_process(
        self, name: str, namesrv: str, store: str | None, release_locks: bool, notify_expired: bool
    ) -> str:
        from rmqlab.broker.server_config import BrokerConfig

        config = BrokerConfig(
            broker_name=name,
            host="127.0.0.1",
            port=0,
            time_scale=self.time_scale,
            store_dir=store,
            namesrv=namesrv,
            release_locks_on_close=release_locks,
            notify_on_channel_expired=notify_expired,
        )
        broker = _InProcessBroker(config, str(self.run_dir / f"{name}.jsonl"))
        addr = self._run(broker.start(), 30)
        self._in_process[name] = broker
        return addr

    def create_topic(self, topic: str, queues: int = 4, timeout_s: float = 30.0) -> None:
        """Create ``topic`` with ``queues`` queues on every broker; wait until the name server routes it."""
        from rmqlab.lab.admin_client import route_brokers

        admin = self._admin_client()

        async def go() -> None:
            for addr in self.brokers.values():
                await admin.topic_create(addr, topic, queues)
            deadline = time.monotonic() + timeout_s
            while route_brokers(await admin.route(self.namesrv, topic)) < set(self.brokers):
                if time.monotonic() > deadline:
                    raise LabTimeout(f"the name server does not route {topic} to every broker")
                await asyncio.sleep(0.05)

        if not self.brokers:
            raise SupervisorError("start a broker first")
        self._run(go(), timeout_s + 10)

    def start_consumers(
        self,
        group: str,
        topic: str,
        *,
        count: int = 1,
        listener: Callable[..., Any] | None = None,
        orderly: bool = False,
        broadcast: bool = False,
        strategy: str = "AVG",
        consume_from: str = "first",
        consume_ms: int = 0,
        env: dict[str, str] | None = None,
    ) -> list[str]:
        """Start ``count`` consumer processes of ``group``; returns their node names (consumer-N).

        ``listener`` (a module-level function taking the message batch) runs in each consumer process;
        without it the consumer acknowledges every message after ``consume_ms``. ``env`` is added to
        the processes' environment (to tell your listener where to record what it did).
        """
        if self.namesrv is None:
            raise SupervisorError("start a broker first")
        args = ["--namesrv", self.namesrv, "--group", group, "--topic", topic, "--strategy", strategy]
        args += ["--consume-from", consume_from]
        if orderly:
            args.append("--orderly")
        if broadcast:
            args.append("--broadcast")
            self._broadcast_groups.add(group)
        if consume_ms:
            args += ["--consume-ms", str(consume_ms)]
        module = "rmqlab.client.consumer_main"
        if listener is not None:
            from rmqlab.chaos.listener_host import listener_spec

            module = "rmqlab.chaos.listener_host"
            args += ["--listener", listener_spec(listener)]
        nodes = []
        for _ in range(count):
            self._consumers += 1
            node = f"consumer-{self._consumers}"
            node_args = list(args)
            if broadcast:  # as the lab does: a stable client id and local offsets per node
                node_args += ["--instance-name", node]
                node_args += ["--set", f"local_offset_store_dir={self.run_dir / 'offsets'}"]
            self.sup.add(node, "consumer", module, node_args, group=group)
            nodes.append(node)
        old_env = dict(self.sup.env)
        self.sup.env.update(env or {})
        try:
            for node in nodes:
                self.sup.spawn(node)
            for node in nodes:
                self.sup.wait_ready(node)
        finally:
            self.sup.env = old_env
        return nodes

    def produce(
        self,
        topic: str,
        count: int,
        *,
        rate: float = 1000.0,
        size: int = 64,
        wait: bool = True,
        timeout_s: float = 60,
    ) -> list[str] | str:
        """Send ``count`` messages from a producer process. With ``wait`` (default) returns the msg ids it
        got acknowledged; otherwise returns the producer's node name at once (see ``wait_produced``)."""
        if self.namesrv is None:
            raise SupervisorError("start a broker first")
        self._producers += 1
        node = f"producer-{self._producers}"
        args = ["--namesrv", self.namesrv, "--topic", topic, "--rate", f"{rate:g}", "--count", str(count)]
        args += ["--size", str(size)]
        self.sup.add(node, "producer", "rmqlab.client.producer_main", args, expect_exit=True)
        self.sup.start(node)
        return self.wait_produced(node, timeout_s) if wait else node

    def wait_produced(self, node: str, timeout_s: float = 60) -> list[str]:
        rc = self.sup.wait_exit(node, timeout_s)
        if rc is None:
            raise LabTimeout(f"{node} did not finish within {timeout_s:g}s")
        if rc != 0:
            raise AssertionError(f"{node} exited with code {rc}:\n{self.sup.output(node)[-2000:]}")
        return [e["msg_id"] for e in self.events("message_sent", node=node)]

    # -- nemeses ---------------------------------------------------------------------------------

    def kill(self, node: str) -> None:
        """SIGKILL: a crash (no unregistration, no offset flush)."""
        self.sup.kill(node)

    def stop(self, node: str) -> None:
        """SIGTERM: a graceful shutdown."""
        self.sup.stop(node)

    def pause(self, node: str) -> None:
        """SIGSTOP: a hung process (a long GC pause); its connections stay open."""
        self.sup.pause(node)

    def resume(self, node: str) -> None:
        self.sup.resume(node)

    def restart(self, node: str, *, mode: str = "stop") -> None:
        """Stop (or ``mode="kill"``) and start again: a new process with a new client id."""
        self.sup.restart(node, mode=mode)

    def client_id(self, node: str) -> str:
        ids = self.sup.member(node).client_ids
        if not ids:
            raise SupervisorError(f"{node} has no client id")
        return ids[-1]

    def live_consumers(self, group: str, *, include_paused: bool = True) -> dict[str, str]:
        """node -> current client id of the group's running (and paused) consumers."""
        out = {}
        for m in self.sup:
            self.sup.refresh(m)
            ok = ("running", "paused") if include_paused else ("running",)
            if m.role == "consumer" and m.group == group and m.state in ok and m.client_ids:
                out[m.node] = m.client_ids[-1]
        return out

    # -- events ----------------------------------------------------------------------------------

    def events(
        self, event: str | None = None, *, node: str | None = None, **match: Any
    ) -> list[dict[str, Any]]:
        """Every event of the run so far (optionally one kind, one node, fields equal to ``match``), in
        (ts_ms, file, line) order as the pipeline takes them."""
        out = []
        for path in sorted(self.run_dir.rglob("*.jsonl")):
            rel = path.relative_to(self.run_dir)
            if any(part.startswith((".", "_")) for part in rel.parts):
                continue
            with open(path, encoding="utf-8", errors="replace") as f:
                for i, line in enumerate(f):
                    try:
                        ev = json.loads(line)
                    except ValueError:
                        continue
                    if not isinstance(ev, dict) or (event is not None and ev.get("event") != event):
                        continue
                    if node is not None and ev.get("node") != node:
                        continue
                    if any(ev.get(k) != v for k, v in match.items()):
                        continue
                    out.append((ev.get("ts_ms", 0), str(rel), i, ev))
        out.sort(key=lambda t: (t[0], t[1], t[2]))
        return [t[3] for t in out]

    def consumed(self, group: str) -> list[dict[str, Any]]:
        return self.events("message_consumed", group=group)

    def duplicates(self, group: str) -> dict[str, int]:
        """msg_id -> times consumed, for the messages the group consumed more than once."""
        counts = Counter(e["msg_id"] for e in self.consumed(group))
        return {m: n for m, n in counts.items() if n > 1}

    def wait_for(
        self, predicate: Callable[[], Any], timeout_s: float, what: str, interval_s: float = 0.1
    ) -> Any:
        deadline = time.monotonic() + timeout_s
        while True:
            value = predicate()
            if value:
                return value
            if time.monotonic() > deadline:
                raise LabTimeout(f"timed out after {timeout_s:g}s waiting for {what}")
            time.sleep(interval_s)

    def wait_consumed(self, group: str, msg_ids: list[str], timeout_s: float = 60) -> None:
        want = set(msg_ids)

        def done() -> bool:
            return want <= {e["msg_id"] for e in self.consumed(group)}

        try:
            self.wait_for(done, timeout_s, f"{group} to consume {len(want)} message(s)", 0.2)
        except LabTimeout as e:
            missing = want - {ev["msg_id"] for ev in self.consumed(group)}
            raise LabTimeout(f"{e}: {len(missing)} still missing, e.g. {sorted(missing)[:3]}") from None

    def convergence_problem(self, group: str) -> str | None:
        """Why ``group`` is not converged now (None when it is): every running member's latest rebalance
        of each topic names exactly the live members, and (clustering) their allocations cover every
        queue exactly once."""
        live = self.live_consumers(group)
        running = self.live_consumers(group, include_paused=False)
        if not live:
            return "no live consumer"
        universe: dict[str, set[str]] = defaultdict(set)
        latest: dict[tuple[str, str], dict[str, Any]] = {}
        for ev in self.events():
            name = ev.get("event")
            if name == "topic_route" and isinstance(ev.get("queues"), list):
                universe[ev["topic"]].update(ev["queues"])
            elif name == "rebalance" and ev.get("group") == group:
                latest[(ev["client_id"], ev["topic"])] = ev
        topics = {t for (_, t) in latest}
        if not topics:
            return "no rebalance yet"
        want = set(live.values())
        for node, cid in running.items():
            for topic in topics:
                ev = latest.get((cid, topic))
                if ev is None:
                    return f"{node} has not rebalanced {topic} yet"
                if set(ev.get("cid_all", [])) != want:
                    return f"{node} still sees {sorted(ev.get('cid_all', []))} in {topic}"
        if group in self._broadcast_groups:
            return None  # every member consumes every queue: nothing to share out
        for topic in topics:
            owners: Counter[str] = Counter()
            for cid in want:
                ev = latest.get((cid, topic))
                if ev is not None:
                    owners.update(ev.get("allocated", []))
            missing = universe[topic] - set(owners)
            if missing:
                return f"queues of {topic} without an owner: {sorted(missing)}"
            shared = [q for q, n in owners.items() if n > 1]
            if shared:
                return f"queues of {topic} owned twice: {sorted(shared)}"
        return None

    def wait_converged(self, group: str, timeout_s: float | None = None) -> None:
        """Wait until ``group`` is converged (see ``convergence_problem``). The default timeout is three
        of RocketMQ's 20 s rebalance intervals, time-scaled, plus process start-up slack."""
        timeout = timeout_s if timeout_s is not None else 60 * self.time_scale + 15
        last: list[str | None] = [None]

        def ok() -> bool:
            last[0] = self.convergence_problem(group)
            return last[0] is None

        try:
            self.wait_for(ok, timeout, f"{group} to converge", 0.2)
        except LabTimeout as e:
            raise LabTimeout(f"{e}: {last[0]}") from None

    # -- assertions ------------------------------------------------------------------------------

    def assert_no_loss(self, group: str, msg_ids: list[str]) -> None:
        missing = set(msg_ids) - {e["msg_id"] for e in self.consumed(group)}
        assert not missing, f"{group} never consumed {len(missing)} of {len(set(msg_ids))} messages"

    def assert_no_duplicates(self, group: str) -> None:
        dups = self.duplicates(group)
        assert not dups, f"{group} consumed {len(dups)} message(s) more than once, e.g. {sorted(dups)[:3]}"

    def order_violations(self, group: str) -> list[dict[str, Any]]:
        """Messages a client consumed at an offset not above an earlier one of the same queue while it
        owned the queue (an ownership starts at its ``mq_added``)."""
        last: dict[tuple[str, str, str, int], int] = {}
        bad = []
        for ev in self.events():
            if ev.get("group") != group:
                continue
            key = (ev.get("client_id"), ev.get("topic"), ev.get("broker"), ev.get("queue_id"))
            if ev.get("event") == "mq_added":
                last.pop(key, None)  # type: ignore[arg-type]
            elif ev.get("event") == "message_consumed":
                off = ev.get("queue_offset")
                prev = last.get(key)  # type: ignore[arg-type]
                if prev is not None and isinstance(off, int) and off <= prev:
                    bad.append(ev)
                if isinstance(off, int):
                    last[key] = max(off, prev if prev is not None else off)  # type: ignore[index]
        return bad

    def assert_ordered(self, group: str) -> None:
        bad = self.order_violations(group)
        assert not bad, f"{group}: {len(bad)} message(s) consumed out of queue order, first {bad[0]}"


class _InProcessBroker:
    def __init__(self, config: Any, log_path: str) -> None:
        self.config = config
        self.log_path = log_path
        self.controller: Any = None
        self.log: Any = None

    async def start(self) -> str:
        from rmqlab.broker.controller import BrokerController
        from rmqlab.protocol.event_log import EventLog

        self.log = EventLog(self.config.broker_name, "broker", self.log_path)
        self.controller = BrokerController(self.config, log=self.log)
        await self.controller.start()
        return str(self.controller.address)

    async def stop(self) -> None:
        try:
            if self.controller is not None:
                await self.controller.shutdown()
        finally:
            if self.log is not None:
                self.log.close()


# ------------------------------------------------------------------------------------------------
# pytest hooks and fixtures


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini(
        "rmq_time_scale", "time scale of the rmq_lab fixture (default 0.05)", default=str(DEFAULT_TIME_SCALE)
    )


def pytest_configure(config: pytest.Config) -> None:
    # Only this plugin's own marker: other plugins' settings (pytest-asyncio's loop scope among them)
    # are the project's to choose.
    config.addinivalue_line("markers", "rmq_time_scale(x): run this test's rmq_lab at time scale x")


def _scale_of(request: pytest.FixtureRequest) -> float:
    marker = request.node.get_closest_marker("rmq_time_scale")
    value = marker.args[0] if marker and marker.args else request.config.getini("rmq_time_scale")
    try:
        scale = float(value)
    except (TypeError, ValueError):
        raise pytest.UsageError(f"rmq_time_scale must be a number > 0, got {value!r}") from None
    if not scale > 0:
        raise pytest.UsageError(f"rmq_time_scale must be > 0, got {value!r}")
    return scale


@pytest.fixture
def rmq_time_scale(request: pytest.FixtureRequest) -> float:
    return _scale_of(request)


# The labs a test used, for its failure report (the item's stash, set by the fixtures).
_LABS = pytest.StashKey[list["RmqLab"]]()


def _remember(request: pytest.FixtureRequest, lab: RmqLab) -> None:
    node = request.node
    labs = node.stash.get(_LABS, None)
    if labs is None:
        labs = node.stash[_LABS] = []
    labs.append(lab)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    labs = item.stash.get(_LABS, [])
    if report.failed and labs:
        text = "\n".join(
            f"run directory: {lab.run_dir}\nanalyse it:    rmq-analyze {lab.run_dir}" for lab in labs
        )
        report.sections.append(("rmqlab", text))
    return report


class LabFactory:
    """Makes labs that live as long as the fixture's scope (a module or the session); each gets its own
    run directory. Tests of that scope share the labs, so they share the brokers and groups in them."""

    def __init__(self, base: Path, time_scale: float) -> None:
        self.base = base
        self.time_scale = time_scale
        self.labs: list[RmqLab] = []

    def __call__(self, name: str = "lab", *, time_scale: float | None = None, **kwargs: Any) -> RmqLab:
        run_dir = self.base / f"{name}-{len(self.labs) + 1}"
        lab = RmqLab(run_dir, time_scale=self.time_scale if time_scale is None else time_scale, **kwargs)
        self.labs.append(lab)
        return lab

    def close(self) -> None:
        for lab in reversed(self.labs):
            with contextlib.suppress(Exception):
                lab.close()


def _factory(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LabFactory]:
    base = tmp_path_factory.mktemp(f"rmq-{request.scope}")
    factory = LabFactory(base, float(request.config.getini("rmq_time_scale")))
    try:
        yield factory
    finally:
        factory.close()


@pytest.fixture
def rmq_lab(request: pytest.FixtureRequest, tmp_path: Path, rmq_time_scale: float) -> Iterator[RmqLab]:
    with RmqLab(tmp_path / "rmq-run", time_scale=rmq_time_scale) as lab:
        _remember(request, lab)
        yield lab


@pytest.fixture(scope="module")
def rmq_lab_module_factory(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LabFactory]:
    """``rmq_lab_module_factory(name)``: an RmqLab shared by the module's tests, closed after its last."""
    yield from _factory(request, tmp_path_factory)


@pytest.fixture(scope="session")
def rmq_lab_session_factory(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LabFactory]:
    """``rmq_lab_session_factory(name)``: an RmqLab for the whole session, closed at its end."""
    yield from _factory(request, tmp_path_factory)


@pytest.fixture
def rmq_broker(rmq_lab: RmqLab) -> str:
    return rmq_lab.start_broker()


__all__ = [
    "LabFactory",
    "LabTimeout",
    "RmqLab",
    "rmq_broker",
    "rmq_lab",
    "rmq_lab_module_factory",
    "rmq_lab_session_factory",
    "rmq_time_scale",
]
