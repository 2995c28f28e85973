"""rmq-proxy's settings: RocketMQ 5 proxy defaults (ProxyConfig), one frozen dataclass."""

from __future__ import annotations

from dataclasses import dataclass

from rmqlab.protocol.clock import TimeScale
from rmqlab.proxy import convert


@dataclass(frozen=True, slots=True)
class ProxyConfig:
    """Where the proxy listens, which name server it asks, and the limits it applies to v5 clients.

    ``time_scale`` applies to the proxy's own timers only (the idle-client scan); times that v5 clients
    send (invisible durations, long polling) are passed on as they are, as the brokers take them.
    """

    namesrv: str
    host: str = "127.0.0.1"
    port: int = 8081  # ProxyConfig.grpcServerPort
    time_scale: float = 1.0
    broker_timeout_ms: int = 3000  # one request to a broker or the name server (not long polling)
    min_invisible_ms: int = convert.MIN_INVISIBLE_MS_FOR_RECV
    max_invisible_ms: int = convert.MAX_INVISIBLE_MS
    default_invisible_ms: int = convert.DEFAULT_INVISIBLE_MS
    min_long_polling_ms: int = convert.MIN_LONG_POLLING_MS
    max_long_polling_ms: int = convert.MAX_LONG_POLLING_MS
    client_expire_ms: int = 120_000  # channelExpiredTimeout: a client silent this long is dropped
    scan_interval_ms: int = 10_000
    route_refresh_ms: int = 20_000  # topicRouteServiceCacheRefreshSeconds

    def scaled(self, ms: int) -> float:
        """A proxy timer in seconds, after the time scale."""
        return TimeScale(self.time_scale).seconds(ms)
