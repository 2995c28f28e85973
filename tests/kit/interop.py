"""Processes for the interop tests: a broker with a native port, real-client drivers and our own
consumer and producer, with their event files, and functions that read those events."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
REAL_PYTHON = ROOT / ".venv-real" / "bin" / "python"
JS_DIR = ROOT / "interop" / "js"
V5_PYTHON = ROOT / ".venv-v5" / "bin" / "python"
JS5_DIR = ROOT / "interop" / "js5"
NODE = "node"


def cpp_client_missing() -> str | None:
    if not REAL_PYTHON.exists():
        return "no .venv-real (run scripts/setup_real_clients.sh to install the C++ client)"
    if subprocess.run([str(REAL_PYTHON), "-c", "import rocketmq.client"], capture_output=True).returncode:
        return ".venv-real cannot load the C++ client (rerun scripts/setup_real_clients.sh)"
    return None


def js_client_missing() -> str | None:
    if not (JS_DIR / "node_modules" / "ali-ons").is_dir():
        return "no interop/js/node_modules (run scripts/setup_real_clients.sh to install ali-ons)"
    if subprocess.run([NODE, "--version"], capture_output=True).returncode:
        return "node is not installed"
    return None


def v5_clients_missing() -> str | None:
    """Why Apache's v5 clients (Python and Node.js) cannot run here, or None."""
    try:
        import rmqlab.proxy.v5  # noqa: F401  (rmq-proxy itself needs the [v5] extra)
    except ImportError as exc:
        return str(exc)
    if not V5_PYTHON.exists():
        return "no .venv-v5 (run scripts/setup_real_clients.sh to install rocketmq-python-client)"
    if not (JS5_DIR / "node_modules" / "rocketmq-client-nodejs").is_dir():
        return "no interop/js5/node_modules (scripts/setup_real_clients.sh installs rocketmq-client-nodejs)"
    if subprocess.run([NODE, "--version"], capture_output=True).returncode:
        return "node is not installed"
    return None


class Proc:
    """A child process in its own process group, with its READY line and its event file."""

    def __init__(self, name: str, argv: list[str], events: Path, out_dir: Path) -> None:
        self.name = name
        self.events = events
        self.out_path = out_dir / f"{name}.out"
        self._out = open(self.out_path, "w")  # noqa: SIM115 (closed in stop)
        self.popen = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=self._out, cwd=ROOT, start_new_session=True, text=True
        )
        self.ready = ""

    def wait_ready(self, timeout: float = 20.0) -> str:
        deadline = time.monotonic() + timeout
        assert self.popen.stdout is not None
        while time.monotonic() < deadline:
            line = self.popen.stdout.readline()
            if line.startswith("READY"):
                self.ready = line.strip().removeprefix("READY").strip()
                return self.ready
            if not line and self.popen.poll() is not None:
                break
        raise AssertionError(f"{self.name} not ready: {self.out_path.read_text()[-2000:]}")

    def signal(self, sig: int) -> None:
        if self.popen.poll() is None:
            os.killpg(self.popen.pid, sig)

    def stop(self, timeout: float = 10.0) -> int | None:
        self.signal(signal.SIGTERM)
        try:
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            self.signal(signal.SIGKILL)
            return self.popen.wait(5)
        finally:
            self._out.close()

    def kill(self) -> None:
        self.signal(signal.SIGKILL)
        self.popen.wait(5)
        self._out.close()


