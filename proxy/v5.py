"""RocketMQ 5's gRPC API (``apache.rocketmq.v2``): the message classes and the service base, in one place.

They come from the ``rocketmq-python-client`` wheel (5.1.2), which ships the classes generated from the
public API definitions as ``rocketmq.grpc_protocol``; the ``[v5]`` extra installs it with grpcio and
protobuf. Nothing else of that package is used. Without the extra, importing this module raises
``V5Unavailable`` with the command that installs it, so the rest of the emulator never needs them.
"""

from __future__ import annotations

from typing import Any


class V5Unavailable(ImportError):
    """grpcio, protobuf or the v5 API classes are not installed."""


try:
    import grpc
    from google.protobuf import duration_pb2, timestamp_pb2
    from grpc import aio
    from rocketmq.grpc_protocol import definition_pb2, service_pb2, service_pb2_grpc
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise V5Unavailable(
        f"rmq-proxy needs the [v5] extra (grpcio, protobuf, rocketmq-python-client): "
        f"pip install -e '.[v5]' ({exc})"
    ) from exc

pb: Any = definition_pb2
svc: Any = service_pb2
Code: Any = definition_pb2.Code
MessagingServiceServicer: Any = service_pb2_grpc.MessagingServiceServicer
add_servicer: Any = service_pb2_grpc.add_MessagingServiceServicer_to_server
MessagingServiceStub: Any = service_pb2_grpc.MessagingServiceStub
Duration: Any = duration_pb2.Duration
Timestamp: Any = timestamp_pb2.Timestamp

__all__ = [
    "Code",
    "Duration",
    "MessagingServiceServicer",
    "MessagingServiceStub",
    "Timestamp",
    "V5Unavailable",
    "add_servicer",
    "aio",
    "grpc",
    "pb",
    "svc",
]
