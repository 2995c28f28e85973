"""``rmq-chaos run --backend docker`` for real: the same experiments as processes and as containers give
the same answers, the engine's faults do what they say, and nothing is left behind."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from kit.docker import chaos_run, figures, host_rules_mentioning, leftovers, partition_figures, shortened

from rmqlab.chaos.container import ImageInfo
from rmqlab.pipeline.metrics_reference import summarize_run

ROUND_S = 20.0  # one rebalance round of RocketMQ time
# A silent channel expiry counts from the paused consumer's last heartbeat (every 30 s), whose phase
# against the pause differs from run to run: there the backends may differ by a heartbeat per queue too.
HEARTBEAT_S = 30.0
COMPARED = {
    # experiment: (group, queues per consumer: the queues a fault of one consumer touches)
    "kill-one-of-four": ("GID_orders", 4),
    "kill-orderly-consumer": ("GID_ledger", 2),
    "pause-past-channel-expiry": ("GID_events", 4),
    "network-partition": ("GID_clicks", 4),
}


def finish(proc: Any, timeout_s: float = 240) -> tuple[int, str]:
    out = proc.communicate(timeout=timeout_s)[0]
    return proc.returncode, out


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(COMPARED))
def test_processes_and_containers_give_the_same_answers(name: str, image: ImageInfo, tmp_path: Path) -> None:
    group, share = COMPARED[name]
    exp_file = tmp_path / f"{name}.toml"
    exp_file.write_text(shortened(name))
    runs = {b: tmp_path / b for b in ("local", "docker")}
    # Both at once: the two clusters share nothing but the machine, and the test takes half the time.
    started = time.monotonic()
    procs = {b: chaos_run(exp_file, runs[b], backend=b) for b in runs}
    results = {b: finish(p) for b, p in procs.items()}
    wall = time.monotonic() - started
    for b, (rc, out) in results.items():
        assert rc == 0, f"{b}:\n{out}"
        assert "drained: every group consumed all" in out, f"{b}:\n{out}"

    manifest = {b: json.loads((runs[b] / "manifest.json").read_text()) for b in runs}
    assert manifest["local"]["backend"] == "local" and "containers" not in manifest["local"]
    assert manifest["docker"]["backend"] == "docker"
    assert manifest["docker"]["containers"]["image_id"] == image.image_id
    scale = manifest["docker"]["time_scale"]

    got = {b: figures(summarize_run(runs[b]), group, scale) for b in runs}
    print(f"\n{name} ({wall:.0f}s wall for both): {json.dumps(got, sort_keys=True)}")
    local, docker = got["local"], got["docker"]
    assert local["verdict"] == docker["verdict"] == "ok", got
    assert local["lost"] == docker["lost"] == 0
    assert len(local["kill_convergence_s"]) == len(docker["kill_convergence_s"])
    for a, b in zip(local["kill_convergence_s"], docker["kill_convergence_s"], strict=True):
        assert a is not None and b is not None and abs(a - b) <= ROUND_S, got
    # a pause stalls the paused consumer's queues: per queue, the two agree within a round (and the
    # heartbeat's phase where the stall ends with a silent expiry)
    slack = ROUND_S + (HEARTBEAT_S if name == "pause-past-channel-expiry" else 0.0)
    assert abs(local["stalled_s"] - docker["stalled_s"]) <= slack * share, got

    if name == "network-partition":
        nemesis = [
            json.loads(line)
            for line in (runs["docker"] / "chaos.jsonl").read_text().splitlines()
            if '"nemesis"' in line
        ]
        via = {e["action"]: e.get("via") for e in nemesis if e["event"] == "nemesis"}
        # the kernel's partition; the latency by netem where the kernel has it, else by the fault relay
        # (as here: this project's kernels have no netem, and the probe says so)
        c = manifest["docker"]["containers"]
        assert via["latency"] == ("netem" if c["netem"] else "relay") and via["blackhole"] == "iptables"
        assert c["netem"] or c["netem_probe"].startswith("this kernel refuses a netem qdisc"), c
        assert [(f["action"], f["via"]) for f in c["network_faults"]] == [
            ("latency", via["latency"]),
            ("blackhole", "iptables"),
        ]
        cut = {b: partition_figures(runs[b], scale) for b in runs}
        print(f"{name} partition: {json.dumps(cut, sort_keys=True)}")
        # both partitions held: consumer-1 consumed nothing from broker-a while cut off, and took up
        # its queues there again within a round of the heal, on both
        assert cut["local"]["consumed_while_cut"] == cut["docker"]["consumed_while_cut"] == 0, cut
        resumed = [cut[b]["resumed_after_heal_s"] for b in runs]
        assert None not in resumed and abs(resumed[0] - resumed[1]) <= ROUND_S, cut
    assert leftovers() == {"containers": [], "networks": []}
    assert host_rules_mentioning(manifest["docker"]["containers"]["subnet"]) == []


RESTARTS = """\
name = "docker-restarts"
time_scale = 0.05
duration = 400
seed = 3
drain_timeout = 300

