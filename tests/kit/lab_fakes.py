"""A fake clock and a fake backend: the Runner's decisions seen without sockets, processes or wall time.

``run_on_fake_clock`` runs a coroutine on asyncio's own loop whose clock jumps to the next timer when
nothing is ready, so a 300 s experiment takes no time and every time the Runner reads is exact.
``FakeBackend`` keeps its nodes' states the way the backends do (a kill needs a node that is up, ...),
refuses what they refuse, and records every call with the clock's time.
"""

from __future__ import annotations

import asyncio
import selectors
from collections.abc import Coroutine, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from rmqlab.lab.backend import NodeError, nemesis_fields
from rmqlab.lab.experiment import Experiment

T = TypeVar("T")


class _JumpSelector(selectors.DefaultSelector):  # type: ignore[misc,valid-type]
    """Waiting ``timeout`` seconds moves the loop's clock on instead (and polls what is registered)."""

    def __init__(self, loop: FakeClockLoop) -> None:
        super().__init__()
        self.loop = loop

    def select(self, timeout: float | None = None) -> list[Any]:
        if timeout is None:
            raise RuntimeError("nothing is ready and no timer is set: the run can never move again")
        self.loop.now += timeout
        return super().select(0)


class FakeClockLoop(asyncio.SelectorEventLoop):
    def __init__(self) -> None:
        self.now = 0.0
        super().__init__(_JumpSelector(self))

    def time(self) -> float:
        return self.now


def run_on_fake_clock(coro: Coroutine[Any, Any, T]) -> T:
    loop = FakeClockLoop()
    try:
        return loop.run_until_complete(coro)
    finally:
        loop.close()


