"""Experiment files: parse and validate a TOML experiment into the model every backend runs.

Everything here is pure: no processes, no sockets, no clock. A bad file raises
``ExperimentError`` whose message names the file, the line of the offending key and
the problem, so nothing starts from a file that cannot run as written. The text is read once: a
backend's own table (the simulator's ``[sim]``) is checked by a ``TableExtension`` given to ``parse``,
with the same ``file:line`` messages, and is an unknown key to every other backend.

Times in an experiment file (``duration``, ``drain_timeout``, ``at``, ``every``, ``from``,
``until``, ``for``, ``down``, and the latencies ``ms``/``jitter_ms``/``latency_ms``) are RocketMQ
time: the lab runs them ``time_scale`` times faster on the wall clock, like every timer of the
emulator, so changing the scale keeps an experiment's meaning. Load figures are wall-clock:
``rate`` (messages per second) and ``consume_ms`` (the consumer's work per message).

A ``[[consumers]]`` table may name a real RocketMQ client (``client = "cpp"`` or ``"js"``, Apache's
Java clients ``"java"``, ``"java5"``, ``"java-lite"`` and its Go client ``"go"``, or Apache's RocketMQ 5
push consumers ``"py5"``, ``"js5"`` and ``"java-grpc"``, which pop through ``rmq-proxy``) instead of ours.
Real clients keep RocketMQ's own timers whatever the time scale (30 s heartbeats, 10-20 s rebalances,
20 s lock renewals), so experiments with them must not run the broker so fast that it expires their
channels or locks: see ``REAL_CLIENT_MIN_TIME_SCALE``.
"""

from __future__ import annotations

import difflib
import re
import tomllib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

from rmqlab.broker.plain_acl import AclConfigError, PlainAccessValidator
from rmqlab.broker.replicas_info import FIRST_BROKER_CONTROLLER_ID
from rmqlab.client.versions import (
    CLIENT_VERSIONS,
    DEFAULT_CLIENT_VERSION,
    ROCKETMQ5_CLIENT_VERSION,
    UnknownVersion,
    check_version,
)
from rmqlab.lab.schedule import (
    UNDO,
    NemesisSpec,
    NodeInfo,
    Step,
    candidates,
    expand_schedule,
    live_random_targets,
    node_order,
)

PROCESS_ACTIONS = ("kill", "stop", "start", "restart", "pause", "resume", "hang", "unhang")
NETWORK_ACTIONS = ("latency", "blackhole", "reset", "loss", "heal")
# Network actions the kernel does (iptables in a container's network namespace): these may name any
# node at the other end of the link (``peer``) and cut or thin one direction only.
KERNEL_NETWORK_ACTIONS = ("blackhole", "loss", "heal")
BROKER_ACTIONS = ("fault", "fault-clear", "policy")
# Actions on a master and its slaves: ``failover`` stops a master that has a slave (RocketMQ 4.9.8 has
# no automatic switch: stopping the master is what an operator can do, and consumers turn to the slave).
HA_ACTIONS = ("failover",)
ACTIONS = PROCESS_ACTIONS + NETWORK_ACTIONS + BROKER_ACTIONS + HA_ACTIONS
SELECTORS = ("random", "next", "all")
PARTITION_DIRECTIONS = ("both", "out", "in")
# "broker" selects the masters, "slave" their slaves (named <broker>-s<id>).
ROLES = ("namesrv", "broker", "slave", "producer", "consumer")
# brokerRole of the masters when they have slaves (the slaves' is SLAVE)
MASTER_ROLES = ("ASYNC_MASTER", "SYNC_MASTER")
MAX_SLAVES = 8
# Allocation strategies that need no per-consumer configuration (CONFIG and MACHINE_ROOM need a queue or
# room list per consumer, which an experiment cannot give yet).
KNOWN_STRATEGIES = ("AVG", "AVG_BY_CIRCLE", "CONSISTENT_HASH")
CONSUME_FROM = ("first", "last", "timestamp")
# Who assigns a group's queues: the client (RocketMQ 4.x and 5.x's default), or the broker (RocketMQ 5,
# clientRebalance = false) in PULL mode (queues by the strategy) or POP mode (messages, not queues).
ASSIGNMENTS = ("client", "server-pull", "server-pop")
# Which client a consumer node runs: ours, or a real RocketMQ client through its driver in interop/.
CLIENTS = ("python", "cpp", "js", "py5", "js5", "java", "java5", "java-lite", "java-grpc", "go")
REAL_CLIENTS = ("cpp", "js", "py5", "js5", "java", "java5", "java-lite", "java-grpc", "go")
# Apache's RocketMQ 5 clients: gRPC to rmq-proxy, which pops from the brokers (no client-side rebalance).
V5_CLIENTS = ("py5", "js5", "java-grpc")
# Apache's Java clients (interop/java): the remoting kinds scale their timers with --time-scale.
JAVA_CLIENTS = ("java", "java5", "java-lite", "java-grpc")
JAVA_REMOTING_CLIENTS = ("java", "java5", "java-lite")
# Real clients whose drivers hang and release their listener on SIGUSR1 / SIGUSR2, as ours do.
HANGABLE_REAL_CLIENTS = ("py5", "js5", *JAVA_CLIENTS)
CLIENT_NAMES = {
    "python": "the lab's Python client",
    "cpp": "Apache's C++ client 2.1.0",
    "js": "ali-ons 3.12.0 (JS)",
    "py5": "Apache's RocketMQ 5 Python client 5.1.2",
    "js5": "Apache's RocketMQ 5 Node.js client 1.0.8",
    "java": "Apache's Java client 4.9.8 (DefaultMQPushConsumer)",
    "java5": "Apache's Java client 5.5.0 (DefaultMQPushConsumer)",
    "java-lite": "Apache's Java client 4.9.8 (DefaultLitePullConsumer)",
    "java-grpc": "Apache's RocketMQ 5 Java client 5.2.0 (gRPC)",
    "go": "Apache's Go client 2.1.2",
}
# Which name server and brokers run an experiment: the lab's emulator, or Apache RocketMQ's own JVMs
# (interop/apache; the names are its ENGINES, tests/interop/test_interop_apache_engine.py keeps them
# equal).
ENGINES = ("emulator", "apache-4.9.7", "apache-5")
ENGINES_NOT_SERVED = {
    "apache-4.9.8": "Maven Central serves no rocketmq-broker, rocketmq-namesrv or rocketmq-filter 4.9.8 "
    "(that release published only its client-side modules there): use apache-4.9.7, the newest 4.9 broker "
    "it serves",
}
# Apache engines the lab runs with slaves (4.9's master-slave: brokerId 1..N, brokerRole SLAVE, no
# automatic failover); 5.x's brokers run masters only here (the lab runs 5.x's controller on the emulator).
MASTER_SLAVE_ENGINES = ("apache-4.9.7",)
# Clients that speak RocketMQ's own remoting protocol, the only one Apache's broker speaks.
NATIVE_CLIENTS = ("cpp", "js", "java", "java5", "java-lite", "go")
# Clients an Apache engine runs: those, and the lab's own over its native transport (--protocol native).
ENGINE_CLIENTS = ("python", *NATIVE_CLIENTS)
# The broker scales its channel expiry (120 s) and its queue-lock lifetime (60 s) with the time scale,
# but a real client still heartbeats every 30 s and an orderly one renews its locks every 20 s. At 0.5
# the broker expires a silent channel after 60 s (two heartbeats) and a lock after 30 s (1.5 renewals);
# at 0.25 the channel expiry would equal the heartbeat interval and real consumers would be dropped
# from their group between two heartbeats, which is no fault of theirs.
REAL_CLIENT_MIN_TIME_SCALE = 0.5
# BrokerConfig.flushConsumerOffsetInterval, which an Apache engine's brokers run with (scaled).
APACHE_FLUSH_CONSUMER_OFFSET_INTERVAL = 5_000
MAX_BROKERS = 26
_MAX_BODY = 4 * 1024 * 1024
NAMESRV_NODE = "namesrv"


class ExperimentError(ValueError):
    """One or more problems in an experiment file; ``problems`` holds (line, message) pairs."""

    def __init__(self, source: str, problems: list[tuple[int | None, str]]) -> None:
        self.source = source
        self.problems = sorted(problems, key=lambda p: (p[0] or 0, p[1]))
        lines = [f"{source}:{line}: {msg}" if line else f"{source}: {msg}" for line, msg in self.problems]
        super().__init__("\n".join(lines))


