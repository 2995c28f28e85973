"""A second listening port that speaks RocketMQ's native remoting format to the same handlers."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from rmqlab.protocol.client_id import local_ip
from rmqlab.protocol.native.codec import NativeCodec, native_codec_factory, port_rewriter
from rmqlab.protocol.remoting import RemotingServer


async def start_native_port(
    primary: RemotingServer,
    host: str,
    port: int,
    log: Any = None,
    *,
    route_ports: Iterable[int] = (),
) -> RemotingServer:
    """Start a server on ``host:port`` (0 = any free port) serving ``primary``'s handlers and connection
    callbacks with the native codec; returns it (close it with ``await server.close()``).

    Route answers given on it name the native port wherever the primary's port (or one of
    ``route_ports``, e.g. an advertised port) appears, so real clients that looked a topic up here come
    back to this port.
    """
    extra_ports = tuple(route_ports)
    server = RemotingServer(
        host,
        port,
        max_frame_bytes=primary.max_frame_bytes,
        max_inflight=primary.max_inflight,
        log=log,
        partial_frame_timeout_s=primary.partial_frame_timeout_s,
    )
    advertised = host if host not in ("0.0.0.0", "", "::") else local_ip()

    def factory(max_frame_bytes: int) -> NativeCodec:
        # Bound per connection: the port is known only once the server listens.
        return native_codec_factory(
            max_frame_bytes,
            store_host=f"{advertised}:{server.port}",
            rewrite_broker_addr=port_rewriter(primary.port, server.port, *extra_ports),
        )

    server.codec_factory = factory
    server.share_handlers_with(primary)
    await server.start()
    return server
