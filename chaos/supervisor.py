"""Local cluster supervisor: runs every role as a real OS process and never leaves one behind.

Each member runs as ``python -m MODULE --node NAME --time-scale X --log-file RUN/NAME.jsonl ...`` (or,
for a real RocketMQ client, its driver's program with the same flags but ``--time-scale``) in a
process group of its own, so signals reach it (and anything it forks) and nothing else. Its stdout and
stderr go to ``RUN/NAME.out``; readiness is the ``READY ...`` line there. Cleanup is layered: ``close()``
(also the context manager and the runner's ``finally``), an ``atexit`` hook, SIGTERM/SIGHUP handlers
when the host program has none, and on Linux a parent-death signal so that even a SIGKILLed
supervisor takes its children with it.

Every operation is a non-blocking step (spawn, signal, check) plus a waiting loop offered twice: a
blocking one for synchronous callers (the pytest plugin) and an ``async`` one for the experiment
runner's event loop. Spawns must happen on a long-lived thread (the main or the loop thread): the
parent-death signal fires when the spawning *thread* ends.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rmqlab.lab.backend import EventSink, NodeError, NodeFailed, nemesis_fields
from rmqlab.lab.experiment import HANGABLE_REAL_CLIENTS

READY_PREFIX = "READY"
_TAIL_BYTES = 4000

# Run in a throw-away interpreter before exec'ing the role: ask the kernel to SIGKILL the role when
# the supervisor dies, and give up if it already has (the parent changed before prctl took effect).
_LAUNCHER = (
    "import ctypes,os,sys\n"
    "libc=ctypes.CDLL(None,use_errno=True)\n"
    "libc.prctl(1,9,0,0,0)\n"  # PR_SET_PDEATHSIG, SIGKILL
    "os.getppid()!=int(sys.argv[1]) and os._exit(70)\n"
    "os.execv(sys.argv[2],[sys.argv[2],*sys.argv[3:]])\n"
)


class SupervisorError(NodeError):
    """An operation that cannot be done in the member's current state (e.g. pausing a stopped node)."""


class ProcessFailed(SupervisorError, NodeFailed):
    """A member exited or did not become ready in time; ``output`` holds the tail of its stdout/stderr."""

    def __init__(self, node: str, problem: str, output: str) -> None:
        tail = output.strip()
        super().__init__(f"{node}: {problem}" + (f"\n--- last output of {node} ---\n{tail}" if tail else ""))
        self.node = node
        self.output = output


@dataclass
class Member:
    """One named process of the cluster, across its restarts (incarnations)."""

    node: str
    role: str
    module: str
    args: list[str]
    group: str | None = None
    port: int | None = None
    expect_exit: bool = False  # producers finish on their own
    # argv that runs the member instead of ``python -m module`` (a real client's driver), and whether
    # it takes --time-scale (real clients keep RocketMQ's own timers).
    program: list[str] | None = None
    time_scaled: bool = True
    client: str | None = None  # consumers: "python", "cpp" or "js"
    native_port: int | None = None  # servers started with --remoting-port: RocketMQ's native port
    state: str = "new"  # new | starting | running | paused | stopping | stopped | exited
    proc: subprocess.Popen[bytes] | None = None
    incarnation: int = 0
    ready_info: str | None = None  # the text after READY: an address or a client id
    client_ids: list[str] = field(default_factory=list)
    log_files: list[str] = field(default_factory=list)
    out_file: str = ""
    returncode: int | None = None
    hung: bool = False  # the listener was hung (SIGUSR1) and not released yet
    _out_offset: int = 0

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    @property
    def address(self) -> str | None:
        return f"127.0.0.1:{self.port}" if self.port else None

    @property
    def native_address(self) -> str | None:
        return f"127.0.0.1:{self.native_port}" if self.native_port else None

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def info(self) -> dict[str, Any]:
        return {
            "role": self.role,
            "group": self.group,
            "port": self.port,
            "native_port": self.native_port,
            "client": self.client,
            "state": self.state,
            "incarnations": self.incarnation,
            "client_ids": list(self.client_ids),
            "log_files": list(self.log_files),
            "out_file": self.out_file,
            "returncode": self.returncode,
        }


