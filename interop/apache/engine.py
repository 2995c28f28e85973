"""Apache RocketMQ's own name server and broker in place of the lab's: the ``apache-*`` engines.

The JVMs are started directly (``java -cp <jars> org.apache.rocketmq.namesrv.NamesrvStartup -c FILE`` and
``... org.apache.rocketmq.broker.BrokerStartup -c FILE``), not through Apache's start scripts: those pick
multi-gigabyte heaps and, for Java 8, CMS options that Java 17 no longer has. The jars come from Maven
Central through ``scripts/setup_apache_engine.sh`` (``interop/apache/pom.xml``), one class-path folder per
version under ``.cache/apache/<version>/lib`` of the checkout.

What this module gives the lab (it imports nothing of the lab's core, only the native codec):

* ``check_environment(engine)``: the JDK and the cached jars, or ``EngineUnavailable`` naming what is
  missing and the setup command;
* ``write_broker_config`` / ``write_namesrv_config`` / ``write_home``: a member's configuration, from its
  name, port, name server, store folder and the lab's time scale;
* ``namesrv_argv`` / ``broker_argv`` and ``plan_cluster``: the command lines, so that a supervisor can
  start them as members like any other process (``Member.ready`` matches the line that says it is up);
* ``cluster_brokers`` / ``wait_registered`` / ``create_topic`` / ``route_brokers``: the admin requests
  the lab needs (GET_BROKER_CLUSTER_INFO, UPDATE_AND_CREATE_TOPIC, GET_ROUTEINFO_BY_TOPIC) over the
  native remoting protocol;
* ``python -m rmqlab.interop.apache.engine start --run-dir DIR --brokers 2``: a name server and brokers,
  one ``READY <name> <host:port>`` line each once every broker is registered, stopped on SIGTERM.

The lab's time scale reaches only what RocketMQ lets a configuration set (see ``broker_properties``); the
rest of the broker's timers are constants of its code and stay RocketMQ's (``UNSCALED``). The clients of
these brokers are real RocketMQ clients, which keep their own timers (a heartbeat every 30 s): below a
time scale of 0.25 the scaled idle-connection close (120 s) would drop them between heartbeats.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import itertools
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, TextIO

from rmqlab.cli import command_parser, positive_float, positive_int, subcommand
from rmqlab.protocol.clock import TimeScale
from rmqlab.protocol.codes import RequestCode, ResponseCode
from rmqlab.protocol.command import FrameError
from rmqlab.protocol.native.frame import NativeFrame, NativeFrameDecoder, encode_frame
from rmqlab.protocol.native.translate import parse_json_body

# -- engines -------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Engine:
    """One Apache RocketMQ release whose name server and broker the lab can run."""

    name: str
    version: str

    @property
    def major(self) -> int:
        return int(self.version.split(".", 1)[0])


DEFAULT_ENGINE: Final = "apache-4.9.7"
ENGINES: Final[dict[str, Engine]] = {
    # The newest 4.9 whose broker and name server Maven Central serves.
    "apache-4.9.7": Engine("apache-4.9.7", "4.9.7"),
    # The newest 5.x whose whole closure it serves: 5.5.1 has a rocketmq-broker, but no rocketmq-namesrv,
    # rocketmq-client, rocketmq-auth, rocketmq-filter or rocketmq-srvutil of that version.
    "apache-5": Engine("apache-5", "5.5.0"),
}
ALIASES: Final = {"apache-4.9": "apache-4.9.7", "apache-5.5.0": "apache-5", "apache-5.5": "apache-5"}
# Releases the lab cannot run, and why (said instead of a missing-jar error).
NOT_SERVED: Final = {
    "apache-4.9.8": (
        "Maven Central serves no rocketmq-broker, rocketmq-namesrv or rocketmq-filter 4.9.8 (that release "
        "published only its client-side modules there); use apache-4.9.7, the newest 4.9 broker it serves"
    ),
}


class EngineUnavailable(RuntimeError):
    """The engine cannot run here; the message says what is missing and how to set it up."""


def resolve_engine(name: str) -> Engine:
    key = ALIASES.get(name, name)
    if key in ENGINES:
        return ENGINES[key]
    if key in NOT_SERVED:
        raise EngineUnavailable(f"engine {name!r}: {NOT_SERVED[key]}")
    known = ", ".join(sorted(ENGINES))
    raise EngineUnavailable(f"unknown engine {name!r} (known: {known})")


# -- environment ---------------------------------------------------------------------------------------

SETUP_SCRIPT: Final = "scripts/setup_apache_engine.sh"
# The jars live in a checkout of the project, where the setup script puts them; an installed package has
# no place for them, so RMQLAB_CHECKOUT names a checkout to use (as for the real clients).
CHECKOUT_ENV: Final = "RMQLAB_CHECKOUT"
PACKAGE_ROOT: Final = Path(__file__).resolve().parents[2]
MIN_JAVA: Final = 11
NAMESRV_MAIN: Final = "org.apache.rocketmq.namesrv.NamesrvStartup"
BROKER_MAIN: Final = "org.apache.rocketmq.broker.BrokerStartup"


def checkout_root() -> Path:
    named = os.environ.get(CHECKOUT_ENV)
    return Path(named).resolve() if named else PACKAGE_ROOT


def cache_dir(engine: Engine, root: Path | None = None) -> Path:
    return (root or checkout_root()) / ".cache" / "apache" / engine.version


def find_java(explicit: str | None = None) -> str | None:
    """``explicit``, else ``$JAVA_HOME/bin/java``, else ``java`` on the PATH."""
    if explicit:
        return explicit if Path(explicit).is_file() else shutil.which(explicit)
    home = os.environ.get("JAVA_HOME")
    if home and (Path(home) / "bin" / "java").is_file():
        return str(Path(home) / "bin" / "java")
    return shutil.which("java")


_JAVA_VERSION_RE = re.compile(r'version "(\d+)(?:\.(\d+))?')


def java_version(java: str) -> str | None:
    """What ``java -version`` says its version is ("17.0.15", "1.8.0_412"), or None if it does not run."""
    try:
        out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    m = re.search(r'version "([^"]+)"', out.stderr + out.stdout)
    return m[1] if m else None


def major_of(version: str) -> int | None:
    """The feature release of a Java version: 8 for "1.8.0_412", 17 for "17.0.15"."""
    m = _JAVA_VERSION_RE.search(f'version "{version}"')
    if not m:
        return None
    major = int(m[1])
    return int(m[2] or 0) if major == 1 else major


def java_major(java: str) -> int | None:
    """The feature release of ``java``, or None if it does not run."""
    version = java_version(java)
    return major_of(version) if version else None


@dataclass(frozen=True, slots=True)
class Environment:
    """What running an engine needs: its release, a JDK and the folder of its jars."""

    engine: Engine
    java: str
    java_major: int
    lib: Path
    java_version: str = ""

    @property
    def class_path(self) -> str:
        return str(self.lib / "*")  # the JVM expands a folder's "*" to its jars


def check_environment(
    engine: str | Engine = DEFAULT_ENGINE, *, root: Path | None = None, java: str | None = None
) -> Environment:
    """The environment to run ``engine`` with; ``EngineUnavailable`` says what is missing and the fix."""
    eng = engine if isinstance(engine, Engine) else resolve_engine(engine)
    root = root or checkout_root()
    problems: list[str] = []
    java_path = find_java(java)
    version = java_version(java_path) if java_path else None
    major = major_of(version) if version else None
    if java_path is None:
        problems.append("no JDK: no java on the PATH and no $JAVA_HOME/bin/java (install a JDK 17)")
    elif major is None:
        problems.append(f"{java_path} does not run (java -version failed)")
    elif major < MIN_JAVA:
        problems.append(f"{java_path} is Java {major}; the engines need Java {MIN_JAVA} or newer (17 tested)")
    cache = cache_dir(eng, root)
    lib = cache / "lib"
    jars = [lib / f"rocketmq-{m}-{eng.version}.jar" for m in ("namesrv", "broker")]
    if not (cache / ".complete").is_file() or not all(j.is_file() for j in jars):
        where = lib.relative_to(root) if lib.is_relative_to(root) else lib
        problems.append(
            f"the jars of Apache RocketMQ {eng.version} are not cached in {where} "
            f"(run {SETUP_SCRIPT} in the project's checkout; it needs Maven and Maven Central)"
        )
    if problems:
        raise EngineUnavailable(f"engine {eng.name}: " + "; ".join(problems))
    assert java_path is not None and major is not None
    return Environment(eng, java_path, major, lib, version or str(major))


# -- configuration -------------------------------------------------------------------------------------

# RocketMQ's timers that no configuration reaches (constants of its code, in ms): they stay RocketMQ's
# whatever the time scale. In 5.x the broker's channel expiry is a setting (channelExpiredTimeout).
UNSCALED: Final[dict[str, dict[str, int]]] = {
    "4": {
        "broker channel expiry (ConsumerManager.CHANNEL_EXPIRED_TIMEOUT)": 120_000,
        "broker scan of idle client channels (ClientHousekeepingService)": 10_000,
        "long-polling re-check (PullRequestHoldService)": 5_000,
        "name server broker expiry (RouteInfoManager.BROKER_CHANNEL_EXPIRED_TIME)": 120_000,
        "name server scan of brokers (NamesrvController)": 10_000,
    },
    "5": {
        "broker scan of idle client channels (ClientHousekeepingService)": 10_000,
        "long-polling re-check (PullRequestHoldService)": 5_000,
        "name server broker expiry (RouteInfoManager.DEFAULT_BROKER_CHANNEL_EXPIRED_TIME)": 120_000,
    },
}
# registerNameServerPeriod is clamped by the broker to this range whatever the file says.
REGISTER_PERIOD_RANGE_MS: Final = (10_000, 60_000)


@dataclass(frozen=True, slots=True)
class StoreSizes:
    """Sizes of the broker's mapped files: small, so that a lab broker maps and touches little.

    RocketMQ's defaults are a 1 GiB commit-log file, 300,000 consume-queue entries of 20 bytes (6 MB per
    queue file), and index files of 5,000,000 slots and 20,000,000 entries (about 420 MB each)."""

    commit_log_bytes: int = 32 * 1024 * 1024
    consume_queue_entries: int = 30_000
    index_hash_slots: int = 50_000
    index_entries: int = 200_000
    # 5.x: the timer message store (timerlog files; RocketMQ's default is 100 MB each)
    timer_log_bytes: int = 4 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class Heaps:
    """Java heaps in MiB: what a lab's name server and broker need, not Apache's 4 GiB and 8 GiB."""

    namesrv_mb: int = 48
    broker_mb: int = 128
    # The heap starts this small and grows as needed: with -Xms at the maximum the serial collector's eden
    # is a third of it, and start-up garbage touches all of it before the first collection (about 20 MB
    # of a broker's resident memory).
    initial_mb: int = 16


def _scaled(ms: int, time_scale: float) -> int:
    return TimeScale(time_scale).whole_ms(ms)


def broker_properties(
    name: str,
    port: int,
    namesrv: str,
    store_dir: str | Path,
    time_scale: float = 1.0,
    *,
    engine: str | Engine = DEFAULT_ENGINE,
    host: str = "127.0.0.1",
    cluster: str = "DefaultCluster",
    auto_create_topic: bool = True,
    default_queue_nums: int = 4,
    sizes: StoreSizes | None = None,
    home: str | Path | None = None,
    timer_wheel: bool = False,
    broker_id: int = 0,
    broker_role: str = "ASYNC_MASTER",
    slave_read_enable: bool = False,
) -> dict[str, str]:
    """A broker's settings (the ``-c`` file's keys, as BrokerConfig, NettyServerConfig and
    MessageStoreConfig name them), with the time scale applied to every interval RocketMQ lets a file set.
    A ``broker_id`` above 0 makes a slave of the master of the same ``name`` (brokerRole SLAVE): it finds
    the master's HA address (its listenPort + 1, set by BrokerStartup) in its registration's answer.
    """
    eng = engine if isinstance(engine, Engine) else resolve_engine(engine)
    sizes = sizes or StoreSizes()
    store = Path(store_dir)
    props: dict[str, str] = {
        "brokerClusterName": cluster,
        "brokerName": name,
        "brokerId": str(broker_id),
        "brokerRole": "SLAVE" if broker_id else broker_role,
        "flushDiskType": "ASYNC_FLUSH",
        "brokerIP1": host,
        "listenPort": str(port),
        "namesrvAddr": namesrv,
        "autoCreateTopicEnable": _bool(auto_create_topic),
        "autoCreateSubscriptionGroup": "true",
        "defaultTopicQueueNums": str(default_queue_nums),
        "notifyConsumerIdsChangedEnable": "true",
        "longPollingEnable": "true",
        "storePathRootDir": str(store),
        "storePathCommitLog": str(store / "commitlog"),
        "mappedFileSizeCommitLog": str(sizes.commit_log_bytes),
        "mappedFileSizeConsumeQueue": str(sizes.consume_queue_entries * 20),  # 20-byte entries
        "maxHashSlotNum": str(sizes.index_hash_slots),
        "maxIndexNum": str(sizes.index_entries),
        # Intervals the files reach, scaled like the lab's own broker. registerNameServerPeriod is
        # clamped to 10..60 s by the broker itself.
        "registerNameServerPeriod": str(_scaled(30_000, time_scale)),
        "flushConsumerOffsetInterval": str(_scaled(5_000, time_scale)),
        "shortPollingTimeMills": str(_scaled(1_000, time_scale)),
        "serverChannelMaxIdleTimeSeconds": str(max(1, round(120 * time_scale))),
        # BrokerFastFailure answers SYSTEM_BUSY ([TIMEOUT_CLEAN_QUEUE]) to a send that waited 200 ms in
        # the send queue, which a JVM still warming up on a loaded machine exceeds; a Java producer does
        # not retry that code, and the run's workload would lose the send for a cause of no interest.
        "waitTimeMillsInSendQueue": "2000",
    }
    if slave_read_enable:
        props["slaveReadEnable"] = "true"
    if home is not None:
        props["rocketmqHome"] = str(home)
    if eng.major >= 5:
        props |= {
            "channelExpiredTimeout": str(_scaled(120_000, time_scale)),
            "subscriptionExpiredTimeout": str(_scaled(600_000, time_scale)),
            "loadBalancePollNameServerInterval": str(_scaled(30_000, time_scale)),
            "mappedFileSizeTimerLog": str(sizes.timer_log_bytes),
            # The timer wheel (messages with a delivery time; delay levels and retries go through the
            # schedule service either way) maps a 38 MB wheel and starts its services at once: about
            # 120 MB of a broker's resident memory and seconds of its start. Off unless asked for: the
            # lab sends no timer messages. 5.x's POP revive needs it ("skip revive topic because
            # timerWheelEnable is false"), so POP consumers need timer_wheel=True.
            "timerWheelEnable": _bool(timer_wheel),
        }
    return props


def namesrv_properties(
    port: int,
    member_dir: str | Path,
    time_scale: float = 1.0,
    *,
    engine: str | Engine = DEFAULT_ENGINE,
    home: str | Path | None = None,
) -> dict[str, str]:
    eng = engine if isinstance(engine, Engine) else resolve_engine(engine)
    d = Path(member_dir)
    props = {
        "listenPort": str(port),
        "kvConfigPath": str(d / "kvConfig.json"),
        "configStorePath": str(d / "namesrv-runtime.properties"),
        "serverChannelMaxIdleTimeSeconds": str(max(1, round(120 * time_scale))),
        # BrokerFastFailure answers SYSTEM_BUSY ([TIMEOUT_CLEAN_QUEUE]) to a send that waited 200 ms in
        # the send queue, which a JVM still warming up on a loaded machine exceeds; a Java producer does
        # not retry that code, and the run's workload would lose the send for a cause of no interest.
        "waitTimeMillsInSendQueue": "2000",
    }
    if home is not None:
        props["rocketmqHome"] = str(home)
    if eng.major >= 5:
        props["scanNotActiveBrokerInterval"] = str(_scaled(5_000, time_scale))
    return props


def _bool(value: bool) -> str:
    return "true" if value else "false"


def write_properties(path: str | Path, props: Mapping[str, str], header: Sequence[str] = ()) -> Path:
    """A Java properties file (keys and values as they are: none of ours needs escaping)."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    lines = [f"# {h}" if h else "#" for h in header]
    lines += [f"{k}={v}" for k, v in props.items()]
    p.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return p