# --------------------------------------------------------------------------------------------
# Where each key is written: a small scanner over the TOML text, good enough to point at a line.


def _split_key(text: str) -> tuple[str, ...]:
    parts: list[str] = []
    buf = ""
    quote = ""
    for ch in text:
        if quote:
            if ch == quote:
                quote = ""
            else:
                buf += ch
        elif ch in "\"'":
            quote = ch
        elif ch == ".":
            parts.append(buf.strip())
            buf = ""
        else:
            buf += ch
    parts.append(buf.strip())
    return tuple(parts)


def _strip_comment(line: str) -> str:
    quote = ""
    for i, ch in enumerate(line):
        if quote:
            if ch == "\\" and quote == '"':
                continue
            if ch == quote:
                quote = ""
        elif ch in "\"'":
            quote = ch
        elif ch == "#":
            return line[:i]
    return line


_TABLE_ARRAY = re.compile(r"^\[\[\s*(.+?)\s*\]\]$")
_TABLE = re.compile(r"^\[\s*([^\[\]]+?)\s*\]$")
_BARE_OR_QUOTED = r"""(?:[A-Za-z0-9_-]+|"[^"]*"|'[^']*')"""
_KEY = re.compile(rf"^({_BARE_OR_QUOTED}(?:\s*\.\s*{_BARE_OR_QUOTED})*)\s*=")
_INLINE_KEY = re.compile(r"[{,]\s*([A-Za-z0-9_-]+)\s*=")


class KeyLines:
    """Maps a key path such as ``("nemesis", 2, "target")`` to the line where it is written."""

    def __init__(self, text: str) -> None:
        self.lines: dict[tuple[Any, ...], int] = {}
        counters: dict[tuple[Any, ...], int] = {}
        current: tuple[Any, ...] = ()
        depth = 0  # open brackets of a multi-line value
        in_multiline = ""
        for lineno, raw in enumerate(text.splitlines(), 1):
            if in_multiline:
                if in_multiline in raw:
                    in_multiline = ""
                continue
            line = _strip_comment(raw).strip()
            if depth > 0:
                depth += line.count("[") + line.count("{") - line.count("]") - line.count("}")
                continue
            if not line:
                continue
            m = _TABLE_ARRAY.match(line)
            if m:
                parts = _split_key(m.group(1))
                path = (*self._resolve(parts[:-1], counters), parts[-1])
                idx = counters.get(path, 0)
                counters[path] = idx + 1
                current = (*path, idx)
                self.lines.setdefault(path, lineno)
                self.lines[current] = lineno
                continue
            m = _TABLE.match(line)
            if m:
                current = self._resolve(_split_key(m.group(1)), counters)
                self.lines.setdefault(current, lineno)
                continue
            m = _KEY.match(line)
            if not m:
                continue
            key = (*current, *_split_key(m.group(1)))
            for i in range(len(current) + 1, len(key) + 1):
                self.lines.setdefault(key[:i], lineno)
            value = line[m.end() :].strip()
            for quote in ('"""', "'''"):
                if value.startswith(quote) and value.count(quote) == 1:
                    in_multiline = quote
            if not in_multiline:
                depth = value.count("[") + value.count("{") - value.count("]") - value.count("}")
                depth = max(depth, 0)
            for inner in _INLINE_KEY.finditer(value):
                self.lines.setdefault((*key, inner.group(1)), lineno)

    @staticmethod
    def _resolve(path: tuple[str, ...], counters: dict[tuple[Any, ...], int]) -> tuple[Any, ...]:
        # [a.b] under [[a]] belongs to the latest element of the array a
        out: tuple[Any, ...] = ()
        for part in path:
            out = (*out, part)
            if out in counters:
                out = (*out, counters[out] - 1)
        return out

    def line_of(self, path: Iterable[Any]) -> int | None:
        p = tuple(path)
        while p:
            if p in self.lines:
                return self.lines[p]
            p = p[:-1]
        return None


# --------------------------------------------------------------------------------------------
# The validated model


@dataclass(frozen=True)
class TopicSpec:
    """A [[topics]] table."""

    name: str
    queues: int  # in total, spread evenly over the brokers


@dataclass(frozen=True)
class ConsumerSpec:
    """A [[consumers]] table: ``count`` consumer processes of one group."""

    group: str
    topic: str
    count: int
    strategy: str
    orderly: bool
    broadcast: bool
    consume_ms: int
    consume_from: str
    nodes: tuple[str, ...]
    client: str = "python"  # one of CLIENTS
    start: float = 0.0  # lab seconds after the cluster is up at which the nodes join (0: with the cluster)
    assignment: str = "client"  # one of ASSIGNMENTS
    rocketmq5: bool = False  # the client's RocketMQ >= 5.2 behaviour (implied by a server assignment)
    # the lab's client behaves as this release of Apache's (client.versions; None: 4.9.8, or the newest
    # 5.x with rocketmq5 or a server assignment)
    client_version: str | None = None
    # ConsumerConfig settings every consumer of the table is given (rmq-consumer --set), such as a known
    # problem's variant (lab.known); not a key of the file
    settings: tuple[tuple[str, Any], ...] = ()

    @property
    def request_mode(self) -> str | None:
        """The mode the brokers keep for (topic, group): PULL or POP; None when the client balances."""
        return {"server-pull": "PULL", "server-pop": "POP"}.get(self.assignment)

    @property
    def effective_client_version(self) -> str:
        """The release whose behaviour switches the consumers get (client.versions)."""
        if self.client_version:
            return self.client_version
        rocketmq5 = self.rocketmq5 or self.assignment != "client"
        return ROCKETMQ5_CLIENT_VERSION if rocketmq5 else DEFAULT_CLIENT_VERSION

    def client_args(self) -> list[str]:
        """rmq-consumer flags for the assignment and the client version (a client_version's switches
        stand for --rocketmq5's)."""
        if self.client_version:
            args = ["--set", f"client_version={self.client_version}"]
        else:
            args = ["--rocketmq5"] if self.rocketmq5 or self.assignment != "client" else []
        if self.assignment != "client":
            args += ["--set", "client_rebalance=false"]
        for key, value in self.settings:
            args += ["--set", f"{key}={str(value).lower() if isinstance(value, bool) else value}"]
        return args

    @property
    def real(self) -> bool:
        return self.client in REAL_CLIENTS


@dataclass(frozen=True)
class WorkloadSpec:
    """The [workload] table: the producer processes and what they send."""

    rate: float  # messages per wall-clock second, per producer
    count: int  # messages per producer
    size: int  # payload bytes
    topics: tuple[str, ...]
    producers: int  # producer processes per topic
    start: float  # lab seconds after the cluster is up
    nodes: tuple[tuple[str, str], ...]  # (node, topic)


@dataclass(frozen=True)
class Policies:
    """The [policies] table: the brokers' what-if switches."""

    notify_on_channel_expired: bool = False
    release_locks_on_close: bool = False
    # initPopOffsetByCheckMsgInMem (RocketMQ 5.1.4, on); off is the behaviour before (ISSUE #7117)
    init_pop_offset_by_check_msg_in_mem: bool = True

    def broker_flags(self) -> list[str]:
        flags = []
        if self.notify_on_channel_expired:
            flags.append("--notify-on-channel-expired")
        if self.release_locks_on_close:
            flags.append("--release-locks-on-close")
        if not self.init_pop_offset_by_check_msg_in_mem:
            flags.append("--no-init-pop-offset-by-check-msg-in-mem")
        return flags


@dataclass(frozen=True)
class AclSpec:
    """``[acl]``: the brokers run with ``--acl file``; the lab's clients and admin sign with the key."""

    file: str  # resolved against the experiment file's folder
    access_key: str
    secret_key: str


class TableSettings(Protocol):
    """A backend's own table, checked: what it adds to the schedule (may be nothing)."""

    def steps(self, exp: Experiment) -> list[Step]: ...


class TableExtension(Protocol):
    """A backend's own table in an experiment file (the simulator's ``[sim]``). ``parse`` gets the table's
    value (None when the file has none) and the experiment built from the rest, and reports what is
    wrong through ``problems`` at the lines of the keys it names."""

    name: str

    def parse(self, value: Any, exp: Experiment, problems: Problems) -> TableSettings: ...


