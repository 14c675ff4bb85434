"""The health server: ``/healthz``, ``/readyz`` and ``/metrics``.

A deliberately small HTTP/1.1 responder on asyncio streams: three GET routes,
no keep-alive, no dependency. ``/healthz`` is 200 while the process works
(503 when a component is degraded, with the reason), ``/readyz`` is 200 once
every table has caught up once and the connections are up, ``/metrics`` is
Prometheus text.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import socket
from collections.abc import Callable

import orjson

from cdc.config_addresses import format_address

log = logging.getLogger("cdc.health")

Probe = Callable[[], tuple[bool, dict[str, object]]]


class HealthServer:
    def __init__(self, host: str, port: int, *, healthz: Probe, readyz: Probe, metrics: Callable[[], bytes]):
        self.host, self.port = host, port
        self._routes: dict[str, Callable[[], tuple[int, str, bytes]]] = {
            "/healthz": lambda: self._probe(healthz),
            "/readyz": lambda: self._probe(readyz),
            "/metrics": lambda: (200, "text/plain; version=0.0.4; charset=utf-8", metrics()),
        }
        self._server: asyncio.Server | None = None

    async def listen(self) -> None:
        """Bind the address without serving yet, so that a port in use or a
        host that does not resolve stops the start before anything else has
        started. Raises OSError; ``listen_error`` says it for the operator."""
        self._server = await asyncio.start_server(self._handle, self.host, self.port, start_serving=False)
        sockets = self._server.sockets or ()
        if sockets:
            self.port = sockets[0].getsockname()[1]

    async def start(self) -> None:
        """Serve (listening first if ``listen`` was not called)."""
        if self._server is None:
            await self.listen()
        assert self._server is not None
        await self._server.start_serving()
        log.info("health server listening", extra={"address": format_address(self.host, self.port)})

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2.0)
            self._server = None

    def listen_error(self, exc: OSError) -> str:
        """Why ``listen`` failed, and what to do, for the operator."""
        address = format_address(self.host, self.port)
        if isinstance(exc, socket.gaierror):
            return f"the host {self.host!r} does not resolve ({exc.strerror}): give an IP address or a known host name"
        if exc.errno == errno.EADDRINUSE:
            return (
                f"{address} is already in use, by another sidecar on this host or another program: "
                "give each sidecar its own port, or turn the health server off with health: null"
            )
        if exc.errno == errno.EADDRNOTAVAIL:
            return f"{address} is not an address of this host: listen on one of its own, or 0.0.0.0 for all"
        if exc.errno == errno.EACCES:
            return f"cannot listen on {address}: permission denied (ports below 1024 need privileges)"
        return f"cannot listen on {address}: {exc.strerror or exc}"

    @staticmethod
    def _probe(probe: Probe) -> tuple[int, str, bytes]:
        ok, detail = probe()
        return (200 if ok else 503), "application/json", orjson.dumps({"ok": ok, **detail}, default=str)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5.0)
            method, _, rest = request.decode("latin-1").partition(" ")
            path = rest.split(" ", 1)[0].split("?", 1)[0]
            route = self._routes.get(path)
            if method not in ("GET", "HEAD"):
                status, kind, body = 405, "text/plain", b"method not allowed\n"
            elif route is None:
                status, kind, body = 404, "text/plain", b"not found\n"
            else:
                status, kind, body = route()
            reason = {200: "OK", 404: "Not Found", 405: "Method Not Allowed", 503: "Service Unavailable"}
            head = (
                f"HTTP/1.1 {status} {reason.get(status, '')}\r\nContent-Type: {kind}\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
            )
            writer.write(head.encode("latin-1") + (b"" if method == "HEAD" else body))
            await writer.drain()
        except (TimeoutError, asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()
