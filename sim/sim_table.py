"""Experiment files for the simulator: ``rmq-chaos``'s language plus a ``[sim]`` table.

The ``[sim]`` table (ignored nowhere: ``rmq-chaos`` rejects it as an unknown key) holds what only makes
sense simulated::

    [sim]
    latency_ms = { dist = "uniform", low = 0.05, high = 0.2 }   # per frame and link (default)
    consume_ms = { dist = "lognormal", median = 2, sigma = 0.5 }  # listener time per message, every group
    digest_over = 64          # rebalance events carry cid_all_digest above this many members
    omit_repeated_rebalances = true   # leave out a rebalance identical to the previous one
    pull_events = false       # the brokers' pull_served line per answered pull (not in EVENTS.md)

    rocketmq5 = false         # brokers and consumers follow RocketMQ 5's rules (the --rocketmq5 flags)
    wire = "objects"          # frames as command objects (default) or "bytes" through the real codec
    host_network = false      # consumers in containers with host networking: one IP, each pid 1

    [sim.client]              # consumer settings (ConsumerConfig fields, RocketMQ ms), every consumer
    rebalance_wait_interval = 20000

    [[sim.gc]]                # GC pauses: pause, then resume after a drawn duration (seconds)
    target = "consumer:random"
    every = 30                # or at = [...], or random = N (with from/until)
    pause_s = { dist = "exponential", mean = 2 }

The table is checked in the same pass as the rest of the file (``SIM_TABLE``, the parser's extension for
it), with the same ``file:line`` messages; what the simulator cannot run (real clients, a durable store,
``[acl]``) is an error there too, before anything starts.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from rmqlab.client.client_config import ConfigError, ConsumerConfig
from rmqlab.lab import experiment as lab_experiment
from rmqlab.lab.experiment import Experiment, ExperimentError, Problems
from rmqlab.lab.schedule import NemesisSpec, Step, candidates, nemesis_times, pick_targets
from rmqlab.sim.dist import Distribution, parse_distribution
from rmqlab.sim.wire import WIRES

DEFAULT_LATENCY = Distribution("uniform", (0.05, 0.2))
DEFAULT_DIGEST_OVER = 64

_SIM_KEYS = (
    "latency_ms", "consume_ms", "digest_over", "omit_repeated_rebalances", "rocketmq5", "client", "gc",
    "wire", "pull_events", "host_network",
)  # fmt: skip
# Consumer settings the simulator derives from the experiment itself (or needs for the run directory).
_CLIENT_SET_BY_SIM = (
    "namesrv_addr", "time_scale", "client_ip", "instance_name", "random_seed", "message_model",
    "consume_from_where", "consume_timestamp", "local_offset_store_dir", "rebalance_event_digest_over",
    "omit_repeated_rebalance_events", "access_key", "secret_key",
)  # fmt: skip
_GC_KEYS = ("target", "group", "at", "every", "from", "until", "times", "random", "pause_s")


@dataclass(frozen=True)
class GcSpec:
    index: int
    target: str
    group: str | None
    at: tuple[float, ...]
    every: float | None
    start: float | None
    until: float | None
    times: int | None
    random_count: int | None
    pause_s: Distribution


@dataclass(frozen=True)
class SimSettings:
    """The ``[sim]`` table, checked."""

    latency_ms: Distribution = DEFAULT_LATENCY
    consume_ms: Distribution | None = None
    digest_over: int = DEFAULT_DIGEST_OVER
    omit_repeated_rebalances: bool = True
    rocketmq5: bool = False
    # A broker's pull_served line per answered pull is off in simulations: not part of EVENTS.md, read
    # by no analysis, and the largest event of a run (a third of a 100-consumer run's lines)
    pull_events: bool = False
    wire: str = "objects"  # how frames cross the in-memory network: sim.wire.WIRES
    # consumers run in containers with host networking on one host (docker's network_mode: host): their
    # client ids carry the host's IP, and each is pid 1 of its container
    host_network: bool = False
    client: tuple[tuple[str, Any], ...] = ()  # ConsumerConfig settings for every consumer, in file order
    gc: tuple[GcSpec, ...] = field(default_factory=tuple)

    def consumer_settings(self) -> dict[str, Any]:
        """What the experiment changes in every consumer's ConsumerConfig: RocketMQ 5's switches, then
        the [sim.client] table (which may override one of them)."""
        return {**(ConsumerConfig.rocketmq5() if self.rocketmq5 else {}), **dict(self.client)}

    def steps(self, exp: Experiment) -> list[Step]:
        """The GC pauses, as the experiment's schedule takes them."""
        return gc_steps(exp, self)

    def to_dict(self) -> dict[str, Any]:
        return {
            "rocketmq5": self.rocketmq5,
            "wire": self.wire,
            "client": dict(self.client),
            "latency_ms": self.latency_ms.describe(),
            "consume_ms": self.consume_ms.describe() if self.consume_ms else None,
            "digest_over": self.digest_over,
            "omit_repeated_rebalances": self.omit_repeated_rebalances,
            "pull_events": self.pull_events,
            "host_network": self.host_network,
            "gc": [{"target": g.target, "pause_s": g.pause_s.describe()} for g in self.gc],
        }


