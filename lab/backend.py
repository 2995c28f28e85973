"""The Backend seam: what the Runner asks of whatever runs an experiment's nodes.

Local processes (``chaos.process_cluster.LocalCluster``), containers
(``chaos.container.ContainerCluster``) and the simulator (``sim.sim_cluster.SimBackend``) implement it; a
new engine or topology is a new implementation, never a copy of the Runner. The Runner decides what to do
and when; a backend does it, on its own clock and network, and writes the ``nemesis`` event of each
process action it carries out (between checking the node's state and acting on it, as a supervisor does).

An action the node cannot take now raises ``NodeError`` (the Runner skips it, with the message as its
reason); a node that does not come up raises ``NodeFailed``; a backend that cannot go on raises
``BackendError``."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, Protocol

from rmqlab.lab.experiment import Experiment

# A node's states, the same in every backend: new | starting | running | paused | stopping | stopped |
# exited. Up is what holds a process (a paused one, or one being stopped, still holds its connections).
UP_STATES = ("running", "paused", "stopping")


class NodeError(RuntimeError):
    """An action the node cannot take in its current state (killing a stopped node, pausing a paused one),
    or a node the backend does not have."""


class NodeFailed(NodeError):
    """A node exited, or did not become ready in time."""


class BackendError(RuntimeError):
    """The backend cannot run here or cannot go on (no container engine, a network it cannot create)."""


class EventSink(Protocol):
    """Where events go (an EventLog)."""

    def emit(self, event: str, **fields: Any) -> None: ...


class Member(Protocol):
    """One named node of the cluster across its incarnations, as the Runner reads it."""

    node: str
    role: str
    group: str | None
    state: str
    hung: bool  # a consumer's listener hung by the ``hang`` nemesis and not released yet
    returncode: int | None
    client_ids: list[str]  # a consumer's client id per incarnation
    out_file: str  # where its output goes ("" when it has no file of its own)


def nemesis_fields(action: str, m: Member) -> dict[str, Any]:
    """The fields every ``nemesis`` event starts with (EVENTS.md): the action, its target and role, a
    consumer's group, and the target's current client id."""
    fields: dict[str, Any] = {"action": action, "target": m.node, "target_role": m.role}
    if m.role == "consumer" and m.group is not None:
        fields["group"] = m.group
    if m.client_ids:
        fields["client_id"] = m.client_ids[-1]
    return fields


class Backend(Protocol):
    """What runs the nodes of one experiment; see the module docstring."""

    kind: str  # "local", "docker", "sim": the manifest's name for it

    # -- the cluster ---------------------------------------------------------------------------------
    async def prepare(self) -> list[str]:
        """Whatever the backend needs before nodes are declared; returns lines worth showing (how it
        does network faults, which image it runs)."""
        ...

    def declare(self, exp: Experiment) -> None:
        """Declare every node of the experiment (nothing starts yet)."""
        ...

    async def start_servers(self) -> None:
        """The name server, then the brokers; every topic created and routed to every broker, and what
        the clients need in front of the servers (fault relays, the v5 clients' gRPC endpoint)."""
        ...

    async def set_message_request_mode(self, topic: str, group: str, mode: str) -> None:
        """RocketMQ 5's server-side assignment: every broker keeps ``mode`` (PULL or POP) for the group."""
        ...

    def member(self, node: str) -> Member:
        """The node as it is now (a process that exited on its own is noticed)."""
        ...

    def members(self) -> Iterator[Member]:
        """Every node, in the order they were declared, each as it is when it is reached."""
        ...

    # -- process actions (each writes its own nemesis event when ``nemesis``) -----------------------
    async def start(self, nodes: Sequence[str], *, nemesis: bool = False) -> None:
        """Start the nodes together and wait until each is ready; with ``nemesis``, one node, as the
        ``start`` action (a node that is up already is refused)."""
        ...

    async def stop(self, node: str) -> None:
        """SIGTERM: a graceful shutdown; killed when it takes too long."""
        ...

    async def kill(self, node: str) -> None:
        """SIGKILL: no shutdown, no unregistration."""
        ...

    async def restart(self, node: str, *, mode: str, down_s: float) -> None:
        """Stop (``mode`` "stop") or kill it if it is up, wait ``down_s`` wall seconds, start it again."""
        ...

    async def pause(self, node: str, *, gc: bool = False) -> None:
        """SIGSTOP (``gc``: a garbage collector's stop-the-world pause, as the event says)."""
        ...

    async def resume(self, node: str, *, gc: bool = False) -> None:
        """SIGCONT."""
        ...

    async def hang(self, node: str) -> None:
        """The consumer's listener stops returning; the process lives on."""
        ...

    async def unhang(self, node: str) -> None:
        """The hung listener's calls return."""
        ...

    # -- network faults ------------------------------------------------------------------------------
    def network_via(self, action: str, node: str, other: str) -> str:
        """The mechanism that does a network fault on the node's links (the event's ``via``)."""
        ...

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
    ) -> Any:
        """A network fault (or ``heal``) on the links between ``node`` and ``broker`` (a node name, or
        "all" brokers); latencies in wall milliseconds."""
        ...

    def faulty_links(self) -> Iterator[str]:
        """The nodes with a network fault still in force on one of their links, for the heal before the
        drain: each looked at when the heals before it are done."""
        ...

    # -- admin requests to a broker ------------------------------------------------------------------
    async def fault_add(self, broker: str, request: dict[str, Any]) -> int:
        """Inject a fault (AdminClient.fault_add's keyword arguments); returns the fault's id."""
        ...

    async def fault_clear(self, broker: str) -> None: ...

    async def policy_set(
        self,
        broker: str,
        *,
        notify_on_channel_expired: bool | None = None,
        release_locks_on_close: bool | None = None,
    ) -> None: ...

    async def elect_master(self, broker: str, broker_id: int) -> None:
        """RocketMQ 5's controller mode: an operator's electMaster for the replica ``broker_id``
        (brokerControllerId) of the broker set ``broker``, sent to the name server's controller."""
        ...

    # -- the end -------------------------------------------------------------------------------------
    async def kill_clients(self) -> list[str]:
        """SIGKILL every consumer and producer that is up, without nemesis events (the end of a run);
        returns their names."""
        ...

    async def close(self) -> None:
        """Stop what is left (servers gracefully) and release everything the backend holds."""
        ...

    def manifest(self) -> dict[str, Any]:
        """The backend's part of manifest.json (addresses, nodes)."""
        ...