@dataclass(frozen=True)
class Experiment:
    """A parsed, checked experiment file."""

    name: str
    question: str
    source: str
    text: str
    time_scale: float
    duration: float
    seed: int
    drain_timeout: float
    brokers: tuple[str, ...]
    durable: bool
    topics: tuple[TopicSpec, ...]
    consumers: tuple[ConsumerSpec, ...]
    workload: WorkloadSpec | None
    policies: Policies
    nemeses: tuple[NemesisSpec, ...]
    acl: AclSpec | None = None
    # the brokers' --flush-consumer-offset-interval (ms); 0: every committed offset durable at once
    flush_consumer_offset_interval: int = 0
    # Master-slave (RocketMQ 4.x): each master's slaves, brokerId 1..slaves, nodes <broker>-s<id>
    slaves: int = 0
    # or the per-master form ([cluster] slaves = { broker-a = 1 }): (master, its slaves), the masters it
    # does not name having none
    broker_slaves: tuple[tuple[str, int], ...] = ()
    broker_role: str = "ASYNC_MASTER"  # the masters' brokerRole
    replication_lag_ms: float = 0  # the slaves hold each copied batch this long (RocketMQ ms)
    slave_read_enable: bool = False  # slaveReadEnable on every broker
    # RocketMQ 5 brokers (--rocketmq5), and their controller mode: the name server runs the controller
    # (enableControllerInNamesrv), which elects each broker set's master among the master and its slaves
    rocketmq5: bool = False
    controller: bool = False
    # masters whose brokerPermission is 4: every topic registered read only (taken out of the producers'
    # routes for maintenance), while the consumers still divide their queues
    read_only_brokers: tuple[str, ...] = ()
    engine: str = "emulator"  # one of ENGINES: whose name server and brokers run the experiment
    # what the tables of the backend that parsed it hold (TableExtension.name -> its parse's result)
    extensions: Mapping[str, TableSettings] = field(default_factory=dict, compare=False, repr=False)

    def slave_count(self, broker: str) -> int:
        """How many slaves the master ``broker`` has."""
        return dict(self.broker_slaves).get(broker, 0) if self.broker_slaves else self.slaves

    @property
    def has_slaves(self) -> bool:
        return any(self.slave_count(b) for b in self.brokers)

    def broker_flags(self, broker: str | None = None) -> list[str]:
        """A master's flags (of ``broker``, or of any master when None): its brokerRole only when it has
        slaves, as a master without one is a plain ASYNC_MASTER (a SYNC_MASTER would fail every send)."""
        flags = self.policies.broker_flags()
        if self.flush_consumer_offset_interval:
            flags += ["--flush-consumer-offset-interval", str(self.flush_consumer_offset_interval)]
        if self.slave_count(broker) if broker is not None else self.has_slaves:
            flags += ["--broker-role", self.broker_role]
            if self.slave_read_enable:
                flags.append("--slave-read-enable")
        return flags + self._v5_flags()

    def _v5_flags(self) -> list[str]:
        return (["--rocketmq5"] if self.rocketmq5 else []) + (
            ["--controller-mode"] if self.controller else []
        )

    def namesrv_flags(self) -> list[str]:
        return ["--enable-controller-in-namesrv"] if self.controller else []

    def slave_nodes(self, broker: str | None = None) -> tuple[str, ...]:
        """The slaves' node names (of one master, or of all), ``<broker>-s<id>`` with brokerId 1..N."""
        masters = self.brokers if broker is None else (broker,)
        return tuple(f"{b}-s{i}" for b in masters for i in range(1, self.slave_count(b) + 1))

    def slave_flags(self, node: str) -> list[str]:
        """What makes a slave of the broker flags: its master's brokerName, its brokerId, SLAVE, the lag.
        The slave finds its master's address in the name server's answer to its registration."""
        _master, broker_id = slave_of(node)
        # in controller mode the role is the controller's: --broker-role is the one it takes as master
        role = self.broker_role if self.controller else "SLAVE"
        flags = [*self.policies.broker_flags(), "--broker-id", str(broker_id), "--broker-role", role]
        if self.flush_consumer_offset_interval:
            flags += ["--flush-consumer-offset-interval", str(self.flush_consumer_offset_interval)]
        if self.replication_lag_ms:
            # RocketMQ time: the broker runs it at its --time-scale like every timer
            flags += ["--ha-replication-lag-ms", str(round(self.replication_lag_ms))]
        if self.slave_read_enable:
            flags.append("--slave-read-enable")
        return flags + self._v5_flags()

    def wall(self, lab_seconds: float) -> float:
        return lab_seconds * self.time_scale

    def nodes(self) -> dict[str, NodeInfo]:
        out = {NAMESRV_NODE: NodeInfo(NAMESRV_NODE, "namesrv")}
        for b in self.brokers:
            out[b] = NodeInfo(b, "broker")
        for s in self.slave_nodes():
            out[s] = NodeInfo(s, "slave")
        if self.workload:
            for node, topic in self.workload.nodes:
                out[node] = NodeInfo(node, "producer", None, topic)
        for c in self.consumers:
            for node in c.nodes:
                out[node] = NodeInfo(node, "consumer", c.group, c.topic, c.client)
        return out

    def real_clients(self) -> set[str]:
        """The real RocketMQ clients this experiment runs (empty when every consumer is ours)."""
        return {c.client for c in self.consumers if c.real}

    def kernel_only_network_faults(self) -> list[str]:
        """Network nemeses the lab's fault relay cannot do, so only the kernel's (the docker backend's):
        one direction only (the relay cuts both), packet loss (the relay passes on a byte stream), and a
        link that is not between a client and a server (the relay sits in front of one client)."""
        nodes = self.nodes()
        out = []
        for n in self.nemeses:
            if n.action not in NETWORK_ACTIONS:
                continue
            other = n.params.get("broker", "all")
            why = []
            if n.params.get("direction", "both") != "both":
                why.append(f"direction={n.params['direction']}")
            if n.action == "loss":
                why.append("packet loss")
            client_link = all(
                nodes[c].role in ("consumer", "producer") for c in candidates(n.target, n.group, nodes)
            ) and (other == "all" or nodes[other].role in ("broker", "namesrv"))
            if not client_link:
                why.append(f"a link between {n.target} and {other}")
            if why:
                out.append(f"{n.action} {n.target} ({', '.join(why)})")
        return out

    def network_targets(self, actions: Iterable[str] = NETWORK_ACTIONS) -> set[str]:
        """Client nodes that need a fault relay because a network nemesis (of ``actions``) may target them."""
        nodes = self.nodes()
        wanted = set(actions)
        out: set[str] = set()
        for n in self.nemeses:
            if n.action in wanted:
                out.update(candidates(n.target, n.group, nodes))
        return out

    def topic_queues_per_broker(self, topic: str) -> int:
        spec = next(t for t in self.topics if t.name == topic)
        return spec.queues // len(self.brokers)

    def schedule(self) -> list[Step]:
        """The nemesis actions in time order, with the steps a backend's own table adds (the simulator's
        GC pauses); deterministic for a given seed."""
        nodes = self.nodes()
        steps = expand_schedule(self.nemeses, nodes, self.seed, self.duration)
        if not self.extensions:
            return steps
        steps += [s for settings in self.extensions.values() for s in settings.steps(self)]
        steps.sort(key=lambda s: (s.t, s.source))
        # again over both: a pause drawn at random goes to a node the nemeses left able to take it
        return live_random_targets(steps, nodes, self.seed)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "question": self.question,
            "source": self.source,
            "time_scale": self.time_scale,
            "duration": self.duration,
            "seed": self.seed,
            "drain_timeout": self.drain_timeout,
            "brokers": list(self.brokers),
            "durable": self.durable,
            "flush_consumer_offset_interval": self.flush_consumer_offset_interval,
            "slaves": self.slaves,
            "broker_slaves": {b: self.slave_count(b) for b in self.brokers},
            "broker_role": self.broker_role,
            "replication_lag_ms": self.replication_lag_ms,
            "slave_read_enable": self.slave_read_enable,
            "rocketmq5": self.rocketmq5,
            "controller": self.controller,
            "slave_nodes": list(self.slave_nodes()),
            "read_only_brokers": list(self.read_only_brokers),
            "engine": self.engine,
            "topics": [{"name": t.name, "queues": t.queues} for t in self.topics],
            "consumers": [
                {
                    "group": c.group,
                    "topic": c.topic,
                    "count": c.count,
                    "strategy": c.strategy,
                    "orderly": c.orderly,
                    "broadcast": c.broadcast,
                    "consume_ms": c.consume_ms,
                    "consume_from": c.consume_from,
                    "nodes": list(c.nodes),
                    "client": c.client,
                    "start": c.start,
                    "assignment": c.assignment,
                    "rocketmq5": c.rocketmq5,
                    "client_version": c.effective_client_version if not c.real else None,
                    "settings": dict(c.settings),
                }
                for c in self.consumers
            ],
            "workload": None
            if self.workload is None
            else {
                "rate": self.workload.rate,
                "count": self.workload.count,
                "size": self.workload.size,
                "topics": list(self.workload.topics),
                "producers": self.workload.producers,
                "start": self.workload.start,
            },
            "policies": {
                "notify_on_channel_expired": self.policies.notify_on_channel_expired,
                "release_locks_on_close": self.policies.release_locks_on_close,
                "init_pop_offset_by_check_msg_in_mem": self.policies.init_pop_offset_by_check_msg_in_mem,
            },
            "schedule": [
                {"t": s.t, "action": s.action, "target": s.target, "group": s.group, "params": s.params}
                for s in self.schedule()
            ],
        }