def pick_port(host: str = "127.0.0.1") -> int:
    """A free TCP port on ``host`` (bind port 0, read it, release it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


# Strong references: a supervisor that was dropped without close() must still be cleaned up at exit.
_live: set[Supervisor] = set()
_hooks_lock = threading.Lock()
_hooks_installed = False


def _cleanup_all() -> None:
    for sup in list(_live):
        with contextlib.suppress(Exception):
            sup.close(timeout_s=2.0)


def _on_fatal_signal(signum: int, _frame: Any) -> None:
    _cleanup_all()
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def _install_hooks() -> None:
    global _hooks_installed
    with _hooks_lock:
        if _hooks_installed:
            return
        _hooks_installed = True
        atexit.register(_cleanup_all)
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGHUP):
                # Only where the host program has not claimed the signal (asyncio runners do).
                if signal.getsignal(sig) == signal.SIG_DFL:
                    signal.signal(sig, _on_fatal_signal)


class Supervisor:
    """Starts, signals and cleans up the processes of one run; see the module docstring."""

    def __init__(
        self,
        run_dir: str | Path,
        *,
        time_scale: float = 1.0,
        log: EventSink | None = None,
        python: str = sys.executable,
        env: dict[str, str] | None = None,
        ready_timeout_s: float = 30.0,
        stop_timeout_s: float = 10.0,
        parent_death_signal: bool = True,
    ) -> None:
        # Absolute: children start with the run directory as their working directory, so a relative
        # path handed to them would land one level deeper.
        self.run_dir = Path(run_dir).resolve()
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.time_scale = time_scale
        self.log = log
        self.python = python
        self.env = {**os.environ, **(env or {}), "PYTHONUNBUFFERED": "1"}
        self.ready_timeout_s = ready_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self.parent_death_signal = parent_death_signal and sys.platform.startswith("linux")
        self.members: dict[str, Member] = {}
        # Arguments written "{name}" are replaced by vars[name] at spawn time (addresses known only later).
        self.vars: dict[str, str] = {}
        self._closed = False
        _live.add(self)
        _install_hooks()

    # ----------------------------------------------------------------------------------------
    # Declaring members

    def add(
        self,
        node: str,
        role: str,
        module: str,
        args: list[str] | None = None,
        *,
        group: str | None = None,
        port: int | None = None,
        expect_exit: bool = False,
        program: list[str] | None = None,
        time_scaled: bool = True,
        client: str | None = None,
    ) -> Member:
        if node in self.members:
            raise SupervisorError(f"node {node!r} already exists")
        if not node or "/" in node or node.startswith((".", "_")):
            raise SupervisorError(f"bad node name {node!r}")
        if program is not None and (not program or not os.path.isabs(program[0])):
            raise SupervisorError(f"{node}: the program must start with an absolute path, got {program!r}")
        m = Member(
            node,
            role,
            module,
            list(args or []),
            group=group,
            port=port,
            expect_exit=expect_exit,
            program=list(program) if program is not None else None,
            time_scaled=time_scaled,
            client=client,
        )
        m.out_file = str(self.run_dir / f"{node}.out")
        self.members[node] = m
        return m

    def member(self, node: str) -> Member:
        try:
            return self.members[node]
        except KeyError:
            raise SupervisorError(f"unknown node {node!r}") from None

    def __iter__(self) -> Iterator[Member]:
        return iter(list(self.members.values()))

    # ----------------------------------------------------------------------------------------
    # Non-blocking steps

    def _resolve(self, arg: str) -> str:
        if len(arg) > 2 and arg[0] == "{" and arg[-1] == "}":
            try:
                return self.vars[arg[1:-1]]
            except KeyError:
                raise SupervisorError(f"argument {arg} is not known yet") from None
        return arg

    def command(self, m: Member, log_file: str) -> list[str]:
        # -P: the working folder is not put on the path, so a folder of the user's never shadows a module
        head = m.program if m.program is not None else [self.python, "-P", "-m", m.module]
        scale = ["--time-scale", f"{self.time_scale:g}"] if m.time_scaled else []
        role_cmd = [
            *head,
            "--node",
            m.node,
            *scale,
            "--log-file",
            log_file,
            *(self._resolve(a) for a in m.args),
        ]
        if not self.parent_death_signal:
            return role_cmd
        return [self.python, "-S", "-c", _LAUNCHER, str(os.getpid()), *role_cmd]

    def spawn(self, node: str, *, nemesis: bool = False) -> Member:
        """Start the member's process (returns at once; see ``wait_ready``)."""
        if self._closed:
            raise SupervisorError("supervisor is closed")
        m = self.member(node)
        self.refresh(m)
        if m.state in ("starting", "running", "paused", "stopping"):
            raise SupervisorError(f"{node} is already {m.state}")
        cmd_args = [self._resolve(a) for a in m.args]  # fail before anything happens
        del cmd_args
        m.incarnation += 1
        name = f"{node}.jsonl" if m.incarnation == 1 else f"{node}.{m.incarnation}.jsonl"
        log_file = str(self.run_dir / name)
        m.log_files.append(log_file)
        if nemesis:
            self._nemesis("start", m)
        with open(m.out_file, "ab") as out:
            out.write(f"--- incarnation {m.incarnation} ---\n".encode())
            # On disk before the child exists: the child appends to the same file, and its READY line may
            # come before this process runs again (a loaded machine); a header still in this buffer would
            # then land after it, and so would the offset check_ready reads from.
            out.flush()
            m._out_offset = out.tell()
            m.proc = subprocess.Popen(
                self.command(m, log_file),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=str(self.run_dir),
                env=self.env,
                start_new_session=True,  # own process group: signals reach it and its children only
            )
        m.state = "starting"
        m.ready_info = None
        m.returncode = None
        self._emit(
            "process_spawned", target=node, target_role=m.role, pid=m.proc.pid, incarnation=m.incarnation
        )
        return m

    def output(self, node: str, *, whole: bool = False) -> str:
        m = self.member(node)
        try:
            with open(m.out_file, "rb") as f:
                if not whole:
                    f.seek(m._out_offset)
                data = f.read()
        except OSError:
            return ""
        return data.decode("utf-8", "replace")

    def check_ready(self, node: str) -> bool:
        """True once the member printed READY; raises ProcessFailed if it died first."""
        m = self.member(node)
        if m.state in ("running", "paused"):
            return True
        if m.state == "exited" and m.ready_info is not None:
            return True
        if m.state != "starting" or m.proc is None:
            raise SupervisorError(f"{node} is {m.state}, not starting")
        text = self.output(node)
        for line in text.splitlines():
            if line == READY_PREFIX or line.startswith(READY_PREFIX + " "):
                m.ready_info = line[len(READY_PREFIX) :].strip()
                if m.role == "consumer" and m.ready_info:
                    m.client_ids.append(m.ready_info.split()[0])  # READY <client id> [metrics=...]
                self._learn_port(m)
                m.state = "running"
                m.hung = False  # a new incarnation's listener is not hung
                self._emit(
                    "process_ready", target=node, target_role=m.role, pid=m.proc.pid, ready=m.ready_info
                )
                self.refresh(m)  # a producer may already have finished
                return True
        rc = m.proc.poll()
        if rc is not None:
            self._reaped(m, rc)
            raise ProcessFailed(
                node, f"exited with code {rc} before it was ready", self.output(node)[-_TAIL_BYTES:]
            )
        return False

    @staticmethod
    def _learn_port(m: Member) -> None:
        """A server started with ``--port 0`` keeps the port it got for its restarts, and so does its
        native port (``--remoting-port 0``): READY host:port [native=host:port]."""
        words = (m.ready_info or "").split()
        if not words:
            return

        def named(key: str) -> str:
            return next((w.removeprefix(key) for w in words[1:] if w.startswith(key)), "")

        native, metrics = named("native="), named("metrics=")
        for flag, addr in (("--port", words[0]), ("--remoting-port", native), ("--metrics-port", metrics)):
            _, sep, port = addr.rpartition(":")
            if not sep or not port.isdigit() or flag not in m.args:
                continue
            for i, a in enumerate(m.args[:-1]):
                if a == flag and m.args[i + 1] == "0":
                    m.args[i + 1] = port
            if flag == "--port" and m.port in (None, 0):
                m.port = int(port)
            if flag == "--remoting-port":
                m.native_port = int(port)

    def refresh(self, m: Member) -> None:
        """Notice a member that exited on its own (and reap it)."""
        if m.proc is not None and m.state in ("running", "paused"):
            rc = m.proc.poll()
            if rc is not None:
                self._reaped(m, rc)

    def refresh_all(self) -> None:
        for m in self:
            self.refresh(m)

    def _reaped(self, m: Member, rc: int) -> None:
        m.returncode = rc
        m.state = "exited"
        self._emit("process_exited", target=m.node, target_role=m.role, returncode=rc)

    def _signal(self, m: Member, sig: int) -> None:
        if m.proc is None:
            return
        try:
            os.killpg(m.proc.pid, sig)
        except ProcessLookupError:
            pass
        except PermissionError:  # the group is gone and its id reused: fall back to the process
            with contextlib.suppress(ProcessLookupError):
                m.proc.send_signal(sig)

    def _require(self, node: str, *states: str) -> Member:
        m = self.member(node)
        self.refresh(m)
        if m.state not in states:
            raise SupervisorError(f"{node} is {m.state}, not {' or '.join(states)}")
        return m

    def begin_kill(self, node: str, *, nemesis: bool = True) -> Member:
        """SIGKILL the member's process group (a crash: no shutdown, no unregistration)."""
        m = self._require(node, "starting", "running", "paused", "stopping")
        if nemesis:
            self._nemesis("kill", m)
        self._signal(m, signal.SIGKILL)
        m.state = "stopping"
        return m

    def kill(self, node: str, *, nemesis: bool = True) -> Member:
        m = self.begin_kill(node, nemesis=nemesis)
        deadline = time.monotonic() + 5
        while not self._finish_stop(m, force=time.monotonic() > deadline):
            time.sleep(0.005)
        return m

    def pause(self, node: str, *, nemesis: bool = True, **extra: Any) -> Member:
        """SIGSTOP: the process stays connected but answers nothing (a GC pause, a hung host); ``extra``
        goes into the nemesis event."""
        m = self._require(node, "running")
        if nemesis:
            self._nemesis("pause", m, **extra)
        self._signal(m, signal.SIGSTOP)
        m.state = "paused"
        return m

    def resume(self, node: str, *, nemesis: bool = True, **extra: Any) -> Member:
        m = self._require(node, "paused")
        if nemesis:
            self._nemesis("resume", m, **extra)
        self._signal(m, signal.SIGCONT)
        m.state = "running"
        return m

    def hang(self, node: str, *, nemesis: bool = True) -> Member:
        """SIGUSR1 to one of the lab's own consumers: its listener stops returning (a stuck call) while the
        process stays alive, heartbeats and keeps its queues."""
        m = self._require_hangable(node)
        if nemesis:
            self._nemesis("hang", m)
        self._signal(m, signal.SIGUSR1)
        m.hung = True
        return m

    def unhang(self, node: str, *, nemesis: bool = True) -> Member:
        """SIGUSR2: the hung listener calls return (success)."""
        m = self._require_hangable(node)
        if not m.hung:
            raise SupervisorError(f"{node}'s listener is not hung")
        if nemesis:
            self._nemesis("unhang", m)
        self._signal(m, signal.SIGUSR2)
        m.hung = False
        return m

    def _require_hangable(self, node: str) -> Member:
        m = self._require(node, "running")
        # The lab's own consumers and the v5 and Java clients' drivers (interop/) answer SIGUSR1/SIGUSR2.
        if m.role != "consumer" or (m.client or "python") not in ("python", *HANGABLE_REAL_CLIENTS):
            raise SupervisorError(
                f"{node} is not one of the lab's own consumers or a v5 or Java client: its listener "
                "cannot be hung"
            )
        return m

    def begin_stop(self, node: str, *, nemesis: bool = True) -> Member:
        """Send SIGTERM (and SIGCONT, so a paused process can act on it); see ``stop``."""
        m = self._require(node, "starting", "running", "paused")
        if nemesis:
            self._nemesis("stop", m)
        self._signal(m, signal.SIGTERM)
        self._signal(m, signal.SIGCONT)
        m.state = "stopping"
        return m

    def _finish_stop(self, m: Member, *, force: bool) -> bool:
        assert m.proc is not None
        rc = m.proc.poll()
        if rc is None and force:
            self._signal(m, signal.SIGKILL)
            try:
                rc = m.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:  # pragma: no cover
                return False
            self._emit("process_stop_forced", target=m.node, target_role=m.role)
        if rc is None:
            return False
        m.state = "stopped"
        m.returncode = rc
        self._emit("process_exited", target=m.node, target_role=m.role, returncode=rc)
        return True

    # ----------------------------------------------------------------------------------------
    # Blocking waits (synchronous callers)

    def wait_ready(self, node: str, timeout_s: float | None = None) -> Member:
        deadline = time.monotonic() + (timeout_s or self.ready_timeout_s)
        while not self.check_ready(node):
            if time.monotonic() > deadline:
                self._give_up(node)
            time.sleep(0.02)
        return self.member(node)

    def _give_up(self, node: str) -> None:
        m = self.member(node)
        self._signal(m, signal.SIGKILL)
        if m.proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                m.proc.wait(timeout=5)
        m.state = "exited"
        m.returncode = m.proc.returncode if m.proc else None
        raise ProcessFailed(node, "did not print READY in time", self.output(node)[-_TAIL_BYTES:])

    def start(self, node: str, *, timeout_s: float | None = None, nemesis: bool = False) -> Member:
        self.spawn(node, nemesis=nemesis)
        return self.wait_ready(node, timeout_s)

    def stop(self, node: str, *, timeout_s: float | None = None, nemesis: bool = True) -> Member:
        """SIGTERM, wait for a graceful exit, SIGKILL after the timeout."""
        m = self.begin_stop(node, nemesis=nemesis)
        deadline = time.monotonic() + (timeout_s if timeout_s is not None else self.stop_timeout_s)
        while not self._finish_stop(m, force=time.monotonic() > deadline):
            time.sleep(0.02)
        return m

    def restart(
        self, node: str, *, mode: str = "stop", down_s: float = 0.0, timeout_s: float | None = None
    ) -> Member:
        """Stop (or kill) then start again: written as two nemesis events, as EVENTS.md asks."""
        m = self.member(node)
        self.refresh(m)
        if m.state in ("starting", "running", "paused"):
            self.kill(node) if mode == "kill" else self.stop(node)
        if down_s > 0:
            time.sleep(down_s)
        return self.start(node, timeout_s=timeout_s, nemesis=True)

    def wait_exit(self, node: str, timeout_s: float) -> int | None:
        m = self.member(node)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self.refresh(m)
            if m.state not in ("starting", "running", "paused", "stopping"):
                return m.returncode
            time.sleep(0.02)
        return None

    # ----------------------------------------------------------------------------------------
    # Async waits (the experiment runner's loop)

    async def astart(self, node: str, *, timeout_s: float | None = None, nemesis: bool = False) -> Member:
        self.spawn(node, nemesis=nemesis)
        return await self.await_ready(node, timeout_s)

    async def await_ready(self, node: str, timeout_s: float | None = None) -> Member:
        deadline = time.monotonic() + (timeout_s or self.ready_timeout_s)
        while not self.check_ready(node):
            if time.monotonic() > deadline:
                self._give_up(node)
            await asyncio.sleep(0.02)
        return self.member(node)

    async def akill(self, node: str, *, nemesis: bool = True) -> Member:
        m = self.begin_kill(node, nemesis=nemesis)
        deadline = time.monotonic() + 5
        while True:
            if self._finish_stop(m, force=time.monotonic() > deadline):
                return m
            await asyncio.sleep(0.005)

    async def astop(self, node: str, *, timeout_s: float | None = None, nemesis: bool = True) -> Member:
        m = self.begin_stop(node, nemesis=nemesis)
        deadline = time.monotonic() + (timeout_s if timeout_s is not None else self.stop_timeout_s)
        while True:
            if self._finish_stop(m, force=time.monotonic() > deadline):
                return m
            await asyncio.sleep(0.02)

    async def arestart(
        self, node: str, *, mode: str = "stop", down_s: float = 0.0, timeout_s: float | None = None
    ) -> Member:
        m = self.member(node)
        self.refresh(m)
        if m.state in ("starting", "running", "paused"):
            if mode == "kill":
                await self.akill(node)
            else:
                await self.astop(node)
        if down_s > 0:
            await asyncio.sleep(down_s)
        return await self.astart(node, timeout_s=timeout_s, nemesis=True)

    async def await_exit(self, node: str, timeout_s: float) -> int | None:
        m = self.member(node)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self.refresh(m)
            if m.state not in ("starting", "running", "paused", "stopping"):
                return m.returncode
            await asyncio.sleep(0.02)
        return None

    # ----------------------------------------------------------------------------------------
    # Cleanup

    def close(self, timeout_s: float | None = None) -> None:
        """Stop every process: SIGTERM (+SIGCONT) to all at once, SIGKILL what is left after the timeout."""
        if self._closed:
            return
        self._closed = True
        timeout = self.stop_timeout_s if timeout_s is None else timeout_s
        pending = []
        for m in self:
            if m.proc is not None and m.proc.poll() is None:
                self._signal(m, signal.SIGTERM)
                self._signal(m, signal.SIGCONT)
                pending.append(m)
            elif m.proc is not None and m.state in ("starting", "running", "paused", "stopping"):
                self._reaped(m, m.proc.returncode)
        deadline = time.monotonic() + timeout
        while pending:
            pending = [m for m in pending if m.proc is not None and m.proc.poll() is None]
            if not pending or time.monotonic() > deadline:
                break
            time.sleep(0.02)
        for m in self:
            if m.proc is None:
                continue
            if m.proc.poll() is None:
                self._signal(m, signal.SIGKILL)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    m.proc.wait(timeout=5)
                self._emit("process_stop_forced", target=m.node, target_role=m.role)
            if m.state in ("starting", "running", "paused", "stopping"):
                m.state = "stopped"
                m.returncode = m.proc.returncode
                self._emit("process_exited", target=m.node, target_role=m.role, returncode=m.returncode)
        _live.discard(self)

    def __enter__(self) -> Supervisor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ----------------------------------------------------------------------------------------
    # Events

    def _emit(self, event: str, **fields: Any) -> None:
        if self.log is not None:
            self.log.emit(event, **fields)

    def _nemesis(self, action: str, m: Member, **extra: Any) -> None:
        self._emit("nemesis", **nemesis_fields(action, m), **extra)

    def manifest(self) -> dict[str, dict[str, Any]]:
        return {m.node: m.info() for m in self}
