"""rmqlab: a RocketMQ rebalance emulator and chaos lab.

Everything the distribution installs lives under this one namespace: ``rmqlab.protocol``,
``rmqlab.broker``, ``rmqlab.client``, ``rmqlab.chaos``, ``rmqlab.sim``, ``rmqlab.pipeline`` and
``rmqlab.proxy``, plus the data the commands read at run time (``rmqlab.interop``'s drivers,
``rmqlab.sweeps``, each role's shipped experiments). The checkout keeps one top-level folder per role;
``pyproject.toml`` maps them here.
"""

from __future__ import annotations

from importlib import metadata

DISTRIBUTION = "rocketmq-rebalance-lab"

try:
    __version__ = metadata.version(DISTRIBUTION)
except metadata.PackageNotFoundError:  # sources shipped without metadata (a Spark executor's zip)
    __version__ = "0+unknown"

__all__ = ["DISTRIBUTION", "__version__"]