# --------------------------------------------------------------------------------------------
# Validation


_REQUIRED: Any = object()


class Problems:
    """The problems found in a file so far, each at the line of the key it names."""

    def __init__(self, lines: KeyLines) -> None:
        self.lines = lines
        self.items: list[tuple[int | None, str]] = []
        self.paths: list[tuple[Any, ...]] = []

    def add(self, path: tuple[Any, ...], msg: str) -> None:
        self.items.append((self.lines.line_of(path), msg))
        self.paths.append(path)


def _where(path: tuple[Any, ...]) -> str:
    out = ""
    for p in path:
        if isinstance(p, int):
            out += f"[{p + 1}]"
        else:
            out += ("." if out else "") + p
    return out


class _Table:
    def __init__(self, data: dict[str, Any], path: tuple[Any, ...], problems: Problems) -> None:
        self.data = data
        self.path = path
        self.problems = problems
        self.used: set[str] = set()

    def err(self, key: str | None, msg: str) -> None:
        path = (*self.path, key) if key else self.path
        self.problems.add(path, f"{_where(path)}: {msg}")

    def get(
        self,
        key: str,
        kind: str,
        default: Any = _REQUIRED,
        check: Callable[[Any], str | None] | None = None,
    ) -> Any:
        self.used.add(key)
        if key not in self.data:
            if default is _REQUIRED:
                self.err(None, f"missing required key '{key}'")
            return None if default is _REQUIRED else default
        value = self.data[key]
        ok = {
            "int": isinstance(value, int) and not isinstance(value, bool),
            "number": isinstance(value, int | float) and not isinstance(value, bool),
            "str": isinstance(value, str),
            "bool": isinstance(value, bool),
            "str-list": isinstance(value, list) and all(isinstance(v, str) for v in value),
            "number-list": isinstance(value, int | float | list)
            and not isinstance(value, bool)
            and all(isinstance(v, int | float) and not isinstance(v, bool) for v in _as_list(value)),
            "any": True,
        }[kind]
        if not ok:
            names = {
                "int": "an integer",
                "number": "a number",
                "str": "a string",
                "bool": "true or false",
                "str-list": "a list of strings",
                "number-list": "a number or a list of numbers",
            }
            self.err(key, f"must be {names[kind]}, got {_show(value)}")
            return None if default is _REQUIRED else default
        if check is not None:
            problem = check(value)
            if problem:
                self.err(key, problem)
                return None if default is _REQUIRED else default
        return value

    def table(self, key: str) -> _Table | None:
        self.used.add(key)
        if key not in self.data:
            return None
        value = self.data[key]
        if not isinstance(value, dict):
            self.err(key, f"must be a table ([{key}]), got {_show(value)}")
            return None
        return _Table(value, (*self.path, key), self.problems)

    def tables(self, key: str) -> list[_Table]:
        self.used.add(key)
        if key not in self.data:
            return []
        value = self.data[key]
        if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
            self.err(key, f"must be an array of tables ([[{key}]]), got {_show(value)}")
            return []
        return [_Table(v, (*self.path, key, i), self.problems) for i, v in enumerate(value)]

    def finish(self) -> None:
        for key in self.data:
            if key not in self.used:
                hint = difflib.get_close_matches(key, sorted(self.used), n=1)
                known = ", ".join(sorted(self.used))
                more = f" (did you mean '{hint[0]}'?)" if hint else f" (known keys: {known})"
                self.err(key, f"unknown key '{key}'{more}")


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def _show(value: Any) -> str:
    kind = type(value).__name__
    names = {"dict": "table", "list": "array", "str": "string", "float": "number", "int": "integer"}
    kind = names.get(kind, kind)
    text = repr(value)
    return f"{kind} {text if len(text) < 40 else text[:37] + '...'}"


def _positive(v: Any) -> str | None:
    return None if v > 0 else "must be > 0"


def _non_negative(v: Any) -> str | None:
    return None if v >= 0 else "must be >= 0"


def _percent(v: Any) -> str | None:
    return None if 0 < v <= 100 else f"must be more than 0 and at most 100, got {_show(v)}"


def _all_non_negative(v: Any) -> str | None:
    return None if min(_as_list(v), default=0) >= 0 else "must be >= 0"


def _name(v: str) -> str | None:
    if not re.fullmatch(r"[A-Za-z0-9_%|-]{1,127}", v):
        return "must be 1-127 characters of letters, digits, '_', '-', '%' or '|'"
    return None


def _one_of(options: Iterable[str]) -> Callable[[Any], str | None]:
    opts = tuple(options)

    def check(v: Any) -> str | None:
        return None if v in opts else f"must be one of {', '.join(opts)}; got {v!r}"

    return check


def broker_names(count: int) -> tuple[str, ...]:
    return tuple(f"broker-{chr(ord('a') + i)}" for i in range(count))


_SLAVE_NODE = re.compile(r"(broker-[a-z])-s([1-9][0-9]*)")


def slave_of(node: str) -> tuple[str, int]:
    """A slave node's master (its brokerName) and brokerId: ``broker-a-s1`` -> ("broker-a", 1)."""
    m = _SLAVE_NODE.fullmatch(node)
    if m is None:
        raise ValueError(f"{node!r} is not a slave's node name (<broker>-s<id>)")
    return m.group(1), int(m.group(2))


def controller_broker_id(node: str) -> int:
    """A broker node's brokerControllerId in controller mode: its configured brokerId + 1, so ``broker-a``
    is 1 and ``broker-a-s1`` 2 (RocketMQ numbers a set's replicas from 1 as they apply)."""
    return (slave_of(node)[1] if _SLAVE_NODE.fullmatch(node) else 0) + FIRST_BROKER_CONTROLLER_ID


def request_code(value: int | str) -> int | None:
    """A request code given as a number or as its RocketMQ name (``PULL_MESSAGE``)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value if value >= 0 else None
    try:
        from rmqlab.protocol.codes import RequestCode
    except ImportError:  # pragma: no cover - protocol is part of the package
        return None
    try:
        return int(RequestCode[str(value).upper()])
    except KeyError:
        return None


def parse_error_spec(text: str) -> tuple[int, str]:
    """``"1:boom"`` -> (1, "boom"); the remark may be empty; raises ValueError on a bad spec."""
    code, sep, remark = text.partition(":")
    try:
        num = int(code.strip())
    except ValueError:
        raise ValueError(f"error {text!r} must be CODE or CODE:REMARK with an integer code") from None
    if num < 0:
        raise ValueError(f"error {text!r}: the code must be >= 0")
    return num, remark if sep else ""


def read_text(path: str | Path) -> str:
    """An experiment file's text, or an ExperimentError naming why it cannot be read."""
    p = Path(path)
    try:
        return p.read_text(encoding="utf-8")
    except OSError as e:
        raise ExperimentError(str(p), [(None, f"cannot read the file: {e.strerror or e}")]) from None
    except UnicodeDecodeError:
        raise ExperimentError(str(p), [(None, "the file is not UTF-8 text")]) from None


