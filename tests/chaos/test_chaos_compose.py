"""docker-compose.yml and Dockerfile, checked without a Docker engine: the file is read with PyYAML
(anchors and merge keys resolved), every command and healthcheck is parsed by the role's own argparse
parser, the healthchecks' Python is run against stand-ins, and start-up waits on health."""

from __future__ import annotations

import argparse
import importlib
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
HOSTNAME = "c0ffee123456"
ROLE_SCRIPTS = {"rmq-namesrv", "rmq-broker", "rmq-producer", "rmq-consumer"}
SHELL_WORDS = {"until", "while", "do", "done", "then", "fi", "if", "else", "exec"}
SERVICES = {"run-dir", "namesrv", "broker-a", "broker-b", "setup", "producer", "consumer"}
ONE_SHOT = {"run-dir", "setup"}  # jobs that run to completion: waited on by their exit, not their health
IMAGE = "rocketmq-rebalance-lab:latest"
MERGE = "tag:yaml.org,2002:merge"  # the tag of a merge key (<<) in PyYAML's node graph

_VAR = re.compile(r"\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?-)([^}]*))?\}|\$([A-Za-z_][A-Za-z0-9_]*)")


def interpolate(value: Any, env: dict[str, str]) -> Any:
    """Compose's variable substitution (``${VAR:-default}``, ``${VAR-default}``, ``${VAR}``, ``$VAR``,
    ``$$``) over every string of a parsed document."""
    if isinstance(value, dict):
        return {k: interpolate(v, env) for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v, env) for v in value]
    if not isinstance(value, str):
        return value

    def sub(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        name = m.group(1) or m.group(4)
        if m.group(2) == ":-":
            return env.get(name) or m.group(3)
        if m.group(2) == "-":
            return env.get(name, m.group(3))
        return env.get(name, "")

    return _VAR.sub(sub, value)


def raw() -> dict[str, Any]:
    """The file as PyYAML reads it (as docker-compose 1.29 does): anchors and merge keys resolved."""
    doc = yaml.safe_load(COMPOSE.read_text())
    assert isinstance(doc, dict)
    return doc


def compose(env: dict[str, str] | None = None) -> dict[str, Any]:
    return interpolate(raw(), env or {})


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


def health_test(svc: dict[str, Any]) -> list[str]:
    """A healthcheck's command (exec form: ``CMD`` and the argv)."""
    test = svc["healthcheck"]["test"]
    assert isinstance(test, list) and test[0] == "CMD" and all(isinstance(a, str) for a in test), test
    return list(test[1:])


def python_check(svc: dict[str, Any]) -> str:
    argv = health_test(svc)
    assert argv[:2] == ["python3", "-c"] and len(argv) == 3, argv
    compile(argv[2], "<healthcheck>", "exec")
    return argv[2]


def test_interpolation_follows_compose() -> None:
    doc = {"x": ["${A:-1}", "${B-2}", "$$(hostname)", "$C", "${D}"]}
    assert interpolate(doc, {"A": "", "C": "c"}) == {"x": ["1", "2", "$(hostname)", "c", ""]}


def test_the_file_has_the_expected_services_and_no_version() -> None:
    doc = raw()
    # no top-level version: (docker-compose 1.29 then reads the Compose Specification, with depends_on
    # conditions) nor name: (which it rejects); x- blocks hold what the services share
    assert set(doc) == {"services", "x-lab", "x-healthcheck"}
    assert set(doc["services"]) == SERVICES
    consumer = doc["services"]["consumer"]
    # a scalable service: no fixed container name or host port
    assert "container_name" not in consumer and "ports" not in consumer


def test_what_the_services_repeat_is_written_once() -> None:
    text = COMPOSE.read_text()
    for key in ("image:", "init:", "volumes:", "environment:", "build:", "interval:", "start_period:"):
        assert len(re.findall(rf"^\s*{key}", text, re.M)) == 1, key
    # every service merges the x-lab block itself (the very node, not a copy of its keys)
    root = yaml.compose(text)
    assert isinstance(root, yaml.MappingNode)
    top = {k.value: v for k, v in root.value}
    lab, health = top["x-lab"], top["x-healthcheck"]
    for name_node, svc_node in top["services"].value:
        name = name_node.value
        assert [v for k, v in svc_node.value if k.tag == MERGE] == [lab], name  # nodes compare by identity
        hc = next(v for k, v in svc_node.value if k.value == "healthcheck")
        if name not in ONE_SHOT:
            assert [v for k, v in hc.value if k.tag == MERGE] == [health], name
    # so every service runs the one image, under an init, with the runs folder
    doc = compose()
    for name, svc in doc["services"].items():
        assert svc["image"] == IMAGE and svc["init"] is True, name
        assert svc["volumes"] == ["./runs:/runs"] and svc["environment"] == {"RMQ_RUN_DIR": "/runs/compose"}
    # built by one service only: the job every other one waits on, so it exists before they start
    built = [n for n, svc in doc["services"].items() if "build" in svc]
    assert built == ["run-dir"]
    assert doc["services"]["run-dir"]["build"]["context"] == "."
    assert set(doc["services"]["run-dir"]["build"]["args"]) == {"BASE_IMAGE", "SOURCE_DIGEST"}
    assert compose({"RMQ_IMAGE": "lab:mine"})["services"]["consumer"]["image"] == "lab:mine"


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
    from rmqlab.chaos.admin_main import build_parser

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
    for argv in (c for c in commands(services["setup"]) if c[0] == "rmq-admin"):
        host, _, port = flag(argv, "--broker").partition(":")
        assert host in ("broker-a", "broker-b") and port == ports[host]
    assert flag(roles["producer"], "--topic") == flag(roles["consumer"], "--topic") == "LabTopic"
    # each server's healthcheck connects to its own port, in its own container
    for name in ("namesrv", "broker-a", "broker-b"):
        assert f"('127.0.0.1', {ports[name]})" in python_check(services[name]), name


def test_start_up_waits_on_health_not_on_shell_loops() -> None:
    services = compose()["services"]
    one_shot = set()
    for name, svc in services.items():
        hc = svc["healthcheck"]  # every service says what healthy means, or that it has no such state
        if hc.get("disable") is True:
            assert set(hc) == {"disable"} and svc["restart"] == "no", name
            one_shot.add(name)
        else:
            assert health_test(svc) and hc["interval"] and hc["retries"] > 0 and hc["start_period"], name
        for c in commands(svc):
            assert not {"until", "while", "sleep"} & set(c), f"{name} waits in a shell loop: {c}"
    assert one_shot == ONE_SHOT
    order = {}
    for name, svc in services.items():
        deps = svc.get("depends_on", {})
        assert isinstance(deps, dict), f"{name}: a bare depends_on list waits for nothing"
        for dep, how in deps.items():
            want = "service_completed_successfully" if dep in ONE_SHOT else "service_healthy"
            assert how == {"condition": want}, (name, dep)
        order[name] = sorted(deps)
    assert order == {
        "run-dir": [],
        "namesrv": ["run-dir"],
        "broker-a": ["namesrv"],
        "broker-b": ["namesrv"],
        "setup": ["broker-a", "broker-b"],
        "producer": ["setup"],
        "consumer": ["namesrv"],
    }


def _run_check(code: str, run_dir: Path) -> int:
    env = {**os.environ, "RMQ_RUN_DIR": str(run_dir)}
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, timeout=30).returncode


