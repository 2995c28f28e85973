"""docker-compose.yml and Dockerfile, checked without a Docker engine: the file is read with a strict
YAML-subset reader, and every command is parsed by the role's own argparse parser."""

from __future__ import annotations

import argparse
import importlib
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
from kit.compose_reader import SubsetError, interpolate, load

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
HOSTNAME = "c0ffee123456"
ROLE_SCRIPTS = {"rmq-namesrv", "rmq-broker", "rmq-producer", "rmq-consumer"}
SHELL_WORDS = {"until", "while", "do", "done", "then", "fi", "if", "else", "exec"}


def compose() -> dict[str, Any]:
    return interpolate(load(COMPOSE.read_text()), {})


def console_scripts() -> dict[str, str]:
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    return {name: target.split(":")[0] for name, target in scripts.items()}


def parse_with_role(argv: list[str]) -> argparse.Namespace:
    """Parse ``argv`` (script + args) with the role's own parser, or fail the test with its message."""
    module_name = console_scripts()[argv[0]]
    module = importlib.import_module(module_name)
    build = getattr(module, "build_parser", None)
    if build is None:  # no parser builder exposed: at least every flag must be in --help
        help_text = subprocess.run(
            [sys.executable, "-m", module_name, "--help"], capture_output=True, text=True, timeout=30
        ).stdout
        for a in argv[1:]:
            if a.startswith("--"):
                assert a.split("=")[0] in help_text, f"{argv[0]} has no flag {a}"
        return argparse.Namespace()
    try:
        return build().parse_args(argv[1:])
    except SystemExit as e:
        pytest.fail(f"{shlex.join(argv)} is rejected by {module_name}'s parser (exit {e.code})")


def commands(service: dict[str, Any]) -> list[list[str]]:
    """The simple commands a service runs: its command list, or each command of its ``sh -c`` script."""
    cmd = service["command"]
    assert isinstance(cmd, list) and all(isinstance(a, str) for a in cmd)
    if cmd[:2] != ["sh", "-c"]:
        assert "$" not in " ".join(cmd), cmd
        return [cmd]
    assert len(cmd) == 3
    script = cmd[2].replace("$(hostname)", HOSTNAME)
    assert "$" not in script, f"unexpected shell expansion in {script!r}"
    lex = shlex.shlex(script, posix=True, punctuation_chars=";&|")
    lex.whitespace_split = True
    out: list[list[str]] = [[]]
    for tok in lex:
        if tok in (";", "&&", "||", "|", "&"):
            out.append([])
        elif not out[-1] and tok in SHELL_WORDS:
            continue
        else:
            out[-1].append(tok)
    return [c for c in out if c]


def role_commands(doc: dict[str, Any]) -> dict[str, list[str]]:
    out = {}
    for name, svc in doc["services"].items():
        for c in commands(svc):
            if c[0] in ROLE_SCRIPTS:
                out[name] = c
    return out


def flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_reader_rejects_what_it_does_not_understand() -> None:
    assert load('a:\n  b:\n    - "x"\n    - 3\n  c: true\n# note\nd: plain-word\n') == {
        "a": {"b": ["x", 3], "c": True},
        "d": "plain-word",
    }
    for bad, why in [
        ("a: [1, 2]\n", "outside the subset"),
        ("a: yes\n", "double-quote it"),
        ("a: 80:80\n", "double-quote it"),
        ("a:\n\t- x\n", "tab"),
        ("a: &x 1\n", "double-quote it"),
        ('a: "x" # c\n', "only a quoted string"),
        ("a:\n  - b: 1\n", "scalars"),
        ("a: 1\na: 2\n", "duplicate key"),
        ("a:\n   b: 1\n", "multiple of two"),
        ("a: |\n  x\n", "double-quote it"),
    ]:
        with pytest.raises(SubsetError, match=why):
            load(bad)


def test_interpolation_follows_compose() -> None:
    doc = {"x": ["${A:-1}", "${B-2}", "$$(hostname)", "$C", "${D}"]}
    assert interpolate(doc, {"A": "", "C": "c"}) == {"x": ["1", "2", "$(hostname)", "c", ""]}


def test_file_parses_in_the_subset_with_the_expected_services() -> None:
    doc = load(COMPOSE.read_text())
    assert set(doc) == {"services"}  # no top-level name: (docker-compose 1.29 rejects it)
    assert set(doc["services"]) == {"namesrv", "broker-a", "broker-b", "setup", "producer", "consumer"}
    consumer = doc["services"]["consumer"]
    # a scalable service: no fixed container name or host port
    assert "container_name" not in consumer and "ports" not in consumer