def write_broker_config(
    path: str | Path,
    name: str,
    port: int,
    namesrv: str,
    store_dir: str | Path,
    time_scale: float = 1.0,
    **kwargs: Any,
) -> Path:
    """Write a broker's ``-c`` file (``broker_properties``' keys) and return its path."""
    eng = kwargs.get("engine", DEFAULT_ENGINE)
    eng = eng if isinstance(eng, Engine) else resolve_engine(eng)
    props = broker_properties(name, port, namesrv, store_dir, time_scale, **kwargs)
    fixed = UNSCALED["5" if eng.major >= 5 else "4"]
    header = [
        f"Apache RocketMQ {eng.version} broker {name} for the lab (time scale {time_scale:g}).",
        "Not scaled, constants of RocketMQ's code: "
        + "; ".join(f"{what} {ms // 1000} s" for what, ms in fixed.items())
        + ".",
    ]
    return write_properties(path, props, header)


def write_namesrv_config(
    path: str | Path, port: int, member_dir: str | Path, time_scale: float = 1.0, **kwargs: Any
) -> Path:
    props = namesrv_properties(port, member_dir, time_scale, **kwargs)
    return write_properties(path, props, ["Apache RocketMQ name server for the lab."])


# The one logging configuration of every member: the JVM's log goes to the file named by the system
# property rmqlab.log.file. 4.9 reads conf/logback_namesrv.xml or conf/logback_broker.xml under its home;
# 5.x's shaded logback reads the file named by rmq.logback.configurationFile.
LOGBACK_XML: Final = """<?xml version="1.0" encoding="UTF-8"?>
<configuration>
  <appender name="FILE" class="ch.qos.logback.core.FileAppender">
    <file>${rmqlab.log.file}</file>
    <append>true</append>
    <encoder>
      <pattern>%d{yyyy-MM-dd HH:mm:ss.SSS} %-5level [%thread] %logger - %msg%n</pattern>
    </encoder>
  </appender>
  <!-- per-minute statistics and water marks: noise for a lab -->
  <logger name="RocketmqStats" level="WARN"/>
  <logger name="RocketmqWaterMark" level="WARN"/>
  <logger name="RocketmqColdCtr" level="WARN"/>
  <root level="INFO">
    <appender-ref ref="FILE"/>
  </root>
</configuration>
"""
LOGBACK_FILES: Final = ("logback_namesrv.xml", "logback_broker.xml", "rmq.logback.xml")


