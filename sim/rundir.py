"""A simulated run read back: its experiment and seed from the manifest and ``experiment.toml`` that
``rmq-sim run`` wrote (for ``rmq-sim replay`` and ``rmq-sim shrink``)."""

from __future__ import annotations

import json
from pathlib import Path

from rmqlab.lab.experiment import ExperimentError
from rmqlab.sim.sim_table import SimExperiment, parse


class RunDirError(Exception):
    """RUN_DIR is not a simulated run that can be read again."""


def read_sim_run(run_dir: Path) -> tuple[SimExperiment, int]:
    """The experiment and seed of a simulated run, from its manifest and experiment.toml."""
    manifest_path = run_dir / "manifest.json"
    if not run_dir.is_dir():
        raise RunDirError(f"{run_dir} is not a directory")
    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    except OSError:
        raise RunDirError(f"{run_dir} has no manifest.json: not a run directory") from None
    except ValueError as e:
        raise RunDirError(f"{manifest_path}: not valid JSON ({e})") from None
    if not isinstance(manifest, dict) or manifest.get("mode") != "sim":
        mode = manifest.get("mode", "real processes") if isinstance(manifest, dict) else "?"
        raise RunDirError(
            f"{run_dir} is not a simulated run (its manifest says mode: {mode}); only rmq-sim runs "
            "can be replayed or shrunk"
        )
    seed = manifest.get("seed")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise RunDirError(f"{manifest_path}: 'seed' is not an integer: {seed!r}")
    recorded = manifest.get("experiment")
    source = recorded.get("source") if isinstance(recorded, dict) else None
    try:
        sx = parse(
            (run_dir / "experiment.toml").read_text(encoding="utf-8"),
            # the source the run was made from, which its first event names
            source=source if isinstance(source, str) else str(run_dir / "experiment.toml"),
            default_name=str(manifest.get("name") or "experiment"),
        )
    except OSError as e:
        raise RunDirError(f"cannot read {run_dir / 'experiment.toml'}: {e.strerror or e}") from None
    except ExperimentError as e:
        raise RunDirError(str(e)) from None
    return sx, seed
