"""The lab as users install it: one import package (``rmqlab``) that a user's own ``sim.py``,
``pipeline/`` or ``chaos/`` cannot shadow, every console script with ``--version``, and a wheel that
installs (not editable) into a fresh environment and runs from any folder."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = sorted(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"])
BIN = Path(sys.executable).parent
# Names a data or test project commonly has, and the lab's role folders carried before the namespace.
SHADOWING_PACKAGES = ("pipeline", "chaos", "broker", "client", "proxy")
SHADOWING_MODULES = ("sim", "protocol")


def shadowing_project(folder: Path) -> Path:
    """A user's project whose modules named like the lab's roles fail loudly when imported."""
    for name in SHADOWING_PACKAGES:
        (folder / name).mkdir(parents=True)
        (folder / name / "__init__.py").write_text(
            f"raise ImportError('the user\\'s own {name} was imported')\n"
        )
    for name in SHADOWING_MODULES:
        (folder / f"{name}.py").write_text(f"raise SystemExit('the user\\'s own {name}.py was run')\n")
    return folder


def run(argv: list[str], cwd: Path, env: dict[str, str] | None = None, timeout: float = 300):
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def project(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    folder = shadowing_project(tmp_path / "project")
    env = {**os.environ, "PYTHONPATH": str(folder)}  # the user's folder first on sys.path
    return folder, env


@pytest.mark.parametrize("script", SCRIPTS)
def test_every_console_script_helps_and_tells_its_version_beside_a_shadowing_project(
    project: tuple[Path, dict[str, str]], script: str
) -> None:
    folder, env = project
    helped = run([str(BIN / script), "--help"], folder, env, timeout=120)
    assert helped.returncode == 0, helped.stdout + helped.stderr
    assert "exit codes:" in helped.stdout and "the user's own" not in helped.stdout + helped.stderr
    version = run([str(BIN / script), "--version"], folder, env, timeout=120)
    assert version.returncode == 0, version.stderr
    assert version.stdout.strip() == f"{script} (rocketmq-rebalance-lab {_version()})"
    completion = run([str(BIN / script), "--print-completion", "bash"], folder, env, timeout=120)
    assert completion.returncode == 0 and "-F _shtab_" in completion.stdout, completion.stderr


def _version() -> str:
    from importlib import metadata

    return metadata.version("rocketmq-rebalance-lab")


@pytest.mark.slow
@pytest.mark.spark
def test_a_simulated_run_its_analysis_and_the_pytest_plugin_work_beside_a_shadowing_project(
    project: tuple[Path, dict[str, str]],
) -> None:
    pytest.importorskip("pyspark")
    folder, env = project
    sim = run(
        [str(BIN / "rmq-sim"), "run", "kill-one-of-four", "--out", "run", "--no-analyze", "--json"],
        folder,
        env,
    )
    assert sim.returncode == 0, sim.stdout + sim.stderr
    assert json.loads(sim.stdout)["verdict"] == "ok"
    analysed = run([str(BIN / "rmq-analyze"), "run", "--no-report", "--quiet"], folder, env, timeout=600)
    assert analysed.returncode == 0, analysed.stdout + analysed.stderr
    summary = json.loads((folder / "run" / "summary.json").read_text())
    assert summary["groups"]["GID_orders"]["lost"] == 0
    (folder / "test_users_consumer.py").write_text(
        "def test_a_group_consumes_what_was_sent(rmq_lab):\n"
        "    rmq_lab.start_broker()\n"
        "    rmq_lab.create_topic('T', queues=4)\n"
        "    rmq_lab.start_consumers('g', 'T', count=2)\n"
        "    rmq_lab.wait_converged('g')\n"
        "    sent = rmq_lab.produce('T', 20)\n"
        "    rmq_lab.wait_consumed('g', sent)\n"
        "    rmq_lab.assert_no_loss('g', sent)\n"
    )
    tested = run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_users_consumer.py"],
        folder,
        env,
    )
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert "1 passed" in tested.stdout


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    built = run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--disable-pip-version-check",
            "-q",
            "-w",
            str(out),
            str(ROOT),
        ],
        ROOT,
        timeout=600,
    )
    assert built.returncode == 0, built.stdout + built.stderr
    (path,) = out.glob("rocketmq_rebalance_lab-*.whl")
    return path


@pytest.mark.slow
def test_the_wheel_holds_one_top_level_package_with_its_data(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/")[0] for n in names if not n.split("/")[0].endswith((".dist-info", ".data"))}
    assert top == {"rmqlab"}
    for needed in (
        "rmqlab/py.typed",
        "rmqlab/chaos/experiments/kill-one-of-four.toml",
        "rmqlab/sim/experiments/sim-scale.toml",
        "rmqlab/sweeps/strategy-churn.toml",
        "rmqlab/interop/js/consumer.js",
        "rmqlab/interop/cpp_consumer.py",
    ):
        assert needed in names, needed
    assert not [n for n in names if "node_modules" in n or "__pycache__" in n]
    # every module of the checkout's role folders is in the wheel
    for folder in ("protocol", "broker", "client", "chaos", "sim", "pipeline", "proxy"):
        for source in (ROOT / folder).rglob("*.py"):
            assert f"rmqlab/{source.relative_to(ROOT).as_posix()}" in names, source
    metadata = next(n for n in names if n.endswith(".dist-info/METADATA"))
    text = zipfile.ZipFile(wheel).read(metadata).decode()
    assert "License-Expression: Apache-2.0" in text
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)


@pytest.mark.slow
def test_the_installed_wheel_runs_experiments_from_any_folder(wheel: Path, tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    made = run([sys.executable, "-m", "venv", str(venv)], tmp_path, timeout=120)
    assert made.returncode == 0, made.stderr
    py = venv / "bin" / "python"
    installed = run(
        [str(py), "-m", "pip", "install", "--no-deps", "--disable-pip-version-check", "-q", str(wheel)],
        tmp_path,
        timeout=300,
    )
    assert installed.returncode == 0, installed.stdout + installed.stderr
    # The dependencies come from this environment (a path line adds its site-packages and nothing more:
    # its editable install of the lab is not activated), so the lab itself is the wheel's.
    site = Path(
        run(
            [str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], tmp_path
        ).stdout.strip()
    )
    (site / "lab-deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    where = run(
        [str(py), "-c", "import rmqlab.chaos, rmqlab; print(rmqlab.chaos.__file__, rmqlab.__version__)"],
        tmp_path,
    )
    assert where.returncode == 0, where.stderr
    assert where.stdout.startswith(str(venv)) and str(ROOT) not in where.stdout
    outside = shadowing_project(tmp_path / "elsewhere")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    listed = run([str(venv / "bin" / "rmq-chaos"), "list", "--json"], outside, env)
    assert listed.returncode == 0, listed.stderr
    assert "kill-one-of-four" in {e["name"] for e in json.loads(listed.stdout)}
    sweep = run([str(venv / "bin" / "rmq-sim"), "sweep", "strategy-churn", "--dry-run"], outside, env)
    assert sweep.returncode == 0 and "12 runs" in sweep.stdout, sweep.stdout + sweep.stderr
    sim = run(
        [str(venv / "bin" / "rmq-sim"), "run", "kill-one-of-four", "--no-analyze", "--json"], outside, env
    )
    assert sim.returncode == 0, sim.stdout + sim.stderr
    assert json.loads(sim.stdout)["verdict"] == "ok"
    real = run(
        [
            str(venv / "bin" / "rmq-chaos"),
            "run",
            "kill-one-of-four",
            "--no-analyze",
            "--json",
            "--out",
            "real",
        ],
        outside,
        env,
        timeout=600,
    )
    assert real.returncode == 0, real.stdout + real.stderr
    assert json.loads(real.stdout)["verdict"] == "ok"
    assert (outside / "real" / "consumer-1.jsonl").is_file()
