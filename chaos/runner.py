"""Runs one experiment: cluster up, workload and nemeses on schedule, drain, manifest, analysis.

The run directory ends up holding every process's JSON-lines events (``NODE.jsonl``, ``NODE.2.jsonl``
after a restart, ``chaos.jsonl`` for the lab's own), their stdout/stderr (``NODE.out``), the experiment
file as run, ``manifest.json`` and, after the analysis, ``summary.json`` and ``report.html``. A real
C++ client also leaves its own log in ``NODE.client-log/``.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.metadata
import importlib.util
import json
import os
import platform
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from rmqlab.chaos.admin import AdminError
from rmqlab.chaos.cluster import PROXY_NODE, LocalCluster
from rmqlab.chaos.container import BackendError, ContainerCluster, ImageInfo
from rmqlab.chaos.experiment import (
    BROKER_ACTIONS,
    NETWORK_ACTIONS,
    V5_CLIENTS,
    Experiment,
    ExperimentError,
    Step,
)
from rmqlab.chaos.realclients import RealClients, check_environment
from rmqlab.chaos.supervisor import ProcessFailed, SupervisorError
from rmqlab.chaos.tally import LogTailer, RunTally, progress_line
from rmqlab.cli import Progress
from rmqlab.protocol.acl import SessionCredentials
from rmqlab.protocol.remoting import RemotingError
from rmqlab.protocol.runtime import EventLog

PACKAGE = "rocketmq-rebalance-lab"


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


def versions() -> dict[str, str]:
    try:
        lab = importlib.metadata.version(PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        lab = "unknown"
    return {"lab": lab, "python": platform.python_version(), "platform": platform.platform()}


def pipeline_available() -> bool:
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


class Runner:
    """Runs one experiment: starts the cluster and workload, applies the nemeses, drains, analyses."""

    def __init__(
        self,
        exp: Experiment,
        run_dir: str | Path,
        *,
        analyze: bool = True,
        out: TextIO | None = None,
        quiet: bool = False,
        metrics: bool = False,
        ready_timeout_s: float = 60.0,
        progress_interval_s: float = 0.5,
        analysis_command: list[str] | None = None,
        clients: RealClients | None = None,
        image: ImageInfo | None = None,
    ) -> None:
        self.exp = exp
        # The backend seam: local processes, or (given a checked image) containers (chaos.container).
        self.image = image
        self.backend = "docker" if image is not None else "local"
        self.clients = clients or RealClients()
        self.run_dir = Path(run_dir)
        self.analyze = analyze
        self.out = out or sys.stdout
        # Progress and step lines; with quiet only the closing lines (verdict, report) are printed.
        self.progress = Progress(self.out, enabled=not quiet)
        self.closing = Progress(self.out)
        self.ready_timeout_s = ready_timeout_s
        self.progress_interval_s = progress_interval_s
        self.analysis_command = analysis_command or [sys.executable, "-m", "rmqlab.pipeline"]
        self.result = RunResult(self.run_dir)
        self.tailer = LogTailer(self.run_dir)
        self.tally = RunTally({c.group: {c.topic} for c in exp.consumers})
        self._tally_lock = asyncio.Lock()
        self._phase = "setup"
        self._t0: float | None = None
        self._end_now = asyncio.Event()
        self._locks: dict[str, asyncio.Lock] = {}
        self.cluster: LocalCluster | None = None
        self.log: EventLog | None = None
        self.executed = 0
        self._analysis: asyncio.subprocess.Process | None = None
        self._ended_at: float | None = None
        self._manifest_path = Path(run_dir).resolve() / "manifest.json"  # the analysis may run elsewhere
        self.metrics = metrics  # every node of ours serves live metrics (--metrics-port)
        self._quick: dict[str, Any] | None = None  # the plain-Python analysis's summary, once said

    # -- output ----------------------------------------------------------------------------------

    def say(self, text: str) -> None:
        self.progress.note(text)

    def _elapsed(self) -> float:
        return 0.0 if self._t0 is None else time.monotonic() - self._t0

    def _stamp(self) -> str:
        """The experiment's clock: RocketMQ seconds since t = 0 (as the file's `at`), wall beside it."""
        wall = self._elapsed()
        return f"[t={wall / self.exp.time_scale:6.1f}s | {wall:5.1f}s wall]"

    def _consumer_counts(self) -> tuple[int, int, int]:
        assert self.cluster is not None
        live = paused = total = 0
        for m in self.cluster.sup:
            if m.role != "consumer":
                continue
            total += 1
            self.cluster.sup.refresh(m)
            if m.state in ("running", "paused"):
                live += 1
            if m.state == "paused":
                paused += 1
        return live, paused, total

    def _show_progress(self, force: bool = False) -> None:
        line = progress_line(
            self._elapsed(),
            self.exp.wall(self.exp.duration),
            self.tally,
            self._consumer_counts(),
            self._phase,
            self.exp.time_scale,
        )
        self.progress.live(line, force=force)

    async def _refresh_tally(self) -> None:
        async with self._tally_lock:
            events = await asyncio.to_thread(self.tailer.poll)
            self.tally.feed(events)

    async def _progress_loop(self) -> None:
        while True:
            await self._refresh_tally()
            self._show_progress()
            await asyncio.sleep(self.progress_interval_s)

    # -- the run ---------------------------------------------------------------------------------

    async def run(self) -> RunResult:
        exp = self.exp
        self.run_dir.mkdir(parents=True, exist_ok=True)
        await asyncio.to_thread((self.run_dir / "experiment.toml").write_text, exp.text, "utf-8")
        self.log = EventLog("chaos", "chaos", str(self.run_dir / "chaos.jsonl"))
        self.log.emit(
            "experiment_started",
            name=exp.name,
            seed=exp.seed,
            time_scale=exp.time_scale,
            duration_s=exp.duration,
            source=exp.source,
        )
        started_ms = int(time.time() * 1000)
        self.cluster = self._make_cluster()
        progress: asyncio.Task[None] | None = None
        try:
            self.say(f"run {exp.name}: {exp.question or '(no question given)'}")
            self.say(f"run directory: {self.run_dir}")
            await self._start_analysis(after=self._manifest_path)
            if self.image is not None:
                self.say(f"backend: docker, image {self.image.name} ({self.image.image_id[:19]})")
            await self.cluster.prepare()
            if isinstance(self.cluster, ContainerCluster):
                self.say(self.cluster.network_note())
            await self._setup()
            progress = asyncio.create_task(self._progress_loop())
            await self._execute()
            await self._drain()
            self._phase = "stop"
            await self._teardown()
        except asyncio.CancelledError:
            self.result.interrupted = True
            self.say("interrupted: stopping the cluster")
        except (
            ProcessFailed,
            SupervisorError,
            TimeoutError,
            AdminError,
            RemotingError,
            OSError,
            ExperimentError,
            BackendError,
        ) as e:
            self.result.errors.append(str(e))
            self.say(f"run failed: {e}")
        finally:
            if progress is not None:
                progress.cancel()
                with contextlib.suppress(BaseException):
                    await progress
            with contextlib.suppress(BaseException):
                await self.cluster.close()
            self.cluster.sup.close()  # no-op after a clean close; the last word otherwise
            if isinstance(self.cluster, ContainerCluster):
                self.cluster.remove_sync()  # containers and network, even when the close was cut short
            with contextlib.suppress(BaseException):
                await self._refresh_tally()
            if self.result.errors or self.result.interrupted or not self.analyze:
                await self._stop_analysis()
            self._finish(started_ms)
        if self.result.interrupted:
            return self.result
        if self.analyze and not self.result.errors:
            await self._analyze()
        elif self.analyze:
            self.say("analysis skipped: the run did not complete")
        self._print_verdict()
        return self.result

    def _make_cluster(self) -> LocalCluster:
        exp = self.exp
        common: dict[str, Any] = {
            "time_scale": exp.time_scale,
            "log": self.log,
            "seed": exp.seed,
            "ready_timeout_s": self.ready_timeout_s,
        }
        if self.image is None:
            if exp.acl is not None:
                common["credentials"] = SessionCredentials(exp.acl.access_key, exp.acl.secret_key)
            return LocalCluster(self.run_dir, metrics=self.metrics, **common)
        if self.metrics:
            raise ExperimentError(exp.source, [(None, "--metrics runs on the local-process backend only")])
        if exp.acl is not None:
            raise ExperimentError(exp.source, [(None, "[acl] runs on the local-process backend only")])
        return ContainerCluster(self.run_dir, image=self.image, **common)

    async def _setup(self) -> None:
        exp, cluster = self.exp, self.cluster
        assert cluster is not None
        # Real 4.x clients speak RocketMQ's own protocol: the servers open their native ports for them.
        # Apache's v5 clients speak gRPC to rmq-proxy, which talks to the brokers as our clients do.
        real = exp.real_clients()
        if real:
            check_environment(exp, self.clients)
        native = bool(real - set(V5_CLIENTS))
        v5 = bool(real & set(V5_CLIENTS))
        cluster.add_namesrv(native=native)
        for b in exp.brokers:
            flags = exp.broker_flags() + (["--acl", exp.acl.file] if exp.acl else [])
            cluster.add_broker(b, durable=exp.durable, flags=flags, native=native)
        if v5:
            cluster.add_proxy()
        proxied = exp.network_targets(cluster.proxied_actions)
        for c in exp.consumers:
            for node in c.nodes:
                if c.real:
                    cluster.add_real_consumer(
                        node,
                        client=c.client,
                        group=c.group,
                        topic=c.topic,
                        orderly=c.orderly,
                        consume_ms=c.consume_ms,
                        clients=self.clients,
                    )
                    continue
                cluster.add_consumer(
                    node,
                    group=c.group,
                    topic=c.topic,
                    strategy=c.strategy,
                    orderly=c.orderly,
                    broadcast=c.broadcast,
                    consume_ms=c.consume_ms,
                    consume_from=c.consume_from,
                    proxied=node in proxied,
                    extra=c.client_args(),
                )
        if exp.workload:
            w = exp.workload
            for node, topic in w.nodes:
                cluster.add_producer(
                    node, topic=topic, rate=w.rate, count=w.count, size=w.size, proxied=node in proxied
                )
        self.say(f"starting name server and {len(exp.brokers)} broker(s)")
        await cluster.start_all(["namesrv"])
        await cluster.start_all(list(exp.brokers))
        for t in exp.topics:
            await cluster.create_topic(
                t.name, exp.topic_queues_per_broker(t.name), timeout_s=self.ready_timeout_s
            )
        for c in exp.consumers:
            if c.request_mode is not None:  # RocketMQ 5 server-side assignment: the brokers keep the mode
                for addr in cluster.brokers.values():
                    await cluster.admin.set_message_request_mode(addr, c.topic, c.group, c.request_mode, -1)
        await cluster.start_links()
        if v5:
            self.say("starting rmq-proxy for the RocketMQ 5 clients")
            await cluster.start_all([PROXY_NODE])
        consumers = [n for c in exp.consumers if c.start <= 0 for n in c.nodes]
        kinds = sorted({c.client for c in exp.consumers if c.start <= 0})
        self.say(f"starting {len(consumers)} consumer(s) ({', '.join(kinds) or 'none'})")
        await cluster.start_all(consumers)
        self.log_emit("cluster_ready", nodes=len(cluster.sup.members))

    def log_emit(self, event: str, **fields: Any) -> None:
        if self.log is not None:
            self.log.emit(event, **fields)

    async def _execute(self) -> None:
        exp = self.exp
        self._t0 = time.monotonic()
        # The experiment's t = 0: nemesis times count from here, and so do the console and the report.
        self.log_emit("schedule_started", time_scale=exp.time_scale, duration_s=exp.duration)
        self._phase = "run"
        total = exp.wall(exp.duration)
        if self.metrics and isinstance(self.cluster, LocalCluster):
            for node, url in sorted(self.cluster.metrics_endpoints().items()):
                self.say(f"metrics: {node} {url}")
        self.say(
            f"running for {total:.1f}s wall ({exp.duration:g}s at time scale {exp.time_scale:g}), "
            f"{len(exp.schedule())} scheduled nemesis action(s) (a restart is written as a stop and a start)"
        )
        async with asyncio.TaskGroup() as tg:
            if exp.workload:
                tg.create_task(self._start_producers())
            for c in exp.consumers:
                if c.start > 0:
                    tg.create_task(self._join_consumers(c.start, list(c.nodes)))
            for step in exp.schedule():
                tg.create_task(self._step(step))
            await asyncio.sleep(total)
            self._end_now.set()  # actions due after the end (an undo of a long pause) run now
        self._phase = "heal"
        await self._heal()

    async def _start_producers(self) -> None:
        w = self.exp.workload
        assert w is not None and self.cluster is not None
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self.exp.wall(w.start)):
                await self._end_now.wait()
        await self.cluster.start_all([n for n, _ in w.nodes])

    async def _join_consumers(self, at: float, nodes: list[str]) -> None:
        """Start consumers that join the group later than the cluster (``start`` in their table)."""
        assert self._t0 is not None and self.cluster is not None
        delay = self._t0 + self.exp.wall(at) - time.monotonic()
        if delay > 0:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):
                    await self._end_now.wait()
        if self._end_now.is_set():
            return
        self.say(f"{self._stamp()} joining: {', '.join(nodes)}")
        self.log_emit("consumers_joining", nodes=nodes, at=at)
        for n in nodes:
            lock = self._locks.setdefault(n, asyncio.Lock())
            async with lock:
                try:
                    await self.cluster.sup.astart(n)
                except ProcessFailed as e:
                    self.result.errors.append(str(e))
                    self.say(f"{self._stamp()} {n} did not start: {str(e).splitlines()[0]}")
                except SupervisorError as e:  # a nemesis started it already
                    self.result.skipped.append(f"join {n}: {e}")
                    self.log_emit("join_skipped", target=n, reason=str(e))

    async def _step(self, step: Step) -> None:
        assert self._t0 is not None
        delay = self._t0 + self.exp.wall(step.t) - time.monotonic()
        if delay > 0:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):
                    await self._end_now.wait()
        lock = self._locks.setdefault(step.target, asyncio.Lock())
        async with lock:
            await self.execute(step)

    async def execute(self, step: Step) -> None:
        """Carry out one nemesis action; an action that cannot apply now is logged and skipped."""
        cluster, exp = self.cluster, self.exp
        assert cluster is not None
        sup = cluster.sup
        self.say(f"{self._stamp()} {step.describe()}")
        try:
            a, target, p = step.action, step.target, step.params
            if a == "kill":
                await sup.akill(target)
            elif a == "stop":
                await sup.astop(target)
            elif a == "start":
                await sup.astart(target, nemesis=True)
            elif a == "restart":
                await sup.arestart(target, mode=p.get("mode", "stop"), down_s=exp.wall(p.get("down", 0.0)))
            elif a == "pause":
                sup.pause(target)
            elif a == "resume":
                sup.resume(target)
            elif a == "hang":
                sup.hang(target)
            elif a == "unhang":
                sup.unhang(target)
            elif a in NETWORK_ACTIONS:
                extra: dict[str, Any] = {"broker": p.get("broker", "all")}
                if a == "latency":
                    extra["latency_ms"] = round(p["ms"] * exp.time_scale, 3)
                    extra["jitter_ms"] = round(p.get("jitter_ms", 0) * exp.time_scale, 3)
                if a == "loss":
                    extra["percent"] = p["percent"]
                if p.get("direction"):
                    extra["direction"] = p["direction"]
                if a != "heal":  # the container backend uses the kernel's iptables or netem where it can
                    extra["via"] = cluster.network_via(a, target, extra["broker"])
                sup.nemesis_event(a, target, **extra)
                await cluster.apply_network(
                    target,
                    a,
                    extra["broker"],
                    ms=extra.get("latency_ms", 0),
                    jitter_ms=extra.get("jitter_ms", 0),
                    direction=extra.get("direction", "both"),
                    percent=extra.get("percent", 0),
                )
            elif a in BROKER_ACTIONS and sup.member(target).state not in ("running", "paused"):
                # Skipped at once, as a refused connect would be: a killed broker's container takes its
                # address along, and the admin connect would wait for its timeout instead.
                raise SupervisorError(f"{target} is not running ({sup.member(target).state})")
            elif a == "fault":
                await self._fault(step)
            elif a == "fault-clear":
                await cluster.admin.fault_clear(cluster.brokers[target])
                sup.nemesis_event(a, target)
            elif a == "policy":
                await cluster.admin.policy_set(
                    cluster.brokers[target],
                    notify_on_channel_expired=p.get("notify_on_channel_expired"),
                    release_locks_on_close=p.get("release_locks_on_close"),
                )
                sup.nemesis_event(a, target, **p)
            self.executed += 1
        except (SupervisorError, AdminError, RemotingError, KeyError, ValueError) as e:
            reason = str(e)
            self.result.skipped.append(f"{step.describe()}: {reason}")
            self.log_emit("nemesis_skipped", action=step.action, target=step.target, reason=reason)
            self.say(f"{self._stamp()} skipped {step.describe()}: {reason.splitlines()[0]}")

    async def _fault(self, step: Step) -> None:
        cluster, exp, p = self.cluster, self.exp, step.params
        assert cluster is not None
        client_id = None
        if p.get("client"):
            m = cluster.sup.member(p["client"])
            if not m.client_ids:
                raise SupervisorError(f"{p['client']} has no client id yet")
            client_id = m.client_ids[-1]
        request, fields = fault_request(exp, step, client_id)
        fault_id = await cluster.admin.fault_add(cluster.brokers[step.target], **request)
        cluster.sup.nemesis_event("fault", step.target, fault_id=fault_id, **fields)

    async def _heal(self) -> None:
        """Undo what the nemeses left behind so the workload can drain: resume, heal links, clear faults."""
        cluster = self.cluster
        assert cluster is not None
        for m in cluster.sup:
            cluster.sup.refresh(m)
            if m.state == "paused":
                await self.execute(Step(self.exp.duration, "resume", m.node, m.role, m.group, {}, 0))
            if m.hung and m.state == "running":
                await self.execute(Step(self.exp.duration, "unhang", m.node, m.role, m.group, {}, 0))
        for m in sorted(cluster.sup, key=lambda m: m.node):  # servers too: a partition may name any node
            if cluster.network_faulty(m.node):
                await self.execute(
                    Step(self.exp.duration, "heal", m.node, m.role, None, {"broker": "all"}, 0)
                )
        for b in sorted({s.target for s in self.exp.schedule() if s.action == "fault"}):
            if cluster.sup.member(b).state == "running":
                await self.execute(Step(self.exp.duration, "fault-clear", b, "broker", None, {}, 0))

    async def _drain(self) -> None:
        """Wait until the producers are done and every group consumed what was sent (or the timeout)."""
        cluster = self.cluster
        assert cluster is not None
        self._phase = "drain"
        timeout = self.exp.wall(self.exp.drain_timeout)
        deadline = time.monotonic() + timeout
        producers = [m for m in cluster.sup if m.role == "producer"]
        while True:
            await self._refresh_tally()
            for m in producers:
                cluster.sup.refresh(m)
            done = all(m.state in ("exited", "stopped") for m in producers)
            if done and self.tally.drained():
                self.result.drained = True
                break
            if time.monotonic() > deadline:
                break
            await asyncio.sleep(0.2)
        for m in producers:
            if m.state == "exited" and m.returncode not in (0, None):
                self.result.errors.append(
                    f"{m.node} exited with code {m.returncode} (see {Path(m.out_file).name})"
                )
            if m.state == "new":
                self.result.errors.append(f"{m.node} never started")
        self._show_progress(force=True)
        self.progress.end_live()
        if self.result.drained:
            self.say(f"drained: every group consumed all {self.tally.sent_total} sent message(s)")
        else:
            parts = []
            for g, n in sorted(self.tally.missing().items()):
                where = ", ".join(f"{q} {k}" for q, k in self.tally.missing_by_queue(g).items())
                parts.append(f"{g}: {n} missing" + (f" ({where})" if n and where else ""))
            busy = [m.node for m in producers if m.state not in ("exited", "stopped")]
            self.say(
                f"not drained after {timeout:.1f}s: {'; '.join(parts) or 'nothing consumed'}"
                + (f"; producers still running: {', '.join(busy)}" if busy else "")
            )
        if self.tally.ignored_pulls:
            where = ", ".join(f"{q} x{k}" for q, k in sorted(self.tally.ignored_pulls.items()))
            self.say(f"pull answers a real client ignored for queues it holds (pull_answer_ignored): {where}")
        self.result.quick_verdict = "ok" if self.result.drained and not self.result.errors else "fail"

    async def _teardown(self) -> None:
        """End the run: clients are SIGKILLed together, without nemesis events, then the servers stop.

        A graceful stop would write a ``consumer_stopped`` per consumer, and EVENTS.md makes each a
        change point that must converge -- which the last consumers of a group leaving at once never
        can. Killing them, unannounced, leaves the experiment's own change points as the only ones.
        """
        assert self.cluster is not None
        self.log_emit("teardown", mode="kill")
        killed = await self.cluster.kill_role("consumer")
        killed += await self.cluster.kill_role("producer")
        self.log_emit("teardown_clients_killed", nodes=killed)

    def _finish(self, started_ms: int) -> None:
        assert self.cluster is not None
        ended_ms = int(time.time() * 1000)
        self._ended_at = time.monotonic()
        manifest = {
            "experiment": self.exp.to_dict(),
            "experiment_file": "experiment.toml",
            "name": self.exp.name,
            "question": self.exp.question,
            "seed": self.exp.seed,
            "time_scale": self.exp.time_scale,
            "versions": {**versions(), **self._client_versions()},
            "clients": {n: c.client for c in self.exp.consumers for n in c.nodes},
            "started_ms": started_ms,
            "ended_ms": ended_ms,
            **self.cluster.manifest(),
            "nemesis_executed": self.executed,
            "nemesis_skipped": self.result.skipped,
            "drained": self.result.drained,
            "live_counts": self.tally.summary(),
            "backend": self.backend,
            "errors": self.result.errors,
            "interrupted": self.result.interrupted,
        }
        (self.run_dir / "manifest.json").write_text(
            json.dumps(manifest, indent=2, sort_keys=True, default=str)
        )
        if self.log is not None:
            self.log.emit(
                "experiment_finished",
                drained=self.result.drained,
                errors=len(self.result.errors),
                interrupted=self.result.interrupted,
            )
            self.log.close()

    def _client_versions(self) -> dict[str, Any]:
        kinds = self.exp.real_clients()
        return {"real_clients": self.clients.versions(kinds)} if kinds else {}

    async def _start_analysis(self, after: Path | None = None) -> None:
        """Start ``python -m rmqlab.pipeline`` (quiet: the runner prints the verdict). With `after`, it starts
        Spark now and reads the run once that file (the manifest) exists, so that the JVM start and its
        first job overlap the experiment instead of following it."""
        if not self.analyze or not pipeline_available() or self._analysis is not None:
            return
        extra = ["--after", str(after)] if after is not None else []
        self._analysis = await asyncio.create_subprocess_exec(
            *self.analysis_command,
            str(self.run_dir),
            "--quiet",
            *extra,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=None,
            start_new_session=True,
        )

    async def _stop_analysis(self) -> None:
        proc, self._analysis = self._analysis, None
        if proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        await proc.wait()

    async def _analyze(self) -> None:
        if not pipeline_available():
            self.say(
                "analysis skipped: the pipeline extra (pyspark) is not installed; showing live counts only"
            )
            return
        await self._start_analysis()
        proc = self._analysis
        assert proc is not None
        self._quick = await self._quick_verdict()
        self.say(
            "writing summary.json and the report (rmq-analyze) ..."
            if self._quick is not None
            else "analysing the run (python -m rmqlab.pipeline) ..."
        )
        try:
            rc = await proc.wait()
        except asyncio.CancelledError:
            await self._stop_analysis()
            raise
        self._analysis = None
        if self._ended_at is not None:
            self.say(f"analysis done {time.monotonic() - self._ended_at:.1f} s after the run ended")
        self.result.analysis_rc = rc
        summary_path = self.run_dir / "summary.json"
        if summary_path.exists():
            try:
                self.result.summary = json.loads(summary_path.read_text())
            except ValueError:
                self.result.summary = None
        report = self.run_dir / "report.html"
        self.result.report = report if report.exists() else None
        if rc in (0, 1) and self.result.summary is not None:
            self.result.verdict = "ok" if rc == 0 else "fail"
            if self._quick is not None:
                from rmqlab.pipeline.quick import disagreement

                why = disagreement(self._quick, self.result.summary)
                if why is not None:  # the same definitions twice: a difference is a bug, never hidden
                    self.result.errors.append(why)
        else:
            self.result.errors.append(f"the analysis failed (python -m rmqlab.pipeline exited with {rc})")

    async def _quick_verdict(self) -> dict[str, Any] | None:
        """The verdict at once, by the plain-Python analysis (off the loop), for a run small enough;
        the Spark analysis writes summary.json and the report meanwhile."""
        from rmqlab.pipeline.quick import quick_summary

        try:
            quick = await asyncio.to_thread(quick_summary, self.run_dir)
        except Exception as exc:  # the Spark analysis still answers; say why this one could not
            self.say(f"no quick verdict: {type(exc).__name__}: {exc}")
            return None
        if quick is None:
            return None
        self._say_groups(quick)
        failed = [g for g, info in quick["groups"].items() if info.get("verdict") != "ok"]
        after = f"{time.monotonic() - self._ended_at:.1f} s after the run ended, " if self._ended_at else ""
        self.closing.note(
            f"verdict: {'FAIL' if failed else 'OK'} (plain-Python analysis, {after}the report follows)"
        )
        return quick

    def _say_groups(self, s: dict[str, Any] | None) -> None:
        """Each group's line and the answer's sentences."""
        if s and isinstance(s.get("groups"), dict):
            for g, info in sorted(s["groups"].items()):
                conv = info.get("convergence") or []
                slow = [c for c in conv if not c.get("converged")]
                worst = max((c.get("convergence_ms") or 0 for c in conv), default=0)
                rmq = [
                    c["convergence_rocketmq_ms"] for c in conv if c.get("convergence_rocketmq_ms") is not None
                ]
                worst_rmq = max(rmq) if rmq else None
                unavailable = (info.get("rocketmq_time") or {}).get("unavailable_ms")
                self.closing.note(
                    f"group {g}: {info.get('verdict')} | sent {info.get('sent')} "
                    f"consumed {info.get('consumed_unique')} lost {info.get('lost')} "
                    f"duplicates {info.get('duplicates')} | "
                    f"{len(conv)} change(s), slowest convergence "
                    + (
                        f"{worst_rmq / 1000:.1f} s RocketMQ ({worst} ms wall)"
                        if worst_rmq is not None
                        else f"{worst} ms"
                    )
                    + (f", {len(slow)} never converged" if slow else "")
                    + (
                        f" | queues unavailable {unavailable / 1000:.1f} s RocketMQ (summed)"
                        if unavailable
                        else ""
                    )
                )
            for sentence in s.get("answer") or []:
                self.closing.note(f"answer: {sentence}")

    def _print_verdict(self) -> None:
        r = self.result
        if self._quick is None:  # said already, when the plain-Python analysis answered at once
            self._say_groups(r.summary)
        verdict = r.verdict if r.verdict is not None else r.quick_verdict
        source = "analysis" if r.verdict is not None else "live counts (no analysis)"
        self.closing.note(f"verdict: {verdict.upper()} ({source})")
        if r.errors:
            for e in r.errors:
                self.closing.note(f"error: {e.splitlines()[0]}")
        if r.skipped:
            self.closing.note(f"{len(r.skipped)} nemesis action(s) skipped (see manifest.json)")
        if r.report is not None:
            self.closing.note(f"report:  {r.report}")
        if r.summary is not None:
            self.closing.note(f"summary: {self.run_dir / 'summary.json'}")
        self.closing.note(f"run directory: {self.run_dir}")