def test_every_command_is_accepted_by_the_roles_own_parser() -> None:
    doc = compose()
    roles = role_commands(doc)
    assert {name: argv[0] for name, argv in roles.items()} == {
        "namesrv": "rmq-namesrv",
        "broker-a": "rmq-broker",
        "broker-b": "rmq-broker",
        "producer": "rmq-producer",
        "consumer": "rmq-consumer",
    }
    assert ROLE_SCRIPTS | {"rmq-admin"} <= set(console_scripts())
    nodes = []
    for name, argv in roles.items():
        args = parse_with_role(argv)
        # the same flags the local supervisor passes to every role
        assert args.node and args.log_file and args.time_scale == 0.05, name
        assert args.log_file.startswith("/runs/compose/") and args.log_file.endswith(".jsonl")
        nodes.append(args.node)
    assert len(nodes) == len(set(nodes))
    args = parse_with_role(roles["consumer"])
    assert args.node == f"consumer-{HOSTNAME}" and HOSTNAME in args.log_file  # unique per replica
    admin = [c for c in commands(doc["services"]["setup"]) if c[0] == "rmq-admin"]
    assert len(admin) == 2
    from rmqlab.chaos.admin import build_parser

    for argv in admin:
        a = build_parser().parse_args(argv[1:])
        assert (a.command, a.topic_command, a.topic, a.queues) == ("topic", "create", "LabTopic", 8)


def test_ports_and_addresses_agree() -> None:
    doc = compose()
    services = doc["services"]
    roles = role_commands(doc)
    ports = {}
    for name in ("namesrv", "broker-a", "broker-b"):
        argv = roles[name]
        port = flag(argv, "--port")
        assert flag(argv, "--host") == "0.0.0.0"
        assert port in services[name]["expose"], name
        for mapping in services[name].get("ports", []):
            assert mapping.startswith("127.0.0.1:") and mapping.rsplit(":", 1)[1] == port
        ports[name] = port
    assert flag(roles["broker-a"], "--broker-name") == "broker-a"
    assert flag(roles["broker-b"], "--broker-name") == "broker-b"
    for name in ("broker-a", "broker-b", "producer", "consumer"):
        assert flag(roles[name], "--namesrv") == f"namesrv:{ports['namesrv']}", name
    for name in ("broker-a", "broker-b", "consumer"):
        assert services[name]["depends_on"] == ["namesrv"], name
    assert services["setup"]["depends_on"] == ["broker-a", "broker-b"]
    for argv in (c for c in commands(services["setup"]) if c[0] == "rmq-admin"):
        host, _, port = flag(argv, "--broker").partition(":")
        assert host in ("broker-a", "broker-b") and port == ports[host]
    assert services["producer"]["depends_on"] == {"setup": {"condition": "service_completed_successfully"}}
    assert flag(roles["producer"], "--topic") == flag(roles["consumer"], "--topic") == "LabTopic"


def test_every_role_writes_into_the_runs_volume() -> None:
    doc = compose()
    for name, svc in doc["services"].items():
        if name == "setup":
            continue
        assert "./runs:/runs" in svc["volumes"], name
        assert svc["init"] is True  # signals reach the role, and it is reaped, under an init process
        assert svc["image"] == "rocketmq-rebalance-lab:latest" and svc["build"] == "."


def test_dockerfile_installs_the_package_with_every_role() -> None:
    text = (ROOT / "Dockerfile").read_text()
    # the base is a build argument, the usual Python image by default
    assert re.search(r"^ARG BASE_IMAGE=python:3\.11-slim$", text, re.M)
    assert re.search(r"^FROM \$\{BASE_IMAGE\}$", text, re.M)
    for pkg in ("protocol", "broker", "client", "chaos", "pipeline", "sim"):
        assert re.search(rf"^COPY {pkg} \./{pkg}$", text, re.M), pkg
    # into a virtual environment: the dependencies from host-built wheels when there are some (offline),
    # before the sources, and the package from the copied sources; else everything from the index
    assert 'python3 -m venv "$VIRTUAL_ENV"' in text and "PATH=/opt/rmqlab/bin:" in text
    assert text.index("pip install --no-index wheels/*.whl") < text.index("COPY protocol ./protocol")
    assert "pip install --no-index --no-deps --no-build-isolation ." in text
    assert re.search(r"^LABEL org\.rocketmq-rebalance-lab\.source-digest=\$\{SOURCE_DIGEST\}$", text, re.M)
    assert 'VOLUME ["/runs"]' in text


def test_dockerignore_keeps_only_the_sources_and_wheels() -> None:
    lines = [ln for ln in (ROOT / ".dockerignore").read_text().splitlines() if ln and not ln.startswith("#")]
    assert lines[0] == "*"
    allowed = {ln[1:].rstrip("/") for ln in lines if ln.startswith("!")}
    assert allowed == {
        "pyproject.toml",
        "README.md",
        "LICENSE",
        "rmqlab",
        "interop",
        "sweeps",
        "protocol",
        "broker",
        "client",
        "chaos",
        "pipeline",
        "sim",
        "proxy",
        "wheels",
    }


def test_files_written_as_the_caller_when_asked() -> None:
    doc = load(COMPOSE.read_text())
    for name, svc in doc["services"].items():
        assert svc["user"] == "${RMQ_USER:-0:0}", name
    assert interpolate(doc, {"RMQ_USER": "1000:1000"})["services"]["consumer"]["user"] == "1000:1000"
    assert interpolate(doc, {})["services"]["consumer"]["user"] == "0:0"


@pytest.mark.skipif(shutil.which("docker-compose") is None, reason="docker-compose 1.29 not installed")
def test_docker_compose_accepts_the_file() -> None:
    proc = subprocess.run(
        ["docker-compose", "-f", str(COMPOSE), "config", "-q"], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