def test_the_clients_are_healthy_once_their_log_says_they_started(tmp_path: Path) -> None:
    services = compose()["services"]
    for name, log, event in (
        ("consumer", f"consumer-{socket.gethostname()}.jsonl", "consumer_started"),
        ("producer", "producer-1.jsonl", "message_sent"),
    ):
        run_dir = tmp_path / name
        run_dir.mkdir()
        code = python_check(services[name])
        assert _run_check(code, run_dir) != 0, name  # no log yet
        path = run_dir / log
        path.write_text('{"ts_ms":1,"event":"topic_route","node":"x","role":"x"}\n')
        assert _run_check(code, run_dir) != 0, name
        with path.open("a") as f:
            f.write(f'{{"ts_ms":2,"event":"{event}","node":"x","role":"x"}}\n')
        assert _run_check(code, run_dir) == 0, name
        # the role's own log is meant: the run folder of the compose file's own RUN_ID
        assert services[name]["environment"]["RMQ_RUN_DIR"] == "/runs/compose"
        assert compose({"RUN_ID": "r2"})["services"][name]["environment"]["RMQ_RUN_DIR"] == "/runs/r2"


@pytest.mark.parametrize("service", ["namesrv", "broker-a", "broker-b"])
def test_a_server_is_healthy_once_its_port_answers(service: str) -> None:
    code = python_check(compose()["services"][service])
    port = "9876" if service == "namesrv" else "10911"  # in its container
    assert f"('127.0.0.1', {port})" in code
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        here = code.replace(port, str(server.getsockname()[1]))
        assert subprocess.run([sys.executable, "-c", here], capture_output=True, timeout=30).returncode == 0
    refused = subprocess.run([sys.executable, "-c", here], capture_output=True, timeout=30)
    assert refused.returncode != 0


