"""A Spark standalone cluster for tests: a master and a worker (2 cores, 1 GiB) started from the installed
pyspark on 127.0.0.1, stopped with their process groups."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

STARTUP_S = 240  # the machine may be busy: JVM starts are slow there


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _spark_env(tmp: Path) -> dict[str, str]:
    import pyspark

    home = str(Path(pyspark.__file__).parent)
    env = dict(os.environ, SPARK_HOME=home, SPARK_LOCAL_IP="127.0.0.1", SPARK_LOG_DIR=str(tmp / "logs"))
    env.pop("SPARK_CONF_DIR", None)
    return env


def _start(cmd: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "wb") as fh:
        return subprocess.Popen(cmd, env=env, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


class ClusterFailed(RuntimeError):
    """The master or the worker did not come up."""


@contextmanager
def standalone_cluster(tmp: Path) -> Iterator[str]:
    """spark://127.0.0.1:PORT of a standalone master with one worker (2 cores, 1 GiB)."""
    import pyspark

    env = _spark_env(tmp)
    spark_class = str(Path(pyspark.__file__).parent / "bin" / "spark-class")
    port, ui = _free_port(), _free_port()
    master = _start(
        [spark_class, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(port),
         "--webui-port", str(ui)],
        env, tmp / "master.log",
    )  # fmt: skip
    url = f"spark://127.0.0.1:{port}"
    worker = _start(
        [spark_class, "org.apache.spark.deploy.worker.Worker", url, "--host", "127.0.0.1", "--cores", "2",
         "--memory", "1g", "--webui-port", str(_free_port()), "--work-dir", str(tmp / "work")],
        env, tmp / "worker.log",
    )  # fmt: skip
    try:
        deadline = time.monotonic() + STARTUP_S
        while True:
            for proc, name in ((master, "master"), (worker, "worker")):
                if proc.poll() is not None:
                    raise ClusterFailed(
                        f"the Spark {name} exited: {(tmp / f'{name}.log').read_text()[-2000:]}"
                    )
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{ui}/json/", timeout=5) as resp:
                    state = json.load(resp)
                if state.get("aliveworkers", 0) >= 1:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise ClusterFailed(f"no worker registered with the master within {STARTUP_S} s")
            time.sleep(1)
        yield url
    finally:
        _stop(worker)
        _stop(master)
