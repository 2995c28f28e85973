"""Consumer driver for Apache's C++ RocketMQ client 2.1.0 (PyPI ``rocketmq-python-cvs``), for the lab.

Run it with the real clients' interpreter (``.venv-real/bin/python interop/cpp_consumer.py ...``, made by
scripts/setup_real_clients.sh); it needs nothing from the project, so the project's own packages never
meet the client's top-level ``rocketmq`` module. It joins a group, consumes, and writes EVENTS.md lines:
``consumer_started``, ``message_consumed`` (with ``started_ms`` and ``mode``), ``consumer_stopped``.

The client's API exposes no allocation, but its own log says what it does: "Add mq:" when a queue is
taken, "Drop mq:" when one is given up, and the allocation result of every changed rebalance. The driver
follows that log (at DEBUG level) and writes ``rebalance`` (every round, with the client ids it used),
``mq_added`` and ``mq_removed`` events from it, and
``pull_answer_ignored`` when the client drops a pull answer because it thinks the queue's request was
dropped (the 2.1.0 bug behind a queue that is never pulled again after it comes back).

Messages carry the address of the broker that stored them, not its name; ``--broker-addrs`` maps those
addresses to names so that ``message_consumed`` names the right broker when there are several.
``--client-log-dir`` has the client write its own log there (the lab keeps it in the run directory).

Prints ``READY <client id>`` once started; SIGTERM or SIGINT shuts the consumer down gracefully.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import re
import signal
import socket
import struct
import sys
import threading
import time
from typing import Any

# Run as a script, so this folder is on sys.path (the project itself is not importable here).
from lab_events import EventWriter, now_ms


def local_ip() -> str:
    """The address the client puts in its id: the first non-loopback IPv4 of this host."""
    try:
        for info in socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET):
            if not str(info[4][0]).startswith("127."):
                return str(info[4][0])
    except OSError:
        pass
    return "127.0.0.1"


# MessageQueue [topic=T, brokerName=B, queueId=N] as the C++ client prints it.
_MQ = r"MessageQueue \[topic=(?P<topic>[^,]+), brokerName=(?P<broker>[^,]+), queueId=(?P<qid>\d+)\]"
_ADD_RE = re.compile(r"Add mq:" + _MQ + r", request initial offset:(?P<offset>-?\d+)")
_DROP_RE = re.compile(r"Drop mq:" + _MQ + r",?\s*(?P<why>.*)$")
# A rebalance round at DEBUG level: "client id:<cid> of topic:<topic>" per consumer id, then
# "allocate mq:<queue>" per queue allocated to this client.
_CID_RE = re.compile(r"\(debug\):client id:(?P<cid>\S+) of topic:(?P<topic>.+)\[doRebalance")
_ALLOCATE_RE = re.compile(r"\(debug\):allocate mq:" + _MQ)
_ROUND_END_RE = re.compile(r"start doRebalance|finish doRebalance|current topic is:|Allocation result for")
# The client's own word that it ignores a pull answer because the queue's request was dropped.
_IGNORED_RE = re.compile(r"Pull request for queue\[" + _MQ + r"\] has been set as dropped")


_FACTORY_RE = re.compile(r"MQClientFactory:(?P<cid>\S+) start")


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def client_log_dirs(extra: str | None) -> list[str]:
    """Where the library writes ``<pid>_rocketmq-cpp.log.N``: the folder given with ``--client-log-dir``,
    else this build's /logs/rocketmq-client or Apache's sources' $HOME/logs/rocketmq-cpp."""
    dirs = [extra] if extra else []
    dirs += ["/logs/rocketmq-client", os.path.join(os.path.expanduser("~"), "logs", "rocketmq-cpp")]
    return dirs