[cluster]
brokers = 2
durable = true

[[topics]]
name = "T"
queues = 8

[[consumers]]
group = "G"
topic = "T"
count = 3
consume_ms = 1

[workload]
rate = 40
count = 700

# the hung listener: SIGUSR1 and SIGUSR2 through the container's init
[[nemesis]]
action = "hang"
target = "consumer-3"
at = 15
for = 40

[[nemesis]]
action = "restart"
target = "consumer-1"
at = 60

[[nemesis]]
action = "loss"
target = "consumer-2"
broker = "broker-b"
percent = 30
at = 70
for = 40

[[nemesis]]
action = "kill"
target = "broker-a"
at = 120
for = 40

# a partition between two servers, in the kernel: broker-b's registrations stop reaching the name
# server, which expires it (120 s after its last one, scanned every 10 s) until the heal
[[nemesis]]
action = "blackhole"
target = "broker-b"
peer = "namesrv"
at = 180
for = 150
"""


def rules_in(container_suffix: str, netem: bool = False) -> list[str]:
    """The iptables rules (or with ``netem`` the qdiscs) in force in the network namespace of the run's
    container named ``*SUFFIX``."""
    [name] = [n for n in leftovers()["containers"] if n.endswith(container_suffix)]
    pid = subprocess.run(
        ["docker", "inspect", "--format", "{{.State.Pid}}", name], capture_output=True, text=True, check=True
    ).stdout.strip()
    show = ["tc", "qdisc", "show", "dev", "eth0"] if netem else ["iptables", "-S"]
    out = subprocess.run(
        ["nsenter", "--target", pid, "--net", *show], capture_output=True, text=True, check=True
    ).stdout
    return [line for line in out.splitlines() if line.startswith("qdisc netem" if netem else "-A ")]


@pytest.mark.slow
def test_restarts_a_hang_a_broker_crash_and_kernel_faults_among_the_nodes(
    image: ImageInfo, tmp_path: Path
) -> None:
    exp_file = tmp_path / "restarts.toml"
    exp_file.write_text(RESTARTS)
    proc = chaos_run(exp_file, tmp_path / "run", backend="docker")
    assert proc.stdout is not None
    seen: list[str] = []
    loss_rules: list[str] = []
    netem = False
    for line in proc.stdout:  # while it runs: the loss is two rules (or a netem) in consumer-2's namespace
        seen.append(line)
        if line.startswith("network faults: "):
            netem = "by tc netem" in line
        if "] loss consumer-2" in line:
            deadline = time.monotonic() + 5
            # the rules go in one after the other, after the line that announces them
            while len(loss_rules) < (1 if netem else 2) and time.monotonic() < deadline:
                time.sleep(0.2)
                loss_rules = [r for r in rules_in("-consumer-2-1", netem) if "statistic" in r or "loss" in r]
            break
    rc, rest = finish(proc)
    out = "".join(seen) + rest
    run = tmp_path / "run"
    if netem:  # the sending side of consumer-2's link to broker-b, in its namespace
        assert len(loss_rules) == 1 and "loss 30%" in loss_rules[0], out
    else:
        assert len(loss_rules) == 2, out  # both directions of consumer-2's link to broker-b
        # iptables keeps the chance in 1/2^31 steps: 0.3 reads back as 0.29999999981
        assert all(re.search(r"--mode random --probability 0\.(3|2999)\d* -j DROP", r) for r in loss_rules)
    # A killed broker container takes its address along: the producer's connects to it time out
    # (nothing answers, not even with a refusal) and use up the send timeout, as against a dead host.
    # Those sends fail and the producer says so; every acknowledged one must survive.
    assert "drained: every group consumed all" in out, out
    errors = [line for line in out.splitlines() if line.startswith("error: ")]
    assert errors in ([], ["error: producer-1 exited with code 1 (see producer-1.out)"]), out
    assert rc == (3 if errors else 0), out
    manifest = json.loads((run / "manifest.json").read_text())
    nodes = manifest["nodes"]
    # a graceful stop (SIGTERM through the container's init) and a new container with a new client id
    c1 = nodes["consumer-1"]
    assert c1["incarnations"] == 2 and len(set(c1["client_ids"])) == 2
    first = [json.loads(x) for x in (run / "consumer-1.jsonl").read_text().splitlines()]
    assert [e["event"] for e in first if e["event"] in ("consumer_started", "consumer_stopped")] == [
        "consumer_started",
        "consumer_stopped",
    ]
    hung_listener(run)
    names = manifest["containers"]["names"]
    assert sum(n.endswith(("-consumer-1-1", "-consumer-1-2")) for n in names) == 2
    # the broker came back in a new container on the same address, with its store from the volume
    assert nodes["broker-a"]["incarnations"] == 2 and nodes["broker-a"]["returncode"] is not None
    assert (run / "store" / "broker-a").is_dir() and any((run / "store" / "broker-a").iterdir())
    [before] = [json.loads(x) for x in (run / "broker-a.jsonl").read_text().splitlines()[:1]]
    [after] = [json.loads(x) for x in (run / "broker-a.2.jsonl").read_text().splitlines()[:1]]
    assert before["event"] == after["event"] == "broker_started"
    assert before["broker_addr"] == after["broker_addr"] and after["store_dir"] == "/runs/store/broker-a"
    assert before["messages"] == 0 and after["messages"] > 0  # what it acknowledged before the crash
    # the partition between broker-b and the name server held: the name server expired broker-b while
    # it was in force, and took it back after the heal
    nemesis = [json.loads(x) for x in (run / "chaos.jsonl").read_text().splitlines() if '"nemesis"' in x]
    [cut] = [e for e in nemesis if e["event"] == "nemesis" and e["action"] == "blackhole"]
    assert cut["target"] == "broker-b" and cut["broker"] == "namesrv" and cut["via"] == "iptables"
    heal = next(e for e in nemesis if e["action"] == "heal" and e["target"] == "broker-b")
    namesrv = [json.loads(x) for x in (run / "namesrv.jsonl").read_text().splitlines()]
    gone = [e for e in namesrv if e["event"] == "broker_unregistered" and e["broker"] == "broker-b"]
    # (later: the stale connection closes after the heal, and the broker unregisters at the end)
    assert gone[0]["reason"] == "expired" and cut["ts_ms"] < gone[0]["ts_ms"] < heal["ts_ms"], gone
    back = [e for e in namesrv if e["event"] == "broker_registered" and e["broker"] == "broker-b"]
    assert back and back[-1]["ts_ms"] > heal["ts_ms"], back
    summary = summarize_run(run)
    assert summary["groups"]["G"]["lost"] == 0 and summary["groups"]["G"]["sent"] > 600
    assert leftovers() == {"containers": [], "networks": []}
    assert host_rules_mentioning(manifest["containers"]["subnet"]) == []


def hung_listener(run: Path) -> None:
    """consumer-3's listener was hung and released through the engine: the calls that started while it
    was hung returned only after the release, nothing returned in between, and heartbeats went on."""
    nemesis = [json.loads(x) for x in (run / "chaos.jsonl").read_text().splitlines() if '"nemesis"' in x]
    [hang] = [e for e in nemesis if e["action"] == "hang"]
    [unhang] = [e for e in nemesis if e["action"] == "unhang"]
    assert hang["target"] == unhang["target"] == "consumer-3"
    events = [json.loads(x) for x in (run / "consumer-3.jsonl").read_text().splitlines()]
    [hung] = [e["ts_ms"] for e in events if e["event"] == "listener_hung"]
    [released] = [e["ts_ms"] for e in events if e["event"] == "listener_released"]
    assert hang["ts_ms"] <= hung < unhang["ts_ms"] <= released
    consumed = [e for e in events if e["event"] == "message_consumed"]
    # a call already under way when the signal came may still return just after it
    assert not [e for e in consumed if hung + 100 < e["ts_ms"] < released]
    held = [e for e in consumed if hung < e["started_ms"] < released]
    assert held and all(e["ts_ms"] >= released for e in held)
    heartbeats = [e["ts_ms"] for e in events if e["event"] == "heartbeat_sent"]
    assert any(hung < t < released for t in heartbeats)  # alive, and still in its group


INTERRUPTED = """\
name = "docker-ctrl-c"
time_scale = 0.05
duration = 2000
seed = 4
drain_timeout = 300