def write_home(home: str | Path) -> Path:
    """A RocketMQ home (``ROCKETMQ_HOME``): ``conf/`` with the logging configuration each version reads."""
    conf = Path(home) / "conf"
    conf.mkdir(parents=True, exist_ok=True)
    for name in LOGBACK_FILES:
        target = conf / name
        if not target.is_file() or target.read_text(encoding="utf-8") != LOGBACK_XML:
            target.write_text(LOGBACK_XML, encoding="utf-8")
    return Path(home)


# -- command lines -------------------------------------------------------------------------------------

# On Java 9+, 4.9's MappedFile.clean() unmaps a file by reflection: DirectByteBuffer.attachment() /
# cleaner() (setAccessible on java.nio members: needs java.nio opened) and jdk.internal.ref.Cleaner.clean()
# (a public method of a package java.base does not export). Without them the broker's shutdown hook dies
# at its first mapped file (StoreCheckpoint): the store keeps its abort file, the broker is not
# unregistered and consumer offsets are not persisted. 5.x unmaps through Unsafe.invokeCleaner instead.
JDK9_BROKER_OPTIONS_4: Final = (
    "--add-exports=java.base/jdk.internal.ref=ALL-UNNAMED",
    "--add-opens=java.base/java.nio=ALL-UNNAMED",
)
# Default TLS mode "permissive" makes every server build a self-signed certificate at start (seconds of
# RSA key generation on a busy machine); the lab's clients speak plain TCP.
TLS_OFF: Final = "-Dtls.server.mode=disabled"