def test_the_run_folder_is_made_for_the_user_the_roles_run_as() -> None:
    for env, owner in (({}, "10001:10001"), ({"RMQ_USER": "1000:1000", "RUN_ID": "r2"}, "1000:1000")):
        job = compose(env)["services"]["run-dir"]
        run = f"/runs/{env.get('RUN_ID', 'compose')}"
        assert job["user"] == "0:0"  # root for this one mkdir and chown, and nothing else
        assert commands(job) == [["mkdir", "-p", run], ["chown", owner, run]]
        for name, svc in compose(env)["services"].items():
            if name != "run-dir":
                assert svc["user"] == owner, name


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


def test_the_image_runs_as_an_unprivileged_user_that_owns_runs() -> None:
    text = (ROOT / "Dockerfile").read_text()
    assert "useradd --uid 10001 --gid 10001" in text and "chown 10001:10001 /runs" in text
    users = re.findall(r"^USER (.+)$", text, re.M)
    assert users == ["10001:10001"]  # numeric: a runtime can tell it is not root without /etc/passwd
    # set after everything that needs root (the installs), and what the compose file defaults to
    last_run = max(m.start() for m in re.finditer(r"^RUN ", text, re.M))
    assert text.index("USER 10001:10001") > last_run
    assert compose()["services"]["namesrv"]["user"] == users[0]


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
        "lab",
        "wheels",
    }


@pytest.mark.skipif(shutil.which("docker-compose") is None, reason="docker-compose 1.29 not installed")
def test_docker_compose_accepts_the_file_with_its_conditions_and_healthchecks(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("RMQ_USER", "RMQ_IMAGE", "RUN_ID", "RUNS_DIR")}
    proc = subprocess.run(
        ["docker-compose", "-f", str(COMPOSE), "config"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    # what docker-compose made of it: the conditions and healthchecks kept, the anchors merged
    seen = yaml.safe_load(proc.stdout)["services"]
    mine = compose()["services"]
    assert set(seen) == SERVICES
    for name, svc in seen.items():
        assert svc.get("depends_on", {}) == mine[name].get("depends_on", {}), name
        assert svc["image"] == IMAGE and svc["init"] is True and svc["user"] == mine[name]["user"], name
        if name in ONE_SHOT:
            assert svc["healthcheck"] == {"test": ["NONE"]}, name
        else:
            assert svc["healthcheck"]["test"] == mine[name]["healthcheck"]["test"], name
            assert svc["healthcheck"]["start_period"] == "1m", name