[cluster]
brokers = 2

[[topics]]
name = "T"
queues = 8

[[consumers]]
group = "G"
topic = "T"
count = 2

[workload]
rate = 20
count = 20000

[[nemesis]]
action = "blackhole"
target = "consumer-1"
broker = "broker-a"
at = 20
for = 1000

[[nemesis]]
action = "pause"
target = "consumer-2"
at = 20
for = 1000
"""


@pytest.mark.slow
def test_ctrl_c_removes_containers_network_and_rules(image: ImageInfo, tmp_path: Path) -> None:
    exp_file = tmp_path / "ctrl-c.toml"
    exp_file.write_text(INTERRUPTED)
    run = tmp_path / "run"
    proc = chaos_run(exp_file, run, backend="docker")
    try:
        assert proc.stdout is not None
        seen = []
        for line in proc.stdout:
            seen.append(line)
            text = "".join(seen)
            if "] pause consumer-2" in text and "] blackhole consumer-1" in text:
                break
        time.sleep(0.5)
        during = leftovers()
        assert len(during["containers"]) == 6 and len(during["networks"]) == 1, "".join(seen)
        proc.send_signal(signal.SIGINT)
        rest = proc.communicate(timeout=90)[0]
        assert proc.returncode == 130, "".join(seen) + rest
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["interrupted"] is True
    assert leftovers() == {"containers": [], "networks": []}
    assert host_rules_mentioning(manifest["containers"]["subnet"]) == []
