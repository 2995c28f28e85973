"""``rmq-chaos clean`` removes what runs of the docker backend left behind: a run's labelled containers
(running, paused, created) and its network, with the partition rules in their namespaces; containers
without the label, and other runs' with ``--run``, stay. The engine-free exit codes run anywhere."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from kit.docker import host_rules_mentioning

from rmqlab.chaos.container import RUN_LABEL, ImageInfo


def clean(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rmqlab.chaos", "clean", *args],
        capture_output=True,
        text=True,
        timeout=180,
        env=env,
        check=False,
    )


def docker(*args: str) -> str:
    proc = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, f"docker {' '.join(args)}: {proc.stderr}"
    return proc.stdout.strip()


def names(*filters: str) -> set[str]:
    out = docker("ps", "-a", *(x for f in filters for x in ("--filter", f)), "--format", "{{.Names}}")
    return set(out.split())


def networks(run: str) -> set[str]:
    return set(
        docker("network", "ls", "--filter", f"label={RUN_LABEL}={run}", "--format", "{{.Name}}").split()
    )


def state(name: str) -> str:
    return docker("inspect", "--format", "{{.State.Status}}", name)


def test_clean_removes_a_runs_containers_and_network_and_leaves_the_rest(image: ImageInfo) -> None:
    run, other = f"rmqlab-{secrets.token_hex(4)}", f"rmqlab-{secrets.token_hex(4)}"
    label = f"{RUN_LABEL}={run}"
    mine = [f"{run}-namesrv-1", f"{run}-consumer-1-1", f"{run}-consumer-2-1"]
    unlabelled, others = f"{run}-unlabelled", f"{other}-namesrv-1"
    try:
        # as the docker backend makes them: a labelled network, labelled containers on it
        docker("network", "create", "--driver", "bridge", "--label", label, run)
        subnet = docker("network", "inspect", "--format", "{{range .IPAM.Config}}{{.Subnet}}{{end}}", run)
        for name in mine[:2]:
            docker(
                "run",
                "-d",
                "--name",
                name,
                "--label",
                label,
                "--init",
                "--network",
                run,
                image.name,
                "sleep",
                "600",
            )
        docker("pause", mine[1])
        docker("create", "--name", mine[2], "--label", label, "--network", run, image.name, "sleep", "600")
        docker("run", "-d", "--name", others, "--label", f"{RUN_LABEL}={other}", image.name, "sleep", "600")
        docker("run", "-d", "--name", unlabelled, image.name, "sleep", "600")  # a name like theirs, no label
        partitioned = os.geteuid() == 0 and shutil.which("nsenter") and shutil.which("iptables")
        if partitioned:  # a partition's rule, where the backend puts it: in the container's namespace
            pid = docker("inspect", "--format", "{{.State.Pid}}", mine[0])
            rule = ["OUTPUT", "-d", subnet, "-j", "DROP"]
            subprocess.run(["nsenter", "--target", pid, "--net", "iptables", "-w", "-A", *rule], check=True)

        looked = clean("--run", run, "--dry-run", "--json")
        assert looked.returncode == 0, looked.stderr
        listed: dict[str, Any] = json.loads(looked.stdout)
        assert listed["dry_run"] is True and listed["runs"] == [run] and listed["removed"] == []
        assert sorted(c["name"] for c in listed["containers"]) == sorted(mine)
        assert {c["name"]: c["state"] for c in listed["containers"]}[mine[1]] == "paused"
        assert [n["name"] for n in listed["networks"]] == [run]
        assert names(f"label={label}") == set(mine) and networks(run) == {run}  # nothing removed

        done = clean("--run", run)
        assert done.returncode == 0, done.stdout + done.stderr
        assert "removed 4 of 4 labelled item(s) of 1 run(s)" in done.stdout
        assert names(f"label={label}") == set() and networks(run) == set()
        assert state(unlabelled) == "running" and state(others) == "running"
        if partitioned:
            assert host_rules_mentioning(subnet) == []

        again = clean("--run", run, "--json")
        assert again.returncode == 0 and json.loads(again.stdout)["containers"] == []
        quiet = clean("--run", run)
        assert "nothing to clean" in quiet.stdout and quiet.returncode == 0

        last = clean("--run", other, "--json")
        assert last.returncode == 0 and json.loads(last.stdout)["removed"] == [others]
        assert state(unlabelled) == "running"
    finally:
        subprocess.run(["docker", "rm", "-f", *mine, unlabelled, others], capture_output=True, check=False)
        subprocess.run(["docker", "network", "rm", run], capture_output=True, check=False)


def test_no_engine_is_exit_3_and_bad_usage_exit_2(tmp_path: Path) -> None:
    # an engine that does not answer
    down = clean("--json", env={**os.environ, "DOCKER_HOST": f"unix://{tmp_path}/no-engine.sock"})
    assert down.returncode == 3, down.stderr
    assert json.loads(down.stdout)["ok"] is False and "does not answer" in down.stderr
    # no docker command at all
    no_docker = clean(env={**os.environ, "PATH": str(tmp_path)})
    assert no_docker.returncode == 3 and "docker command is not installed" in no_docker.stderr
    for bad in (["--run", "a b"], ["--run", "x=y"], ["--bogus"]):
        assert clean(*bad).returncode == 2, bad