class SimTable:
    """The ``[sim]`` table as the experiment parser's extension, and what the simulator refuses to run."""

    name = "sim"

    def parse(self, value: Any, exp: Experiment, problems: Problems) -> SimSettings:
        err = problems.add
        if exp.engine != "emulator":
            err(
                ("cluster", "engine"),
                f"cluster.engine: engine {exp.engine!r} runs Apache RocketMQ's own JVMs, which the simulator "
                "cannot run (it runs our own code only): use rmq-chaos for this experiment",
            )
        for c_index, c in enumerate(exp.consumers):
            if c.real:
                err(
                    ("consumers", c_index, "client"),
                    f"consumers[{c_index + 1}].client: client = {c.client!r} runs a real RocketMQ client, "
                    "which the simulator cannot run (it runs our own code only): use rmq-chaos for this "
                    "experiment",
                )
        if exp.durable:
            err(
                ("cluster", "durable"),
                "cluster.durable: the simulator keeps messages in the memory store (the SQLite store "
                "writes from a thread); use rmq-chaos for a durable broker",
            )
        if exp.acl is not None:
            err(
                ("acl",),
                "acl: the simulator's brokers run without RocketMQ's ACL (the lab's clients would sign for "
                "nothing): use rmq-chaos for an experiment with [acl]",
            )
        return _settings(value, err)


SIM_TABLE = SimTable()


@dataclass(frozen=True)
class SimExperiment:
    """An experiment parsed for the simulator: ``exp`` carries the ``[sim]`` settings among its
    extensions, and ``sim`` is them."""

    exp: Experiment
    sim: SimSettings = field(init=False)

    def __post_init__(self) -> None:
        settings = self.exp.extensions.get(SIM_TABLE.name)
        object.__setattr__(self, "sim", settings if isinstance(settings, SimSettings) else SimSettings())

    def with_seed(self, seed: int) -> SimExperiment:
        """The same experiment run with another seed: its random nemesis targets and times and its GC
        pauses are drawn from that seed too, not only the simulation's own choices."""
        return self if seed == self.exp.seed else SimExperiment(replace(self.exp, seed=seed))

    def with_settings(self, sim: SimSettings) -> SimExperiment:
        """The same experiment with other ``[sim]`` settings."""
        return SimExperiment(replace(self.exp, extensions={**self.exp.extensions, SIM_TABLE.name: sim}))

    def schedule(self) -> list[Step]:
        """The chaos schedule plus the GC pauses drawn from the seed, in time order."""
        return self.exp.schedule()


def load(path: str | Path) -> SimExperiment:
    return SimExperiment(lab_experiment.load(path, extensions=(SIM_TABLE,)))


def parse(text: str, source: str = "<experiment>", default_name: str = "experiment") -> SimExperiment:
    return SimExperiment(lab_experiment.parse(text, source, default_name, extensions=(SIM_TABLE,)))


def _settings(table: Any, err: Any) -> SimSettings:
    if table is None:
        return SimSettings()
    if not isinstance(table, dict):
        err(("sim",), "sim: must be a table")
        return SimSettings()
    for key in sorted(set(table) - set(_SIM_KEYS)):
        err(("sim", key), f"sim.{key}: unknown key (known: {', '.join(_SIM_KEYS)})")
    values: dict[str, Any] = {}
    for key in ("latency_ms", "consume_ms"):
        if key in table:
            try:
                values[key] = parse_distribution(table[key])
            except ValueError as e:
                err(("sim", key), f"sim.{key}: {e}")
    if "digest_over" in table:
        v = table["digest_over"]
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            err(("sim", "digest_over"), f"sim.digest_over: must be an integer >= 0, got {v!r}")
        else:
            values["digest_over"] = v
    for key in ("omit_repeated_rebalances", "rocketmq5", "pull_events", "host_network"):
        if key in table:
            v = table[key]
            if not isinstance(v, bool):
                err(("sim", key), f"sim.{key}: must be true or false, got {v!r}")
            else:
                values[key] = v
    if "wire" in table:
        v = table["wire"]
        if v not in WIRES:
            err(("sim", "wire"), f"sim.wire: must be one of {', '.join(map(repr, WIRES))}, got {v!r}")
        else:
            values["wire"] = v
    if "client" in table:
        values["client"] = _client(table["client"], err)
    gcs = []
    raw_gc = table.get("gc", [])
    if not isinstance(raw_gc, list):
        err(("sim", "gc"), "sim.gc: write [[sim.gc]] tables")
        raw_gc = []
    for i, g in enumerate(raw_gc):
        spec = _gc(i, g, err)
        if spec is not None:
            gcs.append(spec)
    return SimSettings(**values, gc=tuple(gcs))