class ClientLogFollower(threading.Thread):
    """Follows this process's C++ client log and turns its rebalance lines into events."""

    def __init__(self, log_dirs: list[str], events: EventWriter, group: str, topic: str) -> None:
        super().__init__(name="cpp-log-follower", daemon=True)
        self.log_dirs = log_dirs
        self.prefix = f"{os.getpid()}_rocketmq-cpp.log"
        self.events = events
        self.group = group
        self.topic = topic
        self.client_id = ""
        self.client_id_known = threading.Event()
        self.stop_event = threading.Event()
        # The library names its files after the process id only, and ids come round again (32768 of
        # them by default): a file left by an earlier process with this id would give its client id and
        # queues as ours. Made before the client starts, so everything already there is someone else's.
        self._positions: dict[str, int] = {path: _size(path) for path in self._log_files()}
        self._round: dict[str, Any] | None = None

    def run(self) -> None:
        while not self.stop_event.is_set():
            self.poll()
            self.stop_event.wait(0.05)
        self.poll()
        self._flush_round()

    def poll(self) -> None:
        for path in self._log_files():
            try:
                with open(path, "rb") as f:
                    if _size(path) < self._positions.get(path, 0):
                        self._positions[path] = 0  # truncated and begun again: all of it is new
                    f.seek(self._positions.get(path, 0))
                    data = f.read()
                    # Only whole lines; a partial one is read again next time.
                    cut = data.rfind(b"\n") + 1
                    self._positions[path] = self._positions.get(path, 0) + cut
            except OSError:
                continue
            for raw in data[:cut].splitlines():
                self.handle_line(raw.decode("utf-8", "replace"))

    def started(self, client_id: str) -> None:
        self.events.emit(
            "consumer_started", group=self.group, client_id=client_id, client="cpp-2.1.0", topic=self.topic
        )
        self.client_id_known.set()

    def _log_files(self) -> list[str]:
        found = []
        for d in self.log_dirs:
            try:
                found += [os.path.join(d, f) for f in os.listdir(d) if f.startswith(self.prefix)]
            except OSError:
                continue
        return sorted(found)

    def handle_line(self, line: str) -> None:
        if not self.client_id:
            m = _FACTORY_RE.search(line)
            if m:
                # Written here, so that it comes before the first "Add mq" line's event.
                self.client_id = m["cid"]
                self.started(self.client_id)
            return
        m = _CID_RE.search(line)
        if m:
            topic = m["topic"].strip()
            if self._round is None or self._round["topic"] != topic or self._round["allocated"]:
                self._flush_round()
                self._round = {"topic": topic, "cid_all": [], "allocated": [], "changed": False}
            self._round["cid_all"].append(m["cid"])
            return
        m = _ALLOCATE_RE.search(line)
        if m:
            if self._round is not None and self._round["topic"] == m["topic"]:
                self._round["allocated"].append(f"{m['broker']}:{m['qid']}")
            return
        if _ROUND_END_RE.search(line):
            self._flush_round()
        m = _ADD_RE.search(line)
        if m:
            self._mark_changed(m["topic"])
            self.events.emit(
                "mq_added",
                group=self.group,
                client_id=self.client_id,
                topic=m["topic"],
                broker=m["broker"],
                queue_id=int(m["qid"]),
                next_offset=int(m["offset"]),
            )
            return
        m = _IGNORED_RE.search(line)
        if m:
            self.events.emit(
                "pull_answer_ignored",
                group=self.group,
                client_id=self.client_id,
                topic=m["topic"],
                broker=m["broker"],
                queue_id=int(m["qid"]),
                reason="request dropped",
            )
            return
        m = _DROP_RE.search(line)
        if m:
            self._mark_changed(m["topic"])
            reason = "pull_expired" if "timeout" in m["why"].lower() else "reallocated"
            self.events.emit(
                "mq_removed",
                group=self.group,
                client_id=self.client_id,
                topic=m["topic"],
                broker=m["broker"],
                queue_id=int(m["qid"]),
                reason=reason,
            )

    def _mark_changed(self, topic: str) -> None:
        if self._round is not None and self._round["topic"] == topic:
            self._round["changed"] = True

    def _flush_round(self) -> None:
        rnd, self._round = self._round, None
        if rnd is None:
            return
        self.events.emit(
            "rebalance",
            group=self.group,
            client_id=self.client_id,
            topic=rnd["topic"],
            strategy="AVG",
            cid_all=sorted(rnd["cid_all"]),
            allocated=rnd["allocated"],
            changed=rnd["changed"],
        )


def parse_broker_addrs(text: str) -> dict[str, str]:
    """``broker-a=127.0.0.1:4001,broker-b=127.0.0.1:4002`` -> {address: broker name}."""
    out: dict[str, str] = {}
    for item in filter(None, (p.strip() for p in text.split(","))):
        name, sep, addr = item.partition("=")
        host, colon, port = addr.rpartition(":")
        if not sep or not name or not colon or not host or not port.isdigit():
            raise argparse.ArgumentTypeError(f"expected NAME=HOST:PORT, got {item!r}")
        out[addr] = name
    return out


class SockAddrIn(ctypes.Structure):
    """``struct sockaddr`` as the library returns it by value (16 bytes: AF_INET, port, address)."""

    _fields_ = [
        ("family", ctypes.c_uint16),
        ("port", ctypes.c_uint16),  # network byte order
        ("addr", ctypes.c_uint32),  # network byte order
        ("zero", ctypes.c_uint64),
    ]


