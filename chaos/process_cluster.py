"""A local cluster built from the roles' command lines: name server, brokers, producers, consumers.

``LocalCluster`` is the lab's Backend (``lab.backend``) on local processes: the Runner declares an
experiment's nodes on it and drives them through it. This is where the lab knows the CLIs of
CONVENTIONS.md; the supervisor below it only knows processes.
Consumers (and producers) that network nemeses may target get their own fault relays (``ClientLinks``)
and reach the name server and every broker through them. Real RocketMQ clients (``add_real_consumer``)
need the servers' native ports (``native=True``) and reach the name server's directly.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from rmqlab.chaos.fault_relay import ClientLinks
from rmqlab.chaos.realclients import RealClients, check_environment
from rmqlab.chaos.supervisor import EventSink, Member, Supervisor, SupervisorError
from rmqlab.lab.admin_client import AdminClient, route_brokers
from rmqlab.lab.backend import NodeError
from rmqlab.lab.experiment import (
    JAVA_CLIENTS,
    JAVA_REMOTING_CLIENTS,
    NETWORK_ACTIONS,
    V5_CLIENTS,
    ConsumerSpec,
    Experiment,
    ExperimentError,
    KeyLines,
    slave_of,
)
from rmqlab.protocol.acl_signing import ENV_ACCESS_KEY, ENV_SECRET_KEY, SessionCredentials

NAMESRV_MODULE = "rmqlab.broker.namesrv_main"
BROKER_MODULE = "rmqlab.broker"
CONSUMER_MODULE = "rmqlab.client.consumer_main"
PRODUCER_MODULE = "rmqlab.client.producer_main"
PROXY_MODULE = "rmqlab.proxy"
PROXY_NODE = "proxy"
# An Apache engine's name server and brokers: each a JVM under this launcher (interop/apache/member.py).
APACHE_MEMBER_MODULE = "rmqlab.interop.apache.member"
APACHE_ENGINE_MODULE = "rmqlab.interop.apache.engine"
# A JVM broker's start, its registration and its topics' routes take longer than our broker's start.
APACHE_READY_TIMEOUT_S = 120.0


def engine_workload_is_ours(exp: Experiment) -> bool:
    """Whether an engine run's workload is the lab's producer (over RocketMQ's protocol) rather than
    Apache's Go producer: when the lab's own consumers are in the experiment, so that a run of the lab's
    client on Apache's broker is the lab's client throughout; Apache's clients keep Apache's producer."""
    return any(not c.real for c in exp.consumers)


def check_engine_environment(exp: Experiment, clients: RealClients, python: str = sys.executable) -> None:
    """ExperimentError at the engine's line when it cannot run here (no JDK, jars not fetched), and at
    [workload] when Apache's Go producer sends it (``engine_workload_is_ours``) and is not built."""
    lines = KeyLines(exp.text)
    problems: list[tuple[int | None, str]] = []
    try:
        done = subprocess.run(
            [python, "-m", APACHE_ENGINE_MODULE, "check", "--engine", exp.engine],
            capture_output=True,
            text=True,
            timeout=120,
        )
        why = None if done.returncode == 0 else (done.stderr.strip() or done.stdout.strip())
    except (OSError, subprocess.TimeoutExpired) as e:
        why = f"the engine's check did not run: {e}"
    if why:
        problems.append(
            (lines.line_of(("cluster", "engine")), f"cluster.engine: {why.removeprefix('error: ')}")
        )
    if exp.workload and not engine_workload_is_ours(exp) and (missing := clients.missing("go")):
        problems.append(
            (
                lines.line_of(("workload",)),
                f"workload: with engine {exp.engine!r} Apache's Go producer sends the messages; " + missing,
            )
        )
    if problems:
        raise ExperimentError(exp.source, problems)


class LocalCluster:
    """A name server, brokers and their admin client, as local processes."""

    kind = "local"
    # Network actions done through a client's fault relay: here, all of them.
    relayed_actions: tuple[str, ...] = NETWORK_ACTIONS

    def __init__(
        self,
        run_dir: str | Path,
        *,
        time_scale: float,
        log: EventSink | None = None,
        seed: int = 0,
        ready_timeout_s: float = 30.0,
        stop_timeout_s: float = 10.0,
        env: dict[str, str] | None = None,
        credentials: SessionCredentials | None = None,
        clients: RealClients | None = None,
        metrics: bool = False,
    ) -> None:
        self.run_dir = Path(run_dir).resolve()  # paths given to children must not depend on their cwd
        self.clients = clients or RealClients()  # where the real clients' drivers are
        self.exp: Experiment | None = None  # the experiment declared on it
        if credentials is not None:
            # the lab's clients read these (RMQ_ACCESS_KEY / RMQ_SECRET_KEY) and sign every request
            env = {
                **(env or {}),
                ENV_ACCESS_KEY: credentials.access_key,
                ENV_SECRET_KEY: credentials.secret_key,
            }
        self.time_scale = time_scale
        self.seed = seed
        self.sup = Supervisor(
            self.run_dir,
            time_scale=time_scale,
            log=log,
            ready_timeout_s=ready_timeout_s,
            stop_timeout_s=stop_timeout_s,
            env=env,
        )
        self.admin = AdminClient(timeout_s=max(2.0, 5.0 * time_scale), credentials=credentials)
        self.links: dict[str, ClientLinks] = {}
        self._proxied: set[str] = set()
        self.namesrv: str | None = None
        self.brokers: dict[str, str] = {}  # broker name -> address (the masters)
        self.slaves: dict[str, str] = {}  # slave node (<broker>-s<id>) -> address
        # RocketMQ's native remoting ports, when the servers were declared with native=True.
        self.namesrv_native: str | None = None
        self.brokers_native: dict[str, str] = {}
        # The members that are Apache's JVMs (engine = "apache-..."): they serve RocketMQ's protocol only.
        self.engine_nodes: set[str] = set()
        # Every name server, broker and consumer of ours serves live metrics (--metrics-port 0, kept
        # across restarts like the other ports); metrics_endpoints() says where.
        self.metrics = metrics

    # -- declaring and starting -------------------------------------------------------------------
    # Servers listen on port 0 and keep the port they got (from their READY line) across restarts, so
    # nothing can take a port between choosing and binding it. Clients name the name server as
    # "{namesrv}" (or "{namesrv@NODE}" through their fault relays), filled in once it is known.

    # Servers declared with native=True also open RocketMQ's native remoting port (--remoting-port 0);
    # a stand-alone name server then routes real clients to the brokers' native ports.

    def add_namesrv(
        self, node: str = "namesrv", *, native: bool = False, flags: list[str] | None = None
    ) -> Member:
        args = ["--host", "127.0.0.1", "--port", "0"] + (["--remoting-port", "0"] if native else [])
        args += flags or []
        return self.sup.add(node, "namesrv", NAMESRV_MODULE, args + self._metrics_args(), port=0)

    def add_broker(
        self,
        name: str,
        *,
        durable: bool = False,
        flags: list[str] | None = None,
        native: bool = False,
        broker_name: str | None = None,
    ) -> Member:
        """A broker node; a slave's node name differs from its ``broker_name`` (its master's)."""
        args = ["--host", "127.0.0.1", "--port", "0", "--broker-name", broker_name or name]
        args += ["--namesrv", "{namesrv}"]
        if native:
            args += ["--remoting-port", "0"]
        if durable:
            store = self.run_dir / "store" / name
            store.mkdir(parents=True, exist_ok=True)
            args += ["--store-dir", str(store)]
        args += flags or []
        return self.sup.add(name, "broker", BROKER_MODULE, args + self._metrics_args(), port=0)

    def _metrics_args(self) -> list[str]:
        return ["--metrics-port", "0"] if self.metrics else []

    def metrics_endpoints(self) -> dict[str, str]:
        """Node -> the URL of its metrics, for the members that serve them and are up."""
        out = {}
        for m in self.sup:
            words = (m.ready_info or "").split()
            addr = next((w.removeprefix("metrics=") for w in words[1:] if w.startswith("metrics=")), None)
            if addr:
                out[m.node] = f"http://{addr}/metrics"
        return out

    def add_proxy(self, node: str = PROXY_NODE) -> Member:
        """rmq-proxy, the gRPC endpoint Apache's RocketMQ 5 clients talk to, over the name server's routes.

        Its own timers (the 120 s client expiry, the 5 s renewal scan) follow the time scale; the times the
        v5 clients send (invisible durations, long polls) pass through as they are.
        """
        args = ["--host", "127.0.0.1", "--port", "0", "--namesrv", "{namesrv}"]
        return self.sup.add(node, "proxy", PROXY_MODULE, args, port=0)

    def _namesrv_arg(self, node: str, proxied: bool) -> str:
        if proxied:
            self._proxied.add(node)
            return "{namesrv@" + node + "}"
        return "{namesrv}"

    def add_consumer(
        self,
        node: str,
        *,
        group: str,
        topic: str,
        strategy: str = "AVG",
        orderly: bool = False,
        broadcast: bool = False,
        consume_ms: int = 0,
        consume_from: str = "first",
        proxied: bool = False,
        extra: list[str] | None = None,
    ) -> Member:
        args = ["--namesrv", self._namesrv_arg(node, proxied), "--group", group, "--topic", topic]
        args += ["--strategy", strategy, "--consume-from", consume_from]
        if orderly:
            args.append("--orderly")
        if broadcast:
            # one instance name per node, as one host each would give: the node keeps its client id,
            # and so its local offset file, across restarts (kept in the run directory)
            args += ["--broadcast", "--instance-name", node]
            args += ["--set", f"local_offset_store_dir={self.run_dir / 'offsets'}"]
        if consume_ms:
            args += ["--consume-ms", str(consume_ms)]
        args += extra or []
        args += self._metrics_args()
        return self.sup.add(node, "consumer", CONSUMER_MODULE, args, group=group, client="python")

    def add_real_consumer(
        self,
        node: str,
        *,
        client: str,
        group: str,
        topic: str,
        orderly: bool = False,
        consume_ms: int = 0,
        strategy: str = "AVG",
        consume_from: str = "first",
        clients: RealClients | None = None,
    ) -> Member:
        """A real RocketMQ client through its driver: ``cpp``, ``js``, ``go`` and Apache's Java remoting
        clients pointed at the native name server, ``py5``, ``js5`` and ``java-grpc`` (push consumers) at
        rmq-proxy (``add_proxy``).

        Only the Java remoting clients get --time-scale (their driver scales the timers the client lets
        be set); the others keep RocketMQ's own timers. ``strategy`` and ``consume_from`` reach the
        drivers that take them (Java's and Go's; the others keep their client's own).
        """
        clients = clients or RealClients()
        if client in V5_CLIENTS:
            args = ["--endpoints", "{proxy}", "--group", group, "--topic", topic]
            args += [] if client in JAVA_CLIENTS else ["--kind", "push"]
        else:
            args = ["--namesrv", "{namesrv_native}", "--group", group, "--topic", topic]
            if client not in JAVA_CLIENTS:  # a Java client's message names its broker itself
                args += ["--broker-addrs", "{broker_addrs}"]
        if client in (*JAVA_REMOTING_CLIENTS, "go"):
            args += ["--strategy", strategy, "--consume-from", consume_from]
        if consume_ms:
            args += ["--consume-ms", str(consume_ms)]
        if orderly:
            if client not in ("cpp", "go", "java", "java5"):
                raise ValueError(f"{node}: the {client} client consumes concurrently only")
            args.append("--orderly")
        if client in ("cpp", "go", *JAVA_CLIENTS):
            # The client's own log (its rebalance and pull decisions) stays with the run.
            args += ["--client-log-dir", str(self.run_dir / f"{node}.client-log")]
        return self.sup.add(
            node,
            "consumer",
            f"interop:{client}",
            args,
            group=group,
            program=clients.program(client),
            time_scaled=client in JAVA_REMOTING_CLIENTS,
            client=client,
        )

    def add_producer(
        self,
        node: str,
        *,
        topic: str,
        rate: float,
        count: int,
        size: int = 128,
        group: str | None = None,
        proxied: bool = False,
        native: bool = False,
    ) -> Member:
        """The lab's producer; ``native``: over RocketMQ's own protocol (an Apache engine's broker)."""
        args = ["--namesrv", self._namesrv_arg(node, proxied), "--topic", topic]
        args += ["--rate", f"{rate:g}", "--count", str(count), "--size", str(size)]
        if group:
            args += ["--group", group]
        if native:
            args += ["--protocol", "native"]
        return self.sup.add(node, "producer", PRODUCER_MODULE, args, expect_exit=True)

    async def start_all(
        self, nodes: list[str], timeout_s: float | None = None, *, nemesis: bool = False
    ) -> None:
        """Spawn the nodes together, then wait until each is ready (startup overlaps on several cores)."""
        for n in nodes:
            self.sup.spawn(n, nemesis=nemesis)
        for n in nodes:
            await self.sup.await_ready(n, timeout_s)
            m = self.sup.member(n)
            if n in self.engine_nodes:
                m.native_port = m.port  # Apache's servers have one port, RocketMQ's protocol
            if m.role == "namesrv":
                self.namesrv = m.address
                self.sup.vars["namesrv"] = m.address or ""
                if m.native_address:
                    self.namesrv_native = m.native_address
                    self.sup.vars["namesrv_native"] = m.native_address
            elif m.role == "proxy":
                self.sup.vars["proxy"] = m.address or ""
            elif m.role == "broker" and self.exp is not None and n in self.exp.slave_nodes():
                self.slaves[n] = m.address or ""
            elif m.role == "broker":
                self.brokers[n] = m.address or ""
                if m.native_address:
                    self.brokers_native[n] = m.native_address
                    self.sup.vars["broker_addrs"] = ",".join(
                        f"{b}={a}" for b, a in sorted(self.brokers_native.items())
                    )

    async def start_links(self) -> None:
        """Start the fault relays of the clients that need them (after the brokers are up)."""
        if self.namesrv is None:
            raise RuntimeError("start the name server and brokers first")
        for node in sorted(self._proxied - set(self.links)):
            links = await ClientLinks(node, self.namesrv, self.servers(), seed=self.seed).start()
            self.links[node] = links
            self.sup.vars["namesrv@" + node] = links.namesrv_address

    def servers(self) -> dict[str, str]:
        """Every broker node's address: the masters, then their slaves."""
        return {**self.brokers, **self.slaves}

    async def create_topic(self, topic: str, queues_per_broker: int, timeout_s: float = 30.0) -> None:
        """Create the topic on every broker and wait until the name server routes it to all of them."""
        for addr in self.brokers.values():
            await self.admin.topic_create(addr, topic, queues_per_broker)
        if self.namesrv is None:
            return
        deadline = time.monotonic() + timeout_s
        while True:
            route = await self.admin.route(self.namesrv, topic)
            if route_brokers(route) >= set(self.brokers):
                return
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"the name server does not route {topic} to every broker after {timeout_s:g}s "
                    f"(it knows {sorted(route_brokers(route))})"
                )
            await asyncio.sleep(0.1)

    async def prepare(self) -> list[str]:
        """Anything the backend needs before nodes are declared (local processes need nothing)."""
        return []

    # -- the Backend seam: an experiment's nodes --------------------------------------------------------

    def declare(self, exp: Experiment) -> None:
        """Every node of the experiment, with the command line of its role. Real 4.x clients speak
        RocketMQ's own protocol: the servers open their native ports for them. Apache's v5 clients speak
        gRPC to rmq-proxy, which talks to the brokers as our clients do."""
        self.exp = exp
        real = exp.real_clients()
        if real:
            check_environment(exp, self.clients)
        if exp.engine != "emulator":
            self._declare_engine(exp)
            return
        native = bool(real - set(V5_CLIENTS))
        self.add_namesrv(native=native, flags=exp.namesrv_flags())
        acl = ["--acl", exp.acl.file] if exp.acl else []
        # a master creates the topics at each start, as the simulator's do: one started again without its
        # store (durable = false) has them again, as an operator's updateTopic for the cluster would give
        topics = [
            f
            for t in exp.topics
            for f in ("--create-topic", f"{t.name}:{exp.topic_queues_per_broker(t.name)}")
        ]
        for b in exp.brokers:
            # brokerPermission 4 (read only): every topic registered without write permission
            perm = ["--broker-permission", "4"] if b in exp.read_only_brokers else []
            flags = exp.broker_flags(b) + perm + topics + acl
            self.add_broker(b, durable=exp.durable, flags=flags, native=native)
            for s in exp.slave_nodes(b):
                flags = exp.slave_flags(s) + acl
                self.add_broker(s, durable=exp.durable, flags=flags, native=native, broker_name=b)
        if real & set(V5_CLIENTS):
            self.add_proxy()
        proxied = exp.network_targets(self.relayed_actions)
        for c in exp.consumers:
            for node in c.nodes:
                if c.real:
                    self._add_real_consumer_of(node, c)
                    continue
                self._add_consumer_of(node, c, proxied=node in proxied)
        if exp.workload:
            w = exp.workload
            for node, topic in w.nodes:
                self.add_producer(
                    node, topic=topic, rate=w.rate, count=w.count, size=w.size, proxied=node in proxied
                )

    def _add_consumer_of(
        self, node: str, c: ConsumerSpec, *, proxied: bool, extra: list[str] | None = None
    ) -> Member:
        """The lab's own consumer as the experiment's consumer table declares it."""
        return self.add_consumer(
            node,
            group=c.group,
            topic=c.topic,
            strategy=c.strategy,
            orderly=c.orderly,
            broadcast=c.broadcast,
            consume_ms=c.consume_ms,
            consume_from=c.consume_from,
            proxied=proxied,
            extra=[*c.client_args(), *(extra or [])],
        )

    def _add_real_consumer_of(self, node: str, c: ConsumerSpec) -> Member:
        """A real client's consumer as the experiment's consumer table declares it."""
        return self.add_real_consumer(
            node,
            client=c.client,
            group=c.group,
            topic=c.topic,
            orderly=c.orderly,
            consume_ms=c.consume_ms,
            strategy=c.strategy,
            consume_from=c.consume_from,
            clients=self.clients,
        )

    def _declare_engine(self, exp: Experiment) -> None:
        """An Apache engine's name server and brokers (each broker creates the experiment's topics on
        itself) and the consumers: Apache's clients, and the lab's own over RocketMQ's protocol
        (``--protocol native``). The workload is the lab's producer over that protocol when the lab's
        consumers are in the experiment, else Apache's Go producer (``engine_workload_is_ours``)."""
        self._check_engine(exp)
        base = ["--engine", exp.engine, "--run-dir", str(self.run_dir / "engine"), "--port", "0"]
        self.sup.add("namesrv", "namesrv", APACHE_MEMBER_MODULE, ["--role", "namesrv", *base], port=0)
        self.engine_nodes.add("namesrv")
        topics = [f"{t.name}:{exp.topic_queues_per_broker(t.name)}" for t in exp.topics]
        for b in exp.brokers:
            args = ["--role", "broker", *base, "--name", b, "--namesrv", "{namesrv}"]
            read = ["--slave-read-enable"] if exp.slave_read_enable else []
            role = ["--broker-role", exp.broker_role, *read] if exp.slave_count(b) else []
            topics_of = [a for t in topics for a in ("--topic", t)]
            self.sup.add(b, "broker", APACHE_MEMBER_MODULE, args + role + topics_of, port=0)
            self.engine_nodes.add(b)
            # Apache's slaves: the master's brokerName, brokerId 1..N, brokerRole SLAVE
            for s in exp.slave_nodes(b):
                slave = [*args, "--broker-id", str(slave_of(s)[1]), *read]
                self.sup.add(s, "broker", APACHE_MEMBER_MODULE, slave, port=0)
                self.engine_nodes.add(s)
        for c in exp.consumers:
            for node in c.nodes:
                if c.real:
                    self._add_real_consumer_of(node, c)
                else:  # the lab's own consumer over RocketMQ's protocol, as Apache's broker speaks
                    self._add_consumer_of(node, c, proxied=False, extra=["--protocol", "native"])
        if exp.workload and engine_workload_is_ours(exp):
            w = exp.workload
            for node, topic in w.nodes:
                self.add_producer(node, topic=topic, rate=w.rate, count=w.count, size=w.size, native=True)
        elif exp.workload:
            w = exp.workload
            for node, topic in w.nodes:
                args = ["--namesrv", "{namesrv_native}", "--topic", topic, "--rate", f"{w.rate:g}"]
                args += ["--count", str(w.count), "--size", str(w.size)]
                args += ["--client-log-dir", str(self.run_dir / f"{node}.client-log")]
                self.sup.add(
                    node,
                    "producer",
                    "interop:go",
                    args,
                    program=[*self.clients.program("go"), "producer"],
                    time_scaled=False,
                    expect_exit=True,
                )

    def _check_engine(self, exp: Experiment) -> None:
        check_engine_environment(exp, self.clients, self.sup.python)

    async def start_servers(self) -> None:
        """The name server, the brokers, the topics (routed to every broker), then what the clients reach
        the servers through: their fault relays and rmq-proxy."""
        exp = self.exp
        assert exp is not None, "declare the experiment first"
        if exp.engine != "emulator":
            # Apache's JVMs; each broker created the topics on itself and waited for their routes.
            timeout = max(self.sup.ready_timeout_s, APACHE_READY_TIMEOUT_S)
            await self.start_all(["namesrv"], timeout)
            await self.start_all(list(exp.brokers), timeout)
            if exp.has_slaves:  # after their masters, as with the emulator
                await self.start_all(list(exp.slave_nodes()), timeout)
            return
        await self.start_all(["namesrv"])
        await self.start_all(list(exp.brokers))
        for t in exp.topics:
            per_broker = exp.topic_queues_per_broker(t.name)
            await self.create_topic(t.name, per_broker, timeout_s=self.sup.ready_timeout_s)
        # the slaves after their masters: each finds its master in the answer to its registration and
        # copies the topics with the master's offsets in its first sync
        if exp.has_slaves:
            await self.start_all(list(exp.slave_nodes()))
        await self.start_links()
        if PROXY_NODE in self.sup.members:
            await self.start_all([PROXY_NODE])

    async def set_message_request_mode(self, topic: str, group: str, mode: str) -> None:
        for addr in self.brokers.values():
            await self.admin.set_message_request_mode(addr, topic, group, mode, -1)

    def member(self, node: str) -> Member:
        m = self.sup.member(node)
        self.sup.refresh(m)
        return m

    def members(self) -> Iterator[Member]:
        for m in self.sup:
            self.sup.refresh(m)
            yield m

    async def start(self, nodes: Sequence[str], *, nemesis: bool = False) -> None:
        await self.start_all(list(nodes), nemesis=nemesis)

    async def stop(self, node: str) -> None:
        await self.sup.astop(node)

    async def kill(self, node: str) -> None:
        await self.sup.akill(node)

    async def restart(self, node: str, *, mode: str, down_s: float) -> None:
        await self.sup.arestart(node, mode=mode, down_s=down_s)

    async def pause(self, node: str, *, gc: bool = False) -> None:
        self.sup.pause(node, **({"gc": True} if gc else {}))

    async def resume(self, node: str, *, gc: bool = False) -> None:
        self.sup.resume(node, **({"gc": True} if gc else {}))

    async def hang(self, node: str) -> None:
        self.sup.hang(node)

    async def unhang(self, node: str) -> None:
        self.sup.unhang(node)

    def faulty_links(self) -> Iterator[str]:
        for m in sorted(self.sup, key=lambda m: m.node):
            if self.network_faulty(m.node):
                yield m.node

    def _running_broker(self, broker: str) -> str:
        """The broker's address, refused at once when it is not running, as a refused connect would be:
        a killed broker's container takes its address along, and the admin connect would wait for its
        timeout instead."""
        m = self.member(broker)
        if m.state not in ("running", "paused"):
            raise SupervisorError(f"{broker} is not running ({m.state})")
        return self.servers()[broker]

    async def fault_add(self, broker: str, request: dict[str, Any]) -> int:
        return await self.admin.fault_add(self._running_broker(broker), **request)

    async def elect_master(self, broker: str, broker_id: int) -> None:
        if self.namesrv is None:
            raise NodeError("the name server is not up")
        await self.admin.elect_master(self.namesrv, broker, broker_id)

    async def fault_clear(self, broker: str) -> None:
        await self.admin.fault_clear(self._running_broker(broker))

    async def policy_set(
        self,
        broker: str,
        *,
        notify_on_channel_expired: bool | None = None,
        release_locks_on_close: bool | None = None,
    ) -> None:
        await self.admin.policy_set(
            self._running_broker(broker),
            notify_on_channel_expired=notify_on_channel_expired,
            release_locks_on_close=release_locks_on_close,
        )

    async def kill_clients(self) -> list[str]:
        killed = await self.kill_role("consumer")
        return killed + await self.kill_role("producer")

    async def apply_network(self, node: str, action: str, broker: str = "all", **params: Any) -> list[str]:
        """A network nemesis on the node's links (KeyError when the node has no fault relay)."""
        if params.pop("direction", "both") != "both":
            raise ValueError("a one-way partition needs the docker backend (the fault relay cuts both ways)")
        if action == "loss":
            raise ValueError("packet loss needs the docker backend (the fault relay relays a byte stream)")
        if node not in self.links:
            raise ValueError(f"{node} has no fault relay: a link of a server needs the docker backend")
        params.pop("percent", None)
        return self.links[node].apply(action, broker, **params)

    def network_via(self, action: str, node: str, other: str = "all") -> str:
        """The mechanism that does a network fault on the node's link (here always the fault relay)."""
        return "relay"

    def network_faulty(self, node: str) -> bool:
        """Whether a network fault is in force on one of the node's links."""
        links = self.links.get(node)
        return links is not None and any(
            p.latency_ms or p.blackholed or p.refusing for p in links.select("all")
        )

    # -- stopping --------------------------------------------------------------------------------

    async def stop_role(self, role: str, timeout_s: float | None = None) -> None:
        """Gracefully stop every live member of a role, all at once."""
        nodes = []
        for m in self.sup:
            self.sup.refresh(m)
            if m.role == role and m.state in ("starting", "running", "paused"):
                nodes.append(m.node)
        await asyncio.gather(*(self.sup.astop(n, timeout_s=timeout_s, nemesis=False) for n in nodes))

    async def kill_role(self, role: str) -> list[str]:
        """SIGKILL every live member of a role at once, without a nemesis event (the end of a run)."""
        nodes = []
        for m in self.sup:
            self.sup.refresh(m)
            if m.role == role and m.state in ("starting", "running", "paused", "stopping"):
                nodes.append(m.node)
        await asyncio.gather(*(self.sup.akill(n, nemesis=False) for n in nodes))
        return nodes

    async def close(self) -> None:
        """Stop everything that is left (consumers first, so they can leave their group cleanly)."""
        try:
            for role in ("consumer", "producer", "broker", "namesrv"):
                await self.stop_role(role)
        finally:
            self.sup.close()
            for links in self.links.values():
                await links.close()
            await self.admin.close()

    def manifest(self) -> dict[str, Any]:
        nodes = {}
        for node, info in self.sup.manifest().items():
            info = dict(info)
            info["log_files"] = [str(Path(p).relative_to(self.run_dir)) for p in info["log_files"]]
            info["out_file"] = str(Path(info["out_file"]).relative_to(self.run_dir))
            if node in self.links:
                info["relays"] = self.links[node].state()
            nodes[node] = info
        return {
            "namesrv": self.namesrv,
            "brokers": dict(self.brokers),
            "slaves": dict(self.slaves),
            "native": {"namesrv": self.namesrv_native, "brokers": dict(self.brokers_native)},
            "ports": {n: m.port for n, m in self.sup.members.items() if m.port is not None},
            "nodes": nodes,
        }