@dataclass(frozen=True, slots=True)
class CdsFiles:
    """A role's class-data-sharing archive (AppCDS): the JVM maps the classes it loaded last time instead
    of loading and verifying them again, a faster start and a few MB less per JVM. When the archive does
    not exist yet the JVM writes one at exit (``dump``); ``install_cds_archive`` moves it into place."""

    archive: Path
    dump: Path | None

    def options(self) -> list[str]:
        if self.dump is not None:
            return [f"-XX:ArchiveClassesAtExit={self.dump}"]
        return [f"-XX:SharedArchiveFile={self.archive}"]


def cds_files(env: Environment, role: str, member_dir: str | Path) -> CdsFiles:
    """Where ``role``'s archive belongs (per version, JDK and fetch of the jars, whose class path it is
    valid for) and, while it is missing, where a member writes one."""
    stamp = env.lib.parent / ".complete"
    fetched = int(stamp.stat().st_mtime) if stamp.exists() else 0
    archive = env.lib.parent / "cds" / f"{role}-java{env.java_version}-{fetched}.jsa"
    dump = None if archive.is_file() else Path(member_dir) / "tmp" / f"{role}.jsa"
    return CdsFiles(archive, dump)


def install_cds_archive(files: CdsFiles | None) -> bool:
    """Move an archive a stopped member wrote into place (once: the first one stays)."""
    if files is None or files.dump is None or not files.dump.is_file() or files.archive.exists():
        return False
    files.archive.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.replace(files.dump, files.archive)  # atomic: a JVM starting now maps a whole file or none
    except OSError:
        return False
    return True


def jvm_options(
    env: Environment,
    role: str,
    *,
    member_dir: str | Path,
    home: str | Path,
    log_file: str | Path,
    heap_mb: int,
    time_scale: float = 1.0,
    initial_heap_mb: int | None = None,
    cds: CdsFiles | None = None,
) -> list[str]:
    """The JVM's options for ``role`` ("namesrv" or "broker"): a small heap, the serial collector and C1
    only (quick to start, little memory), everything a member writes inside ``member_dir``; with ``cds``,
    the class-data archive of the role (used, or written at exit when there is none yet)."""
    d = Path(member_dir)
    initial = min(heap_mb, initial_heap_mb or Heaps().initial_mb)
    opts = [
        f"-Xms{initial}m",
        f"-Xmx{heap_mb}m",
        "-XX:+UseSerialGC",
        "-XX:TieredStopAtLevel=1",
        "-XX:-UsePerfData",  # no hsperfdata file in /tmp
        f"-Duser.home={d}",  # 4.9 puts default paths (logs, store, kv config) under it
        f"-Djava.io.tmpdir={d / 'tmp'}",  # native libraries unpacked at start (RocksDB in 5.x)
        f"-Drocketmq.home.dir={Path(home)}",
        f"-Drmqlab.log.file={Path(log_file)}",
        f"-Drmq.logback.configurationFile={Path(home) / 'conf' / 'rmq.logback.xml'}",
        TLS_OFF,
        # Netty's pooled buffers come in chunks of pageSize << maxOrder: 16 MiB in 4.9's Netty, 4 MiB in
        # 5.x's, each zeroed (so resident) when first used; 1 MiB is plenty for a lab's messages.
        "-Dio.netty.allocator.maxOrder=7",
    ]
    if cds is not None:
        opts += cds.options()
    if role == "broker":
        if env.engine.major < 5 and env.java_major >= 9:
            opts += JDK9_BROKER_OPTIONS_4
        # RebalanceLockManager reads the lock lease once, from this property (RocketMQ's 60 s).
        opts.append(f"-Drocketmq.broker.rebalance.lockMaxLiveTime={_scaled(60_000, time_scale)}")
    return opts


