"""The aiohttp application of `vidsentry serve` and the server that listens for it."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from aiohttp import web

from realtime.errors import ServiceError
from realtime.http import api, ops, page, preview, sse
from realtime.http.connections import (
    AcceptErrorLog,
    BadRequestLog,
    CappedSite,
    ConnectionCollector,
    ConnectionStats,
    ConnectionTable,
    fd_bound_cap,
    mark_busy,
)
from realtime.http.context import APP_CONTEXT, HttpContext
from realtime.http.deadline import STREAMING_ROUTE, request_deadline
from realtime.http.errors import json_errors
from realtime.http.guards import (
    bearer_auth,
    json_bodies_only,
    known_hosts_only,
    refuse_changes_while_draining,
    same_site_only,
)
from realtime.http.handlers import MAX_BODY_BYTES
from realtime.http.headers import add_security_headers

log = logging.getLogger(__name__)

CONNECTION_STATS = web.AppKey("vidsentry_connection_stats", ConnectionStats)


def create_app(context: HttpContext) -> web.Application:
    # Outermost first: errors wrap everything, so a 401, 403 or 503 is JSON like the rest. The
    # cheap refusals (host, origin, token) come before anything reads a body.
    app = web.Application(
        middlewares=[
            json_errors,
            mark_busy,
            known_hosts_only,
            same_site_only,
            bearer_auth,
            refuse_changes_while_draining,
            json_bodies_only,
            request_deadline,
        ],
        client_max_size=MAX_BODY_BYTES,
    )
    app[APP_CONTEXT] = context
    app[CONNECTION_STATS] = stats = ConnectionStats()
    context.metrics.registry.register(ConnectionCollector(stats))
    app.on_response_prepare.append(add_security_headers)
    api.add_routes(app)
    app.router.add_get("/api/streams/{stream_id}/events", sse.stream_events, name=STREAMING_ROUTE)
    preview.add_routes(app)
    ops.add_routes(app)
    page.add_routes(app)
    return app


class ListenError(ServiceError, OSError):
    """The address cannot be listened on (in use, not local, no permission)."""


class HttpServer:
    """Listens on one address; `start` returns the URL actually bound (port 0 picks a free one).

    `max_connections` and `idle_timeout_s` bound the connections (see connections.py)."""

    def __init__(
        self,
        app: web.Application,
        *,
        shutdown_timeout_s: float = 5.0,
        max_connections: int = 512,
        idle_timeout_s: float = 30.0,
    ) -> None:
        # No access log: probes and scrapes would drown the structured logs. Handlers are cancelled
        # when their client disconnects, so an event viewer that leaves is cleaned up at once.
        self._handler_args: dict[str, Any] = {"access_log": None, "keepalive_timeout": idle_timeout_s}
        self._runner = web.AppRunner(
            app,
            handle_signals=False,
            handler_cancellation=True,
            shutdown_timeout=shutdown_timeout_s,
            **self._handler_args,
        )
        self._stats = app[CONNECTION_STATS]
        self._max_connections = max_connections
        self._accept_log: AcceptErrorLog | None = None
        self._started = False

    async def start(self, host: str, port: int) -> str:
        """Bind and serve; ListenError if the address cannot be used."""
        await self._runner.setup()
        self._started = True
        cap = fd_bound_cap(self._max_connections)
        if cap < self._max_connections:
            log.warning(
                "HTTP connections capped below http.max_connections by the open-file limit",
                extra={"max_connections": self._max_connections, "applied": cap},
            )
        site = CappedSite(
            self._runner,
            host,
            port,
            table=ConnectionTable(cap, self._stats),
            bad_requests=BadRequestLog(self._stats),
            handler_args=self._handler_args,
        )
        try:
            await site.start()
        except OSError as exc:
            await self.stop()
            raise ListenError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
        self._accept_log = AcceptErrorLog(asyncio.get_running_loop(), self._stats)
        self._accept_log.install()
        bound_host, bound_port = self._runner.addresses[0][:2]
        shown_host = f"[{bound_host}]" if ":" in bound_host else bound_host
        return f"http://{shown_host}:{bound_port}"

    async def stop(self) -> None:
        if self._accept_log is not None:
            self._accept_log.uninstall()
            self._accept_log = None
        if self._started:
            self._started = False
            await self._runner.cleanup()
