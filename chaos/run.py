"""``rmq-chaos run``: one experiment on local processes or containers, its analysis and its verdict.

The lab's Runner (``lab.runner``) runs the experiment on the backend chosen here (``LocalCluster``, or
``ContainerCluster`` given a checked image). Around it this module keeps the run directory: the
experiment file as run, the lab's own events (``chaos.jsonl``), ``manifest.json``, and the analysis
(``python -m rmqlab.pipeline``, started beside the run so that Spark's start overlaps it), whose verdict
and report it prints at the end.

The run directory ends up holding every process's JSON-lines events (``NODE.jsonl``, ``NODE.2.jsonl``
after a restart, ``chaos.jsonl`` for the lab's own), their stdout/stderr (``NODE.out``), the experiment
file as run, ``manifest.json`` and, after the analysis, ``summary.json`` and ``report.html``. A real
C++ client also leaves its own log in ``NODE.client-log/``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any, TextIO

from rmqlab.chaos.container import ContainerCluster, ImageInfo
from rmqlab.chaos.process_cluster import LocalCluster
from rmqlab.chaos.realclients import RealClients
from rmqlab.cli import Progress
from rmqlab.lab.experiment import Experiment, ExperimentError
from rmqlab.lab.runner import Console, Runner, RunResult, pipeline_available, versions
from rmqlab.lab.tally import LogTailer, RunTally
from rmqlab.pipeline.discover import clock_word
from rmqlab.protocol.acl_signing import SessionCredentials
from rmqlab.protocol.event_log import EventLog


class ChaosRun:
    """One ``rmq-chaos run``: the backend, the Runner on it, the manifest, the analysis, the verdict."""

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
        manifest_extra: dict[str, Any] | None = None,
    ) -> None:
        self.exp = exp
        # keys the caller adds to manifest.json (a known problem's entry and variant)
        self.manifest_extra = dict(manifest_extra or {})
        # The backend: local processes, or (given a checked image) containers (chaos.container).
        self.image = image
        self.clients = clients or RealClients()
        self.run_dir = Path(run_dir)
        self.analyze = analyze
        self.out = out or sys.stdout
        # Progress and step lines; with quiet only the closing lines (verdict, report) are printed.
        self.console = _ChaosConsole(self, self.out, quiet=quiet)
        self.closing = Progress(self.out)
        self.ready_timeout_s = ready_timeout_s
        self.progress_interval_s = progress_interval_s
        self.analysis_command = analysis_command or [sys.executable, "-m", "rmqlab.pipeline"]
        self.result = RunResult(self.run_dir)
        self.tally = RunTally({c.group: {c.topic} for c in exp.consumers})
        self.cluster: LocalCluster | None = None
        self.runner: Runner | None = None
        self.log: EventLog | None = None
        self._analysis: asyncio.subprocess.Process | None = None
        self._ended_at: float | None = None
        self._manifest_path = Path(run_dir).resolve() / "manifest.json"  # the analysis may run elsewhere
        self.metrics = metrics  # every node of ours serves live metrics (--metrics-port)
        self._quick: dict[str, Any] | None = None  # the plain-Python analysis's summary, once said

    def say(self, text: str) -> None:
        self.console.say(text)

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
        self.cluster = self._make_cluster(self.log)
        self.runner = Runner(
            exp,
            self.cluster,
            self.log,
            self.result,
            console=self.console,
            tally=self.tally,
            tailer=LogTailer(self.run_dir),
            progress_interval_s=self.progress_interval_s,
        )
        try:
            await self._start_analysis(after=self._manifest_path)
        except OSError as e:
            self.result.errors.append(str(e))
            self.say(f"run failed: {e}")
            with contextlib.suppress(BaseException):
                await self.cluster.close()
        else:
            await self.runner.run()
        finally:
            self.cluster.sup.close()  # no-op after a clean close; the last word otherwise
            if isinstance(self.cluster, ContainerCluster):
                self.cluster.remove_sync()  # containers and network, even when the close was cut short
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

    def _make_cluster(self, log: EventLog) -> LocalCluster:
        exp = self.exp
        common: dict[str, Any] = {
            "time_scale": exp.time_scale,
            "log": log,
            "seed": exp.seed,
            "ready_timeout_s": self.ready_timeout_s,
        }
        if self.image is None:
            if exp.acl is not None:
                common["credentials"] = SessionCredentials(exp.acl.access_key, exp.acl.secret_key)
            return LocalCluster(self.run_dir, clients=self.clients, metrics=self.metrics, **common)
        if self.metrics:
            raise ExperimentError(exp.source, [(None, "--metrics runs on the local-process backend only")])
        if exp.acl is not None:
            raise ExperimentError(exp.source, [(None, "[acl] runs on the local-process backend only")])
        return ContainerCluster(self.run_dir, image=self.image, **common)

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
            "nemesis_executed": self.runner.executed if self.runner is not None else 0,
            "nemesis_skipped": self.result.skipped,
            "drained": self.result.drained,
            "live_counts": self.tally.summary(),
            "backend": self.cluster.kind,
            "errors": self.result.errors,
            "interrupted": self.result.interrupted,
            **self.manifest_extra,
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
        kinds = set(self.exp.real_clients())
        out: dict[str, Any] = {}
        if self.exp.engine != "emulator":
            out["engine"] = self.exp.engine
            if self.exp.workload:
                kinds.add("go")  # Apache's Go producer sends the workload
        if kinds:
            out["real_clients"] = self.clients.versions(kinds)
        return out

    # -- the analysis ----------------------------------------------------------------------------

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
        from rmqlab.pipeline.quick import RunTooLarge, quick_summary

        try:
            quick = await asyncio.to_thread(quick_summary, self.run_dir)
        except RunTooLarge as exc:  # the Spark analysis answers alone
            self.say(f"no quick verdict: {exc}")
            return None
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
        from rmqlab.pipeline.quick import group_line

        if s and isinstance(s.get("groups"), dict):
            for g, info in sorted(s["groups"].items()):
                self.closing.note("group " + group_line(g, info, clock_word(self.run_dir)))
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


class _ChaosConsole(Console):
    """rmq-chaos's console: with ``--metrics``, where each node serves its metrics, once the cluster is up."""

    def __init__(self, run: ChaosRun, out: TextIO, *, quiet: bool) -> None:
        super().__init__(out, quiet=quiet)
        self.run = run

    def running(self, exp: Experiment, actions: int) -> None:
        cluster = self.run.cluster
        if self.run.metrics and cluster is not None and not isinstance(cluster, ContainerCluster):
            for node, url in sorted(cluster.metrics_endpoints().items()):
                self.say(f"metrics: {node} {url}")
        super().running(exp, actions)