class BrokerNames:
    """The name of the broker a message came from, by the store host the library decoded from it.

    The C API exposes no store host, so this calls the library's own accessor
    (``MQMessageExt::getStoreHost() const``, a plain member returning ``sockaddr`` by value); the message
    handle a listener gets is that object. Without the symbol, or for an unknown address, the default
    name is used.
    """

    SYMBOL = "_ZNK8rocketmq12MQMessageExt12getStoreHostEv"

    def __init__(self, dll: Any, addrs: dict[str, str], default: str) -> None:
        self.addrs = addrs
        self.by_port = {int(a.rpartition(":")[2]): n for a, n in addrs.items()}
        self.default = default
        self._fn = getattr(dll, self.SYMBOL, None) if addrs else None
        if self._fn is not None:
            self._fn.argtypes = [ctypes.c_void_p]
            self._fn.restype = SockAddrIn

    def store_host(self, handle: Any) -> str | None:
        if self._fn is None:
            return None
        sa = self._fn(handle)
        if sa.family != socket.AF_INET:
            return None
        return f"{socket.inet_ntoa(struct.pack('=I', sa.addr))}:{socket.ntohs(sa.port)}"

    def name(self, handle: Any) -> str:
        host = self.store_host(handle)
        if host is None:
            return self.default
        if host in self.addrs:
            return self.addrs[host]
        # The advertised host may differ from the one the lab knows; the port alone is unique here.
        return self.by_port.get(int(host.rpartition(":")[2]), self.default)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="cpp_consumer", description=__doc__.split("\n\n")[0])
    p.add_argument("--namesrv", required=True, help="HOST:PORT of the emulator's native port")
    p.add_argument("--group", required=True)
    p.add_argument("--topic", required=True)
    p.add_argument("--tags", default="*", help="subscription expression (default *)")
    p.add_argument("--orderly", action="store_true", help="orderly listener (locks queues)")
    p.add_argument("--consume-ms", type=int, default=0, help="time the listener takes per message")
    p.add_argument(
        "--broker-name", default="broker-a", help="broker name written in events for an unknown store host"
    )
    p.add_argument(
        "--broker-addrs",
        type=parse_broker_addrs,
        default={},
        metavar="NAME=HOST:PORT,...",
        help="brokers' native addresses, to name the broker each message came from",
    )
    p.add_argument("--instance", default=None, help="instance name (default: pid and start time)")
    p.add_argument("--threads", type=int, default=4, help="consume threads")
    p.add_argument("--access-key", default=None, help="ACL session credentials (with --secret-key)")
    p.add_argument("--secret-key", default=None)
    p.add_argument("--node", default=None, help="node name in events (default: cpp-<pid>)")
    p.add_argument("--log-file", default=None, help="events file (JSON lines); stderr when absent")
    p.add_argument("--client-log-dir", default=None, help="folder the client writes its own log to")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.client_log_dir:
        # This build reads its log folder from the environment once, when its logger starts
        # (SetPushConsumerLogPath does not move it).
        os.environ["ROCKETMQ_CLIENT_LOG_DIR"] = os.path.abspath(args.client_log_dir)
    from rocketmq.client import PushConsumer  # the real client's module, only in its own venv
    from rocketmq.ffi import dll

    node = args.node or f"cpp-{os.getpid()}"
    events = EventWriter(node, args.log_file)
    instance = args.instance or str(time.monotonic_ns())
    mode = "ORDERLY" if args.orderly else "CONCURRENTLY"

    # Before the client exists, so that it takes in only the log files that were there already.
    follower = ClientLogFollower(client_log_dirs(args.client_log_dir), events, args.group, args.topic)
    consumer = PushConsumer(args.group, orderly=args.orderly)
    consumer.set_namesrv_addr(args.namesrv)
    consumer.set_instance_name(instance)
    consumer.set_thread_count(args.threads)
    if args.access_key or args.secret_key:
        # AclClientRPCHook's C++ twin: every request signed with these
        consumer.set_session_credentials(args.access_key or "", args.secret_key or "", "")
    dll.SetPushConsumerLogLevel.argtypes = [ctypes.c_void_p, ctypes.c_int]
    dll.SetPushConsumerLogLevel(consumer._handle, 5)  # DEBUG: the rebalance rounds the follower reads
    # Message trace must be OPEN (0) before start(): with it closed, 2.1.0's shutdown() crashes.
    dll.SetPushConsumerMessageTrace.argtypes = [ctypes.c_void_p, ctypes.c_int]
    dll.SetPushConsumerMessageTrace(consumer._handle, 0)
    brokers = BrokerNames(dll, args.broker_addrs, args.broker_name)

    def on_message(msg: Any) -> None:
        started = now_ms()
        if args.consume_ms > 0:
            time.sleep(args.consume_ms / 1000)
        events.emit(
            "message_consumed",
            group=args.group,
            client_id=follower.client_id,
            msg_id=msg.id,
            topic=msg.topic,
            broker=brokers.name(msg._handle),
            queue_id=int(msg.queue_id),
            queue_offset=int(msg.queue_offset),
            started_ms=started,
            mode=mode,
            reconsume_times=int(msg.reconsume_times),
            body=msg.body.decode("utf-8", "replace")[:200],
        )

    follower.start()
    consumer.subscribe(args.topic, on_message, args.tags)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    consumer.start()
    # The library builds its id (ip@pid#instance) itself and only its log says what it is.
    if not follower.client_id_known.wait(10):
        follower.client_id = f"{local_ip()}@{os.getpid()}#{instance}"
        follower.started(follower.client_id)
    client_id = follower.client_id
    print(f"READY {client_id}", flush=True)
    while not stop.wait(0.2):
        pass
    consumer.shutdown()
    follower.stop_event.set()
    follower.join(timeout=5)
    events.emit("consumer_stopped", group=args.group, client_id=client_id)
    events.close()
    # The library's destructors race its own threads at interpreter exit; leave without running them.
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
