"""The kernel's netem on a container's link: whether the kernel has it, and the ``tc`` commands of a fault.

Latency, jitter and packet loss between two containers are a netem qdisc on the sending side, for the
packets to the other end only: the namespace's root becomes a ``prio`` qdisc whose first three bands
keep the default priority map (unshaped traffic), and every shaped destination gets a band of its own
with a netem qdisc, chosen by a u32 filter on the destination address. Nothing here runs ``tc``: the
container backend runs the commands in a container's network namespace (``nsenter -n``), and the probe
in a scratch namespace of its own, so the probe leaves nothing behind.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, replace

DEVICE = "eth0"  # a container's interface on its bridge network
ROOT = "1:"
BANDS = 16  # prio's maximum
FIRST_BAND = 4  # bands 1-3 carry the unshaped traffic, as prio's default priority map puts it
# prio's default priority map (every priority to bands 1-3), given explicitly with 16 bands
PRIOMAP = ["1", "2", "2", "2", "1", "2", "0", "0", "1", "1", "1", "1", "1", "1", "1", "1"]


class NetemFull(RuntimeError):
    """No band left in a namespace for one more shaped destination."""


@dataclass(frozen=True)
class Shape:
    """What netem does to the packets of one link: held ``delay_ms`` plus up to ``jitter_ms`` (uniformly,
    as the lab's fault relay adds it), and each one dropped with ``loss_percent`` chance."""

    delay_ms: float = 0.0
    jitter_ms: float = 0.0
    loss_percent: float = 0.0

    def netem_args(self) -> list[str]:
        args = ["netem"]
        if self.delay_ms or self.jitter_ms:
            # netem's jitter is +-: centre the window so the delay is uniform in [ms, ms + jitter]
            half = self.jitter_ms / 2
            args += ["delay", _us(self.delay_ms + half)]
            if half:
                args.append(_us(half))
        if self.loss_percent:
            args += ["loss", "random", f"{self.loss_percent:g}%"]
        return args

    def merged(self, other: Shape) -> Shape:
        """Two faults on one link at once: the larger of each."""
        return Shape(
            max(self.delay_ms, other.delay_ms),
            max(self.jitter_ms, other.jitter_ms),
            max(self.loss_percent, other.loss_percent),
        )


def _us(ms: float) -> str:
    return f"{round(ms * 1000)}us"


def _band(k: int) -> tuple[str, str]:
    """prio's class of band ``k`` and the handle of the netem under it (tc reads both in hex)."""
    return f"1:{k:x}", f"{k:x}0:"


def probe_command() -> list[str]:
    """Add a netem qdisc to the loopback of a network namespace made for the purpose (gone at exit)."""
    return ["unshare", "--net", "tc", "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1ms"]


def probe_precondition() -> str | None:
    """Why the probe cannot even be tried here (None when it can)."""
    missing = [t for t in ("tc", "unshare", "nsenter") if shutil.which(t) is None]
    if missing:
        return f"{' and '.join(missing)} not installed (apt-get install iproute2 util-linux)"
    if os.geteuid() != 0:
        return "netem is set in a container's network namespace, which needs root"
    return None


def probe_answer(returncode: int, stderr: str) -> str | None:
    """None when the probe added its qdisc, else why not (one line)."""
    if returncode == 0:
        return None
    first = stderr.strip().splitlines()[0] if stderr.strip() else f"exit {returncode}"
    return f"this kernel refuses a netem qdisc ({first})"


class NetemTable:
    """The netem qdiscs in force in one network namespace, and the ``tc`` arguments that change them.

    Every shaped destination address has a band; each owner (the nemesis target that asked) has its own
    shape there, and the band's netem is their merge, so that healing one fault leaves another on the
    same link in force."""

    def __init__(self, device: str = DEVICE) -> None:
        self.device = device
        self.bands: dict[str, int] = {}  # destination ip -> band
        self.shapes: dict[str, dict[str, Shape]] = {}  # destination ip -> owner -> shape

    def __bool__(self) -> bool:
        return bool(self.bands)

    def shape_of(self, dst: str) -> Shape | None:
        owners = self.shapes.get(dst)
        if not owners:
            return None
        out = Shape()
        for s in owners.values():
            out = out.merged(s)
        return out

    def _qdisc(self, verb: str, k: int, shape: Shape) -> list[str]:
        cls, handle = _band(k)
        return ["qdisc", verb, "dev", self.device, "parent", cls, "handle", handle, *shape.netem_args()]

    def set(self, dst: str, owner: str, **fields: float) -> list[list[str]]:
        """Make ``owner``'s shape of the link to ``dst`` have ``fields`` (delay_ms, jitter_ms,
        loss_percent); the ``tc`` argument lists that do it, in order."""
        owners = self.shapes.setdefault(dst, {})
        owners[owner] = replace(owners.get(owner, Shape()), **fields)
        shape = self.shape_of(dst)
        assert shape is not None
        if dst in self.bands:
            return [self._qdisc("change", self.bands[dst], shape)]
        used = set(self.bands.values())
        free = [k for k in range(FIRST_BAND, BANDS + 1) if k not in used]
        if not free:
            del owners[owner]
            raise NetemFull(f"no netem band left on {self.device} for {dst} ({len(used)} links shaped)")
        k = free[0]
        cmds = []
        if not self.bands:
            cmds.append(
                ["qdisc", "add", "dev", self.device, "root", "handle", ROOT, "prio", "bands", str(BANDS),
                 "priomap", *PRIOMAP]
            )  # fmt: skip
        self.bands[dst] = k
        cmds.append(self._qdisc("add", k, shape))
        cmds.append(
            ["filter", "add", "dev", self.device, "parent", ROOT, "protocol", "ip", "prio", str(k), "u32",
             "match", "ip", "dst", f"{dst}/32", "flowid", _band(k)[0]]
        )  # fmt: skip
        return cmds

    def clear(self, dst: str, owner: str) -> list[list[str]]:
        """Take ``owner``'s shape off the link to ``dst``: what is left of others', or the band itself
        (and the root, when it was the last)."""
        owners = self.shapes.get(dst, {})
        if owner not in owners:
            return []
        del owners[owner]
        shape = self.shape_of(dst)
        if shape is not None:
            return [self._qdisc("change", self.bands[dst], shape)]
        del self.shapes[dst]
        k = self.bands.pop(dst)
        if not self.bands:
            return [self._root_del()]
        return [
            ["filter", "del", "dev", self.device, "parent", ROOT, "protocol", "ip", "prio", str(k)],
            ["qdisc", "del", "dev", self.device, "parent", _band(k)[0], "handle", _band(k)[1]],
        ]

    def _root_del(self) -> list[str]:
        return ["qdisc", "del", "dev", self.device, "root"]

    def teardown(self) -> list[list[str]]:
        """Remove everything (the root qdisc takes its bands and filters along); nothing when nothing is
        shaped."""
        had = bool(self.bands)
        self.bands.clear()
        self.shapes.clear()
        return [self._root_del()] if had else []

    def owners(self) -> set[str]:
        return {o for owners in self.shapes.values() for o in owners}