def load(path: str | Path, extensions: Sequence[TableExtension] = ()) -> Experiment:
    p = Path(path)
    return parse(read_text(p), source=str(p), default_name=p.stem, extensions=extensions)


def parse(
    text: str,
    source: str = "<experiment>",
    default_name: str = "experiment",
    extensions: Sequence[TableExtension] = (),
) -> Experiment:
    """The checked experiment of a TOML text; ``extensions`` check the tables of the backend that is to
    run it (a table of no extension given is an unknown key)."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        m = re.search(r"\(at line (\d+), column (\d+)\)", str(e))
        msg = re.sub(r"\s*\(at line \d+, column \d+\)", "", str(e))
        line = int(m.group(1)) if m else None
        col = f" (column {m.group(2)})" if m else ""
        raise ExperimentError(source, [(line, f"not valid TOML: {msg}{col}")]) from None
    problems = Problems(KeyLines(text))
    exp = _build(data, text, source, default_name, problems, extensions)
    if problems.items or exp is None:
        raise ExperimentError(source, problems.items or [(None, "invalid experiment")])
    return exp


def _build(
    data: dict[str, Any],
    text: str,
    source: str,
    default_name: str,
    pr: Problems,
    extensions: Sequence[TableExtension],
) -> Experiment | None:
    root = _Table(data, (), pr)
    root.used.update(ext.name for ext in extensions)
    name = root.get("name", "str", default_name, _name)
    question = root.get("question", "str", "")
    time_scale = root.get("time_scale", "number", 1.0, _positive)
    duration = root.get("duration", "number", _REQUIRED, _positive)
    seed = root.get("seed", "int", 0)
    drain_timeout = root.get("drain_timeout", "number", 300, _positive)
    n_brokers, durable, flush_interval, engine, ha = _cluster(root.table("cluster"))
    policies = _policies(root.table("policies"))
    acl = _acl(root.table("acl"), source)
    topics = _topics(root.tables("topics"), n_brokers)
    if not topics and "topics" not in data:
        root.err(None, "at least one [[topics]] table is required")
    declared = {t.name for t in topics}
    consumers = _consumers(root.tables("consumers"), declared)
    workload = _workload(root.table("workload"), topics, declared)
    nemeses = [
        spec for i, n in enumerate(root.tables("nemesis")) if (spec := _nemesis(n, i + 1, pr)) is not None
    ]
    root.finish()
    _check_time_scale(root, time_scale, consumers)
    _check_consumer_starts(pr, consumers, duration)
    # The schedule's checks still run after problems elsewhere (so that every mistake is reported at
    # once), unless a table that defines nodes or groups is broken: its missing nodes would be reported
    # again as unknown targets.
    nodes_sound = not any(p and p[0] in ("cluster", "topics", "consumers", "workload") for p in pr.paths)
    if duration is None or not nodes_sound:
        return None
    exp = Experiment(
        name=name,
        question=question,
        source=source,
        text=text,
        time_scale=float(time_scale or 1.0),
        duration=float(duration),
        seed=seed,
        drain_timeout=float(drain_timeout),
        brokers=broker_names(n_brokers),
        durable=durable,
        topics=tuple(topics),
        consumers=tuple(consumers),
        workload=workload,
        policies=policies,
        nemeses=tuple(nemeses),
        acl=acl,
        flush_consumer_offset_interval=flush_interval,
        **ha,
        engine=engine,
    )
    if acl is not None and exp.real_clients():
        root.err("acl", "the lab runs real clients without credentials: remove [acl] or the real clients")
    _check_nemeses(exp, pr)
    if exp.engine != "emulator":
        _check_engine(exp, pr)
    if pr.items:
        return None
    # A backend's own table is checked against the experiment it belongs to (once that is sound).
    settings = {ext.name: ext.parse(data.get(ext.name), exp, pr) for ext in extensions}
    if pr.items:
        return None
    return replace(exp, extensions=settings) if settings else exp


def _cluster(cluster: _Table | None) -> tuple[int, bool, int, str, dict[str, Any]]:
    """[cluster]: (number of brokers, durable stores, the brokers' offset flush interval in ms, engine,
    the master-slave settings and the read-only brokers as Experiment keywords)."""
    if not cluster:
        return 1, False, 0, "emulator", {}
    n_brokers = cluster.get(
        "brokers", "int", 1, lambda v: None if 1 <= v <= MAX_BROKERS else f"must be 1..{MAX_BROKERS}"
    )
    durable = cluster.get("durable", "bool", False)
    flush_interval = cluster.get("flush_consumer_offset_interval", "int", 0, _non_negative)
    if flush_interval and not durable:
        cluster.err("flush_consumer_offset_interval", "needs durable = true (offsets flushed to a store)")
    slaves, broker_slaves = _slaves(cluster, n_brokers or 1)
    role = cluster.get("broker_role", "str", "ASYNC_MASTER", _master_role)
    lag = cluster.get("replication_lag_ms", "number", 0, _non_negative)
    slave_read = cluster.get("slave_read_enable", "bool", False)
    rocketmq5 = cluster.get("rocketmq5", "bool", False)
    controller = cluster.get("controller", "bool", False)
    engine = cluster.get("engine", "str", "emulator", _engine)
    names = broker_names(n_brokers or 1)
    read_only = cluster.get("read_only_brokers", "str-list", [], lambda v: _brokers_among(v, names))
    cluster.finish()
    any_slaves = bool(slaves) or any(n for _b, n in broker_slaves)
    if not any_slaves:
        for key in ("broker_role", "replication_lag_ms", "slave_read_enable"):
            if key in cluster.data:
                cluster.err(key, f"'{key}' is a master-slave setting: it needs slaves >= 1")
    if controller:
        if not rocketmq5:
            cluster.err(
                "controller", "the controller is RocketMQ 5's: it needs rocketmq5 = true in [cluster]"
            )
        if not any_slaves:
            cluster.err("controller", "the controller elects a master among its slaves: it needs slaves >= 1")
        if engine not in (None, "emulator"):
            cluster.err(
                "controller", f"engine {engine!r}: the lab runs the controller with the emulator only"
            )
    ha = {
        "slaves": slaves,
        "broker_slaves": broker_slaves,
        "broker_role": role or "ASYNC_MASTER",
        "replication_lag_ms": lag or 0,
        "slave_read_enable": bool(slave_read),
        "rocketmq5": bool(rocketmq5),
        "controller": bool(controller),
        "read_only_brokers": tuple(read_only or ()),
    }
    return n_brokers, durable, flush_interval, engine, ha


def _brokers_among(v: list[str], names: tuple[str, ...]) -> str | None:
    wrong = [b for b in v if b not in names]
    return f"{wrong[0]!r} is not a broker (brokers: {', '.join(names)})" if wrong else None


def _slave_count(v: int) -> str | None:
    return None if 0 <= v <= MAX_SLAVES else f"must be a whole number 0..{MAX_SLAVES}, got {v}"


def _master_role(v: str) -> str | None:
    if v == "SLAVE":
        return (
            "is the masters' brokerRole, and 'SLAVE' would leave the slaves with no master (a slave is "
            "SLAVE by itself): use " + " or ".join(MASTER_ROLES)
        )
    return _one_of(MASTER_ROLES)(v)


def _slaves(cluster: _Table, n_brokers: int) -> tuple[int, tuple[tuple[str, int], ...]]:
    """[cluster] slaves: each master's count (``slaves = 1``), or a count per master (``slaves =
    { broker-a = 1 }``, the masters it does not name having none), as (count, per-master counts)."""
    if not isinstance(cluster.data.get("slaves"), dict):
        return cluster.get("slaves", "int", 0, _slave_count) or 0, ()
    per = cluster.table("slaves")
    assert per is not None
    masters = broker_names(n_brokers)
    counts: dict[str, int] = {}
    for name in per.data:
        try:
            master, broker_id = slave_of(name)
        except ValueError:
            master, broker_id = "", 0
        if broker_id:
            per.used.add(name)
            per.err(
                name,
                f"{name} is not a master but a slave (brokerId {broker_id} of {master}): slaves hang "
                "off a master, and RocketMQ chains no slave behind a slave",
            )
            continue
        if name not in masters:
            per.used.add(name)
            per.err(
                name,
                f"no master {name!r}: the masters of this cluster are {', '.join(masters)} "
                f"([cluster] brokers = {n_brokers})",
            )
            continue
        count = per.get(name, "int", 0, _slave_count)
        if count is not None:
            counts[name] = count
    return 0, tuple((b, counts[b]) for b in masters if b in counts)


def _slaves_text(exp: Experiment) -> str:
    """The file's slave setting, for messages: ``[cluster] slaves = 1`` or ``= { broker-a = 1 }``."""
    if not exp.broker_slaves:
        return f"[cluster] slaves = {exp.slaves}"
    return "[cluster] slaves = { " + ", ".join(f"{b} = {n}" for b, n in exp.broker_slaves) + " }"


