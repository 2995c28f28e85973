"""One member of an Apache engine (its name server or one broker) as a process the lab's supervisor runs.

``python -m rmqlab.interop.apache.member --role broker --engine apache-4.9.7 --run-dir D --name broker-a
--namesrv HOST:PORT --port 0 --topic T:4 --node broker-a --time-scale 0.5 --log-file D/broker-a.jsonl``

It writes the member's configuration (``engine.plan``'s files, the lab's time scale applied), starts the
JVM as its child in its own process group, so that the supervisor's signals (SIGSTOP, SIGCONT, SIGKILL,
SIGTERM to the group) reach the JVM itself, and prints ``READY HOST:PORT native=HOST:PORT`` once the
member serves: a name server once it answers, a broker once the name server lists it and routes each of
its ``--topic`` (created on it through UPDATE_AND_CREATE_TOPIC) to it, a slave (``--broker-id 1``, the
master's ``--name``) once the name server lists it under its master's name. ``--port 0`` picks a free
port, which the supervisor then passes again on a restart, so that a broker comes back at its address
with its store.
It exits with the JVM's status. Apache's broker writes no lab events; this process writes a ``log`` line
when its member is up and when it exited.
"""

from __future__ import annotations

import argparse
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, Final, TextIO

from rmqlab.cli import add_common_args, announce_ready, command_parser, positive_float
from rmqlab.interop.apache.engine import (
    BROKER_READY,
    DEFAULT_ENGINE,
    NAMESRV_READY,
    AdminError,
    EngineUnavailable,
    Heaps,
    _die_with_parent,
    _topic_arg,
    broker_argv,
    cds_files,
    check_environment,
    cluster_brokers,
    create_topic,
    free_port,
    install_cds_archive,
    namesrv_argv,
    wait_topic,
    write_broker_config,
    write_home,
    write_namesrv_config,
)
from rmqlab.protocol.event_log import EventLog

EXIT_CODES: Final = {
    0: "the member stopped cleanly (SIGTERM)",
    1: "the member failed: the JVM exited, or did not come up in time",
    2: "bad usage",
    3: "the engine cannot run here (no JDK, or its jars not cached: the message names the setup command)",
}


def build_parser() -> argparse.ArgumentParser:
    p = command_parser(
        "python -m rmqlab.interop.apache.member",
        "One JVM of an Apache engine (name server or broker) under the lab's supervisor.",
        EXIT_CODES,
    )
    p.add_argument("--role", required=True, choices=("namesrv", "broker"))
    p.add_argument("--engine", default=DEFAULT_ENGINE, help=f"default {DEFAULT_ENGINE}")
    p.add_argument("--run-dir", required=True, help="the run's folder (the member's files go to RUN/NAME)")
    p.add_argument("--name", default=None, help="broker name (default: the node); the name server's folder")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0, help="0 (default) picks a free one")
    p.add_argument("--namesrv", default=None, help="HOST:PORT of the name server (brokers)")
    p.add_argument("--topic", type=_topic_arg, action="append", default=[], metavar="TOPIC[:QUEUES]")
    p.add_argument("--timeout", type=positive_float, default=90.0, help="seconds to come up (default 90)")
    p.add_argument("--heap-mb", type=int, default=None, help="the JVM's heap (default: engine.Heaps)")
    p.add_argument("--timer-wheel", action="store_true", help="5.x: keep the timer wheel (POP needs it)")
    p.add_argument(
        "--broker-id",
        type=int,
        default=0,
        help="0 (default): a master; 1..N: a slave of --name (brokerRole SLAVE)",
    )
    p.add_argument(
        "--broker-role",
        choices=("ASYNC_MASTER", "SYNC_MASTER"),
        default="ASYNC_MASTER",
        help="a master's role",
    )
    p.add_argument("--slave-read-enable", action="store_true", help="slaveReadEnable")
    add_common_args(p)
    return p


def _pump(stream: IO[bytes], sink: TextIO, seen: threading.Event, ready_line: re.Pattern[str]) -> None:
    """Copy the JVM's output to ours line by line; set ``seen`` at its boot line."""
    for raw in iter(stream.readline, b""):
        line = raw.decode("utf-8", "replace")
        sink.write(line)
        sink.flush()
        if ready_line.search(line):
            seen.set()


