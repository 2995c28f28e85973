"""Seeded distributions for what a simulation draws: link latency, consume time, GC pauses.

Written in an experiment as a number (constant) or a table such as ``{ dist = "uniform", low = 1,
high = 5 }``, ``{ dist = "normal", mean = 5, sd = 1 }``, ``{ dist = "lognormal", median = 5, sigma = 0.5 }``
or ``{ dist = "exponential", mean = 5 }``; samples are never negative.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

_PARAMS = {
    "constant": ("value",),
    "uniform": ("low", "high"),
    "normal": ("mean", "sd"),
    "lognormal": ("median", "sigma"),
    "exponential": ("mean",),
}


@dataclass(frozen=True)
class Distribution:
    kind: str
    params: tuple[float, ...]

    def sample(self, rng: random.Random) -> float:
        p = self.params
        if self.kind == "constant":
            return p[0]
        if self.kind == "uniform":
            return rng.uniform(p[0], p[1])
        if self.kind == "normal":
            return max(0.0, rng.gauss(p[0], p[1]))
        if self.kind == "lognormal":
            return rng.lognormvariate(math.log(p[0]), p[1])
        return rng.expovariate(1.0 / p[0]) if p[0] > 0 else 0.0

    def sampler(self) -> Callable[[random.Random], float]:
        """``sample`` as one function, its parameters bound: the same draws from ``rng`` and the same
        values, for a caller that samples on every frame."""
        p = self.params
        if self.kind == "constant":
            value = p[0]
            return lambda rng: value
        if self.kind == "uniform":
            low, span = p[0], p[1] - p[0]  # random.uniform(a, b) is a + (b - a) * random()
            return lambda rng: low + span * rng.random()
        return self.sample

    @property
    def mean(self) -> float:
        p = self.params
        if self.kind in ("constant", "exponential"):
            return p[0]
        if self.kind == "uniform":
            return (p[0] + p[1]) / 2
        if self.kind == "normal":
            return p[0]
        return p[0] * math.exp(p[1] ** 2 / 2)

    def describe(self) -> str:
        names = _PARAMS[self.kind]
        return (
            self.kind + "(" + ", ".join(f"{n}={v:g}" for n, v in zip(names, self.params, strict=True)) + ")"
        )


def parse_distribution(value: Any) -> Distribution:
    """A number or a ``{dist = ..., ...}`` table; ValueError naming what is wrong."""
    if isinstance(value, bool):
        raise ValueError(f"expected a number or a distribution table, got {value!r}")
    if isinstance(value, int | float):
        if value < 0 or value != value or math.isinf(value):
            raise ValueError(f"must be a finite number >= 0, got {value!r}")
        return Distribution("constant", (float(value),))
    if not isinstance(value, dict):
        raise ValueError(f"expected a number or a distribution table, got {value!r}")
    kind = value.get("dist")
    if kind not in _PARAMS:
        raise ValueError(f"'dist' must be one of {', '.join(_PARAMS)}, got {kind!r}")
    names = _PARAMS[kind]
    unknown = sorted(set(value) - {"dist", *names})
    if unknown:
        raise ValueError(
            f"unknown key(s) {', '.join(unknown)} for dist = {kind!r} (takes {', '.join(names)})"
        )
    params = []
    for n in names:
        v = value.get(n)
        if isinstance(v, bool) or not isinstance(v, int | float) or v != v or math.isinf(v) or v < 0:
            raise ValueError(f"dist = {kind!r} needs {n} as a finite number >= 0, got {v!r}")
        params.append(float(v))
    if kind == "uniform" and params[1] < params[0]:
        raise ValueError(f"uniform: high ({params[1]:g}) is below low ({params[0]:g})")
    if kind == "lognormal" and params[0] <= 0:
        raise ValueError("lognormal: median must be > 0")
    return Distribution(kind, tuple(params))
