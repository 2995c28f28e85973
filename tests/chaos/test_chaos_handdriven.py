"""Hand-driven faults on a compose cluster: which node a container is, the event written for the
analysis, and what ``rmq-chaos wait`` calls balanced. A stand-in ``docker`` command plays the engine;
tests/docker runs the real thing (the compose scenario)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from rmqlab.chaos.handdriven import GroupWatch, node_of

CONSUMER_CMD = [
    "sh",
    "-c",
    "exec rmq-consumer --namesrv namesrv:9876 --group G --topic T --node consumer-$(hostname) "
    "--log-file /runs/compose/consumer-$(hostname).jsonl",
]


def test_node_of_reads_the_role_command_as_the_container_sees_it() -> None:
    assert node_of({"Config": {"Cmd": CONSUMER_CMD, "Hostname": "c0ffee"}}) == "consumer-c0ffee"
    assert node_of({"Config": {"Cmd": ["rmq-broker", "--node", "broker-a"], "Hostname": "x"}}) == "broker-a"
    assert node_of({"Config": {"Entrypoint": ["rmq-namesrv"], "Cmd": ["--node=ns"]}}) == "ns"
    assert node_of({"Config": {"Cmd": ["python3"], "Hostname": "x"}}) is None


def ev(event: str, **fields: object) -> dict[str, object]:
    return {"event": event, "ts_ms": 1, "node": "n", "role": "consumer", **fields}


def test_balanced_means_every_live_consumer_saw_exactly_the_live_set() -> None:
    w = GroupWatch("G")
    w.feed([ev("consumer_started", group="G", client_id=c) for c in ("a", "b", "c")])
    assert not w.balanced(3)
    w.feed([ev("rebalance", group="G", client_id=c, cid_all=["a", "b", "c"]) for c in ("a", "b")])
    assert not w.balanced(3)  # c has not rebalanced yet
    w.feed([ev("rebalance", group="G", client_id="c", cid_all=["a", "b", "c"])])
    assert w.balanced(3) and not w.balanced(2)
    w.feed([ev("nemesis", action="kill", target="n", client_id="c")])
    assert w.live() == {"a", "b"} and not w.balanced(2)  # a and b still believe in c
    w.feed([ev("rebalance", group="G", client_id=c, cid_all=["a", "b"]) for c in ("a", "b")])
    w.feed([ev("rebalance", group="OTHER", client_id="a", cid_all=["z"])])
    assert w.balanced(2)


FAKE = textwrap.dedent(
    """\
    #!{python}
    import json, os, sys
    args = sys.argv[1:]
    with open(os.environ["CALLS"], "a") as f:
        f.write(json.dumps(args) + "\\n")
    if args[:1] == ["inspect"]:
        if args[-1] != "proj_consumer_2":
            sys.exit("Error: No such container: " + args[-1])
        print(json.dumps([{{"Name": "/proj_consumer_2", "State": {{"Status": os.environ["STATE"]}},
                           "Config": {{"Hostname": "c0ffee", "Cmd": {cmd}}}}}]))
        sys.exit(0)
    sys.exit(0)
    """
)


def nemesis(tmp_path: Path, *args: str, state: str = "running") -> tuple[int, str, list[list[str]]]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    fake = bin_dir / "docker"
    fake.write_text(FAKE.format(python=sys.executable, cmd=json.dumps(CONSUMER_CMD)))
    fake.chmod(0o755)
    calls = tmp_path / "calls.jsonl"
    env = {
        **os.environ,
        "PATH": str(bin_dir) + os.pathsep + os.environ["PATH"],
        "CALLS": str(calls),
        "STATE": state,
    }
    proc = subprocess.run(
        [sys.executable, "-m", "rmqlab.chaos", "nemesis", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    made = [json.loads(x) for x in calls.read_text().splitlines()] if calls.exists() else []
    return proc.returncode, proc.stdout + proc.stderr, made


def test_nemesis_does_the_action_and_records_it(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "consumer-c0ffee.jsonl").write_text(
        json.dumps(ev("consumer_started", node="consumer-c0ffee", group="G", client_id="1.2.3.4@7#1")) + "\n"
    )
    rc, out, calls = nemesis(tmp_path, "kill", "proj_consumer_2", "--run-dir", str(run))
    assert rc == 0, out
    assert calls[-1] == ["kill", "--signal", "KILL", "proj_consumer_2"]
    [event] = [json.loads(x) for x in (run / "nemesis.jsonl").read_text().splitlines()]
    assert {k: event[k] for k in ("event", "node", "role", "action", "target", "target_role", "group")} == {
        "event": "nemesis",
        "node": "chaos",
        "role": "chaos",
        "action": "kill",
        "target": "consumer-c0ffee",
        "target_role": "consumer",
        "group": "G",
    }
    assert event["client_id"] == "1.2.3.4@7#1" and event["by"] == "hand"

    # a container in the wrong state: nothing done, nothing written
    rc, out, calls = nemesis(tmp_path, "resume", "proj_consumer_2", "--run-dir", str(run))
    assert rc == 1 and "cannot resume proj_consumer_2 (consumer-c0ffee): it is running" in out
    assert calls[-1][0] == "inspect" and len((run / "nemesis.jsonl").read_text().splitlines()) == 1
    # --record-only writes the event without touching the container
    rc, out, calls = nemesis(tmp_path, "stop", "proj_consumer_2", "--run-dir", str(run), "--record-only")
    assert rc == 0 and calls[-1][0] == "inspect"
    assert json.loads((run / "nemesis.jsonl").read_text().splitlines()[-1])["action"] == "stop"
    # the hung listener: SIGUSR1 and SIGUSR2 to the container, which its init passes on to the consumer
    for action, sig in (("hang", "USR1"), ("unhang", "USR2")):
        rc, out, calls = nemesis(tmp_path, action, "proj_consumer_2", "--run-dir", str(run))
        assert rc == 0, out
        assert calls[-1] == ["kill", "--signal", sig, "proj_consumer_2"]
        assert json.loads((run / "nemesis.jsonl").read_text().splitlines()[-1])["action"] == action


def test_only_a_consumer_can_be_hung(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "consumer-c0ffee.jsonl").write_text(
        json.dumps(ev("broker_started", node="consumer-c0ffee", role="broker")) + "\n"
    )
    rc, out, calls = nemesis(tmp_path, "hang", "proj_consumer_2", "--run-dir", str(run))
    assert rc == 1 and "only a consumer's listener can be hung" in out, out
    assert calls[-1][0] == "inspect" and not (run / "nemesis.jsonl").exists()


def test_nemesis_refuses_what_it_cannot_record(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    rc, out, _ = nemesis(tmp_path, "kill", "proj_consumer_2", "--run-dir", str(run))
    assert rc == 1 and "runs node consumer-c0ffee, but" in out and "holds no event of it" in out
    rc, out, _ = nemesis(tmp_path, "kill", "nope", "--run-dir", str(run))
    assert rc == 1 and "no container 'nope'" in out
    rc, out, _ = nemesis(tmp_path, "kill", "x", "--run-dir", str(tmp_path / "missing"))
    assert rc == 2 and "no run directory" in out
    assert not (run / "nemesis.jsonl").exists()
