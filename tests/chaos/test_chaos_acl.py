"""The lab with RocketMQ's ACL: an experiment's ``[acl]`` runs the brokers with ``--acl`` and signs every
request of the lab's clients and admin; rmq-admin takes credentials."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from kit.chaos import run_experiment

from rmqlab.lab.experiment import ExperimentError, parse

ACL = """\
accounts:
  - accessKey: labadmin
    secretKey: lab-secret
    admin: true
"""

EXPERIMENT = """\
name = "acl"
time_scale = 0.05
duration = 60
seed = 1

[acl]
file = "plain_acl.yml"
access_key = "labadmin"
secret_key = "lab-secret"

[[topics]]
name = "AclTopic"
queues = 4

[[consumers]]
group = "GID_acl"
topic = "AclTopic"
count = 2

[workload]
rate = 50
count = 100

[[nemesis]]
action = "fault"
target = "broker-a"
code = "PULL_MESSAGE"
errors = ["2:injected busy"]
count = 2
at = 20
"""


def test_acl_table_is_checked_before_anything_starts(tmp_path: Path) -> None:
    (tmp_path / "plain_acl.yml").write_text(ACL)
    source = str(tmp_path / "exp.toml")
    exp = parse(EXPERIMENT, source=source)
    assert exp.acl is not None and exp.acl.file == str(tmp_path / "plain_acl.yml")
    with pytest.raises(ExperimentError, match="admin account"):
        parse(EXPERIMENT.replace('"lab-secret"', '"wrong-secret"'), source=source)
    with pytest.raises(ExperimentError, match="cannot read"):
        parse(EXPERIMENT.replace('"plain_acl.yml"', '"missing.yml"'), source=source)


@pytest.mark.slow
def test_an_experiment_with_acl_runs_signed(tmp_path: Path) -> None:
    (tmp_path / "plain_acl.yml").write_text(ACL)
    rc, run_dir, out = run_experiment(tmp_path, EXPERIMENT)
    assert rc == 0, out
    assert "drained: every group consumed all 100 sent message(s)" in out
    broker = [json.loads(line) for line in (run_dir / "broker-a.jsonl").read_text().splitlines() if line]
    assert [e for e in broker if e["event"] == "fault_injected"]
    assert not [e for e in broker if e["event"] == "request_refused"]


@pytest.mark.slow
def test_rmq_admin_signs_with_its_credentials(tmp_path: Path) -> None:
    acl = tmp_path / "plain_acl.yml"
    acl.write_text(ACL)
    broker = subprocess.Popen(
        [sys.executable, "-m", "rmqlab.broker", "--port", "0", "--acl", str(acl)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert broker.stdout is not None
        addr = broker.stdout.readline().split()[1]
        base = [sys.executable, "-m", "rmqlab.chaos.admin_main", "--broker", addr]
        fault = ["fault", "add", "--code", "PULL_MESSAGE", "--error", "2:busy", "--count", "1"]
        refused = subprocess.run(base + fault, capture_output=True, text=True, timeout=30)
        assert refused.returncode == 1 and "No accessKey" in refused.stderr
        keys = ["--access-key", "labadmin", "--secret-key", "lab-secret"]
        done = subprocess.run(base + keys + fault, capture_output=True, text=True, timeout=30)
        assert done.returncode == 0, done.stderr
        half = subprocess.run(base + keys[:2] + fault, capture_output=True, text=True, timeout=30)
        assert half.returncode == 2 and "secret key" in half.stderr
    finally:
        broker.terminate()
        broker.wait(10)
