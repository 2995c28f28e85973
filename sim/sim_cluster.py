"""A whole experiment in one process: the real name server, brokers, consumers and producers as virtual
processes on the virtual loop and the in-memory network, driven by the lab's one Runner.

``SimBackend`` is the simulator's implementation of the lab's Backend (``lab.backend``): it keeps the
nodes' lifecycle (spawn, SIGTERM, SIGKILL, SIGSTOP as virtual processes), the network's faults (rules on
the in-memory links) and the GC pauses (the pause and resume steps ``[sim]`` adds to the schedule).
``SimCluster`` runs an experiment on it: the Runner on the virtual loop, then the run directory.

The run directory is the one ``rmq-chaos`` writes (``NODE.jsonl`` per process, ``NODE.2.jsonl`` after a
restart, ``chaos.jsonl``, ``experiment.toml``, ``manifest.json`` with ``"mode": "sim"`` and the seed), so
``rmq-analyze`` reads it unchanged. Every random choice comes from a generator seeded by the experiment's
seed and the node's name, so one seed gives the same bytes in every file.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import random
import re
import sys
import time
from collections.abc import Callable, Coroutine, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from rmqlab.broker.controller import BrokerController
from rmqlab.broker.namesrv import NamesrvController
from rmqlab.broker.server_config import BrokerConfig, NamesrvConfig
from rmqlab.broker.topic_config import PERM_READ_WRITE, TopicConfig
from rmqlab.cli import Progress
from rmqlab.client.client_config import ConsumerConfig, ProducerConfig
from rmqlab.client.consumer_base import normalize_enums
from rmqlab.client.consumer_main import ListenerGate
from rmqlab.client.errors import MQClientError
from rmqlab.client.instance import MQClientManager
from rmqlab.client.producer import DEFAULT_PRODUCER_GROUP, Producer
from rmqlab.client.producer_main import make_body
from rmqlab.client.push_consumer import PushConsumer
from rmqlab.lab.admin_client import AdminClient, route_brokers
from rmqlab.lab.backend import NodeError, NodeFailed, nemesis_fields
from rmqlab.lab.experiment import Experiment, slave_of
from rmqlab.lab.runner import Console, Runner, RunResult, versions
from rmqlab.lab.schedule import Step
from rmqlab.lab.tally import RunTally, progress_line
from rmqlab.protocol.event_log import EventLog
from rmqlab.protocol.model import Message, MessageModel
from rmqlab.protocol.route import PERM_READ, PERM_WRITE
from rmqlab.sim.dist import Distribution
from rmqlab.sim.loop import CURRENT, SimDeadlock, VirtualClock, VirtualLoop, VirtualProcess
from rmqlab.sim.network import Network
from rmqlab.sim.sim_table import SimExperiment

NAMESRV_PORT = 9876
BROKER_PORT = 10911
# The paced collector (GarbageCollector): a full collection once this share of the objects alive
# after the last one have been added since, and never for fewer than _GC_MIN_GROWTH new objects
_GC_GROWTH = 1.0
_GC_MIN_GROWTH = 1_000_000
# the events the live tally counts, found with one scan of the line
_COUNTED = re.compile('"(?:message_sent|message_consumed|consumer_started|consumer_stopped|nemesis)"')
_COUNTED_PLAIN = frozenset(("message_sent", "message_consumed", "consumer_started", "consumer_stopped"))


class GarbageCollector:
    """Cyclic garbage collection paced by the growth of the heap instead of by allocations.

    CPython collects the young generation every so many net allocations and promotes what survives;
    a simulation keeps allocating state that lives for the whole run (each restart's client, its
    queues, messages, held requests), so nearly every young collection traverses objects that are not
    garbage, and at 1,000 consumers that was a sixth of the CPU time. With automatic collection off,
    the net count of new tracked objects (what CPython's own generation-0 counter holds) grows by what
    stays alive plus the cyclic garbage; a full collection once it reaches the number of objects alive
    after the previous one (the heap has doubled, counting its garbage) keeps the garbage at most the
    size of the live heap and the collections to a logarithm of its growth. (With CPython's quarter, its
    own rule for full collections, a 1,000-consumer run made ten full collections, 12.4 CPU s.) Cyclic
    garbage is rare here: a 100-consumer run of 600 s left 53,022 such objects in all. Nothing in a run
    depends on when the collector runs: a killed process's objects stay referenced (the cluster's
    graveyard) until the run ends.
    """

    def __init__(self, growth: float = _GC_GROWTH, min_growth: int = _GC_MIN_GROWTH) -> None:
        self.growth = growth
        self.min_growth = min_growth
        self.collections = 0
        self._alive = 0
        self._next = min_growth
        self._was_enabled = False

    def start(self) -> None:
        self._was_enabled = gc.isenabled()
        # no collection here: a sweep starts run after run in one process (and collects after each)
        self._alive = len(gc.get_objects())
        self._next = max(self.min_growth, int(self._alive * self.growth))
        gc.disable()

    def check(self) -> None:
        grown = gc.get_count()[0]
        if grown >= self._next:
            self._alive += grown - gc.collect()
            self.collections += 1
            self._next = max(self.min_growth, int(self._alive * self.growth))

    def stop(self) -> None:
        if self._was_enabled:
            gc.enable()


class LogFiles:
    """Appends for many files through few open handles: lines wait in memory up to ``limit`` bytes."""

    def __init__(self, limit: int = 8 << 20) -> None:
        self.limit = limit
        self._buf: dict[Path, list[str]] = {}
        self._size = 0
        self.lines = 0

    def append(self, path: Path, line: str) -> None:
        self._buf.setdefault(path, []).append(line + "\n")
        self._size += len(line) + 1
        self.lines += 1
        if self._size >= self.limit:
            self.flush()

    def flush(self) -> None:
        for path, lines in self._buf.items():
            with open(path, "a", encoding="utf-8") as fh:
                fh.write("".join(lines))
        self._buf.clear()
        self._size = 0


class _Sink:
    """An EventLog's line sink in the simulation: the run's files, plus the live tally."""

    def __init__(
        self,
        files: LogFiles,
        path: Path,
        tally: Callable[[str], None],
        count: Callable[[dict[str, Any]], None],
    ) -> None:
        self._files = files
        self._path = path
        self._tally = tally
        self._count = count
        path.touch()

    def put(self, line: str) -> None:
        self._files.append(self._path, line)
        if _COUNTED.search(line) is not None:
            self._tally(line)

    def put_record(self, line: str, record: dict[str, Any]) -> None:
        # the tally reads these plain fields (strings and ints) as the line has them, so the record
        # itself is counted instead of the line parsed back; a nemesis record, whose fields the tally
        # keeps and shows, still goes through its line
        self._files.append(self._path, line)
        if record["event"] in _COUNTED_PLAIN:
            self._count(record)
        elif _COUNTED.search(line) is not None:
            self._tally(line)

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass


@dataclass
class SimNode:
    """One named process of the cluster across its incarnations (chaos.supervisor.Member's counterpart)."""

    node: str
    role: str
    group: str | None = None
    topic: str | None = None
    spec: Any = None
    state: str = "new"  # new | running | paused | stopping | stopped | exited
    incarnation: int = 0
    proc: VirtualProcess | None = None
    main: asyncio.Task[Any] | None = None
    log: EventLog | None = None
    address: str | None = None
    client_ids: list[str] = field(default_factory=list)
    log_files: list[str] = field(default_factory=list)
    returncode: int | None = None
    server: Any = None  # the live NamesrvController / BrokerController
    gate: ListenerGate | None = None  # a consumer's listener gate (the hang nemesis), per incarnation
    out_file: str = ""  # a virtual process has no output file of its own
    hung: bool = False

    def info(self) -> dict[str, Any]:
        return {
            "role": self.role,
            "group": self.group,
            "client": "python" if self.role == "consumer" else None,
            "state": self.state,
            "incarnations": self.incarnation,
            "client_ids": list(self.client_ids),
            "log_files": list(self.log_files),
            "address": self.address,
            "returncode": self.returncode,
        }


# The host's address in client ids when consumers run with host networking ([sim] host_network).
HOST_NETWORK_IP = "192.168.0.10"


class SimError(NodeError):
    """The simulated cluster could not do what the experiment asks of a node (its state does not allow
    it, or it is not one the action can act on)."""


@dataclass
class SimResult(RunResult):
    """What a simulated run produced: the Runner's result, the simulated and wall seconds it took and
    the events it wrote."""

    sim_seconds: float = 0.0
    wall_seconds: float = 0.0
    events: int = 0


def consumer_flags(spec: Any) -> dict[str, Any]:
    """What rmq-chaos's ``--rocketmq5`` or ``--set client_version=V``, and ``--set client_rebalance=false``
    (ConsumerSpec.client_args) set in the consumer's config: a release's behaviour switches, and with a
    server assignment the broker's QUERY_ASSIGNMENT instead of the client's own allocation (then POP or
    PULL per the mode)."""
    flags: dict[str, Any] = {}
    if spec.client_version:  # its switches stand for --rocketmq5's (ConsumerConfig.from_mapping expands it)
        flags["client_version"] = spec.client_version
    elif spec.rocketmq5 or spec.assignment != "client":
        flags.update(ConsumerConfig.rocketmq5())
    if spec.assignment != "client":
        flags["client_rebalance"] = False
    flags.update(dict(spec.settings))  # as rmq-consumer --set
    return flags


class SimBackend:
    """The lab's Backend as virtual processes on the virtual loop and the in-memory network."""

    kind = "sim"

    def __init__(self, sx: SimExperiment, run_dir: Path, seed: int, tally: RunTally) -> None:
        self.sx = sx
        self.exp = sx.exp
        self.seed = seed
        self.run_dir = run_dir
        self.tally = tally  # fed by the event logs' sinks as lines are written
        self.loop = VirtualLoop()
        self.net = Network(self.loop, self.seed, sx.sim.latency_ms, sx.sim.wire)
        self.clock = VirtualClock(self.loop)
        self.files = LogFiles()
        self.nodes: dict[str, SimNode] = {}
        self._pids = 0
        self._faulty: dict[str, set[str]] = {}  # network nemesis target -> the nodes at the links' other end
        self.namesrv_addr = ""
        self.brokers: dict[str, str] = {}  # the masters
        self.slaves: dict[str, str] = {}  # slave node (<broker>-s<id>) -> address
        self._client_ids: list[str] = []
        # Killed processes stay referenced until the run ends: collecting their tasks would close the
        # coroutines and run their finally blocks, which a SIGKILLed process never does.
        self._graveyard: list[VirtualProcess] = []
        self.chaos = self._new_process("chaos")
        # rmq-chaos talks to the brokers from their own host, and brokers take admin requests from
        # loopback only
        self.net.assign_ip("chaos", "127.0.0.1")
        self.log = self._event_log("chaos", "chaos", "chaos.jsonl")
        self.admin: AdminClient | None = None

    # -- plumbing ------------------------------------------------------------------------------------
    def _new_process(self, node: str, incarnation: int = 1) -> VirtualProcess:
        self._pids += 1
        proc = VirtualProcess(node, incarnation)
        proc.pid = 100 + self._pids
        return proc

    def _event_log(self, node: str, role: str, file: str) -> EventLog:
        return EventLog(
            node,
            role,
            None,
            clock=self.clock,
            console=False,
            sink=_Sink(self.files, self.run_dir / file, self._count, self._count_record),
        )

    def _count(self, line: str) -> None:
        with contextlib.suppress(ValueError):
            ev = json.loads(line)
            if isinstance(ev, dict):
                self.tally.feed([ev])

    def _count_record(self, record: dict[str, Any]) -> None:
        self.tally.feed([record])

    def rng(self, *parts: object) -> random.Random:
        return random.Random(":".join(str(p) for p in (self.seed, *parts)))

    def cleanup(self) -> None:
        for cid in self._client_ids:  # the process-wide table of client instances outlives no run
            MQClientManager.remove(cid)
        left = asyncio.all_tasks(self.loop)
        for task in left:
            task._log_destroy_pending = False  # type: ignore[attr-defined]
        self.loop.close()
        # The killed processes' coroutines end here, with the loop closed and their logs shut: whatever
        # their finally blocks try fails at its first await, writes nothing, and is not reported.
        for task in sorted(left, key=lambda t: t.get_name()):
            with contextlib.suppress(BaseException):
                task.get_coro().close()  # type: ignore[union-attr]
        self._graveyard.clear()

    def _declare(self) -> None:
        exp = self.exp
        self.nodes["namesrv"] = SimNode("namesrv", "namesrv")
        for b in exp.brokers:
            self.nodes[b] = SimNode(b, "broker")
        for s in exp.slave_nodes():
            self.nodes[s] = SimNode(s, "broker")
        for c in exp.consumers:
            for node in c.nodes:
                self.nodes[node] = SimNode(node, "consumer", c.group, c.topic, c)
        if exp.workload:
            for node, topic in exp.workload.nodes:
                self.nodes[node] = SimNode(node, "producer", None, topic, exp.workload)

    def _hang(self, n: SimNode, action: str) -> None:
        """The listener stops returning (SIGUSR1 to rmq-consumer) or its blocked calls return (SIGUSR2).
        The consumer's own ListenerGate does it, in the consumer's process, as its signal handler would."""
        self._require(n, "running")
        if n.gate is None or n.proc is None:
            raise SimError(f"{n.node} is not one of the lab's own consumers: its listener cannot be hung")
        if action == "unhang" and not n.hung:
            raise SimError(f"{n.node}'s listener is not hung")
        self._nemesis(action, n)
        self.loop.call_soon(n.gate.hang if action == "hang" else n.gate.release, context=n.proc.context)
        n.hung = action == "hang"

    # -- the Backend seam ----------------------------------------------------------------------------
    async def prepare(self) -> list[str]:
        self.admin = AdminClient(timeout_s=max(2.0, 5.0 * self.exp.time_scale))
        return []

    def declare(self, exp: Experiment) -> None:
        self._declare()

    async def start_servers(self) -> None:
        """The name server, then each broker (which creates the experiment's topics as it starts), then
        until the name server routes every topic to every broker."""
        exp = self.exp
        await self._start(self.nodes["namesrv"])
        for b in exp.brokers:
            await self._start(self.nodes[b])
        # the slaves after their masters: each finds its master in the answer to its registration
        for s in exp.slave_nodes():
            await self._start(self.nodes[s])
        assert self.admin is not None
        for t in exp.topics:
            deadline = self.loop.time() + 30
            while True:
                route = await self.admin.route(self.namesrv_addr, t.name)
                if route_brokers(route) >= set(exp.brokers):
                    break
                if self.loop.time() > deadline:
                    raise SimError(f"the name server does not route {t.name} to every broker")
                await asyncio.sleep(0.1)

    async def set_message_request_mode(self, topic: str, group: str, mode: str) -> None:
        assert self.admin is not None
        for addr in self.brokers.values():
            await self.admin.set_message_request_mode(addr, topic, group, mode, -1)

    def member(self, node: str) -> SimNode:
        return self.nodes[node]

    def members(self) -> Iterator[SimNode]:
        yield from self.nodes.values()

    async def start(self, nodes: Sequence[str], *, nemesis: bool = False) -> None:
        if not nemesis:
            await self._start_all([self.nodes[node] for node in nodes])
            return
        for node in nodes:
            n = self.nodes[node]
            self._require(n, "new", "stopped", "exited")
            await self._start(n, nemesis=True)

    async def stop(self, node: str) -> None:
        n = self.nodes[node]
        self._require(n, "running", "paused")
        self._nemesis("stop", n)
        await self._stop(n)

    async def kill(self, node: str) -> None:
        n = self.nodes[node]
        self._require(n, "running", "paused", "stopping")
        self._nemesis("kill", n)
        self._kill(n)

    async def restart(self, node: str, *, mode: str, down_s: float) -> None:
        n = self.nodes[node]
        if self._alive(n):
            if mode == "kill":
                self._nemesis("kill", n)
                self._kill(n)
            else:
                self._nemesis("stop", n)
                await self._stop(n)
        if down_s > 0:
            await asyncio.sleep(down_s)
        await self._start(n, nemesis=True)

    async def pause(self, node: str, *, gc: bool = False) -> None:
        n = self.nodes[node]
        self._require(n, "running")
        self._nemesis("pause", n, **({"gc": True} if gc else {}))
        assert n.proc is not None
        n.proc.state = "paused"
        n.state = "paused"

    async def resume(self, node: str, *, gc: bool = False) -> None:
        n = self.nodes[node]
        self._require(n, "paused")
        self._nemesis("resume", n, **({"gc": True} if gc else {}))
        assert n.proc is not None
        self.loop.resume_process(n.proc)
        n.state = "running"

    async def hang(self, node: str) -> None:
        self._hang(self.nodes[node], "hang")

    async def unhang(self, node: str) -> None:
        self._hang(self.nodes[node], "unhang")

    def network_via(self, action: str, node: str, other: str) -> str:
        return "sim"

    async def apply_network(
        self,
        node: str,
        action: str,
        broker: str = "all",
        *,
        ms: float = 0,
        jitter_ms: float = 0,
        direction: str = "both",
        percent: float = 0,
    ) -> None:
        """Rules on the links between ``node`` and ``broker`` (every broker for "all"), both ways."""
        peers = [b for b in self._servers() if b != node] if broker == "all" else [broker]
        if action == "heal" and broker == "all":  # every link of the target's faults (the kernel's heal too)
            peers += sorted(self._faulty.get(node, set()) - set(peers))
        for b in peers:
            for src, dst in ((node, b), (b, node)):
                if action == "latency":
                    r = self.net.rule(src, dst)
                    r.latency_ms, r.jitter_ms = ms, jitter_ms
                elif action in ("blackhole", "loss") and direction in (
                    "both",
                    "out" if src == node else "in",
                ):
                    if action == "blackhole":
                        # a cut link holds the frames, as TCP retransmits them until the heal
                        self.net.rule(src, dst).blackhole = True
                    else:
                        self.net.rule(src, dst).loss = percent / 100.0
            if action in ("latency", "blackhole", "loss"):
                self._faulty.setdefault(node, set()).add(b)
            if action == "reset":
                self.net.reset(node, b)
            elif action == "heal":
                self.net.heal(node, b)
                self._faulty.get(node, set()).discard(b)

    def faulty_links(self) -> Iterator[str]:
        """Clients whose links to the servers have a rule in force, then the faults that does not see: a
        server's links (``peer``), one-way cuts into a client (those the heals before left)."""
        touched = sorted(
            {a for (a, b) in self.net.rules if a in self.nodes and self.nodes[a].role != "broker"}
        )
        for node in touched:
            if any(not r.idle for (a, _b), r in self.net.rules.items() if a == node):
                yield node
        for node in sorted(t for t, peers in self._faulty.items() if peers):
            yield node

    async def fault_add(self, broker: str, request: dict[str, Any]) -> int:
        assert self.admin is not None
        return await self.admin.fault_add(self._servers()[broker], **request)

    async def elect_master(self, broker: str, broker_id: int) -> None:
        assert self.admin is not None
        await self.admin.elect_master(self.namesrv_addr, broker, broker_id)

    async def fault_clear(self, broker: str) -> None:
        assert self.admin is not None
        await self.admin.fault_clear(self._servers()[broker])

    async def policy_set(
        self,
        broker: str,
        *,
        notify_on_channel_expired: bool | None = None,
        release_locks_on_close: bool | None = None,
    ) -> None:
        assert self.admin is not None
        await self.admin.policy_set(
            self._servers()[broker],
            notify_on_channel_expired=notify_on_channel_expired,
            release_locks_on_close=release_locks_on_close,
        )

    async def kill_clients(self) -> list[str]:
        killed = [
            n.node for n in self.nodes.values() if n.role in ("consumer", "producer") and self._alive(n)
        ]
        for node in killed:
            self._kill(self.nodes[node])
        return killed

    async def close(self) -> None:
        """The brokers, then the name server, stop gracefully; the lab's admin connections close."""
        try:
            for role in ("broker", "namesrv"):
                for n in list(self.nodes.values()):
                    if n.role == role and self._alive(n):
                        await self._stop(n)
        finally:
            if self.admin is not None:
                await self.admin.close()

    def manifest(self) -> dict[str, Any]:
        return {
            "namesrv": self.namesrv_addr,
            "brokers": dict(self.brokers),
            "slaves": dict(self.slaves),
            "nodes": {name: n.info() for name, n in self.nodes.items()},
        }

    def _servers(self) -> dict[str, str]:
        """Every broker node's address: the masters, then their slaves."""
        return {**self.brokers, **self.slaves}

    # -- processes -----------------------------------------------------------------------------------
    @staticmethod
    def _alive(n: SimNode) -> bool:
        return n.state in ("running", "paused", "stopping")

    @staticmethod
    def _require(n: SimNode, *states: str) -> None:
        if n.state not in states:
            raise SimError(f"{n.node} is {n.state}, not {' or '.join(states)}")

    def _nemesis(self, action: str, n: SimNode, **extra: Any) -> None:
        self.log.emit("nemesis", **nemesis_fields(action, n), **extra)

    async def _start(self, n: SimNode, *, nemesis: bool = False) -> None:
        await self._await_ready(n, self._spawn(n, nemesis=nemesis))

    async def _start_all(self, nodes: list[SimNode]) -> None:
        """Spawn the nodes together, then wait until each is ready, as rmq-chaos starts them."""
        spawned = [(n, self._spawn(n)) for n in nodes]
        for n, ready in spawned:
            await self._await_ready(n, ready)

    def _spawn(self, n: SimNode, *, nemesis: bool = False) -> asyncio.Future[str]:
        if self._alive(n):
            raise SimError(f"{n.node} is already {n.state}")
        n.incarnation += 1
        name = f"{n.node}.jsonl" if n.incarnation == 1 else f"{n.node}.{n.incarnation}.jsonl"
        n.log_files.append(name)
        if nemesis:
            self._nemesis("start", n)
        proc = self._new_process(n.node, n.incarnation)
        n.proc = proc
        n.log = self._event_log(n.node, n.role, name)
        n.state = "starting"
        n.returncode = None
        self.log.emit(
            "process_spawned", target=n.node, target_role=n.role, pid=proc.pid, incarnation=n.incarnation
        )
        ready: asyncio.Future[str] = self.loop.create_future()
        body = self._body(n, proc, ready)
        n.main = self.loop.create_task(self._process_main(n, proc, body, ready), context=proc.context)
        return ready

    async def _await_ready(self, n: SimNode, ready: asyncio.Future[str]) -> None:
        proc = n.proc
        assert proc is not None
        try:
            async with asyncio.timeout(max(30.0, 60 * self.exp.time_scale)):
                info = await ready
        except TimeoutError:
            self._kill(n)
            raise NodeFailed(f"{n.node} did not become ready") from None
        except Exception as exc:
            raise NodeFailed(f"{n.node} failed to start: {exc}") from exc
        if n.role == "consumer":
            n.client_ids.append(info)
            self._client_ids.append(info)
        elif n.role == "producer":
            self._client_ids.append(info)
        else:
            n.address = info
        if n.state == "starting":
            n.state = "running"
        self.log.emit("process_ready", target=n.node, target_role=n.role, pid=proc.pid, ready=info)

    async def _process_main(
        self, n: SimNode, proc: VirtualProcess, body: Coroutine[Any, Any, int], ready: asyncio.Future[str]
    ) -> None:
        rc = 1
        try:
            rc = await body
        except asyncio.CancelledError:
            rc = 0  # SIGTERM: the body's own finally did the graceful part
        except Exception as exc:
            assert n.log is not None
            n.log.error("process failed", error=repr(exc))
            if not ready.done():
                ready.set_exception(exc)
        # the process exits: the kernel closes what is left open
        if n.proc is proc and proc.alive:
            proc.state = "exited"
            self.net.process_died(proc)
            n.state = "exited" if n.state != "stopping" else "stopped"
            n.returncode = rc
            self.log.emit("process_exited", target=n.node, target_role=n.role, returncode=rc)

    def _kill(self, n: SimNode) -> None:
        """SIGKILL: the process's callbacks never run again and the kernel closes its sockets."""
        proc = n.proc
        if proc is None or not proc.alive:
            return
        proc.state = "killed"
        proc.held.clear()
        self._graveyard.append(proc)
        if n.log is not None:
            n.log.close()
        self.net.process_died(proc)
        for t in proc.tasks:
            t._log_destroy_pending = False  # type: ignore[attr-defined]
        n.state = "stopped"
        n.returncode = -9
        if n.client_ids and n.role == "consumer":
            MQClientManager.remove(n.client_ids[-1])
        self.log.emit("process_exited", target=n.node, target_role=n.role, returncode=-9)

    async def _stop(self, n: SimNode) -> None:
        """SIGTERM (and SIGCONT): the graceful shutdown runs; SIGKILL after the supervisor's 10 s."""
        proc, main = n.proc, n.main
        if proc is None or main is None or not proc.alive:
            return
        if proc.state == "paused":
            self.loop.resume_process(proc)
        n.state = "stopping"
        main.get_loop().call_soon(main.cancel, context=proc.context)
        try:
            async with asyncio.timeout(10.0):
                await asyncio.shield(main)
        except TimeoutError:
            self.log.emit("process_stop_forced", target=n.node, target_role=n.role)
            self._kill(n)
        except asyncio.CancelledError:
            if CURRENT.get() is not self.chaos:
                raise

    # -- what each role's process runs ---------------------------------------------------------------
    def _body(self, n: SimNode, proc: VirtualProcess, ready: asyncio.Future[str]) -> Coroutine[Any, Any, int]:
        if n.role == "namesrv":
            return self._namesrv(n, ready)
        if n.role == "broker":
            return self._broker(n, ready)
        if n.role == "consumer":
            return self._consumer(n, proc, ready)
        return self._producer(n, proc, ready)

    async def _namesrv(self, n: SimNode, ready: asyncio.Future[str]) -> int:
        cfg = NamesrvConfig(
            host=self.net.ip_of(n.node),
            port=NAMESRV_PORT,
            time_scale=self.exp.time_scale,
            enable_controller_in_namesrv=self.exp.controller,
        )
        ctl = NamesrvController(cfg, log=n.log, clock=self.clock)
        await ctl.start()
        self.namesrv_addr = ctl.address
        n.server = ctl
        ready.set_result(ctl.address)
        try:
            await asyncio.Event().wait()
        finally:
            await ctl.shutdown()
        return 0

    async def _broker(self, n: SimNode, ready: asyncio.Future[str]) -> int:
        exp = self.exp
        slave = n.node in exp.slave_nodes()
        master, broker_id = slave_of(n.node) if slave else (n.node, 0)
        ha: dict[str, Any] = {}
        if exp.slave_count(master):  # the settings rmq-chaos gives as flags (broker_flags, slave_flags)
            ha = {
                "broker_id": broker_id,
                # in controller mode the controller decides; the role is the one taken as master
                "broker_role": "SLAVE" if slave and not exp.controller else exp.broker_role,
                "controller_mode": exp.controller,
                "slave_read_enable": exp.slave_read_enable,
                "ha_replication_lag_ms": round(exp.replication_lag_ms) if slave else 0,
            }
        cfg = BrokerConfig(
            broker_name=master,
            **ha,
            host=self.net.ip_of(n.node),
            port=BROKER_PORT,
            time_scale=exp.time_scale,
            namesrv=self.namesrv_addr,
            notify_on_channel_expired=exp.policies.notify_on_channel_expired,
            release_locks_on_close=exp.policies.release_locks_on_close,
            init_pop_offset_by_check_msg_in_mem=exp.policies.init_pop_offset_by_check_msg_in_mem,
            broker_permission=PERM_READ if master in exp.read_only_brokers else PERM_READ | PERM_WRITE,
            rocketmq5=self.sx.sim.rocketmq5 or exp.rocketmq5,
            random_seed=self.rng(n.node, n.incarnation, "broker").getrandbits(63),
        )
        broker = BrokerController(cfg, log=n.log, clock=self.clock)
        broker.pull_events = self.sx.sim.pull_events
        await broker.start()
        n.server = broker
        try:
            # a master creates the topics (as rmq-chaos's admin does); a slave copies them in its sync
            for t in exp.topics if not slave else ():
                per = exp.topic_queues_per_broker(t.name)
                tc = TopicConfig(t.name, per, per, PERM_READ_WRITE)
                if broker.topic_manager.put(tc):
                    broker.topic_created(tc)
            (self.slaves if slave else self.brokers)[n.node] = broker.address
            ready.set_result(broker.address)
            await asyncio.Event().wait()
        finally:
            await broker.shutdown()
        return 0

    def _client_settings(self, n: SimNode, proc: VirtualProcess, pid: int | None = None) -> dict[str, Any]:
        return {
            "namesrv_addr": self.namesrv_addr,
            "time_scale": self.exp.time_scale,
            "client_ip": self.net.ip_of(n.node),
            # RocketMQ's pid#nanos, from the virtual process and clock; System.nanoTime's origin is
            # the JVM's own, so containers started at one instant (each pid 1) still differ
            "instance_name": f"{pid}#{self._nano_time(n)}"
            if pid is not None
            else f"{proc.pid}#{int(self.loop.time() * 1e9)}",
            "random_seed": self.rng(n.node, n.incarnation, "client").getrandbits(63),
        }

    def _nano_time(self, n: SimNode) -> int:
        """A container's System.nanoTime: the virtual clock from an origin of its own."""
        return int(self.loop.time() * 1e9) + self.rng(n.node, n.incarnation, "nano-origin").getrandbits(40)

    async def _consumer(self, n: SimNode, proc: VirtualProcess, ready: asyncio.Future[str]) -> int:
        spec = n.spec
        sim = self.sx.sim
        # a container's process is its pid 1; with host networking the client ip is the host's
        settings = self._client_settings(n, proc, 1 if sim.host_network else None)
        if sim.host_network:
            settings["client_ip"] = HOST_NETWORK_IP
        settings.update(
            message_model=MessageModel.BROADCASTING if spec.broadcast else MessageModel.CLUSTERING,
            consume_from_where=spec.consume_from,
            local_offset_store_dir=str(self.run_dir / "offsets" / n.node),
            rebalance_event_digest_over=sim.digest_over,
            # RocketMQ's default, half an hour before start, on the virtual clock (local time, as parsed)
            consume_timestamp=time.strftime(
                "%Y%m%d%H%M%S", time.localtime(self.clock.now_ms() / 1000 - 30 * 60)
            ),
            omit_repeated_rebalance_events=sim.omit_repeated_rebalances,
            **consumer_flags(spec),
            **sim.consumer_settings(),
        )
        config = ConsumerConfig.from_mapping(normalize_enums(settings))
        if not config.instance_name_with_nano_time:  # changeInstanceNameToPID before 4.9.0: the pid alone
            config = config.replace(instance_name=str(settings["instance_name"]).partition("#")[0])
        # this virtual process's client table: another one may carry the same client id
        MQClientManager.own_process()
        consumer = PushConsumer(
            spec.group, config=config, strategy=spec.strategy, log=n.log, clock=self.clock
        )
        consumer.subscribe(spec.topic, "*")
        consume = sim.consume_ms or Distribution("constant", (float(spec.consume_ms),))
        rng = self.rng(n.node, n.incarnation, "consume")
        gate = n.gate = ListenerGate(n.log, spec.group)  # a new incarnation's listener is not hung
        n.hung = False

        async def listener(msgs: list[Message]) -> None:
            await gate.open.wait()  # returns at once while open: no extra step in the loop
            ms = sum(consume.sample(rng) for _ in msgs)
            if ms > 0:
                await asyncio.sleep(ms / 1000.0)

        if spec.orderly:
            consumer.register_message_listener_orderly(listener)
        else:
            consumer.register_message_listener(listener)
        await consumer.start()
        ready.set_result(consumer.client_id)
        try:
            await asyncio.Event().wait()
        finally:
            await consumer.shutdown()
        return 0

    async def _producer(self, n: SimNode, proc: VirtualProcess, ready: asyncio.Future[str]) -> int:
        w = self.exp.workload
        assert w is not None and n.topic is not None and n.log is not None
        config = ProducerConfig.from_mapping(self._client_settings(n, proc))
        producer = Producer(DEFAULT_PRODUCER_GROUP, config=config, log=n.log, clock=self.clock)
        await producer.start()
        ready.set_result(producer.client_id)
        acked = failed = 0
        slots = asyncio.Semaphore(32)
        t0 = self.loop.time()
        log, topic = n.log, n.topic

        async def send_one(i: int) -> None:
            nonlocal acked, failed
            try:
                await producer.send(topic, make_body(i, w.size, n.node), keys=f"{n.node}-{i}")
                acked += 1
            except MQClientError as exc:
                failed += 1
                log.emit("send_abandoned", topic=topic, index=i, error=str(exc))
            finally:
                slots.release()

        try:
            async with asyncio.TaskGroup() as tg:
                for i in range(w.count):
                    delay = t0 + i / w.rate - self.loop.time()
                    if delay > 0:
                        await asyncio.sleep(delay)
                    await slots.acquire()
                    tg.create_task(send_one(i))
        finally:
            await producer.shutdown()
        return 1 if failed else 0

    # -- the end -------------------------------------------------------------------------------------


class SimConsole(Console):
    """What rmq-sim says as it goes: simulated and wall seconds side by side; the step and progress lines
    only with ``progress``, the others always."""

    def __init__(self, out: TextIO, *, progress: bool) -> None:
        self.lines = Progress(out)
        self.show_steps = progress
        self.wall0 = time.monotonic()

    @property
    def shows_progress(self) -> bool:
        return self.show_steps

    def opening(self, exp: Experiment, run_dir: Path) -> None:
        self.say(f"simulate {exp.name} (seed {exp.seed}): {exp.question or '(no question given)'}")
        self.say(f"run directory: {run_dir}")

    def stamp(self, exp: Experiment, elapsed_s: float) -> str:
        return f"[sim {elapsed_s:7.1f}s | wall {time.monotonic() - self.wall0:6.1f}s]"

    def step(self, stamp: str, step: Step) -> None:
        if self.show_steps:
            self.say(f"{stamp} {step.describe()}")

    def starting_consumers(self, nodes: list[str], kinds: list[str]) -> None:
        self.say(f"starting {len(nodes)} consumer(s)")

    def running(self, exp: Experiment, actions: int) -> None:
        self.say(
            f"simulating {exp.duration:g}s of lab time ({exp.wall(exp.duration):g}s at time scale "
            f"{exp.time_scale:g}), {actions} nemesis action(s)"
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
        if self.show_steps:
            line = progress_line(elapsed_s, exp.wall(exp.duration), tally, consumers, phase)
            self.say(f"{line} | wall {time.monotonic() - self.wall0:.1f}s")

    def not_drained(self, tally: RunTally, timeout_s: float, busy: list[str]) -> None:
        parts = [f"{g}: {k} missing" for g, k in sorted(tally.missing().items())]
        self.say(f"not drained: {'; '.join(parts) or 'nothing consumed'}")


class SimCluster:
    """One experiment simulated: the lab's Runner on a SimBackend, on the virtual loop, and the run
    directory it leaves (``run`` returns when the virtual cluster is down and the files are written)."""

    def __init__(
        self,
        sx: SimExperiment,
        run_dir: str | Path,
        *,
        seed: int | None = None,
        out: TextIO | None = None,
        progress: bool = True,
        manifest_extra: dict[str, Any] | None = None,
    ) -> None:
        self.seed = sx.exp.seed if seed is None else seed
        self.sx = sx.with_seed(self.seed)  # --seed draws the chaos schedule too, not only the network's
        # keys a caller adds to manifest.json (a sweep: its point and the varied parameters)
        self.manifest_extra = dict(manifest_extra or {})
        self.exp = self.sx.exp
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.out = out or sys.stdout
        self.console = SimConsole(self.out, progress=progress)
        self.tally = RunTally({c.group: {c.topic} for c in self.exp.consumers})
        self.result = SimResult(self.run_dir)
        self.backend = SimBackend(self.sx, self.run_dir, self.seed, self.tally)
        self.loop, self.net, self.clock, self.log = (
            self.backend.loop,
            self.backend.net,
            self.backend.clock,
            self.backend.log,
        )
        self.runner = Runner(
            self.exp,
            self.backend,
            self.log,
            self.result,
            console=self.console,
            tally=self.tally,
            progress_interval_s=max(self.exp.wall(self.exp.duration) / 10, 0.5),
        )

    def run(self) -> SimResult:
        """Run the whole experiment; returns when the virtual cluster is down and the files are written."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / "experiment.toml").write_text(self.exp.text, encoding="utf-8")
        self.console.wall0 = time.monotonic()
        started_ms = self.clock.now_ms()
        main = self.loop.create_task(self._main(), context=self.backend.chaos.context)
        collector = GarbageCollector()
        collector.start()
        self.loop.housekeeping = collector.check
        try:
            self.loop.run_until_complete(main)
        except SimDeadlock as e:
            self.result.errors.append(f"the simulation stalled: {e}")
        finally:
            self.loop.housekeeping = None
            collector.stop()
            self.backend.cleanup()
        self.result.sim_seconds = self.loop.time()
        self.result.wall_seconds = time.monotonic() - self.console.wall0
        self._finish(started_ms)
        return self.result

    async def _main(self) -> None:
        exp = self.exp
        self.log.emit(
            "experiment_started",
            name=exp.name,
            seed=self.seed,
            time_scale=exp.time_scale,
            duration_s=exp.duration,
            source=exp.source,
            mode="sim",
        )
        await self.runner.run()

    def _finish(self, started_ms: int) -> None:
        exp = self.exp
        self.result.events = self.backend.files.lines
        manifest = {
            "mode": "sim",
            "seed": self.seed,
            "experiment": exp.to_dict(),
            "experiment_file": "experiment.toml",
            "name": exp.name,
            "question": exp.question,
            "time_scale": exp.time_scale,
            "sim": self.sx.sim.to_dict(),
            "versions": versions(),
            "clients": {node: "python" for c in exp.consumers for node in c.nodes},
            "started_ms": started_ms,
            "ended_ms": self.clock.now_ms(),
            **self.backend.manifest(),
            "nemesis_executed": self.runner.executed,
            "nemesis_skipped": self.result.skipped,
            "drained": self.result.drained,
            "live_counts": self.tally.summary(),
            "errors": self.result.errors,
            "interrupted": False,
            "loop_errors": self.loop.errors[:50],
            **self.manifest_extra,
        }
        self.log.emit(
            "experiment_finished",
            drained=self.result.drained,
            errors=len(self.result.errors),
            interrupted=False,
        )
        self.backend.files.flush()
        (self.run_dir / "manifest.json").write_text(
            json.dumps(manifest, indent=2, sort_keys=True, default=str)
        )