def _engine(v: str) -> str | None:
    if v in ENGINES:
        return None
    if v in ENGINES_NOT_SERVED:
        return f"engine {v!r} is not available: {ENGINES_NOT_SERVED[v]}"
    return f"must be one of {', '.join(ENGINES)}; got {v!r}"


def with_engine(exp: Experiment, engine: str) -> Experiment:
    """The experiment on another engine, checked as if its file said so: ExperimentError at the lines of
    what that engine cannot run."""
    pr = Problems(KeyLines(exp.text))
    problem = _engine(engine)
    if problem:
        raise ExperimentError(exp.source, [(None, f"engine {engine!r}: {problem}")])
    out = replace(exp, engine=engine)
    if engine != "emulator":
        _check_engine(out, pr)
    if pr.items:
        raise ExperimentError(exp.source, pr.items)
    return out


def _check_engine(exp: Experiment, pr: Problems) -> None:
    """What an Apache engine cannot run: rmq-proxy (it speaks the lab's protocol, Apache's broker only
    RocketMQ's remoting; the lab's own consumers and producer speak RocketMQ's there), a server-side
    assignment, and the emulator's own broker controls."""
    engine = exp.engine
    lines = pr.lines
    for i, c in enumerate(exp.consumers):
        if c.client in ENGINE_CLIENTS:
            if c.assignment != "client":
                pr.add(
                    ("consumers", i, "assignment"),
                    f"consumers[{i + 1}].assignment: the lab sets a server assignment through its own admin "
                    f"protocol, which engine {engine!r} does not serve",
                )
            continue
        where = ("consumers", i, "client") if ("consumers", i, "client") in lines.lines else ("consumers", i)
        pr.add(
            where,
            f"consumers[{i + 1}]: engine {engine!r} runs Apache's broker, which speaks only RocketMQ's "
            f"remoting protocol, and {CLIENT_NAMES[c.client]} needs rmq-proxy, which reaches the brokers "
            "with the lab's own protocol: use client = " + ", ".join(f'"{k}"' for k in ENGINE_CLIENTS),
        )
    if exp.policies != Policies():
        pr.add(
            ("policies",),
            f"policies: engine {engine!r} runs Apache's broker, which has none of the lab's policies",
        )
    if exp.acl is not None:
        pr.add(("acl",), f"acl: the lab runs engine {engine!r} without ACL")
    if exp.read_only_brokers:
        pr.add(
            ("cluster", "read_only_brokers"),
            f"cluster.read_only_brokers: the lab sets brokerPermission on its own brokers only, not on "
            f"engine {engine!r}'s",
        )
    if exp.has_slaves and engine not in MASTER_SLAVE_ENGINES:
        pr.add(
            ("cluster", "slaves"),
            f"cluster.slaves: the lab runs engine {engine!r} with masters only (master-slave runs on "
            + ", ".join(("emulator", *MASTER_SLAVE_ENGINES))
            + ")",
        )
    elif exp.replication_lag_ms:
        pr.add(
            ("cluster", "replication_lag_ms"),
            f"cluster.replication_lag_ms: Apache's broker (engine {engine!r}) copies to its slaves as fast "
            "as it can; the lag is the emulator's",
        )
    # Apache's broker persists its offset table every flushConsumerOffsetInterval, which the engine sets
    # to RocketMQ's 5 s (scaled): a file may say so, so that one experiment flushes alike on both brokers.
    if exp.flush_consumer_offset_interval not in (0, APACHE_FLUSH_CONSUMER_OFFSET_INTERVAL):
        pr.add(
            ("cluster", "flush_consumer_offset_interval"),
            f"cluster.flush_consumer_offset_interval: engine {engine!r} flushes offsets at RocketMQ's "
            f"flushConsumerOffsetInterval ({APACHE_FLUSH_CONSUMER_OFFSET_INTERVAL} ms, scaled with "
            "time_scale): leave it out or set that",
        )
    for n in exp.nemeses:
        if n.action in BROKER_ACTIONS:
            pr.add(
                ("nemesis", n.index - 1, "action"),
                f"nemesis[{n.index}].action: {n.action!r} is a request to the lab's broker; Apache's broker "
                f"(engine {engine!r}) has no fault injection or policy switch",
            )
        elif n.action in NETWORK_ACTIONS:
            pr.add(
                ("nemesis", n.index - 1, "action"),
                f"nemesis[{n.index}].action: {n.action!r} needs the lab's fault relay, which speaks only the "
                f"lab's protocol; with engine {engine!r} every client speaks RocketMQ's",
            )


def _policies(pol: _Table | None) -> Policies:
    """[policies]: the brokers' what-if switches."""
    if not pol:
        return Policies()
    policies = Policies(
        notify_on_channel_expired=pol.get("notify_on_channel_expired", "bool", False),
        release_locks_on_close=pol.get("release_locks_on_close", "bool", False),
        init_pop_offset_by_check_msg_in_mem=pol.get("init_pop_offset_by_check_msg_in_mem", "bool", True),
    )
    pol.finish()
    return policies


def _topics(tables: Iterable[_Table], n_brokers: int) -> list[TopicSpec]:
    """[[topics]]: unique names, queues spread evenly over the brokers."""
    topics: list[TopicSpec] = []
    seen: set[str] = set()
    for t in tables:
        tname = t.get("name", "str", _REQUIRED, _name)
        queues = t.get("queues", "int", _REQUIRED, _positive)
        t.finish()
        if tname is None or queues is None:
            continue
        if tname in seen:
            t.err("name", f"topic {tname!r} is declared twice")
        if queues % n_brokers:
            t.err("queues", f"{queues} queues cannot be spread evenly over {n_brokers} brokers")
        seen.add(tname)
        topics.append(TopicSpec(tname, queues))
    return topics


def _consumers(tables: Iterable[_Table], declared: set[str]) -> list[ConsumerSpec]:
    """[[consumers]]: each table is ``count`` processes, numbered consumer-1, consumer-2 ... in order."""
    consumers: list[ConsumerSpec] = []
    number = 0
    for c in tables:
        group = c.get("group", "str", _REQUIRED, _name)
        topic = c.get("topic", "str", _REQUIRED)
        count = c.get("count", "int", 1, _positive)
        strategy = c.get("strategy", "str", "AVG", _one_of(KNOWN_STRATEGIES))
        orderly = c.get("orderly", "bool", False)
        broadcast = c.get("broadcast", "bool", False)
        consume_ms = c.get("consume_ms", "int", 0, _non_negative)
        consume_from = c.get("consume_from", "str", "first", _one_of(CONSUME_FROM))
        client = c.get("client", "str", "python", _one_of(CLIENTS))
        join = c.get("start", "number", 0.0, _non_negative)
        assignment = c.get("assignment", "str", "client", _one_of(ASSIGNMENTS))
        rocketmq5 = c.get("rocketmq5", "bool", False)
        version = c.get("client_version", "str", None, _client_version)
        c.finish()
        if version is not None:
            _check_client_version(c, version, client, bool(rocketmq5) or assignment not in (None, "client"))
        if assignment != "client" and (orderly or broadcast or client not in ("python", "java5")):
            c.err(
                "assignment",
                "a server assignment is for concurrent CLUSTERING consumers of the lab's own client or of "
                'client "java5" (RocketMQ balances orderly and broadcasting consumers in the client)',
            )
        if topic is not None and topic not in declared:
            c.err("topic", f"topic {topic!r} is not declared in [[topics]]")
        if client in REAL_CLIENTS:
            _check_real_client(c, client)
        if group is None or topic is None or count is None or client is None:
            continue
        nodes = tuple(f"consumer-{number + i + 1}" for i in range(count))
        number += count
        consumers.append(
            ConsumerSpec(
                group,
                topic,
                count,
                strategy,
                orderly,
                broadcast,
                consume_ms,
                consume_from,
                nodes,
                client=client,
                start=float(join or 0.0),
                assignment=assignment or "client",
                rocketmq5=bool(rocketmq5),
                client_version=version,
            )
        )
    return consumers


