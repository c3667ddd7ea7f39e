"""The aiohttp application of `vidsentry serve` and the server that listens for it."""

from __future__ import annotations

import logging

from aiohttp import web

from realtime.http import api, ops, page, sse
from realtime.http.context import APP_CONTEXT, HttpContext
from realtime.http.errors import json_errors
from realtime.http.guards import bearer_auth, refuse_changes_while_draining
from realtime.http.handlers import MAX_BODY_BYTES

log = logging.getLogger(__name__)


def create_app(context: HttpContext) -> web.Application:
    # Outermost first: errors wrap everything, so a 401 or 503 is JSON like the rest.
    app = web.Application(
        middlewares=[json_errors, bearer_auth, refuse_changes_while_draining], client_max_size=MAX_BODY_BYTES
    )
    app[APP_CONTEXT] = context
    api.add_routes(app)
    app.router.add_get("/api/streams/{stream_id}/events", sse.stream_events)
    ops.add_routes(app)
    page.add_routes(app)
    return app


class ListenError(OSError):
    """The address cannot be listened on (in use, not local, no permission)."""


class HttpServer:
    """Listens on one address; `start` returns the URL actually bound (port 0 picks a free one)."""

    def __init__(self, app: web.Application, *, shutdown_timeout_s: float = 5.0) -> None:
        # No access log: probes and scrapes would drown the structured logs. Handlers are cancelled
        # when their client disconnects, so an event viewer that leaves is cleaned up at once.
        self._runner = web.AppRunner(
            app,
            access_log=None,
            handle_signals=False,
            handler_cancellation=True,
            shutdown_timeout=shutdown_timeout_s,
        )
        self._started = False

    async def start(self, host: str, port: int) -> str:
        """Bind and serve; ListenError if the address cannot be used."""
        await self._runner.setup()
        self._started = True
        site = web.TCPSite(self._runner, host, port)
        try:
            await site.start()
        except OSError as exc:
            await self.stop()
            raise ListenError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
        bound_host, bound_port = self._runner.addresses[0][:2]
        shown_host = f"[{bound_host}]" if ":" in bound_host else bound_host
        return f"http://{shown_host}:{bound_port}"

    async def stop(self) -> None:
        if self._started:
            self._started = False
            await self._runner.cleanup()