def member_argv(
    env: Environment,
    role: str,
    config: str | Path,
    *,
    member_dir: str | Path,
    home: str | Path,
    log_file: str | Path,
    heaps: Heaps | None = None,
    time_scale: float = 1.0,
    cds: CdsFiles | None = None,
) -> list[str]:
    """The command line of a name server (``role`` "namesrv") or a broker ("broker")."""
    heaps = heaps or Heaps()
    opts = jvm_options(
        env,
        role,
        member_dir=member_dir,
        home=home,
        log_file=log_file,
        heap_mb=heaps.namesrv_mb if role == "namesrv" else heaps.broker_mb,
        initial_heap_mb=heaps.initial_mb,
        time_scale=time_scale,
        cds=cds,
    )
    main_class = NAMESRV_MAIN if role == "namesrv" else BROKER_MAIN
    return [env.java, *opts, "-cp", env.class_path, main_class, "-c", str(config)]


def namesrv_argv(env: Environment, config: str | Path, **kwargs: Any) -> list[str]:
    return member_argv(env, "namesrv", config, **kwargs)


def broker_argv(env: Environment, config: str | Path, **kwargs: Any) -> list[str]:
    return member_argv(env, "broker", config, **kwargs)


# The lines each prints on stdout once up (4.9 and 5.x alike).
NAMESRV_READY: Final = re.compile(r"The Name Server boot success")
BROKER_READY: Final = re.compile(r"The broker\[(?P<name>[^,\]]+), (?P<addr>[^\]]+)\] boot success")


@dataclass(frozen=True, slots=True)
class Member:
    """One JVM of the cluster, as a supervisor starts it."""

    name: str
    role: str  # "namesrv" or "broker"
    addr: str
    argv: list[str]
    dir: Path
    config: Path
    log_file: Path  # the JVM's own log (logback)
    ready: re.Pattern[str]  # its stdout line that says it is up
    cds: CdsFiles | None = None  # its class-data archive (install_cds_archive once it stopped)


@dataclass(frozen=True, slots=True)
class ClusterPlan:
    env: Environment
    namesrv: Member
    brokers: list[Member]
    time_scale: float

    @property
    def members(self) -> list[Member]:
        return [self.namesrv, *self.brokers]


def broker_names(count: int) -> list[str]:
    """broker-a, broker-b, ... (the lab's names)."""
    letters = "abcdefghijklmnopqrstuvwxyz"
    return [f"broker-{letters[i]}" if i < 26 else f"broker-{i}" for i in range(count)]