def _client_version(v: str) -> str | None:
    try:
        check_version(v)
    except UnknownVersion as e:
        return str(e)
    return None


def _check_client_version(c: _Table, version: str, client: str | None, rocketmq5: bool) -> None:
    """client_version selects behaviour switches of the lab's own client, within what the table allows."""
    if client is not None and client in REAL_CLIENTS:
        c.err(
            "client_version",
            f"client_version selects the behaviour of the lab's own client; {CLIENT_NAMES[client]} "
            "runs its own release",
        )
    elif rocketmq5 and version in CLIENT_VERSIONS and version < "5":
        c.err(
            "client_version",
            f"{version} is a 4.x release: rocketmq5 and a server assignment need a 5.x client_version "
            f"({', '.join(v for v in CLIENT_VERSIONS if v >= '5')})",
        )


def _workload(w: _Table | None, topics: list[TopicSpec], declared: set[str]) -> WorkloadSpec | None:
    """[workload]: the producers, one set per topic (all declared topics by default)."""
    if not w:
        return None
    rate = w.get("rate", "number", _REQUIRED, _positive)
    count = w.get("count", "int", _REQUIRED, _positive)
    size = w.get("size", "int", 128, lambda v: None if 1 <= v <= _MAX_BODY else f"must be 1..{_MAX_BODY}")
    wtopics = w.get("topics", "str-list", [t.name for t in topics])
    producers = w.get("producers", "int", 1, _positive)
    start = w.get("start", "number", 0.0, _non_negative)
    w.finish()
    for t in wtopics or []:
        if t not in declared:
            w.err("topics", f"topic {t!r} is not declared in [[topics]]")
    if rate is None or count is None:
        return None
    pnodes: list[tuple[str, str]] = []
    for t in wtopics or []:
        for _ in range(producers or 1):
            pnodes.append((f"producer-{len(pnodes) + 1}", t))
    return WorkloadSpec(
        float(rate), count, size, tuple(wtopics or ()), producers or 1, float(start), tuple(pnodes)
    )


def _check_time_scale(root: _Table, time_scale: float | None, consumers: list[ConsumerSpec]) -> None:
    """Real clients keep RocketMQ's own timers: the lab may not run much faster than they do."""
    real = sorted({c.client for c in consumers if c.real})
    if real and time_scale is not None and time_scale < REAL_CLIENT_MIN_TIME_SCALE:
        names = " and ".join(CLIENT_NAMES[k] for k in real)
        root.err(
            "time_scale",
            f"must be >= {REAL_CLIENT_MIN_TIME_SCALE:g} with real clients ({names}), got {time_scale:g}: "
            "they heartbeat every 30 s and renew locks every 20 s whatever the time scale, and a faster "
            "broker would expire their channels and locks",
        )


def _check_consumer_starts(pr: Problems, consumers: list[ConsumerSpec], duration: float | None) -> None:
    for i, c in enumerate(consumers):
        if duration is not None and c.start >= duration:
            pr.add(
                ("consumers", i, "start"),
                f"consumers[{i + 1}].start: start = {c.start:g} is not before the end of the experiment "
                f"(duration = {duration:g})",
            )


def _acl(t: _Table | None, source: str) -> AclSpec | None:
    if t is None:
        return None
    file = t.get("file", "str", _REQUIRED)
    access_key = t.get("access_key", "str", _REQUIRED)
    secret_key = t.get("secret_key", "str", _REQUIRED)
    t.finish()
    if file is None or access_key is None or secret_key is None:
        return None
    base = Path(source).parent if source and not source.startswith("<") else Path.cwd()
    path = (base / file).resolve()
    try:
        accounts = PlainAccessValidator.from_file(str(path)).config.accounts
    except OSError as e:
        t.err("file", f"cannot read {path}: {e.strerror or e}")
        return None
    except AclConfigError as e:
        t.err("file", str(e))
        return None
    account = accounts.get(access_key)
    if account is None or account.secret_key != secret_key or not account.admin:
        t.err(
            "access_key",
            f"must name an admin account of {file} and its secret key (the lab creates topics)",
        )
        return None
    return AclSpec(str(path), access_key, secret_key)


def _check_real_client(c: _Table, client: str) -> None:
    """What the real clients' drivers (interop/) can and cannot do."""
    name = CLIENT_NAMES[client]
    strategy = c.data.get("strategy", "AVG")
    if client == "js" and c.data.get("orderly") is True:
        c.err("orderly", f"{name} consumes concurrently only: remove 'orderly' or use client \"cpp\"")
    if client == "java-lite" and c.data.get("orderly") is True:
        c.err("orderly", f'{name} has no listener to run orderly: use client "java" to consume orderly')
    if client in V5_CLIENTS:
        if c.data.get("orderly") is True:
            c.err("orderly", f"the lab runs {name} as a concurrent push consumer (FIFO is not emulated)")
        if "strategy" in c.data:
            c.err("strategy", f"{name} has no allocation strategy: the broker hands out messages (POP)")
    elif client in ("cpp", "js") and strategy in KNOWN_STRATEGIES and strategy != "AVG":
        c.err("strategy", f'{name} allocates averagely only: use strategy "AVG" or leave it out')
    if c.data.get("broadcast") is True:
        c.err("broadcast", f"the lab runs {name} in clustering mode only: remove 'broadcast'")
    if client in (*JAVA_REMOTING_CLIENTS, "go"):
        if c.data.get("consume_from") == "timestamp":
            c.err("consume_from", f'the lab starts {name} from "first" or "last" only')
    elif "consume_from" in c.data:
        c.err(
            "consume_from",
            f"cannot be set for {name}: its driver keeps the client's own setting (a new group starts "
            "at the first offset of a queue the broker still holds from offset 0)",
        )


_SCHEDULE_KEYS = ("at", "every", "random")