def _client(table: Any, err: Any) -> tuple[tuple[str, Any], ...]:
    """[sim.client]: ConsumerConfig fields, each checked by the consumer's own validation."""
    if not isinstance(table, dict):
        err(("sim", "client"), "sim.client: must be a table of consumer settings")
        return ()
    good: list[tuple[str, Any]] = []
    for key, value in table.items():
        if key in _CLIENT_SET_BY_SIM:
            err(("sim", "client", key), f"sim.client.{key}: set by the simulator from the experiment")
            continue
        try:
            # a stand-in name server address: only the setting itself is being checked
            ConsumerConfig.from_mapping({key: value}, namesrv_addr="127.0.0.1:9876")
        except ConfigError as e:
            err(("sim", "client", key), f"sim.client.{key}: {e}")
            continue
        except TypeError as e:  # a value of the wrong kind that the dataclass itself rejects
            err(("sim", "client", key), f"sim.client.{key}: bad value {value!r} ({e})")
            continue
        good.append((key, value))
    return tuple(good)


def _num(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and v >= 0


def _gc(i: int, g: Any, err: Any) -> GcSpec | None:
    where = f"sim.gc[{i + 1}]"
    path = ("sim", "gc", i)
    if not isinstance(g, dict):
        err(path, f"{where}: must be a table")
        return None
    for key in sorted(set(g) - set(_GC_KEYS)):
        err((*path, key), f"{where}.{key}: unknown key (known: {', '.join(_GC_KEYS)})")
    target = g.get("target")
    if not isinstance(target, str):
        err(path, f"{where}: 'target' (a consumer node or consumer:random|next|all) is required")
        return None
    if "pause_s" not in g:
        err(path, f"{where}: 'pause_s' (seconds, a number or a distribution) is required")
        return None
    try:
        pause = parse_distribution(g["pause_s"])
    except ValueError as e:
        err((*path, "pause_s"), f"{where}.pause_s: {e}")
        return None
    given = [k for k in ("at", "every", "random") if k in g]
    if len(given) != 1:
        err(path, f"{where}: give exactly one of 'at', 'every' or 'random'")
        return None
    at = g.get("at", [])
    at_list = at if isinstance(at, list) else [at]
    for key, ok in (
        ("every", lambda v: _num(v) and v > 0),
        ("from", _num),
        ("until", _num),
        ("times", lambda v: isinstance(v, int) and not isinstance(v, bool) and v > 0),
        ("random", lambda v: isinstance(v, int) and not isinstance(v, bool) and v > 0),
    ):
        if key in g and not ok(g[key]):
            err((*path, key), f"{where}.{key}: bad value {g[key]!r}")
            return None
    if not all(_num(x) for x in at_list):
        err((*path, "at"), f"{where}.at: must be numbers >= 0")
        return None
    return GcSpec(
        index=i + 1,
        target=target,
        group=g.get("group") if isinstance(g.get("group"), str) else None,
        at=tuple(float(x) for x in at_list),
        every=float(g["every"]) if "every" in g else None,
        start=float(g["from"]) if "from" in g else None,
        until=float(g["until"]) if "until" in g else None,
        times=g.get("times"),
        random_count=g.get("random"),
        pause_s=pause,
    )


def gc_steps(exp: Experiment, sim: SimSettings) -> list[Step]:
    """Pause/resume pairs for every [[sim.gc]] entry; times, targets and lengths drawn from the seed."""
    nodes = exp.nodes()
    steps: list[Step] = []
    for g in sim.gc:
        # the chaos language's own schedule rules, on a stand-in nemesis
        spec = NemesisSpec(
            index=1000 + g.index,
            line=None,
            action="pause",
            target=g.target,
            group=g.group,
            at=g.at,
            every=g.every,
            start=g.start,
            until=g.until,
            times=g.times,
            random_count=g.random_count,
            for_s=None,
        )
        times = nemesis_times(spec, exp.seed, exp.duration)
        matching = candidates(g.target, g.group, nodes)
        if not matching:
            raise ExperimentError(exp.source, [(None, f"sim.gc[{g.index}]: no node matches {g.target!r}")])
        rng = random.Random(f"{exp.seed}:gc:{g.index}")
        drawn = tuple(matching) if g.target.endswith(":random") else ()
        for k, t in enumerate(times):
            for target in pick_targets(g.target, matching, k, rng):
                info = nodes[target]
                group = info.group if info.role == "consumer" else None
                length = round(g.pause_s.sample(rng), 3)
                pause = Step(t, "pause", target, info.role, group, {"gc": True}, spec.index, drawn, k)
                steps.append(pause)
                steps.append(
                    replace(pause, t=round(t + length, 6), action="resume", params={"gc": True}, choices=())
                )
    return steps