class Events:
    """An event sink that keeps what it is given (the lab's chaos.jsonl)."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []

    def emit(self, event: str, **fields: Any) -> None:
        self.events.append({"event": event, **fields})

    def named(self, event: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e["event"] == event]


@dataclass
class FakeMember:
    node: str
    role: str
    group: str | None = None
    state: str = "new"
    hung: bool = False
    returncode: int | None = None
    client_ids: list[str] = field(default_factory=list)
    out_file: str = ""
    incarnation: int = 0


class FakeBackend:
    """The Backend protocol on nodes that are only states; ``calls`` holds (loop time, method, args)."""

    kind = "fake"

    def __init__(self, log: Events, *, start_s: float = 0.5, producers_exit: bool = True) -> None:
        self.log = log
        self.start_s = start_s  # how long a node takes to become ready
        self.producers_exit = producers_exit
        self.nodes: dict[str, FakeMember] = {}
        self.calls: list[tuple[float, str, tuple[Any, ...]]] = []
        self.faulty: set[str] = set()
        self.faults: list[str] = []
        self.closed = False

    def _call(self, name: str, *args: Any) -> None:
        self.calls.append((asyncio.get_running_loop().time(), name, args))

    def called(self, name: str) -> list[tuple[Any, ...]]:
        return [args for _t, n, args in self.calls if n == name]

    def _require(self, node: str, *states: str) -> FakeMember:
        m = self.nodes[node]
        if m.state not in states:
            raise NodeError(f"{node} is {m.state}, not {' or '.join(states)}")
        return m

    def _nemesis(self, action: str, m: FakeMember, **extra: Any) -> None:
        self.log.emit("nemesis", **nemesis_fields(action, m), **extra)

    async def prepare(self) -> list[str]:
        self._call("prepare")
        return ["fake backend ready"]

    def declare(self, exp: Experiment) -> None:
        for info in exp.nodes().values():
            self.nodes[info.node] = FakeMember(info.node, info.role, info.group)

    async def start_servers(self) -> None:
        self._call("start_servers")
        for m in self.nodes.values():
            if m.role in ("namesrv", "broker"):
                m.state = "running"

    async def set_message_request_mode(self, topic: str, group: str, mode: str) -> None:
        self._call("set_message_request_mode", topic, group, mode)

    def member(self, node: str) -> FakeMember:
        return self.nodes[node]

    def members(self) -> Iterator[FakeMember]:
        yield from self.nodes.values()

    async def start(self, nodes: Sequence[str], *, nemesis: bool = False) -> None:
        self._call("start", tuple(nodes), nemesis)
        for node in nodes:
            m = self.nodes[node]
            if m.state in ("running", "paused", "stopping"):
                raise NodeError(f"{node} is already {m.state}")
            m.incarnation += 1
            if nemesis:
                self._nemesis("start", m)
            m.state = "starting"
        await asyncio.sleep(self.start_s)
        for node in nodes:
            m = self.nodes[node]
            m.state = "running"
            m.hung = False
            if m.role == "consumer":
                m.client_ids.append(f"{node}#{m.incarnation}")
            if m.role == "producer" and self.producers_exit:
                m.state, m.returncode = "exited", 0

    async def stop(self, node: str) -> None:
        self._call("stop", node)
        m = self._require(node, "running", "paused")
        self._nemesis("stop", m)
        m.state = "stopped"

    async def kill(self, node: str) -> None:
        self._call("kill", node)
        m = self._require(node, "running", "paused", "stopping")
        self._nemesis("kill", m)
        m.state, m.returncode = "stopped", -9

    async def restart(self, node: str, *, mode: str, down_s: float) -> None:
        self._call("restart", node, mode, down_s)
        m = self.nodes[node]
        if m.state in ("running", "paused"):
            self._nemesis(mode, m)
            m.state = "stopped"
        await asyncio.sleep(down_s)
        await self.start([node], nemesis=True)

    async def pause(self, node: str, *, gc: bool = False) -> None:
        self._call("pause", node, gc)
        m = self._require(node, "running")
        self._nemesis("pause", m, **({"gc": True} if gc else {}))
        m.state = "paused"

    async def resume(self, node: str, *, gc: bool = False) -> None:
        self._call("resume", node, gc)
        m = self._require(node, "paused")
        self._nemesis("resume", m, **({"gc": True} if gc else {}))
        m.state = "running"

    async def hang(self, node: str) -> None:
        self._call("hang", node)
        m = self._require(node, "running")
        self._nemesis("hang", m)
        m.hung = True

    async def unhang(self, node: str) -> None:
        self._call("unhang", node)
        m = self._require(node, "running")
        if not m.hung:
            raise NodeError(f"{node}'s listener is not hung")
        self._nemesis("unhang", m)
        m.hung = False

    def network_via(self, action: str, node: str, other: str) -> str:
        return "fake"

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
        self._call("apply_network", node, action, broker, ms, jitter_ms, direction, percent)
        if action == "heal":
            self.faulty.discard(node)
        else:
            self.faulty.add(node)

    def faulty_links(self) -> Iterator[str]:
        for node in sorted(self.faulty):
            if node in self.faulty:  # looked at when the heals before it are done
                yield node

    async def fault_add(self, broker: str, request: dict[str, Any]) -> int:
        self._call("fault_add", broker, request)
        self._require(broker, "running", "paused")
        self.faults.append(broker)
        return len(self.faults)

    async def fault_clear(self, broker: str) -> None:
        self._call("fault_clear", broker)
        self._require(broker, "running", "paused")

    async def policy_set(
        self,
        broker: str,
        *,
        notify_on_channel_expired: bool | None = None,
        release_locks_on_close: bool | None = None,
    ) -> None:
        self._call("policy_set", broker, notify_on_channel_expired, release_locks_on_close)
        self._require(broker, "running", "paused")

    async def elect_master(self, broker: str, broker_id: int) -> None:
        self._call("elect_master", broker, broker_id)
        self._require(broker, "running", "paused")

    async def kill_clients(self) -> list[str]:
        self._call("kill_clients")
        killed = [
            m.node
            for m in self.nodes.values()
            if m.role in ("consumer", "producer") and m.state in ("running", "paused", "stopping")
        ]
        for node in killed:
            self.nodes[node].state = "stopped"
        return killed

    async def close(self) -> None:
        self._call("close")
        self.closed = True

    def manifest(self) -> dict[str, Any]:
        return {"nodes": {n: m.state for n, m in self.nodes.items()}}
