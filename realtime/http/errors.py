"""JSON errors for every failure: `{"error": "...", "detail": ...}`.

Handlers raise `ApiError` for bad input (4xx). The middleware turns aiohttp's own HTTP errors
(unknown route, wrong method, body too large) into the same shape, and any other exception
into a 500 that says nothing about the code: the trace goes to the log only.
"""

from __future__ import annotations

import logging
from typing import Any

from aiohttp import web

from realtime.errors import ServiceError
from realtime.http.handlers import MAX_BODY_BYTES, Handler

log = logging.getLogger(__name__)

# Headers of aiohttp's HTTP errors that a client needs even in the JSON version.
_KEPT_HEADERS = ("Allow", "WWW-Authenticate", "Retry-After")


class ApiError(ServiceError):
    def __init__(self, status: int, error: str, detail: Any = None, *, headers: dict[str, str] | None = None) -> None:
        super().__init__(error)
        self.status = status
        self.error = error
        self.detail = detail
        self.headers = headers or {}


def json_error(status: int, error: str, detail: Any = None, *, headers: dict[str, str] | None = None) -> web.Response:
    return web.json_response({"error": error, "detail": detail}, status=status, headers=headers)


def _from_http_exception(request: web.Request, exc: web.HTTPException) -> web.Response:
    detail: Any = None
    if isinstance(exc, web.HTTPNotFound):
        detail = {"path": request.path}
    elif isinstance(exc, web.HTTPMethodNotAllowed):
        detail = {"method": exc.method, "allowed": sorted(exc.allowed_methods)}
    elif isinstance(exc, web.HTTPRequestEntityTooLarge):
        detail = {"max_bytes": MAX_BODY_BYTES}
    headers = {name: exc.headers[name] for name in _KEPT_HEADERS if name in exc.headers}
    return json_error(exc.status, (exc.reason or "error").lower(), detail, headers=headers)


@web.middleware
async def json_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except ApiError as exc:
        return json_error(exc.status, exc.error, exc.detail, headers=exc.headers)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise  # redirects and the like are not errors
        return _from_http_exception(request, exc)
    except Exception:
        log.exception("unhandled error in HTTP handler", extra={"method": request.method, "path": request.path})
        return json_error(500, "internal error", "the server failed; see its log")
