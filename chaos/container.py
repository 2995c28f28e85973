"""Containers as a chaos backend: every node of an experiment in its own container of the lab's image.

``ContainerCluster`` is the local cluster with the process operations done through the Docker engine:
kill is SIGKILL to the container, pause and resume are the cgroup freezer (``docker pause``), the
hung listener is SIGUSR1/SIGUSR2 to the container (its init, ``--init``, passes every signal on to the
role), a restart is a new container (a new client id), and a partition is a pair of iptables DROP rules in the
client container's network namespace (``nsenter -n``), as Jepsen does it. Latency, jitter and loss
are the kernel's ``tc netem`` where it has it (probed once per run, in a scratch namespace), and
otherwise the lab's fault relay (latency, jitter; listening on the run's bridge gateway) and iptables'
statistic match (loss); connection resets are always the relay's. Every container runs on the run's
own bridge network, with the run directory bind-mounted at ``/runs``, so the event logs, the durable
broker stores and the outputs land where the local backend puts them; the containers, the network and
with them every rule and qdisc are removed at the end.

The engine is driven through the ``docker`` command line: asynchronously from the runner's loop, and
in the supervisor's synchronous steps without waiting (the attached ``docker run`` process is what the
supervisor watches, as it watches a local process).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import ipaddress
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rmqlab.chaos.fault_relay import ClientLinks
from rmqlab.chaos.netem import NetemTable, probe_answer, probe_command, probe_precondition
from rmqlab.chaos.process_cluster import BROKER_MODULE, LocalCluster
from rmqlab.chaos.supervisor import EventSink, Member, Supervisor, SupervisorError
from rmqlab.lab.backend import BackendError
from rmqlab.lab.experiment import NAMESRV_NODE, Experiment

# The lab's image; RMQ_IMAGE names another (a checkout of its own on a shared engine).
IMAGE = os.environ.get("RMQ_IMAGE") or "rocketmq-rebalance-lab:latest"
DIGEST_LABEL = "org.rocketmq-rebalance-lab.source-digest"
RUN_LABEL = "org.rocketmq-rebalance-lab.run"
# The package sources that go into the image (the Dockerfile's COPY lines, less the pipeline, which runs
# on the host: the image's rmq-analyze has no Spark).
SOURCE_PACKAGES = (
    "rmqlab",
    "protocol",
    "broker",
    "client",
    "lab",
    "chaos",
    "sim",
    "proxy",
    "interop",
    "sweeps",
)
NAMESRV_PORT = 9876
BROKER_PORT = 10911
CONTAINER_RUN_DIR = "/runs"
# Network actions the kernel does here; the rest need a fault relay in front of the client.
KERNEL_ACTIONS = ("blackhole", "loss")
RELAY_ACTIONS = ("latency", "reset")
# What netem does where the kernel has it (then only resets need the relay).
NETEM_ACTIONS = ("latency", "loss")


def source_digest(root: Path | None = None) -> str:
    """SHA-256 over the image's package sources (relative path and content of every .py and .toml)."""
    root = root or Path(__file__).resolve().parents[1]
    h = hashlib.sha256()
    for pkg in SOURCE_PACKAGES:
        files = sorted(
            p
            for p in (root / pkg).rglob("*")
            if p.suffix in (".py", ".toml") and p.is_file() and "__pycache__" not in p.parts
        )
        for p in files:
            rel = p.relative_to(root).as_posix()
            h.update(rel.encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()


def _docker_sync(*args: str, timeout_s: float = 30.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout_s, check=False)


def _docker_control(cmd: list[str]) -> None:
    """One control command (pause, unpause, kill); its failure is the container's state to show, and
    the supervisor's refresh sees it."""
    with contextlib.suppress(OSError, subprocess.TimeoutExpired):
        subprocess.run(
            cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=30
        )


async def _exec(*cmd: str, timeout_s: float) -> tuple[int, str, str]:
    """Run a command without blocking the loop: exit code, stdout, stderr (TimeoutError, killed, when it
    takes longer)."""
    proc = await asyncio.create_subprocess_exec(
        *cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL
    )
    try:
        async with asyncio.timeout(timeout_s):
            out, err = await proc.communicate()
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()
        raise
    assert proc.returncode is not None
    return proc.returncode, out.decode(errors="replace"), err.decode(errors="replace")


async def docker(*args: str, timeout_s: float = 30.0, check: bool = True) -> str:
    """Run ``docker ARGS`` without blocking the loop; its stdout, or BackendError with its stderr."""
    try:
        rc, out, err = await _exec("docker", *args, timeout_s=timeout_s)
    except TimeoutError:
        raise BackendError(f"docker {' '.join(args[:2])} did not answer within {timeout_s:g}s") from None
    if check and rc != 0:
        raise BackendError(f"docker {' '.join(args[:2])} failed: {err.strip() or out.strip()}")
    return out


@dataclass(frozen=True)
class ImageInfo:
    name: str
    image_id: str
    digest: str


def engine_problem() -> str | None:
    """Why the Docker engine cannot be used (None when it answers)."""
    if shutil.which("docker") is None:
        return "the docker command is not installed: install a Docker engine (see the README)"
    try:
        proc = _docker_sync("info", "--format", "{{.ServerVersion}}", timeout_s=20)
    except subprocess.TimeoutExpired:
        return "the Docker engine did not answer `docker info` within 20 s"
    if proc.returncode == 0:
        return None
    err = proc.stderr.strip().splitlines()[0] if proc.stderr.strip() else "no answer"
    if "permission denied" in proc.stderr.lower():
        return (
            "no permission to use the Docker engine's socket (join the docker group, or run as root): " + err
        )
    return f"the Docker engine does not answer (start dockerd): {err}"


def check_image(image: str, digest: str | None = None) -> ImageInfo:
    """The image must exist and be built from this checkout's sources (its digest label)."""
    proc = _docker_sync("image", "inspect", image, timeout_s=20)
    if proc.returncode != 0:
        raise BackendError(
            f"the image {image} does not exist: build it with `bash scripts/docker/build_image.sh`"
        )
    info = json.loads(proc.stdout)[0]
    labels = (info.get("Config") or {}).get("Labels") or {}
    built_from = labels.get(DIGEST_LABEL, "")
    want = digest or source_digest()
    if built_from != want:
        raise BackendError(
            f"the image {image} was built from other sources than this checkout (source digest "
            f"{built_from[:12] or 'missing'}, checkout {want[:12]}): rebuild it with "
            "`bash scripts/docker/build_image.sh`"
        )
    return ImageInfo(image, str(info["Id"]), built_from)


def backend_problems(exp: Experiment) -> list[str]:
    """What in an experiment the container backend cannot do (checked before anything starts)."""
    out = []
    if exp.engine != "emulator":
        out.append(
            f"engine {exp.engine!r}: the docker backend runs the lab's own servers only; Apache's JVMs run "
            "on the process backend (leave out --backend docker)"
        )
    real = sorted({n for c in exp.consumers if c.real for n in c.nodes})
    if real:
        out.append(
            "the docker backend runs the lab's own clients only; real RocketMQ clients are not in the "
            f"image: {', '.join(real)}"
        )
    if any(n.action in KERNEL_ACTIONS for n in exp.nemeses):
        missing = [t for t in ("nsenter", "iptables") if shutil.which(t) is None]
        if missing:
            out.append(
                f"a partition or packet loss needs {' and '.join(missing)} on this machine "
                "(apt-get install util-linux iptables)"
            )
        elif os.geteuid() != 0:
            out.append(
                "a partition or packet loss sets iptables rules in a container's network namespace: "
                "run as root"
            )
    return out


async def probe_netem(timeout_s: float = 10.0) -> str | None:
    """None when this kernel takes a netem qdisc (tried in a scratch network namespace), else why not."""
    problem = probe_precondition()
    if problem:
        return problem
    try:
        rc, _, err = await _exec(*probe_command(), timeout_s=timeout_s)
    except TimeoutError:
        return f"the netem probe did not answer within {timeout_s:g}s"
    return probe_answer(rc, err)


def check_backend(exp: Experiment, image: str) -> ImageInfo:
    """Everything the container backend needs, or BackendError naming each problem."""
    problems = backend_problems(exp)
    engine = engine_problem()
    if engine:
        problems.append(engine)
    if problems:
        raise BackendError("; ".join(problems))
    return check_image(image)


# ------------------------------------------------------------------------------------------------
# Kernel network faults


@dataclass(frozen=True)
class Cut:
    """One iptables rule a network nemesis put in a container's namespace."""

    peer: str  # the node at the other end of the link
    namespace: str  # the node whose network namespace holds the rule
    rule: list[str]


def _ip_port(addr: str) -> tuple[str, str]:
    ip, _, port = addr.rpartition(":")
    return ip, port


def drop_rules(
    ip: str, port: str | None, *, drop_out: bool, drop_in: bool, probability: float | None = None
) -> list[list[str]]:
    """iptables rules (chain first) dropping the packets to and/or from ``ip`` (its TCP ``port`` only,
    when given); with ``probability``, each packet independently with that chance (loss)."""
    chance = []
    if probability:
        chance = ["-m", "statistic", "--mode", "random", "--probability", f"{probability:g}"]
    rules = []
    if drop_out:
        where = ["-p", "tcp", "-d", ip, "--dport", port] if port else ["-d", ip]
        rules.append(["OUTPUT", *where, *chance, "-j", "DROP"])
    if drop_in:
        where = ["-p", "tcp", "-s", ip, "--sport", port] if port else ["-s", ip]
        rules.append(["INPUT", *where, *chance, "-j", "DROP"])
    return rules


# ------------------------------------------------------------------------------------------------
# The supervisor: containers instead of processes


@dataclass
class ContainerMember(Member):
    ip: str = ""
    container: str = ""

    @property
    def address(self) -> str | None:
        return f"{self.ip}:{self.port}" if self.port else None


class ContainerSupervisor(Supervisor):
    """The supervisor's state machine over containers: ``docker run`` (attached) is the member's process."""

    def __init__(
        self,
        run_dir: str | Path,
        *,
        image: str,
        network: str,
        label: str,
        time_scale: float,
        log: EventSink | None,
        ready_timeout_s: float,
        stop_timeout_s: float,
    ) -> None:
        super().__init__(
            run_dir,
            time_scale=time_scale,
            log=log,
            ready_timeout_s=ready_timeout_s,
            stop_timeout_s=stop_timeout_s,
            parent_death_signal=False,
        )
        self.image = image
        self.network = network
        self.label = label
        self.free_ips: list[str] = []
        self.containers: list[str] = []
        self._lanes: dict[str, ThreadPoolExecutor] = {}

    def add(self, node: str, role: str, module: str, args: list[str] | None = None, **kw: Any) -> Member:
        m = super().add(node, role, module, args, **kw)
        if m.program is not None:
            del self.members[node]
            raise SupervisorError(f"{node}: the docker backend cannot run a real client's program")
        if not self.free_ips:
            raise SupervisorError("no address left on the run's network")
        cm = ContainerMember(
            **{k: getattr(m, k) for k in Member.__dataclass_fields__}, ip=self.free_ips.pop(0)
        )
        self.members[node] = cm
        return cm

    def _in_container(self, arg: str) -> str:
        run = str(self.run_dir.resolve())
        if arg == run or arg.startswith(run + os.sep):
            return CONTAINER_RUN_DIR + arg[len(run) :]
        return arg

    def command(self, m: Member, log_file: str) -> list[str]:
        assert isinstance(m, ContainerMember)
        m.container = f"{self.label}-{m.node}-{m.incarnation}"
        self.containers.append(m.container)
        role = [
            "python",
            "-m",
            m.module,
            "--node",
            m.node,
            "--time-scale",
            f"{self.time_scale:g}",
            "--log-file",
            self._in_container(log_file),
            *(self._in_container(self._resolve(a)) for a in m.args),
        ]
        return [
            "docker",
            "run",
            "--name",
            m.container,
            "--label",
            f"{RUN_LABEL}={self.label}",
            "--init",  # a real init as pid 1: signals reach the role, zombies are reaped
            "--network",
            self.network,
            "--ip",
            m.ip,
            "--hostname",
            m.node,
            "--user",
            f"{os.getuid()}:{os.getgid()}",
            "--volume",
            f"{self.run_dir.resolve()}:{CONTAINER_RUN_DIR}",
            "--workdir",
            CONTAINER_RUN_DIR,
            "--env",
            "PYTHONUNBUFFERED=1",
            self.image,
            *role,
        ]

    def _control(self, m: Member, *args: str) -> None:
        """Queue a ``docker`` control command for the member's container and return at once.

        Each node has one lane, a single worker thread, so its commands run in the order given (pause
        before unpause, unpause before a SIGTERM) while the caller, the runner's event loop, never waits
        for the engine."""
        assert isinstance(m, ContainerMember)
        lane = self._lanes.get(m.node)
        if lane is None:
            lane = self._lanes[m.node] = ThreadPoolExecutor(1, thread_name_prefix=f"docker-{m.node}")
        lane.submit(_docker_control, ["docker", *args, m.container])

    def _signal(self, m: Member, sig: int) -> None:
        if m.proc is None or not isinstance(m, ContainerMember) or not m.container:
            return
        if sig == signal.SIGSTOP:
            self._control(m, "pause")
        elif sig == signal.SIGCONT:
            if m.state == "paused":
                self._control(m, "unpause")
        else:
            if m.state == "paused" and sig != signal.SIGKILL:
                self._control(m, "unpause")  # a frozen container cannot act on SIGTERM
            self._control(m, "kill", "--signal", signal.Signals(sig).name)

    def remove_all(self) -> None:
        """Remove every container of the run (synchronous: also the last word at exit)."""
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            ids = _docker_sync("ps", "-aq", "--filter", f"label={RUN_LABEL}={self.label}").stdout.split()
            if ids:
                _docker_sync("rm", "-f", *ids, timeout_s=60)

    def close(self, timeout_s: float | None = None) -> None:
        try:
            super().close(timeout_s)
        finally:
            lanes, self._lanes = self._lanes, {}
            for lane in lanes.values():
                lane.shutdown(wait=True)  # every queued command has run before the containers go
            self.remove_all()


# ------------------------------------------------------------------------------------------------
# The cluster


class ContainerCluster(LocalCluster):
    """The local cluster's roles and topology, each node in a container on the run's bridge network."""

    kind = "docker"
    relayed_actions = RELAY_ACTIONS

    def __init__(
        self,
        run_dir: str | Path,
        *,
        image: ImageInfo,
        time_scale: float,
        log: EventSink | None = None,
        seed: int = 0,
        ready_timeout_s: float = 60.0,
        stop_timeout_s: float = 10.0,
    ) -> None:
        super().__init__(
            Path(run_dir).resolve(),  # every path a container sees is translated from under it
            time_scale=time_scale,
            log=log,
            seed=seed,
            ready_timeout_s=ready_timeout_s,
            stop_timeout_s=stop_timeout_s,
        )
        self.sup.close()  # the process supervisor made above has nothing to run
        self.image = image
        self.label = f"rmqlab-{secrets.token_hex(4)}"
        self.network = self.label
        self.subnet = ""
        self.gateway = ""
        self.sup = ContainerSupervisor(
            self.run_dir,
            image=image.name,
            network=self.network,
            label=self.label,
            time_scale=time_scale,
            log=log,
            ready_timeout_s=ready_timeout_s,
            stop_timeout_s=stop_timeout_s,
        )
        self._network_created = False
        self._removed = False
        self.rules: dict[str, list[Cut]] = {}  # a nemesis' target -> the iptables rules it put in force
        self.netem = False  # whether this kernel takes a netem qdisc (prepare probes it)
        self.netem_probe = "not probed"
        self.relayed_actions = RELAY_ACTIONS
        self.netem_tables: dict[str, NetemTable] = {}  # container -> the netem qdiscs in its namespace
        # a nemesis' target -> the links it shaped: (peer, container, node of that namespace, destination)
        self.shaped: dict[str, list[tuple[str, str, str, str]]] = {}
        self.network_faults: list[dict[str, str]] = []  # each network fault and the mechanism it used

    async def prepare(self) -> list[str]:
        """Probe for netem, create the run's bridge network and learn its addresses (before any node is
        declared: which clients need a fault relay depends on the probe); returns the image it runs and
        what does the network faults, to be shown."""
        await self.probe()
        create = ("network", "create", "--driver", "bridge", "--label", f"{RUN_LABEL}={self.label}")
        await docker(*create, self.network)
        self._network_created = True
        # Fixed addresses (--ip) need a subnet given at creation: take the one the engine chose as
        # free, and create the network again with it.
        out = await docker(
            "network",
            "inspect",
            "--format",
            "{{range .IPAM.Config}}{{.Subnet}} {{.Gateway}}{{end}}",
            self.network,
        )
        subnet, gateway = out.split()
        await docker("network", "rm", self.network)
        self._network_created = False
        await docker(*create, "--subnet", subnet, "--gateway", gateway, self.network)
        self._network_created = True
        net = ipaddress.ip_network(subnet)
        self.subnet, self.gateway = subnet, gateway
        hosts = [str(h) for h in net.hosts() if str(h) != gateway]
        assert isinstance(self.sup, ContainerSupervisor)
        self.sup.free_ips = hosts[9:]  # leave the first few to the engine's own use
        return [f"backend: docker, image {self.image.name} ({self.image.image_id[:19]})", self.network_note()]

    async def probe(self) -> None:
        """Whether netem does latency, jitter and loss in this run, or the relay and iptables do."""
        problem = await probe_netem()
        self.netem = problem is None
        self.netem_probe = problem or "netem qdisc added in a scratch network namespace"
        self.relayed_actions = tuple(a for a in RELAY_ACTIONS if not (self.netem and a in NETEM_ACTIONS))

    # -- roles: servers listen on every interface of their container, at RocketMQ's usual ports ------

    def add_namesrv(
        self, node: str = "namesrv", *, native: bool = False, flags: list[str] | None = None
    ) -> Member:
        args = ["--host", "0.0.0.0", "--port", str(NAMESRV_PORT), *(flags or [])]
        return self.sup.add(node, "namesrv", "rmqlab.broker.namesrv_main", args, port=NAMESRV_PORT)

    def add_broker(
        self,
        name: str,
        *,
        durable: bool = False,
        flags: list[str] | None = None,
        native: bool = False,
        broker_name: str | None = None,
    ) -> Member:
        args = [
            "--host",
            "0.0.0.0",
            "--port",
            str(BROKER_PORT),
            "--broker-name",
            broker_name or name,
            "--namesrv",
            "{namesrv}",
            # The lab's admin client reaches the broker from the host across the run's own bridge network,
            # never from the container's loopback.
            "--admin-from",
            "any",
        ]
        if durable:
            store = self.run_dir / "store" / name
            store.mkdir(parents=True, exist_ok=True)
            args += ["--store-dir", str(store.resolve())]
        args += flags or []
        return self.sup.add(name, "broker", BROKER_MODULE, args, port=BROKER_PORT)

    async def start_links(self) -> None:
        """Fault relays on the host, listening on the run network's gateway (reachable from containers)."""
        if self.namesrv is None:
            raise RuntimeError("start the name server and brokers first")
        for node in sorted(self._proxied - set(self.links)):
            links = ClientLinks(node, self.namesrv, self.servers(), seed=self.seed, host=self.gateway)
            self.links[node] = await links.start()
            self.sup.vars["namesrv@" + node] = links.namesrv_address

    # -- network faults ------------------------------------------------------------------------------

    def _server_address(self, name: str) -> str | None:
        return self.namesrv if name == NAMESRV_NODE else self.servers().get(name)

    def _ends(self, node: str, other: str) -> list[tuple[str, str, str, str | None, bool]]:
        """Where the packets between ``node`` and each node ``other`` names can be dropped:
        (peer, namespace node, remote ip, remote port or None, whether in and out are swapped).

        A client with fault relays reaches the servers through the host (the run network's gateway),
        so its links to them are cut in its own namespace, on the relay's address, whichever end the
        nemesis names; every other link is cut in the target's namespace, on the peer's address."""
        peers = sorted(set(self.servers()) - {node}) if other == "all" else [other]
        out = []
        for peer in peers:
            if node in self.links and self._server_address(peer) is not None:
                addr = self.links[node].select(peer)[0].address
                out.append((peer, node, *_ip_port(addr), False))
            elif peer in self.links and self._server_address(node) is not None:
                addr = self.links[peer].select(node)[0].address
                out.append((peer, peer, *_ip_port(addr), True))
            elif peer in self.sup.members:
                m = self.sup.members[peer]
                assert isinstance(m, ContainerMember)
                out.append((peer, node, m.ip, None, False))
            else:
                raise ValueError(f"{node} has no link to {peer!r}")
        return out

    def network_note(self) -> str:
        """One line for the run's output: which mechanism does latency, jitter and loss, and why."""
        if self.netem:
            return "network faults: latency, jitter and loss by tc netem (the kernel has it)"
        return (
            f"network faults: no netem ({self.netem_probe}): latency and jitter through the fault relay, "
            "loss by iptables' statistic match"
        )

    def _through_relay(self, node: str, other: str) -> bool:
        """Whether a link of ``node`` to ``other`` (or to every broker) passes a client's fault relay."""
        peers = sorted(set(self.servers()) - {node}) if other == "all" else [other]
        return any(
            (node in self.links and self._server_address(p) is not None)
            or (p in self.links and self._server_address(node) is not None)
            for p in peers
        )

    def network_via(self, action: str, node: str, other: str = "all") -> str:
        if action == "blackhole":
            return "iptables"
        if action in NETEM_ACTIONS and self.netem and not self._through_relay(node, other):
            return "netem"
        return "iptables" if action == "loss" else "relay"

    async def _in_namespace(self, node: str, container: str, *cmd: str) -> None:
        """Run a host command (iptables, tc) in the network namespace of the node's container."""
        pid = (await docker("inspect", "--format", "{{.State.Pid}}", container, check=False)).strip()
        if not pid.isdigit() or pid == "0":
            raise ValueError(f"{node} has no running container")
        try:
            rc, _, err = await _exec("nsenter", "--target", pid, "--net", *cmd, timeout_s=30)
        except TimeoutError:
            raise ValueError(f"{cmd[0]} in {node}'s network namespace did not answer within 30 s") from None
        if rc != 0:
            raise ValueError(f"{cmd[0]} in {node}'s network namespace failed: {err.strip()}")

    async def _iptables(self, node: str, op: str, rule: list[str]) -> None:
        m = self.sup.member(node)
        assert isinstance(m, ContainerMember)
        await self._in_namespace(node, m.container, "iptables", "-w", op, *rule)

    async def _tc(self, node: str, container: str, args: list[str]) -> None:
        await self._in_namespace(node, container, "tc", *args)

    def _member(self, node: str) -> ContainerMember:
        m = self.sup.member(node)
        assert isinstance(m, ContainerMember)
        return m

    async def _shape(self, node: str, other: str, action: str, params: dict[str, Any]) -> list[str]:
        """netem on the direct links between ``node`` and ``other``: on the sending side of each
        direction the fault covers (latency: both; loss: as ``direction`` says)."""
        if action == "latency":
            fields = {"delay_ms": float(params.get("ms", 0)), "jitter_ms": float(params.get("jitter_ms", 0))}
            direction = "both"
        else:
            fields = {"loss_percent": float(params["percent"])}
            direction = params.get("direction", "both")
        peers = sorted(set(self.servers()) - {node}) if other == "all" else [other]
        ends = []
        for peer in peers:
            if peer not in self.sup.members:
                raise ValueError(f"{node} has no link to {peer!r}")
            a, b = self._member(node), self._member(peer)
            if direction in ("both", "out"):
                ends.append((peer, a, b.ip))
            if direction in ("both", "in"):
                ends.append((peer, b, a.ip))
        done = []
        for peer, m, dst in ends:
            table = self.netem_tables.setdefault(m.container, NetemTable())
            entry = (peer, m.container, m.node, dst)
            if entry not in self.shaped.setdefault(node, []):
                self.shaped[node].append(entry)  # first: a heal takes off what a failure left half done
            for args in table.set(dst, node, **fields):
                await self._tc(m.node, m.container, args)
                done.append(f"{m.node}: tc {' '.join(args)}")
        return done

    async def _unshape(self, node: str, other: str) -> None:
        """Take ``node``'s netem off its links to ``other`` (every peer for "all")."""
        keep = []
        for entry in self.shaped.pop(node, []):
            peer, container, ns_node, dst = entry
            if other not in ("all", peer):
                keep.append(entry)
                continue
            table = self.netem_tables.get(container)
            for args in table.clear(dst, node) if table is not None else []:
                with contextlib.suppress(ValueError):  # a restarted container has a namespace of its own
                    await self._tc(ns_node, container, args)
        if keep:
            self.shaped[node] = keep

    async def apply_network(self, node: str, action: str, broker: str = "all", **params: Any) -> list[str]:
        if action != "heal":
            via = self.network_via(action, node, broker)
            self.network_faults.append({"action": action, "target": node, "peer": broker, "via": via})
            if via == "netem":
                return await self._shape(node, broker, action, params)
        if action in ("blackhole", "loss"):
            direction = params.get("direction", "both")
            probability = params["percent"] / 100 if action == "loss" else None
            cuts = []
            for peer, ns, ip, port, swapped in self._ends(node, broker):
                out, into = direction in ("both", "out"), direction in ("both", "in")
                if swapped:
                    out, into = into, out
                for rule in drop_rules(ip, port, drop_out=out, drop_in=into, probability=probability):
                    cuts.append(Cut(peer, ns, rule))
            for cut in cuts:
                await self._iptables(cut.namespace, "-A", cut.rule)
                self.rules.setdefault(node, []).append(cut)
            return [f"{c.namespace}: {' '.join(c.rule)}" for c in cuts]
        if action == "heal":
            wanted = None if broker == "all" else {broker}
            keep = []
            for cut in self.rules.pop(node, []):
                if wanted is not None and cut.peer not in wanted:
                    keep.append(cut)
                    continue
                with contextlib.suppress(ValueError):  # a restarted container has no rules left
                    await self._iptables(cut.namespace, "-D", cut.rule)
            if keep:
                self.rules[node] = keep
            await self._unshape(node, broker)
            if node in self.links and (broker == "all" or self._server_address(broker) is not None):
                self.links[node].apply("heal", broker)
            return [f"heal {broker}"]
        if node not in self.links:
            raise ValueError(f"{node} has no fault relay for {action}")
        return self.links[node].apply(action, broker, **params)

    def network_faulty(self, node: str) -> bool:
        return bool(self.rules.get(node)) or bool(self.shaped.get(node)) or super().network_faulty(node)

    # -- the end -------------------------------------------------------------------------------------

    async def remove_netem(self) -> None:
        """Remove every netem qdisc still in force (a run that failed before its heal): the namespace
        goes with its container, but a qdisc left on a live one would shape the clients' stop."""
        names = {m.container: m.node for m in self.sup if isinstance(m, ContainerMember)}
        for container, table in self.netem_tables.items():
            for args in table.teardown():
                with contextlib.suppress(ValueError, BackendError):
                    await self._tc(names.get(container, container), container, args)
        self.shaped.clear()

    async def close(self) -> None:
        try:
            await self.remove_netem()
            await super().close()
        finally:
            await self.remove()

    async def remove(self) -> None:
        """Remove the run's containers (their namespaces take the iptables rules along) and network."""
        ids = (await docker("ps", "-aq", "--filter", f"label={RUN_LABEL}={self.label}", check=False)).split()
        if ids:
            await docker("rm", "-f", *ids, timeout_s=60, check=False)
        if self._network_created:
            await docker("network", "rm", self.network, check=False)
            self._network_created = False
        self.rules.clear()
        self._removed = True

    def remove_sync(self) -> None:
        """The same, for the last word when ``remove`` did not complete (synchronous)."""
        if self._removed:
            return
        assert isinstance(self.sup, ContainerSupervisor)
        self.sup.remove_all()
        if self._network_created:
            with contextlib.suppress(OSError, subprocess.TimeoutExpired):
                _docker_sync("network", "rm", self.network)
            self._network_created = False

    def manifest(self) -> dict[str, Any]:
        out = super().manifest()
        for node, info in out["nodes"].items():
            m = self.sup.members[node]
            assert isinstance(m, ContainerMember)
            info["ip"] = m.ip
        out["containers"] = {
            "image": self.image.name,
            "image_id": self.image.image_id,
            "source_digest": self.image.digest,
            "network": self.network,
            "subnet": self.subnet,
            "names": list(self.sup.containers) if isinstance(self.sup, ContainerSupervisor) else [],
            "netem": self.netem,
            "netem_probe": self.netem_probe,
            "network_faults": list(self.network_faults),
        }
        return out


def leftovers(label_prefix: str = "rmqlab-") -> dict[str, list[str]]:
    """Containers and networks of lab runs still present (for tests and for `rmq-chaos` cleanups)."""
    ps = _docker_sync("ps", "-a", "--filter", f"label={RUN_LABEL}", "--format", "{{.Names}}")
    nets = _docker_sync("network", "ls", "--filter", f"label={RUN_LABEL}", "--format", "{{.Name}}")
    return {
        "containers": [n for n in ps.stdout.split() if n.startswith(label_prefix)],
        "networks": [n for n in nets.stdout.split() if n.startswith(label_prefix)],
    }


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m rmqlab.chaos.container", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("digest", help="print the source digest of this checkout (the image's label)")
    chk = sub.add_parser(
        "check", help="check the engine and the image as `rmq-chaos run --backend docker` does"
    )
    chk.add_argument("--image", default=IMAGE)
    args = p.parse_args(argv)
    if args.command == "digest":
        print(source_digest())
        return 0
    problem = engine_problem()
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    try:
        info = check_image(args.image)
    except BackendError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"ok: {info.name} {info.image_id}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
