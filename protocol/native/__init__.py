"""RocketMQ's native remoting protocol, so that real RocketMQ clients can use the emulator.

``start_native_port(primary, host, port)`` opens a second port with the same handlers as ``primary``;
``native_codec_factory`` is the per-connection codec behind it; ``native_client_codec_factory`` is the same
codec for our client's side (``ClientConfig.protocol = "native"``).
"""

from rmqlab.protocol.native.codec import (
    NativeCodec,
    native_client_codec_factory,
    native_codec_factory,
    port_rewriter,
)
from rmqlab.protocol.native.server import start_native_port

__all__ = [
    "NativeCodec",
    "native_client_codec_factory",
    "native_codec_factory",
    "port_rewriter",
    "start_native_port",
]
