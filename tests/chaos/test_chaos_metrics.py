"""rmq-chaos run --metrics: every name server, broker and consumer of ours serves live metrics while
the experiment runs, at the addresses the runner prints."""

from __future__ import annotations

import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

EXPERIMENT = """\
name = "metrics"
question = "does every node serve its metrics?"
time_scale = 0.05
duration = 200
seed = 3

[cluster]
brokers = 1

[[topics]]
name = "T"
queues = 4

[[consumers]]
group = "g"
topic = "T"
count = 2

[workload]
rate = 40
count = 200
"""


def scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return resp.read().decode()


@pytest.mark.slow
def test_every_node_of_a_run_serves_its_metrics_at_the_printed_address(tmp_path: Path) -> None:
    (tmp_path / "exp.toml").write_text(EXPERIMENT)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "rmqlab.chaos",
            "run",
            "exp.toml",
            "--metrics",
            "--no-analyze",
            "--out",
            "run",
        ],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert proc.stdout is not None
    urls: dict[str, str] = {}
    seen: dict[str, str] = {}
    try:
        for line in proc.stdout:
            if line.startswith("metrics: "):
                node, url = line.split()[1:3]
                urls[node] = url
            elif urls and not seen:  # the next line after the endpoints: the run is on
                seen = {node: scrape(url) for node, url in urls.items()}
        rc = proc.wait(timeout=300)
    finally:
        proc.kill()
    assert rc == 0
    assert set(urls) == {"namesrv", "broker-a", "consumer-1", "consumer-2"}
    assert "active_broker_num" in seen["namesrv"]
    assert 'rocketmq_consumer_connections{cluster="DefaultCluster",consumer_group="g"' in seen["broker-a"]
    assert "rmqlab_consumer_rebalances_total" in seen["consumer-1"]