def _can_bind(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


# Below Linux's ephemeral range (32768-60999), so that no outgoing connection holds a port picked here.
_PORT_RANGE: Final = (12_000, 32_000)


def free_port(host: str = "127.0.0.1", *, also: Sequence[int] = (), taken: set[int] | None = None) -> int:
    """A port ``p`` free on ``host`` together with ``p + d`` for each ``d`` in ``also``.

    A broker listens on ``listenPort``, on ``listenPort - 2`` (its "VIP" channel) and on ``listenPort + 1``
    (HA), so brokers need ``also=(-2, 1)``. ``taken`` holds ports already handed out by this process."""
    taken = taken if taken is not None else set()
    rng = random.Random()
    for _ in range(2000):
        p = rng.randrange(*_PORT_RANGE)
        ports = [p, *(p + d for d in also)]
        if any(q in taken for q in ports):
            continue
        if all(_can_bind(host, q) for q in ports):
            taken.update(ports)
            return p
    raise OSError(f"no free port on {host}")


def plan_cluster(
    env: Environment,
    run_dir: str | Path,
    brokers: int | Sequence[str] = 1,
    *,
    host: str = "127.0.0.1",
    namesrv_port: int = 0,
    broker_ports: Sequence[int] = (),
    time_scale: float = 1.0,
    heaps: Heaps | None = None,
    sizes: StoreSizes | None = None,
    auto_create_topic: bool = True,
    default_queue_nums: int = 4,
    cds: bool = True,
    timer_wheel: bool = False,
) -> ClusterPlan:
    """Write every member's configuration under ``run_dir`` and return their command lines.

    Layout: ``<run_dir>/rocketmq-home/conf/`` (logging), and per member ``<run_dir>/<name>/`` with
    ``<name>.properties``, ``rocketmq.log`` (its JVM log), ``store/`` (brokers) and ``tmp/``. Ports 0 are
    picked free. ``cds``: use (or, the first time, write) each role's class-data archive."""
    run = Path(run_dir).resolve()
    heaps = heaps or Heaps()
    home = write_home(run / "rocketmq-home")
    taken: set[int] = set()
    ns_port = namesrv_port or free_port(host, taken=taken)
    taken.add(ns_port)
    namesrv_addr = f"{host}:{ns_port}"
    ns_dir = run / "namesrv"
    (ns_dir / "tmp").mkdir(parents=True, exist_ok=True)
    ns_conf = write_namesrv_config(
        ns_dir / "namesrv.properties", ns_port, ns_dir, time_scale, engine=env.engine, home=home
    )
    ns_log = ns_dir / "rocketmq.log"
    ns_cds = cds_files(env, "namesrv", ns_dir) if cds else None
    ns_argv = namesrv_argv(
        env,
        ns_conf,
        member_dir=ns_dir,
        home=home,
        log_file=ns_log,
        heaps=heaps,
        time_scale=time_scale,
        cds=ns_cds,
    )
    namesrv = Member(
        "namesrv", "namesrv", namesrv_addr, ns_argv, ns_dir, ns_conf, ns_log, NAMESRV_READY, ns_cds
    )
    names = broker_names(brokers) if isinstance(brokers, int) else list(brokers)
    members = []
    for i, name in enumerate(names):
        port = broker_ports[i] if i < len(broker_ports) else free_port(host, also=(-2, 1), taken=taken)
        d = run / name
        (d / "tmp").mkdir(parents=True, exist_ok=True)
        conf = write_broker_config(
            d / f"{name}.properties",
            name,
            port,
            namesrv_addr,
            d / "store",
            time_scale,
            engine=env.engine,
            host=host,
            sizes=sizes,
            home=home,
            auto_create_topic=auto_create_topic,
            default_queue_nums=default_queue_nums,
            timer_wheel=timer_wheel,
        )
        log = d / "rocketmq.log"
        b_cds = cds_files(env, "broker", d) if cds else None
        argv = broker_argv(
            env, conf, member_dir=d, home=home, log_file=log, heaps=heaps, time_scale=time_scale, cds=b_cds
        )
        members.append(Member(name, "broker", f"{host}:{port}", argv, d, conf, log, BROKER_READY, b_cds))
    return ClusterPlan(env, namesrv, members, time_scale)


# -- admin over the native protocol --------------------------------------------------------------------

GET_BROKER_CLUSTER_INFO: Final = 106  # RequestCode.GET_BROKER_CLUSTER_INFO (not one the lab's broker serves)
_OPAQUE = itertools.count(1)
_MAX_ANSWER_BYTES: Final = 64 * 1024 * 1024


class AdminError(RuntimeError):
    """A native request failed: no connection, no answer in time, or an answer other than SUCCESS."""

    def __init__(self, message: str, code: int | None = None) -> None:
        super().__init__(message)
        self.code = code


def native_request(
    addr: str,
    code: int,
    ext: Mapping[str, str | int | bool] | None = None,
    body: bytes | None = None,
    timeout: float = 3.0,
) -> NativeFrame:
    """One request on a connection of its own; returns the answer (whatever its code)."""
    host, _, port = addr.rpartition(":")
    opaque = next(_OPAQUE)
    frame = NativeFrame(code=code, opaque=opaque, ext=dict(ext or {}), body=body)
    deadline = time.monotonic() + timeout
    try:
        with socket.create_connection((host, int(port)), timeout=timeout) as sock:
            sock.sendall(encode_frame(frame))
            decoder = NativeFrameDecoder(_MAX_ANSWER_BYTES)
            while True:
                sock.settimeout(max(0.01, deadline - time.monotonic()))
                chunk = sock.recv(65536)
                if not chunk:
                    raise AdminError(f"{addr} closed the connection before answering request {code}")
                for answer in decoder.feed(chunk):
                    if answer.is_response and answer.opaque == opaque:
                        return answer
    except TimeoutError:
        raise AdminError(f"{addr} did not answer request {code} within {timeout:g} s") from None
    except FrameError as exc:
        raise AdminError(f"{addr} answered request {code} with a broken frame: {exc}") from None
    except OSError as exc:
        raise AdminError(f"request {code} to {addr} failed: {exc}") from None


def _checked(answer: NativeFrame, what: str) -> NativeFrame:
    if answer.code != ResponseCode.SUCCESS:
        raise AdminError(f"{what}: answer {answer.code} {answer.remark or ''}".rstrip(), answer.code)
    return answer


def cluster_brokers(namesrv: str, timeout: float = 3.0) -> dict[str, dict[int, str]]:
    """The name server's brokers: name -> {broker id: address} (GET_BROKER_CLUSTER_INFO)."""
    answer = _checked(native_request(namesrv, GET_BROKER_CLUSTER_INFO, timeout=timeout), "cluster info")
    body = parse_json_body(answer.body) or {}
    out: dict[str, dict[int, str]] = {}
    for name, data in (body.get("brokerAddrTable") or {}).items():
        addrs = (data or {}).get("brokerAddrs") or {}
        out[name] = {int(k): str(v) for k, v in addrs.items()}
    return out


def route_brokers(namesrv: str, topic: str, timeout: float = 3.0) -> dict[str, str]:
    """Brokers in ``topic``'s route: name -> master address; empty when the topic has none."""
    answer = native_request(namesrv, RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": topic}, timeout=timeout)
    if answer.code == ResponseCode.TOPIC_NOT_EXIST:
        return {}
    body = parse_json_body(_checked(answer, f"route of {topic}").body) or {}
    out: dict[str, str] = {}
    for data in body.get("brokerDatas") or []:
        addrs = data.get("brokerAddrs") or {}
        master = addrs.get("0", addrs.get(0))
        if master:
            out[str(data.get("brokerName"))] = str(master)
    return out


def create_topic(
    broker: str,
    topic: str,
    queues: int = 4,
    *,
    perm: int = 6,
    order: bool = False,
    timeout: float = 5.0,
) -> None:
    """UPDATE_AND_CREATE_TOPIC on one broker (it registers the topic with its name servers at once)."""
    ext: dict[str, str | int | bool] = {
        "topic": topic,
        "defaultTopic": "TBW102",
        "readQueueNums": queues,
        "writeQueueNums": queues,
        "perm": perm,
        "topicFilterType": "SINGLE_TAG",
        "topicSysFlag": 0,
        "order": order,
    }
    answer = native_request(broker, RequestCode.UPDATE_AND_CREATE_TOPIC, ext, timeout=timeout)
    _checked(answer, f"create topic {topic} on {broker}")


def wait_until(what: str, check: Callable[[], bool], timeout: float, interval: float = 0.1) -> float:
    """Seconds until ``check()`` held; TimeoutError naming ``what`` after ``timeout``."""
    start = time.monotonic()
    while True:
        try:
            if check():
                return time.monotonic() - start
        except AdminError:
            pass
        if time.monotonic() - start > timeout:
            raise TimeoutError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(interval)


def wait_registered(namesrv: str, brokers: Mapping[str, str], timeout: float = 60.0) -> float:
    """Seconds until the name server lists each broker (name -> address) as its master."""

    def registered() -> bool:
        known = cluster_brokers(namesrv)
        return all(known.get(name, {}).get(0) == addr for name, addr in brokers.items())

    return wait_until(f"brokers {', '.join(brokers)} registered with {namesrv}", registered, timeout)


def wait_topic(namesrv: str, topic: str, brokers: Sequence[str], timeout: float = 20.0) -> float:
    """Seconds until ``topic``'s route at the name server names every one of ``brokers``."""
    return wait_until(
        f"topic {topic} routed to {', '.join(brokers)}",
        lambda: set(brokers) <= set(route_brokers(namesrv, topic)),
        timeout,
    )


# -- running a cluster ---------------------------------------------------------------------------------


def rss_kb(pid: int) -> int | None:
    """Resident memory (VmRSS) of a process in KiB, or None when it is gone."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


@dataclass
class RunningMember:
    member: Member
    popen: subprocess.Popen[bytes]
    out_path: Path
    _out: Any = field(default=None, repr=False)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def output(self) -> str:
        try:
            return self.out_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""

    def is_ready(self) -> bool:
        return bool(self.member.ready.search(self.output()))


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM it when the supervisor dies, even by SIGKILL (Linux's
    PR_SET_PDEATHSIG), so that no JVM outlives the process that started it."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM))  # 1: PR_SET_PDEATHSIG


class Cluster:
    """The JVMs of a ``ClusterPlan``, started in order and stopped together."""

    def __init__(self, plan: ClusterPlan) -> None:
        self.plan = plan
        self.running: dict[str, RunningMember] = {}
        self.timings: dict[str, float] = {}

    def spawn(self, member: Member) -> RunningMember:
        out_path = member.dir / "stdout.log"
        out = open(out_path, "wb")  # noqa: SIM115 (closed in stop)
        popen = subprocess.Popen(
            member.argv,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=member.dir,
            start_new_session=True,  # a terminal's ^C reaches the supervisor only; it stops the JVMs
            preexec_fn=_die_with_parent,
        )
        (member.dir / "pid").write_text(f"{popen.pid}\n", encoding="ascii")
        run = RunningMember(member, popen, out_path, out)
        self.running[member.name] = run
        return run

    def _wait_member(self, run: RunningMember, check: Callable[[], bool], what: str, deadline: float) -> None:
        while True:
            if not run.alive():
                code = run.popen.returncode
                raise RuntimeError(
                    f"{run.member.name} exited with {code} before {what}:\n{run.output()[-3000:]}"
                )
            try:
                if check():
                    return
            except AdminError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"{run.member.name}: timed out waiting for {what}\n{run.output()[-3000:]}")
            time.sleep(0.05)

    def start(self, timeout: float = 90.0) -> dict[str, float]:
        """Start the name server, then the brokers together once it answers, and wait until every broker
        is registered with it. Returns seconds from the start to each milestone."""
        t0 = time.monotonic()
        deadline = t0 + timeout
        ns = self.spawn(self.plan.namesrv)
        # Up when it answers: a broker that cannot reach it at its start registers only at its next
        # period (10 s or more), so the brokers wait for it.
        self._wait_member(ns, lambda: cluster_brokers(ns.member.addr, 1.0) is not None, "answering", deadline)
        self.timings["namesrv"] = time.monotonic() - t0
        runs = [self.spawn(b) for b in self.plan.brokers]
        pending = {r.member.name: r for r in runs}
        while pending:
            known = cluster_brokers(ns.member.addr) if ns.alive() else {}
            for name, run in list(pending.items()):
                if known.get(name, {}).get(0) == run.member.addr:
                    self.timings[name] = time.monotonic() - t0
                    del pending[name]
                elif not run.alive():
                    raise RuntimeError(f"{name} exited with {run.popen.returncode}:\n{run.output()[-3000:]}")
            if not ns.alive():
                raise RuntimeError(
                    f"the name server exited with {ns.popen.returncode}:\n{ns.output()[-3000:]}"
                )
            if pending and time.monotonic() > deadline:
                raise TimeoutError(
                    f"timed out after {timeout:g} s waiting for {', '.join(pending)} to register"
                )
            if pending:
                time.sleep(0.05)
        self.timings["all"] = time.monotonic() - t0
        return dict(self.timings)

    def create_topic(self, topic: str, queues: int = 4, timeout: float = 20.0) -> None:
        """Create ``topic`` on every broker and wait until the name server routes it to all of them."""
        for b in self.plan.brokers:
            create_topic(b.addr, topic, queues)
        wait_topic(self.plan.namesrv.addr, topic, [b.name for b in self.plan.brokers], timeout)

    def stop(self, timeout: float = 30.0) -> dict[str, int | None]:
        """SIGTERM the brokers (their shutdown hooks unregister them and persist offsets), then the name
        server; SIGKILL whatever is left after ``timeout``. Returns exit codes by name."""
        codes: dict[str, int | None] = {}
        brokers = [r for n, r in self.running.items() if r.member.role == "broker"]
        rest = [r for r in self.running.values() if r.member.role != "broker"]
        for group in (brokers, rest):
            for r in group:
                if r.alive():
                    with contextlib.suppress(ProcessLookupError):
                        r.popen.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + timeout
            for r in group:
                try:
                    codes[r.member.name] = r.popen.wait(max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(r.popen.pid, signal.SIGKILL)
                    codes[r.member.name] = r.popen.wait(10)
                if r._out is not None:
                    r._out.close()
                install_cds_archive(r.member.cds)
        return codes

    def rss(self) -> dict[str, int | None]:
        return {name: rss_kb(r.pid) for name, r in self.running.items()}


# -- command line --------------------------------------------------------------------------------------

EXIT_CODES: Final = {
    0: "stopped (SIGTERM or SIGINT) after the members' clean shutdown, or the environment is ready (check)",
    1: "a member failed: it exited, or was not registered in time",
    2: "bad usage",
    3: "the environment is missing (no JDK, or the jars not cached: the message names the setup command)",
}


def _topic_arg(text: str) -> tuple[str, int]:
    name, _, queues = text.partition(":")
    if not name or (queues and not queues.isdigit()) or (queues and int(queues) < 1):
        raise argparse.ArgumentTypeError(f"expected TOPIC[:QUEUES], got {text!r}")
    return name, int(queues) if queues else 4


def build_parser() -> argparse.ArgumentParser:
    p = command_parser(
        "python -m rmqlab.interop.apache.engine",
        "Apache RocketMQ's own name server and brokers (JVMs) for the lab's apache-* engines.",
        EXIT_CODES,
        note=f"Set up the jars with {SETUP_SCRIPT}. Engines: "
        + ", ".join(f"{n} ({e.version})" for n, e in ENGINES.items()),
    )
    sub = p.add_subparsers(dest="command", required=True)
    start = subcommand(sub, "start", "start a name server and brokers; READY lines; stop on SIGTERM")
    start.add_argument("--run-dir", required=True, help="folder for the members' configuration, logs, stores")
    start.add_argument("--brokers", type=positive_int, default=1, help="how many brokers (broker-a, ...)")
    start.add_argument("--engine", default=DEFAULT_ENGINE, help=f"default {DEFAULT_ENGINE}")
    start.add_argument("--host", default="127.0.0.1", help="address the members listen on and register")
    start.add_argument("--namesrv-port", type=int, default=0, help="0 (default) picks a free one")
    start.add_argument("--time-scale", type=positive_float, default=1.0, help="the lab's time scale")
    start.add_argument("--topic", type=_topic_arg, action="append", default=[], metavar="TOPIC[:QUEUES]")
    start.add_argument("--timeout", type=positive_float, default=90.0, help="seconds to wait for the start")
    start.add_argument("--broker-heap-mb", type=positive_int, default=Heaps().broker_mb)
    start.add_argument("--namesrv-heap-mb", type=positive_int, default=Heaps().namesrv_mb)
    start.add_argument("--java", default=None, help="the java to run (default $JAVA_HOME/bin/java or PATH)")
    start.add_argument("--no-cds", action="store_true", help="no class-data archives (see CdsFiles)")
    start.add_argument("--timer-wheel", action="store_true", help="5.x: keep the timer wheel (POP needs it)")
    check = subcommand(sub, "check", "say whether an engine can run here (JDK, cached jars)")
    check.add_argument("--engine", default=DEFAULT_ENGINE)
    check.add_argument("--java", default=None)
    return p


def _say(text: str, stream: TextIO = sys.stderr) -> None:
    stream.write(text + "\n")
    stream.flush()


# Real clients heartbeat every 30 s; the scaled idle close (120 s x scale) must stay above that.
MIN_TIME_SCALE_FOR_REAL_CLIENTS: Final = 0.25


def cmd_start(args: argparse.Namespace) -> int:
    if args.time_scale < MIN_TIME_SCALE_FOR_REAL_CLIENTS:
        _say(
            f"warning: at time scale {args.time_scale:g} the brokers close a connection idle for "
            f"{120 * args.time_scale:g} s, less than real clients' 30 s heartbeat"
        )
    try:
        env = check_environment(args.engine, java=args.java)
    except EngineUnavailable as exc:
        _say(f"error: {exc}")
        return 3
    plan = plan_cluster(
        env,
        args.run_dir,
        args.brokers,
        host=args.host,
        namesrv_port=args.namesrv_port,
        time_scale=args.time_scale,
        heaps=Heaps(args.namesrv_heap_mb, args.broker_heap_mb),
        cds=not args.no_cds,
        timer_wheel=args.timer_wheel,
    )
    cluster = Cluster(plan)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    code = 0
    try:
        timings = cluster.start(args.timeout)
        _say(
            f"{env.engine.name} ({env.engine.version}, Java {env.java_major}): "
            + ", ".join(f"{k} {v:.2f} s" for k, v in timings.items())
        )
        for topic, queues in args.topic:
            cluster.create_topic(topic, queues)
        for m in plan.members:
            _say(f"READY {m.name} {m.addr}", sys.stdout)
        while not stop.wait(0.5):
            dead = [r for r in cluster.running.values() if not r.alive()]
            if dead:
                for r in dead:
                    _say(f"error: {r.member.name} exited with {r.popen.returncode}:\n{r.output()[-2000:]}")
                code = 1
                break
    except (RuntimeError, TimeoutError, AdminError) as exc:
        _say(f"error: {exc}")
        code = 1
    finally:
        codes = cluster.stop()
        notes = []
        for name, exit_code in codes.items():
            member = cluster.running[name].member
            # A broker that did not finish its shutdown hook leaves the store's abort file behind.
            unclean = member.role == "broker" and (member.dir / "store" / "abort").exists()
            notes.append(f"{name} exit {exit_code}" + (" (store left with an abort file)" if unclean else ""))
            code = code or (1 if unclean else 0)
        _say("stopped: " + ", ".join(notes))
    return code


def cmd_check(args: argparse.Namespace) -> int:
    try:
        env = check_environment(args.engine, java=args.java)
    except EngineUnavailable as exc:
        _say(f"error: {exc}")
        return 3
    eng = env.engine
    _say(f"{eng.name}: Apache RocketMQ {eng.version}, {env.java} (Java {env.java_major}), {env.lib}")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "start":
        return cmd_start(args)
    return cmd_check(args)


if __name__ == "__main__":
    sys.exit(main())
