"""RocketMQ's native remoting protocol, so that real RocketMQ clients can use the emulator.

``start_native_port(primary, host, port)`` opens a second port with the same handlers as ``primary``;
``native_codec_factory`` is the per-connection codec behind it.
"""

from rmqlab.protocol.native.codec import NativeCodec, native_codec_factory, port_rewriter
from rmqlab.protocol.native.server import start_native_port

__all__ = ["NativeCodec", "native_codec_factory", "port_rewriter", "start_native_port"]