class Lab:
    """One broker with a native port, and the clients of a test."""

    def __init__(self, run_dir: Path) -> None:
        self.dir = run_dir
        self.procs: list[Proc] = []
        self.addr = ""
        self.native = ""
        self.proxy = ""

    def start(self, name: str, argv: list[str]) -> Proc:
        events = self.dir / f"{name}.jsonl"
        proc = Proc(name, argv, events, self.dir)
        self.procs.append(proc)
        return proc

    def start_broker(self, topics: list[str], queue_nums: int = 4, *extra: str) -> None:
        argv = [sys.executable, "-m", "rmqlab.broker", "--port", "0", "--remoting-port", "0"]
        argv += ["--default-queue-nums", str(queue_nums), "--node", "broker-a"]
        argv += ["--log-file", str(self.dir / "broker-a.jsonl"), *extra]
        for t in topics:
            argv += ["--create-topic", t]
        proc = self.start("broker-a", argv)
        ready = proc.wait_ready()
        self.addr, _, native = ready.partition(" native=")
        self.native = native

    def cpp_consumer(self, name: str, group: str, topic: str, *extra: str) -> Proc:
        return self.start(name, self.cpp_consumer_argv(name, group, topic, *extra))

    def cpp_consumer_argv(self, name: str, group: str, topic: str, *extra: str) -> list[str]:
        """The C++ driver's command line, its client's own log in ``<name>.client-log`` of the run."""
        argv = [str(REAL_PYTHON), "interop/cpp_consumer.py", "--namesrv", self.native, "--group", group]
        argv += ["--topic", topic, "--node", name, "--log-file", str(self.dir / f"{name}.jsonl")]
        return [*argv, "--client-log-dir", str(self.dir / f"{name}.client-log"), *extra]

    def js_consumer(self, name: str, group: str, topic: str, *extra: str) -> Proc:
        argv = [NODE, "interop/js/consumer.js", "--namesrv", self.native, "--group", group, "--topic", topic]
        argv += ["--node", name, "--log-file", str(self.dir / f"{name}.jsonl"), *extra]
        return self.start(name, argv)

    def py_consumer(self, name: str, group: str, topic: str, *extra: str) -> Proc:
        argv = [sys.executable, "-m", "rmqlab.client.consumer_main", "--namesrv", self.addr, "--group", group]
        argv += ["--topic", topic, "--node", name, "--log-file", str(self.dir / f"{name}.jsonl"), *extra]
        return self.start(name, argv)

    def py_producer(self, name: str, topic: str, count: int) -> Proc:
        argv = [sys.executable, "-m", "rmqlab.client.producer_main", "--namesrv", self.addr, "--topic", topic]
        argv += ["--rate", "1000", "--count", str(count), "--node", name]
        argv += ["--log-file", str(self.dir / f"{name}.jsonl")]
        return self.start(name, argv)

    def cpp_producer(self, name: str, topic: str, count: int, prefix: str, *extra: str) -> Proc:
        argv = [str(REAL_PYTHON), "interop/cpp_producer.py", "--namesrv", self.native, "--topic", topic]
        argv += ["--count", str(count), "--prefix", prefix, "--node", name, *extra]
        argv += ["--log-file", str(self.dir / f"{name}.jsonl")]
        return self.start(name, argv)

    def start_proxy(self, *extra: str) -> str:
        """rmq-proxy over this lab's broker (its embedded name server); returns the gRPC address."""
        argv = [
            sys.executable,
            "-m",
            "rmqlab.proxy",
            "--namesrv",
            self.addr,
            "--port",
            "0",
            "--node",
            "proxy",
        ]
        argv += ["--log-file", str(self.dir / "proxy.jsonl"), *extra]
        self.proxy = self.start("proxy", argv).wait_ready()
        return self.proxy

    def v5_consumer(self, client: str, name: str, group: str, topic: str, *extra: str) -> Proc:
        """Apache's v5 Python (``py5``) or Node.js (``js5``) consumer through the proxy."""
        program = (
            [str(V5_PYTHON), "interop/py5_client.py"] if client == "py5" else [NODE, "interop/js5/client.js"]
        )
        argv = [*program, "consumer", "--endpoints", self.proxy, "--group", group, "--topic", topic]
        argv += ["--node", name, "--log-file", str(self.dir / f"{name}.jsonl"), *extra]
        return self.start(name, argv)

    def v5_producer(self, client: str, name: str, topic: str, count: int, prefix: str) -> Proc:
        program = (
            [str(V5_PYTHON), "interop/py5_client.py"] if client == "py5" else [NODE, "interop/js5/client.js"]
        )
        argv = [*program, "producer", "--endpoints", self.proxy, "--topic", topic, "--count", str(count)]
        argv += ["--prefix", prefix]
        return self.start(name, argv)

    def close(self) -> None:
        for proc in reversed(self.procs):
            if proc.popen.poll() is None:
                proc.stop()

    # -- events ----------------------------------------------------------------------------------
    def events(self, name: str | None = None, event: str | None = None) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        files = [self.dir / f"{name}.jsonl"] if name else sorted(self.dir.glob("*.jsonl"))
        for f in files:
            if not f.exists():
                continue
            for line in f.read_text().splitlines():
                try:
                    obj = json.loads(line)
                except ValueError:
                    continue
                if event is None or obj.get("event") == event:
                    out.append(obj)
        out.sort(key=lambda e: e.get("ts_ms", 0))
        return out


def wait_for(what: str, check: Callable[[], Any], timeout: float, lab: Lab | None = None) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            detail = ""
            if lab is not None:
                detail = "\n".join(f"{p.name}: {p.out_path.read_text()[-600:]}" for p in lab.procs)
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}\n{detail}")
        time.sleep(0.2)


def ownership(lab: Lab, group: str, topic: str) -> dict[str, set[int]]:
    """Queues each live client holds now, from its mq_added / mq_removed events."""
    held: dict[str, set[int]] = {}
    for e in lab.events():
        if e.get("group") != group:
            continue
        kind = e["event"]
        if kind == "consumer_started":
            held.setdefault(e["client_id"], set())
        elif kind == "consumer_stopped":
            held.pop(e["client_id"], None)
        elif kind in ("mq_added", "mq_removed") and e.get("topic") == topic:
            qs = held.setdefault(e["client_id"], set())
            if kind == "mq_added":
                qs.add(e["queue_id"])
            else:
                qs.discard(e["queue_id"])
    return held


def consumed_positions(lab: Lab, group: str, topic: str) -> dict[tuple[int, int], set[str]]:
    """(queue id, queue offset) of every consumed message -> the clients that consumed it."""
    out: dict[tuple[int, int], set[str]] = {}
    for e in lab.events(event="message_consumed"):
        if e.get("group") == group and e.get("topic") == topic:
            out.setdefault((e["queue_id"], e["queue_offset"]), set()).add(e["client_id"])
    return out


def max_offsets(lab: Lab, topic: str) -> dict[int, int]:
    """Per queue, one past the highest offset any producer's acknowledged send got."""
    out: dict[int, int] = {}
    for e in lab.events(event="message_sent"):
        if e.get("topic") == topic:
            out[e["queue_id"]] = max(out.get(e["queue_id"], 0), e["queue_offset"] + 1)
    return out


def averagely(clients: list[str], queues: int) -> dict[str, set[int]]:
    """AllocateMessageQueueAveragely of one broker's queues (by id) over the sorted client ids, written
    out independently of the lab's own strategy: what a settled group of real clients must hold."""
    cids = sorted(clients)
    n = len(cids)
    out = {}
    for i, cid in enumerate(cids):
        mod = queues % n
        size = queues // n + (1 if i < mod else 0) if queues > n else 1 if i < queues else 0
        start = i * size if mod and i < mod else i * size + mod
        out[cid] = {start + k for k in range(min(size, queues - start))} if size else set()
    return out
