"""The one Runner: an experiment on a backend, from the cluster coming up to its teardown.

The Runner decides what happens when; the backend (``lab.backend``) does it. Every time is read from the
event loop, so the same code runs on the wall clock (processes, containers) and on the simulator's
virtual one; every nemesis action goes through one table of handlers (``Runner.actions``); an action the
node cannot take now is skipped with its reason (a ``nemesis_skipped`` event), never an error. Before the
drain the Runner undoes what the nemeses left behind (resumes, unhangs, heals, clears faults), waits
until every group consumed what was sent (or the drain timeout), and SIGKILLs the clients.

The run directory around it (the experiment file as run, the lab's own ``chaos.jsonl``, the manifest,
the analysis) belongs to the command that runs it: ``chaos.run`` and ``sim.sim_cluster``. What the Runner
says as it goes is a ``Console``'s: rmq-chaos's words here, rmq-sim's where its clock differs.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.metadata
import importlib.util
import platform
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from rmqlab.cli import Progress
from rmqlab.lab.admin_client import AdminError
from rmqlab.lab.backend import (
    UP_STATES,
    Backend,
    BackendError,
    EventSink,
    NodeError,
    NodeFailed,
    nemesis_fields,
)
from rmqlab.lab.experiment import (
    NETWORK_ACTIONS,
    V5_CLIENTS,
    Experiment,
    ExperimentError,
    controller_broker_id,
)
from rmqlab.lab.schedule import Step
from rmqlab.lab.tally import LogTailer, RunTally, progress_line
from rmqlab.protocol.remoting import RemotingError

PACKAGE = "rocketmq-rebalance-lab"

# What ends a run as failed (its message goes to the errors); anything else is a bug and propagates.
RUN_ERRORS = (NodeError, BackendError, AdminError, RemotingError, TimeoutError, OSError, ExperimentError)
# What skips one nemesis action (its message is the reason).
SKIP_ERRORS = (NodeError, AdminError, RemotingError, KeyError, ValueError)


@dataclass
class RunResult:
    """What a run produced: its directory, whether it drained, its verdicts and report."""

    run_dir: Path
    drained: bool = False
    quick_verdict: str = "fail"  # from the live counts: every sent message consumed by every group
    verdict: str | None = None  # from the analysis, when it ran
    analysis_rc: int | None = None
    report: Path | None = None
    summary: dict[str, Any] | None = None
    errors: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    interrupted: bool = False

    def as_json(self) -> dict[str, Any]:
        """The outcome as ``rmq-chaos run --json`` prints it (with the exit code beside it)."""
        return {
            "run_dir": str(self.run_dir),
            "verdict": self.verdict if self.verdict is not None else self.quick_verdict,
            "verdict_source": "analysis" if self.verdict is not None else "live counts",
            "drained": self.drained,
            "report": str(self.report) if self.report is not None else None,
            "summary": str(self.run_dir / "summary.json") if self.summary is not None else None,
            "errors": list(self.errors),
            "skipped_actions": len(self.skipped),
            "interrupted": self.interrupted,
        }

    @property
    def exit_code(self) -> int:
        if self.interrupted:
            return 130
        if self.errors:
            return 3
        verdict = self.verdict if self.verdict is not None else self.quick_verdict
        return 0 if verdict == "ok" else 1


@dataclass(frozen=True)
class Executed:
    """One nemesis action the Runner took up: its step, and why it was skipped (None: carried out)."""

    step: Step
    skipped: str | None = None


def versions() -> dict[str, str]:
    try:
        lab = importlib.metadata.version(PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        lab = "unknown"
    return {"lab": lab, "python": platform.python_version(), "platform": platform.platform()}


def pipeline_available() -> bool:
    """Whether the analysis can run here (the pipeline extra, pyspark, is installed)."""
    try:
        return (
            importlib.util.find_spec("pyspark") is not None
            and importlib.util.find_spec("rmqlab.pipeline.__main__") is not None
        )
    except (ImportError, ValueError):
        return False


def fault_request(
    exp: Experiment, step: Step, client_id: str | None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """A ``fault`` step as AdminClient.fault_add's arguments (times scaled to the run) and the fields of
    its ``nemesis`` event (all but ``fault_id``)."""
    p = step.params
    duration_ms = round(exp.wall(p["for"]) * 1000) if p.get("for") else None
    latency_ms = round(p.get("latency_ms", 0) * exp.time_scale)
    request = {
        "request_code": p["code"],
        "errors": p.get("errors", []),
        "count": p.get("count"),
        "group": p.get("group"),
        "client_id": client_id,
        "latency_ms": latency_ms,
        "drop": bool(p.get("drop")),
        "duration_ms": max(1, duration_ms) if duration_ms is not None else None,
    }
    fields = {
        "request_code": p["code"],
        "errors": [f"{c}:{r}" for c, r in p.get("errors", [])],
        "count": p.get("count"),
        "fault_group": p.get("group"),
        "client_id": client_id,
        "latency_ms": latency_ms,
        "drop": bool(p.get("drop")),
        "duration_ms": duration_ms,
    }
    return request, fields


class Console:
    """What a run says as it goes, in rmq-chaos's words; with ``quiet`` it says nothing (the command's
    closing lines are its own)."""

    def __init__(self, out: TextIO | None = None, *, quiet: bool = False) -> None:
        self.lines = Progress(out if out is not None else sys.stdout, enabled=not quiet)

    def say(self, text: str) -> None:
        self.lines.note(text)

    @property
    def shows_progress(self) -> bool:
        return self.lines.enabled

    def opening(self, exp: Experiment, run_dir: Path) -> None:
        self.say(f"run {exp.name}: {exp.question or '(no question given)'}")
        self.say(f"run directory: {run_dir}")

    def stamp(self, exp: Experiment, elapsed_s: float) -> str:
        """The experiment's clock: RocketMQ seconds since t = 0 (as the file's `at`), wall beside it."""
        return f"[t={elapsed_s / exp.time_scale:6.1f}s | {elapsed_s:5.1f}s wall]"

    def step(self, stamp: str, step: Step) -> None:
        self.say(f"{stamp} {step.describe()}")

    def starting_consumers(self, nodes: list[str], kinds: list[str]) -> None:
        self.say(f"starting {len(nodes)} consumer(s) ({', '.join(kinds) or 'none'})")

    def running(self, exp: Experiment, actions: int) -> None:
        self.say(
            f"running for {exp.wall(exp.duration):.1f}s wall ({exp.duration:g}s at time scale "
            f"{exp.time_scale:g}), {actions} scheduled nemesis action(s) (a restart is written as a stop "
            "and a start)"
        )

    def progress(
        self,
        exp: Experiment,
        elapsed_s: float,
        tally: RunTally,
        consumers: tuple[int, int, int],
        phase: str,
        *,
        force: bool = False,
    ) -> None:
        line = progress_line(elapsed_s, exp.wall(exp.duration), tally, consumers, phase, exp.time_scale)
        self.lines.live(line, force=force)

    def drain_ended(self, tally: RunTally, drained: bool, timeout_s: float, busy: list[str]) -> None:
        self.lines.end_live()
        if drained:
            self.say(f"drained: every group consumed all {tally.sent_total} sent message(s)")
        else:
            self.not_drained(tally, timeout_s, busy)
        if tally.ignored_pulls:
            where = ", ".join(f"{q} x{k}" for q, k in sorted(tally.ignored_pulls.items()))
            self.say(f"pull answers a real client ignored for queues it holds (pull_answer_ignored): {where}")

    def not_drained(self, tally: RunTally, timeout_s: float, busy: list[str]) -> None:
        parts = []
        for g, n in sorted(tally.missing().items()):
            where = ", ".join(f"{q} {k}" for q, k in tally.missing_by_queue(g).items())
            parts.append(f"{g}: {n} missing" + (f" ({where})" if n and where else ""))
        self.say(
            f"not drained after {timeout_s:.1f}s: {'; '.join(parts) or 'nothing consumed'}"
            + (f"; producers still running: {', '.join(busy)}" if busy else "")
        )


class Runner:
    """Runs one experiment on a backend; see the module docstring."""

    def __init__(
        self,
        exp: Experiment,
        backend: Backend,
        log: EventSink,
        result: RunResult,
        *,
        console: Console | None = None,
        tally: RunTally | None = None,
        tailer: LogTailer | None = None,
        progress_interval_s: float = 0.5,
    ) -> None:
        self.exp = exp
        self.backend = backend
        self.log = log  # the lab's own events (chaos.jsonl); the backend writes its events there too
        self.result = result
        self.console = console or Console()
        # The live counts: fed by the caller as events are written (the simulator), or read back from the
        # run's files by ``tailer`` in a worker thread (processes and containers).
        self.tally = tally or RunTally({c.group: {c.topic} for c in exp.consumers})
        self.tailer = tailer
        self.progress_interval_s = progress_interval_s
        self.phase = "setup"
        self.executed = 0
        self.record: list[Executed] = []  # every nemesis action taken up, in the order it was
        self._tally_lock = asyncio.Lock()
        self._t0: float | None = None  # the loop's time at the experiment's t = 0
        self._end_now = asyncio.Event()
        self._locks: dict[str, asyncio.Lock] = {}
        # The dispatch table: one handler per action of the experiment language.
        self.actions: dict[str, Callable[[Step], Awaitable[None]]] = {
            "kill": self._kill,
            "stop": self._stop,
            "start": self._start,
            "restart": self._restart,
            "pause": self._pause,
            "resume": self._resume,
            "hang": self._hang,
            "unhang": self._unhang,
            **dict.fromkeys(NETWORK_ACTIONS, self._network),
            "fault": self._fault,
            "fault-clear": self._fault_clear,
            "policy": self._policy,
            "failover": self._failover,
        }

    # -- output ----------------------------------------------------------------------------------

    def say(self, text: str) -> None:
        self.console.say(text)

    def _elapsed(self) -> float:
        return 0.0 if self._t0 is None else asyncio.get_running_loop().time() - self._t0

    def _stamp(self) -> str:
        return self.console.stamp(self.exp, self._elapsed())

    def _show_progress(self, force: bool = False) -> None:
        if not self.console.shows_progress:
            return
        consumers = [m for m in self.backend.members() if m.role == "consumer"]
        live = sum(1 for m in consumers if m.state in UP_STATES)
        paused = sum(1 for m in consumers if m.state == "paused")
        counts = (live, paused, len(consumers))
        self.console.progress(self.exp, self._elapsed(), self.tally, counts, self.phase, force=force)

    async def _refresh_tally(self) -> None:
        if self.tailer is None:  # fed as the events are written: nothing to read (and no await)
            return
        tailer = self.tailer
        async with self._tally_lock:
            events = await asyncio.to_thread(tailer.poll)
            self.tally.feed(events)

    async def _progress_loop(self) -> None:
        while True:
            await asyncio.sleep(self.progress_interval_s)
            await self._refresh_tally()
            self._show_progress()

    def _lock(self, node: str) -> asyncio.Lock:
        """One action at a time on a node (a restart's stop and start are not split by another)."""
        return self._locks.setdefault(node, asyncio.Lock())

    # -- the run ---------------------------------------------------------------------------------

    async def run(self) -> RunResult:
        """Cluster up, workload and schedule, heal, drain, teardown; what goes wrong ends in ``result``."""
        progress: asyncio.Task[None] | None = None
        try:
            self.console.opening(self.exp, self.result.run_dir)
            for line in await self.backend.prepare():
                self.say(line)
            await self._setup()
            progress = asyncio.create_task(self._progress_loop())
            await self._execute()
            await self._drain()
            self.phase = "stop"
            await self._teardown(progress)
        except asyncio.CancelledError:
            self.result.interrupted = True
            self.say("interrupted: stopping the cluster")
        except RUN_ERRORS as e:
            self.result.errors.append(str(e))
            self.say(f"run failed: {e}")
        finally:
            if progress is not None and not progress.done():
                progress.cancel()
            with contextlib.suppress(BaseException):
                await self.backend.close()
            with contextlib.suppress(BaseException):
                await self._refresh_tally()
        return self.result

    async def _setup(self) -> None:
        exp, backend = self.exp, self.backend
        backend.declare(exp)
        engine = "" if exp.engine == "emulator" else f" of engine {exp.engine} (Apache RocketMQ's own JVMs)"
        slaves = f" with {len(exp.slave_nodes())} slave(s)" if exp.has_slaves else ""
        self.say(f"starting name server and {len(exp.brokers)} broker(s){slaves}{engine}")
        if exp.real_clients() & set(V5_CLIENTS):  # Apache's v5 clients speak gRPC to rmq-proxy
            self.say("starting rmq-proxy for the RocketMQ 5 clients")
        await backend.start_servers()
        await self._set_request_modes()
        first = [n for c in exp.consumers if c.start <= 0 for n in c.nodes]
        self.console.starting_consumers(first, sorted({c.client for c in exp.consumers if c.start <= 0}))
        await backend.start(first)
        self.log.emit("cluster_ready", nodes=sum(1 for m in backend.members() if m.state in UP_STATES))

    async def _execute(self) -> None:
        exp = self.exp
        self._t0 = asyncio.get_running_loop().time()
        self._end_now = asyncio.Event()
        # The experiment's t = 0: nemesis times count from here, and so do the console and the report.
        self.log.emit("schedule_started", time_scale=exp.time_scale, duration_s=exp.duration)
        self.phase = "run"
        schedule = exp.schedule()
        self.console.running(exp, len(schedule))
        async with asyncio.TaskGroup() as tg:
            if exp.workload:
                tg.create_task(self._start_producers())
            for c in exp.consumers:
                if c.start > 0:
                    tg.create_task(self._join(c.start, list(c.nodes)))
            for step in schedule:
                tg.create_task(self._step(step))
            await asyncio.sleep(exp.wall(exp.duration))
            self._end_now.set()  # actions due after the end (an undo of a long pause) run now
        self.phase = "heal"
        await self._heal()

    async def _wait_until(self, lab_s: float) -> None:
        """Until ``lab_s`` RocketMQ seconds after t = 0, or the end of the experiment if that is sooner
        (not at all when it is due already)."""
        assert self._t0 is not None
        delay = self._t0 + self.exp.wall(lab_s) - asyncio.get_running_loop().time()
        if delay > 0:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):
                    await self._end_now.wait()

    async def _start_producers(self) -> None:
        w = self.exp.workload
        assert w is not None
        await self._wait_until(w.start)
        await self.backend.start([node for node, _ in w.nodes])

    async def _join(self, at: float, nodes: list[str]) -> None:
        """Start consumers that join the group later than the cluster (``start`` in their table)."""
        await self._wait_until(at)
        if self._end_now.is_set():
            return
        self.say(f"{self._stamp()} joining: {', '.join(nodes)}")
        self.log.emit("consumers_joining", nodes=nodes, at=at)
        for node in nodes:
            async with self._lock(node):
                try:
                    await self.backend.start([node])
                except NodeFailed as e:
                    self.result.errors.append(str(e))
                    self.say(f"{self._stamp()} {node} did not start: {str(e).splitlines()[0]}")
                except NodeError as e:  # a nemesis started it already
                    self.result.skipped.append(f"join {node}: {e}")
                    self.log.emit("join_skipped", target=node, reason=str(e))

    async def _step(self, step: Step) -> None:
        await self._wait_until(step.t)
        async with self._lock(step.target):
            await self.execute(step)

    async def execute(self, step: Step) -> None:
        """Carry out one nemesis action; an action that cannot apply now is logged and skipped."""
        self.console.step(self._stamp(), step)
        try:
            await self.actions[step.action](step)
            self.executed += 1
            self.record.append(Executed(step))
        except SKIP_ERRORS as e:
            reason = str(e)
            self.result.skipped.append(f"{step.describe()}: {reason}")
            self.record.append(Executed(step, reason))
            self.log.emit("nemesis_skipped", action=step.action, target=step.target, reason=reason)
            self.say(f"{self._stamp()} skipped {step.describe()}: {reason.splitlines()[0]}")

    def _nemesis(self, action: str, node: str, **extra: Any) -> None:
        """The ``nemesis`` event of an action the Runner does itself (network faults, broker requests)."""
        self.log.emit("nemesis", **nemesis_fields(action, self.backend.member(node)), **extra)

    # -- the actions ------------------------------------------------------------------------------

    async def _kill(self, step: Step) -> None:
        await self.backend.kill(step.target)

    async def _stop(self, step: Step) -> None:
        await self.backend.stop(step.target)

    async def _set_request_modes(self) -> None:
        """RocketMQ 5 server-side assignment: the brokers keep each group's mode (setConsumeMode)."""
        for c in self.exp.consumers:
            if c.request_mode is not None:
                await self.backend.set_message_request_mode(c.topic, c.group, c.request_mode)

    async def _start(self, step: Step) -> None:
        await self.backend.start([step.target], nemesis=True)
        await self._broker_back(step.target)

    async def _restart(self, step: Step) -> None:
        p = step.params
        down_s = self.exp.wall(p.get("down", 0.0))
        await self.backend.restart(step.target, mode=p.get("mode", "stop"), down_s=down_s)
        await self._broker_back(step.target)

    async def _broker_back(self, node: str) -> None:
        """A broker started again without its store (durable = false) has lost the groups' modes: the
        lab sets them again as it did at setup, as an operator's setConsumeMode for the whole cluster
        would; a new broker's queues are then popped, not pulled, as the experiment declares."""
        if node in self.exp.brokers and not self.exp.durable:
            await self._set_request_modes()

    async def _pause(self, step: Step) -> None:
        await self.backend.pause(step.target, gc=bool(step.params.get("gc")))

    async def _resume(self, step: Step) -> None:
        await self.backend.resume(step.target, gc=bool(step.params.get("gc")))

    async def _hang(self, step: Step) -> None:
        await self.backend.hang(step.target)

    async def _unhang(self, step: Step) -> None:
        await self.backend.unhang(step.target)

    def _has(self, node: str) -> bool:
        try:
            self.backend.member(node)
        except (NodeError, KeyError):
            return False
        return True

    async def _network(self, step: Step) -> None:
        a, target, p = step.action, step.target, step.params
        # "broker" names the other end: a broker, the name server, or (``peer``) any node
        other = p.get("broker", "all")
        if other != "all" and (other == target or not self._has(other)):
            raise ValueError(f"{target} has no link to {other!r}")
        extra: dict[str, Any] = {"broker": other}
        if a == "latency":
            extra["latency_ms"] = round(p["ms"] * self.exp.time_scale, 3)
            extra["jitter_ms"] = round(p.get("jitter_ms", 0) * self.exp.time_scale, 3)
        if a == "loss":
            extra["percent"] = p["percent"]
        if p.get("direction"):
            extra["direction"] = p["direction"]
        if a != "heal":  # the container backend uses the kernel's iptables or netem where it can
            extra["via"] = self.backend.network_via(a, target, other)
        self._nemesis(a, target, **extra)
        await self.backend.apply_network(
            target,
            a,
            other,
            ms=extra.get("latency_ms", 0),
            jitter_ms=extra.get("jitter_ms", 0),
            direction=p.get("direction", "both"),
            percent=p.get("percent", 0),
        )

    async def _fault(self, step: Step) -> None:
        p = step.params
        client_id = None
        if p.get("client"):
            ids = self.backend.member(p["client"]).client_ids
            if not ids:
                raise NodeError(f"{p['client']} has no client id yet")
            client_id = ids[-1]
        request, fields = fault_request(self.exp, step, client_id)
        fault_id = await self.backend.fault_add(step.target, request)
        self._nemesis("fault", step.target, fault_id=fault_id, **fields)

    async def _fault_clear(self, step: Step) -> None:
        await self.backend.fault_clear(step.target)
        self._nemesis("fault-clear", step.target)

    async def _policy(self, step: Step) -> None:
        p = step.params
        await self.backend.policy_set(
            step.target,
            notify_on_channel_expired=p.get("notify_on_channel_expired"),
            release_locks_on_close=p.get("release_locks_on_close"),
        )
        self._nemesis("policy", step.target, **p)

    async def _failover(self, step: Step) -> None:
        """RocketMQ 4.9.8 has no automatic failover: what an operator can do is take the master down, so
        that the name server drops it from the routes and consumers pull from the slave and commit their
        offsets there (PROTOCOL.md, "Master and slaves"). The action stops (or kills) a master whose
        slave is running; its undo after ``for`` starts the master again. In controller mode (RocketMQ 5)
        it asks the controller to elect the master's first running slave instead."""
        master = step.target
        live = [s for s in self.exp.slave_nodes(master) if self.backend.member(s).state == "running"]
        if not live:
            raise NodeError(f"{master} has no running slave to fail over to")
        if self.exp.controller:
            # RocketMQ 5: an operator's electMaster at the controller (mqadmin electMaster -b); the elected
            # slave becomes master, the old master a slave of the new epoch, nothing stops
            chosen = live[0]
            broker_id = controller_broker_id(chosen)
            self._nemesis("failover", master, mode="elect", slaves=live, elected=chosen)
            await self.backend.elect_master(master, broker_id)
            return
        mode = step.params.get("mode", "stop")
        if self.backend.member(master).state not in ("running", "paused"):
            raise NodeError(f"{master} is {self.backend.member(master).state}, not running or paused")
        self._nemesis("failover", master, mode=mode, slaves=live)
        if mode == "kill":
            await self.backend.kill(master)
        else:
            await self.backend.stop(master)

    # -- after the schedule -----------------------------------------------------------------------

    async def _heal(self) -> None:
        """Undo what the nemeses left behind so the workload can drain: resume, unhang, heal links, clear
        faults."""
        end = self.exp.duration
        for m in self.backend.members():
            if m.state == "paused":
                await self.execute(Step(end, "resume", m.node, m.role, m.group, {}, 0))
            if m.hung and m.state == "running":
                await self.execute(Step(end, "unhang", m.node, m.role, m.group, {}, 0))
        for node in self.backend.faulty_links():  # servers too: a partition may name any node
            m = self.backend.member(node)
            await self.execute(Step(end, "heal", node, m.role, m.group, {"broker": "all"}, 0))
        for broker in sorted({s.target for s in self.exp.schedule() if s.action == "fault"}):
            if self.backend.member(broker).state == "running":
                await self.execute(Step(end, "fault-clear", broker, "broker", None, {}, 0))

    async def _drain(self) -> None:
        """Wait until the producers are done and every group consumed what was sent (or the timeout)."""
        self.phase = "drain"
        loop = asyncio.get_running_loop()
        timeout = self.exp.wall(self.exp.drain_timeout)
        deadline = loop.time() + timeout
        producers = [m.node for m in self.backend.members() if m.role == "producer"]
        while True:
            await self._refresh_tally()
            done = all(self.backend.member(n).state in ("exited", "stopped") for n in producers)
            if done and self.tally.drained():
                self.result.drained = True
                break
            if loop.time() > deadline:
                break
            await asyncio.sleep(0.2)
        for m in (self.backend.member(n) for n in producers):
            if m.state == "exited" and m.returncode not in (0, None):
                see = f" (see {Path(m.out_file).name})" if m.out_file else ""
                self.result.errors.append(f"{m.node} exited with code {m.returncode}{see}")
            if m.state == "new":
                self.result.errors.append(f"{m.node} never started")
        self._show_progress(force=True)
        busy = [n for n in producers if self.backend.member(n).state not in ("exited", "stopped")]
        self.console.drain_ended(self.tally, self.result.drained, timeout, busy)
        self.result.quick_verdict = "ok" if self.result.drained and not self.result.errors else "fail"

    async def _teardown(self, progress: asyncio.Task[None]) -> None:
        """End the run: clients are SIGKILLed together, without nemesis events; the servers stop in
        ``backend.close``.

        A graceful stop would write a ``consumer_stopped`` per consumer, and EVENTS.md makes each a
        change point that must converge -- which the last consumers of a group leaving at once never
        can. Killing them, unannounced, leaves the experiment's own change points as the only ones.
        """
        self.log.emit("teardown", mode="kill")
        killed = await self.backend.kill_clients()
        self.log.emit("teardown_clients_killed", nodes=killed)
        progress.cancel()
