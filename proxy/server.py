"""The gRPC server around ``MessagingService``: listen, expire idle clients, stop gracefully."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from rmqlab.protocol.event_log import EventLog
from rmqlab.proxy.proxy_config import ProxyConfig
from rmqlab.proxy.service import MessagingService
from rmqlab.proxy.v5 import add_servicer, aio


class ProxyServer:
    """One gRPC server on ``config.host:config.port`` serving ``apache.rocketmq.v2.MessagingService``."""

    def __init__(self, config: ProxyConfig, log: EventLog) -> None:
        self.config = config
        self.log = log
        self._server: Any = None
        self._tasks: list[asyncio.Task[None]] = []
        self.port = config.port
        self.service: MessagingService | None = None

    @property
    def address(self) -> str:
        return f"{self.config.host}:{self.port}"

    async def start(self) -> None:
        server = aio.server(options=[("grpc.so_reuseport", 0)])
        bound = server.add_insecure_port(f"{self.config.host}:{self.config.port}")
        if bound == 0:
            raise OSError(f"cannot bind {self.config.host}:{self.config.port}")
        self.port = bound
        # Routes point clients back here, so the service needs the port actually bound.
        from dataclasses import replace

        self.service = MessagingService(replace(self.config, port=bound), self.log)
        add_servicer(self.service, server)
        await server.start()
        self._server = server
        self._tasks = [
            asyncio.create_task(self.service.expire_idle()),
            asyncio.create_task(self.service.renew_held()),
        ]
        self.log.emit("proxy_started", address=self.address, namesrv=self.config.namesrv)

    async def wait(self) -> None:
        await self._server.wait_for_termination()

    async def stop(self, grace_s: float = 1.0) -> None:
        for task in self._tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._server is not None:
            await self._server.stop(grace_s)
        if self.service is not None:
            await self.service.close()
        self.log.emit("proxy_stopped", address=self.address)
