"""The connections of the HTTP server: how many, how long idle, and what a malformed request gets.

aiohttp keeps an idle connection for an hour and a half-sent request head for as long as the
client likes; with a few hundred of them the process runs out of file descriptors and nothing
answers, /healthz included. Here:

- `http.idle_timeout_s`: a connection that has not sent a complete request head within this
  long of connecting or of its last response is closed (aiohttp's keep-alive timer, which
  3.9+ also starts when the connection is made, so a slow head counts too).
- `http.max_connections`, and never more than half the open-file limit: at the cap the
  longest-idle connection makes room for the new one; when every connection is busy (event
  streams, requests in flight) the new one gets a JSON 503 and is closed. Both are counted.
- A request aiohttp cannot parse gets the JSON error body every other error has; it is logged
  once per client address, with the reason and never a header value (a malformed
  `Authorization` would otherwise put the token in the log), and counted.
- The event loop's "socket.accept() out of system resource" errors (EMFILE) are logged at
  most once per `ACCEPT_LOG_EVERY_S`, with how many were not, instead of a traceback each.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import resource
import time
from collections import OrderedDict
from collections.abc import Iterable
from http import HTTPStatus
from typing import Any

from aiohttp import web
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_request import BaseRequest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from realtime.http.handlers import Handler
from realtime.http.headers import SECURITY_HEADERS

log = logging.getLogger(__name__)

ACCEPT_LOG_EVERY_S = 10.0
_ACCEPT_ERROR = "socket.accept() out of system resource"
_REMEMBERED_CLIENTS = 1024  # addresses whose malformed requests were logged (the oldest are forgotten)


def fd_bound_cap(max_connections: int) -> int:
    """The cap actually used: at most half the soft open-file limit, so streams, NATS and the
    model keep theirs however many clients come."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return max_connections
    return max(1, min(max_connections, soft // 2))


class ConnectionStats:
    """What the listener did, for /metrics."""

    def __init__(self) -> None:
        self.cap = 0  # as applied (see fd_bound_cap); 0 until listening
        self.open = 0
        self.evicted = 0  # idle connections closed to make room
        self.refused = 0  # new connections refused with a 503: every connection was busy
        self.bad_requests = 0  # requests aiohttp could not parse (answered with a JSON 4xx)
        self.accept_errors = 0  # the event loop could not accept (out of file descriptors)


class ConnectionTable:
    """The open connections, which are busy (inside a handler), and the cap."""

    def __init__(self, cap: int, stats: ConnectionStats) -> None:
        self.cap = stats.cap = cap
        self.stats = stats
        self._idle_since: dict[ServiceRequestHandler, float] = {}  # 0.0 while busy
        self._busy: dict[ServiceRequestHandler, int] = {}

    def add(self, conn: ServiceRequestHandler) -> None:
        self._idle_since[conn] = time.monotonic()
        self.stats.open = len(self._idle_since)

    def remove(self, conn: ServiceRequestHandler) -> None:
        self._idle_since.pop(conn, None)
        self._busy.pop(conn, None)
        self.stats.open = len(self._idle_since)

    def busy(self, conn: ServiceRequestHandler) -> None:
        self._busy[conn] = self._busy.get(conn, 0) + 1

    def idle(self, conn: ServiceRequestHandler) -> None:
        left = self._busy.get(conn, 1) - 1
        if left > 0:
            self._busy[conn] = left
            return
        self._busy.pop(conn, None)
        if conn in self._idle_since:
            self._idle_since[conn] = time.monotonic()

    def make_room(self) -> bool:
        """True if another connection may open: below the cap, or after closing the longest-idle one."""
        if len(self._idle_since) < self.cap:
            return True
        idle = [(since, id(c), c) for c, since in self._idle_since.items() if c not in self._busy]
        if not idle:
            return False
        _, _, oldest = min(idle)
        self.remove(oldest)  # now, not when its close completes: the new one takes the slot
        oldest.force_close()
        self.stats.evicted += 1
        return True


class BadRequestLog:
    """Logs a malformed request once per client address; later ones are only counted."""

    def __init__(self, stats: ConnectionStats, remembered: int = _REMEMBERED_CLIENTS) -> None:
        self.stats = stats
        self._seen: OrderedDict[str, int] = OrderedDict()
        self._remembered = remembered

    def note(self, client: str, status: int, reason: str) -> None:
        self.stats.bad_requests += 1
        if client in self._seen:
            self._seen[client] += 1
            self._seen.move_to_end(client)
            return
        self._seen[client] = 1
        if len(self._seen) > self._remembered:
            self._seen.popitem(last=False)
        log.warning(
            "malformed HTTP request; later ones from this client are only counted",
            extra={"client": client, "status": status, "reason": reason},
        )


def parse_error_reason(exc: BaseException | None) -> str:
    """aiohttp's parser message without the offending bytes (they may be a header value)."""
    text = str(getattr(exc, "message", "") or "").split("\n", 1)[0]
    text = re.split(r"[:'\"\\]", text, maxsplit=1)[0].strip()
    text = "".join(ch for ch in text if ch.isprintable())[:100]
    return text or "malformed request"


class ServiceRequestHandler(RequestHandler):
    """aiohttp's connection protocol, registered in the table and with JSON errors of its own."""

    table: ConnectionTable
    bad_requests: BadRequestLog

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self.table.add(self)

    def connection_lost(self, exc: BaseException | None) -> None:
        self.table.remove(self)
        super().connection_lost(exc)

    def handle_error(
        self, request: BaseRequest, status: int = 500, exc: BaseException | None = None, message: str | None = None
    ) -> web.StreamResponse:
        """Errors outside the application: a request the parser refused (4xx), or a handler that
        failed past the JSON error middleware (5xx)."""
        if status >= 500:
            log.error("HTTP request failed outside the handlers", exc_info=exc, extra={"status": status})
            detail = "the server failed; see its log"
        else:
            detail = parse_error_reason(exc)
            self.bad_requests.note(str(request.remote), status, detail)
        if request.writer.output_size > 0:
            raise ConnectionError("the response has started; no error can be sent")  # as aiohttp does
        body = {"error": HTTPStatus(status).phrase.lower(), "detail": detail}
        response = web.json_response(body, status=status, headers=SECURITY_HEADERS)
        response.force_close()
        return response


def _refusal(cap: int) -> bytes:
    body = json.dumps(
        {"error": "too many connections", "detail": {"limit": cap, "setting": "http.max_connections"}}
    ).encode()
    head = [
        "HTTP/1.1 503 Service Unavailable",
        "Content-Type: application/json; charset=utf-8",
        f"Content-Length: {len(body)}",
        "Retry-After: 1",
        "Connection: close",
        *(f"{name}: {value}" for name, value in SECURITY_HEADERS.items()),
    ]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


class _Refused(asyncio.Protocol):
    """A connection past the cap: the 503, then closed, without reading the request."""

    def __init__(self, response: bytes) -> None:
        self._response = response

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.WriteTransport)
        transport.write(self._response)
        transport.close()


class CappedSite(web.BaseSite):
    """A TCP site whose connections are `ServiceRequestHandler`s, at most `table.cap` of them."""

    __slots__ = ("_host", "_port", "_table", "_bad_requests", "_handler_args")

    def __init__(
        self,
        runner: web.BaseRunner,
        host: str,
        port: int,
        *,
        table: ConnectionTable,
        bad_requests: BadRequestLog,
        handler_args: dict[str, Any],
    ) -> None:
        super().__init__(runner)
        self._host = host
        self._port = port
        self._table = table
        self._bad_requests = bad_requests
        self._handler_args = handler_args  # what AppRunner hands its own handlers (timeouts, logging)

    @property
    def name(self) -> str:
        return f"http://{self._host}:{self._port}"

    async def start(self) -> None:
        await super().start()
        loop = asyncio.get_running_loop()
        server = self._runner.server
        assert server is not None
        refusal = _refusal(self._table.cap)

        def connection() -> asyncio.Protocol:
            if not self._table.make_room():
                self._table.stats.refused += 1
                return _Refused(refusal)
            handler = ServiceRequestHandler(server, loop=loop, **self._handler_args)
            handler.table = self._table
            handler.bad_requests = self._bad_requests
            return handler

        self._server = await loop.create_server(connection, self._host, self._port, reuse_address=True)


@web.middleware
async def mark_busy(request: web.Request, handler: Handler) -> web.StreamResponse:
    """A connection inside a handler is busy, so it is never closed to make room."""
    conn = request.protocol
    if not isinstance(conn, ServiceRequestHandler):
        return await handler(request)
    conn.table.busy(conn)
    try:
        return await handler(request)
    finally:
        conn.table.idle(conn)


class AcceptErrorLog:
    """An event-loop exception handler that rate-limits the loop's accept errors (EMFILE and kin)."""

    def __init__(
        self, loop: asyncio.AbstractEventLoop, stats: ConnectionStats, every_s: float = ACCEPT_LOG_EVERY_S
    ) -> None:
        self._loop = loop
        self._stats = stats
        self._previous = loop.get_exception_handler()
        self._every_s = every_s
        self._last = float("-inf")
        self.errors = 0
        self._unlogged = 0

    def install(self) -> None:
        self._loop.set_exception_handler(self)

    def uninstall(self) -> None:
        if self._loop.get_exception_handler() is self:
            self._loop.set_exception_handler(self._previous)

    def __call__(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        if context.get("message") != _ACCEPT_ERROR:
            if self._previous is not None:
                self._previous(loop, context)
            else:
                loop.default_exception_handler(context)
            return
        self.errors += 1
        self._stats.accept_errors += 1
        now = time.monotonic()
        if now - self._last < self._every_s:
            self._unlogged += 1
            return
        exc = context.get("exception")
        reason = getattr(exc, "strerror", None) or str(exc)
        log.error(
            "cannot accept HTTP connections; retrying",
            extra={"reason": reason, "not_logged_since_last": self._unlogged, "errors_total": self.errors},
        )
        self._last = now
        self._unlogged = 0


class ConnectionCollector(Collector):
    def __init__(self, stats: ConnectionStats) -> None:
        self.stats = stats

    def collect(self) -> Iterable[Metric]:
        s = self.stats
        yield GaugeMetricFamily("vidsentry_http_connections", "Open HTTP connections", value=s.open)
        yield GaugeMetricFamily(
            "vidsentry_http_connections_limit", "http.max_connections as applied", value=s.cap
        )
        yield CounterMetricFamily(
            "vidsentry_http_connections_evicted", "Idle connections closed to make room", value=s.evicted
        )
        yield CounterMetricFamily(
            "vidsentry_http_connections_refused", "Connections refused (503): all were busy", value=s.refused
        )
        yield CounterMetricFamily(
            "vidsentry_http_bad_requests", "Requests the HTTP parser refused (JSON 4xx)", value=s.bad_requests
        )
        yield CounterMetricFamily(
            "vidsentry_http_accept_errors", "Connections the event loop could not accept (EMFILE and kin)",
            value=s.accept_errors,
        )