def run(args: argparse.Namespace, log: EventLog) -> int:
    name = args.name or args.node or args.role
    if args.role == "broker" and not args.namesrv:
        print("member: a broker needs --namesrv", file=sys.stderr)
        return 2
    try:
        env = check_environment(args.engine)
    except EngineUnavailable as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 3
    run_dir = Path(args.run_dir).resolve()
    home = write_home(run_dir / "rocketmq-home")
    # a slave shares its master's brokerName, not its folder
    member_dir = run_dir / (f"{name}-s{args.broker_id}" if args.broker_id else name)
    (member_dir / "tmp").mkdir(parents=True, exist_ok=True)
    port = args.port or free_port(args.host, also=(-2, 1) if args.role == "broker" else ())
    addr = f"{args.host}:{port}"
    heaps = Heaps()
    common = {"member_dir": member_dir, "home": home, "log_file": member_dir / "rocketmq.log"}
    cds = cds_files(env, args.role, member_dir)
    if args.role == "namesrv":
        conf = write_namesrv_config(
            member_dir / "namesrv.properties", port, member_dir, args.time_scale, engine=env.engine, home=home
        )
        heaps = Heaps(namesrv_mb=args.heap_mb or heaps.namesrv_mb)
        argv = namesrv_argv(env, conf, heaps=heaps, time_scale=args.time_scale, cds=cds, **common)
        ready_line = NAMESRV_READY
    else:
        conf = write_broker_config(
            member_dir / f"{name}.properties",
            name,
            port,
            args.namesrv,
            member_dir / "store",
            args.time_scale,
            engine=env.engine,
            host=args.host,
            home=home,
            auto_create_topic=False,  # the experiment's topics only, created with their queue counts
            timer_wheel=args.timer_wheel,
            broker_id=args.broker_id,
            broker_role=args.broker_role,
            slave_read_enable=args.slave_read_enable,
        )
        heaps = Heaps(broker_mb=args.heap_mb or heaps.broker_mb)
        argv = broker_argv(env, conf, heaps=heaps, time_scale=args.time_scale, cds=cds, **common)
        ready_line = BROKER_READY

    stopping = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        # The JVM is in this process's group: a signal to the group reached it too; one to this process
        # alone is passed on.
        stopping.set()
        if jvm.poll() is None:
            jvm.send_signal(signum)

    jvm = subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        cwd=member_dir,
        preexec_fn=_die_with_parent,  # no JVM outlives this process, even a SIGKILLed one
    )
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)
    booted = threading.Event()
    pump = threading.Thread(target=_pump, args=(jvm.stdout, sys.stdout, booted, ready_line), daemon=True)
    pump.start()
    deadline = time.monotonic() + args.timeout
    try:
        _wait_up(args, name, addr, jvm, booted, stopping, deadline)
    except (TimeoutError, AdminError) as exc:
        print(f"error: {name}: {exc}", file=sys.stderr)
        jvm.kill()
        jvm.wait()
        return 1
    if jvm.poll() is None and not stopping.is_set():
        log.info(f"Apache RocketMQ {env.engine.version} {args.role} {name} up at {addr}")
        announce_ready(f"{addr} native={addr}")
    code = jvm.wait()
    pump.join(5)
    install_cds_archive(cds)
    log.info(f"Apache RocketMQ {args.role} {name} exited with {code}")
    if stopping.is_set() and code in (0, 143):  # 143: the JVM's exit on SIGTERM after its hooks ran
        return 0
    return code if code > 0 else 1


def _wait_up(
    args: argparse.Namespace,
    name: str,
    addr: str,
    jvm: subprocess.Popen[bytes],
    booted: threading.Event,
    stopping: threading.Event,
    deadline: float,
) -> None:
    """Until the member serves (see the module's docstring), or raise; returns early on a stop."""
    created = False
    while not stopping.is_set():
        if jvm.poll() is not None:
            raise TimeoutError(f"the JVM exited with {jvm.returncode} before it was up")
        if time.monotonic() > deadline:
            raise TimeoutError(f"not up after {args.timeout:g} s")
        if booted.is_set():
            try:
                if args.role == "namesrv":
                    cluster_brokers(addr, 1.0)
                    return
                if cluster_brokers(args.namesrv, 1.0).get(name, {}).get(args.broker_id) == addr:
                    if args.broker_id:
                        return  # a slave copies its master's topics in its sync (SlaveSynchronize)
                    if not created:
                        for topic, queues in args.topic:
                            create_topic(addr, topic, queues)
                        created = True
                    for topic, _ in args.topic:
                        wait_topic(args.namesrv, topic, [name], max(0.1, deadline - time.monotonic()))
                    return
            except AdminError:
                pass
        time.sleep(0.1)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    log = EventLog(args.node or args.role, args.role, args.log_file)
    try:
        return run(args, log)
    finally:
        log.close()


if __name__ == "__main__":
    sys.exit(main())
