"""A client's identity in RocketMQ's format, ``clientIP@instanceName`` (ClientConfig.buildMQClientId)."""

from __future__ import annotations

import os
import socket
import time


def new_instance_name(with_nano_time: bool = True) -> str:
    """``pid#monotonic-ns``: unique per process even when every container's pid is 1 (RocketMQ >= 4.9.0);
    without ``with_nano_time`` the pid alone, as before 4.9.0."""
    if not with_nano_time:
        return str(os.getpid())
    return f"{os.getpid()}#{time.monotonic_ns()}{time.time_ns() % 1_000_000:06d}"


_local_ip: str | None = None


def local_ip() -> str:
    global _local_ip
    if _local_ip is None:
        ip = "127.0.0.1"
        try:
            for info in socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET):
                cand = str(info[4][0])
                if not cand.startswith("127."):
                    ip = cand
                    break
        except OSError:
            pass
        _local_ip = ip
    return _local_ip


def build_client_id(instance_name: str | None = None, client_ip: str | None = None) -> str:
    """RocketMQ's ``clientIP@instanceName`` (ClientConfig.buildMQClientId); the IP defaults to this host's."""
    return f"{client_ip or local_ip()}@{instance_name or new_instance_name()}"