def _nemesis(n: _Table, index: int, pr: Problems) -> NemesisSpec | None:
    action = n.get("action", "str", _REQUIRED, _one_of(ACTIONS))
    target = n.get("target", "str", _REQUIRED)
    group = n.get("group", "str", None)
    at = n.get("at", "number-list", None, _all_non_negative)
    every = n.get("every", "number", None, _positive)
    start = n.get("from", "number", None, _non_negative)
    until = n.get("until", "number", None, _positive)
    times = n.get("times", "int", None, _positive)
    random_count = n.get("random", "int", None, _positive)
    for_s = n.get("for", "number", None, _positive)
    params: dict[str, Any] = {}
    if action in ("restart", "failover"):
        params["mode"] = n.get("mode", "str", "stop", _one_of(("stop", "kill")))
    if action == "restart":
        params["down"] = n.get("down", "number", 0.0, _non_negative)
    if action in NETWORK_ACTIONS:
        params["broker"] = n.get("broker", "str", "all")
    if "peer" in n.data and action not in KERNEL_NETWORK_ACTIONS:
        n.get("peer", "str", None)
        kernel = ", ".join(KERNEL_NETWORK_ACTIONS)
        n.err("peer", f"'peer' goes with {kernel} (the kernel's faults), not {action!r}")
    if action in KERNEL_NETWORK_ACTIONS and "peer" in n.data:
        # the other end of the link, any node: "broker" is the same key for brokers only, and keeps
        # its name in the schedule and the events
        if "broker" in n.data:
            n.err("peer", "give 'broker' or 'peer', not both")
        params["broker"] = n.get("peer", "str", "all")
    if action in ("blackhole", "loss") and "direction" in n.data:
        # one-way faults: "out" drops what the node sends to its peer, "in" what it receives
        params["direction"] = n.get("direction", "str", "both", _one_of(PARTITION_DIRECTIONS))
    if action == "loss":
        params["percent"] = n.get("percent", "number", _REQUIRED, _percent)
    if action == "latency":
        params["ms"] = n.get("ms", "number", _REQUIRED, _positive)
        params["jitter_ms"] = n.get("jitter_ms", "number", 0, _non_negative)
    if action == "fault":
        code = n.get("code", "any", _REQUIRED)
        if code is not None and request_code(code) is None:
            n.err("code", f'must be a request code number or name (11 or "PULL_MESSAGE"), got {code!r}')
        params["code"] = request_code(code) if code is not None else None
        errors = n.get("errors", "str-list", [])
        parsed = []
        for e in errors or []:
            try:
                parsed.append(parse_error_spec(e))
            except ValueError as exc:
                n.err("errors", str(exc))
        params["errors"] = parsed
        params["count"] = n.get("count", "int", None, _positive)
        params["latency_ms"] = n.get("latency_ms", "number", 0, _non_negative)
        params["drop"] = n.get("drop", "bool", False)
        params["client"] = n.get("client", "str", None)
        if not parsed and not params["latency_ms"] and not params["drop"]:
            n.err(None, "a fault needs at least one of 'errors', 'latency_ms' or 'drop'")
    if action == "policy":
        for key in ("notify_on_channel_expired", "release_locks_on_close"):
            v = n.get(key, "bool", None)
            if v is not None:
                params[key] = v
        if not params:
            n.err(None, "a policy action needs notify_on_channel_expired and/or release_locks_on_close")
    n.finish()
    given = [k for k in _SCHEDULE_KEYS if k in n.data]
    if len(given) != 1:
        n.err(None, "give exactly one of 'at', 'every' or 'random' (seconds)")
    if "every" not in n.data and "random" not in n.data:
        for k in ("from", "until"):
            if k in n.data:
                n.err(k, f"'{k}' only goes with 'every' or 'random'")
    if "times" in n.data and "every" not in n.data:
        n.err("times", "'times' only goes with 'every'")
    if for_s is not None and action not in (*UNDO, "fault"):
        n.err("for", f"'for' is not supported by {action!r} (only by {', '.join((*UNDO, 'fault'))})")
    if action is None or target is None:
        return None
    return NemesisSpec(
        index=index,
        line=pr.lines.line_of(n.path),
        action=action,
        target=target,
        group=group,
        at=tuple(float(x) for x in _as_list(at)) if at is not None else (),
        every=float(every) if every is not None else None,
        start=float(start) if start is not None else None,
        until=float(until) if until is not None else None,
        times=times,
        random_count=random_count,
        for_s=float(for_s) if for_s is not None else None,
        params=params,
        peer_given=action in KERNEL_NETWORK_ACTIONS and "peer" in n.data,
    )


def _check_nemeses(exp: Experiment, pr: Problems) -> None:
    nodes = exp.nodes()
    groups = {c.group for c in exp.consumers}
    servers = (*exp.brokers, *exp.slave_nodes())
    for n in exp.nemeses:
        path = ("nemesis", n.index - 1)

        def err(key: str | None, msg: str, path: tuple[Any, ...] = path) -> None:
            p = (*path, key) if key else path
            pr.add(p, f"{_where(p)}: {msg}")

        if n.group is not None and n.group not in groups:
            err("group", f"no [[consumers]] table has group {n.group!r}")
        if ":" in n.target:
            role, _, sel = n.target.partition(":")
            if role not in ROLES or sel not in SELECTORS:
                err(
                    "target",
                    f"target {n.target!r} must be a node name or ROLE:SELECTOR with ROLE one of "
                    f"{', '.join(ROLES)} and SELECTOR one of {', '.join(SELECTORS)}",
                )
                continue
            if n.group is not None and role != "consumer" and n.action not in ("fault", "fault-clear"):
                err("group", "'group' selects consumers; the target is not a consumer")
            if not candidates(n.target, n.group, nodes):
                err("target", f"no node matches {n.target!r}" + (f" in group {n.group!r}" if n.group else ""))
                continue
            roles = {role}
        else:
            if n.target not in nodes:
                known = ", ".join(sorted(nodes, key=node_order))
                try:
                    master, _ = slave_of(n.target)
                except ValueError:
                    master = ""
                if master in exp.brokers:
                    err(
                        "target",
                        f"no slave {n.target!r}: {master} has {exp.slave_count(master)} slave(s) "
                        f"({_slaves_text(exp)}; nodes of this experiment: {known})",
                    )
                else:
                    err("target", f"unknown node {n.target!r} (nodes of this experiment: {known})")
                continue
            roles = {nodes[n.target].role}
        other = n.params.get("broker", "all")
        client_target = roles <= {"consumer", "producer"}
        if n.action in NETWORK_ACTIONS and not client_target and n.action not in KERNEL_NETWORK_ACTIONS:
            err("target", f"{n.action!r} acts on a client's link to a broker: target a consumer or producer")
        elif n.action in ("blackhole", "loss") and not client_target and other == "all":
            err(None, f"{n.action!r} on {n.target}, a server, needs the other end of the link: 'peer'")
        elif n.action in NETWORK_ACTIONS:
            real = [c for c in candidates(n.target, n.group, nodes) if nodes[c].client in REAL_CLIENTS]
            if real:
                err(
                    "target",
                    f"{n.action!r} needs the lab's fault relay, which speaks only the lab's own protocol: "
                    f"it cannot sit in front of real clients ({', '.join(real)})",
                )
        if n.action in ("hang", "unhang"):
            hangable = [
                c
                for c in candidates(n.target, n.group, nodes)
                if nodes[c].role == "consumer" and nodes[c].client in (None, "python", *HANGABLE_REAL_CLIENTS)
            ]
            if (
                roles != {"consumer"}
                or not hangable
                or len(hangable) != len(candidates(n.target, n.group, nodes))
            ):
                err(
                    "target",
                    f"{n.action!r} hangs the listener of the lab's own consumers and of the v5 and Java "
                    "clients' drivers: target those only",
                )
        if n.action in BROKER_ACTIONS and not roles <= {"broker", "slave"}:
            err("target", f"{n.action!r} is sent to a broker: target one of {', '.join(exp.brokers)}")
        if n.action == "failover":
            if exp.controller and n.for_s is not None:
                err(
                    "for",
                    "under the controller 'failover' elects a slave and the old master stays up as a "
                    "slave: there is nothing to undo, remove 'for'",
                )
            with_slaves = [b for b in exp.brokers if exp.slave_count(b)]
            alone = [
                c for c in candidates(n.target, n.group, nodes) if c in exp.brokers and c not in with_slaves
            ]
            if not with_slaves:
                err(None, "'failover' switches a master to its slave: give [cluster] slaves >= 1")
            elif roles != {"broker"}:
                err("target", f"'failover' acts on a master: target one of {', '.join(with_slaves)}")
            elif alone:
                err(
                    "target",
                    f"'failover' switches a master to its slave, and {', '.join(alone)} "
                    f"{'has' if len(alone) == 1 else 'have'} none ({_slaves_text(exp)}): target "
                    + ", ".join(with_slaves),
                )
        if n.action in NETWORK_ACTIONS and n.peer_given:
            if other != "all" and other not in nodes:
                known = ", ".join(sorted(nodes, key=node_order))
                err("peer", f'unknown node {other!r} (nodes of this experiment: {known}, or "all")')
            elif other == n.target:
                err("peer", "a link has two ends: the peer is the target itself")
        elif n.action in NETWORK_ACTIONS and other not in ("all", NAMESRV_NODE, *servers):
            names = ", ".join(servers)
            err("broker", f'unknown broker {other!r} (brokers: {names}, or "all")')
        if n.action == "fault" and n.params.get("client") is not None:
            c = n.params["client"]
            if c not in nodes or nodes[c].role not in ("consumer", "producer"):
                err("client", f"'client' must name a consumer or producer node, got {c!r}")
        for t in n.at:
            if t >= exp.duration:
                err("at", f"at = {t:g} is not before the end of the experiment (duration = {exp.duration:g})")
        if n.until is not None and n.start is not None and n.until <= n.start:
            err("until", "'until' must be after 'from'")
        if n.every is not None and (n.start if n.start is not None else n.every) >= exp.duration:
            err("every", "the first occurrence is not before the end of the experiment")
