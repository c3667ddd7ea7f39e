"""Who may call the API, and when: the bearer token, and no changes while draining."""

from __future__ import annotations

import hmac

from aiohttp import web

from realtime.http.context import context_of
from realtime.http.errors import json_error
from realtime.http.handlers import Handler

API_PREFIX = "/api"
_READ_ONLY = frozenset({"GET", "HEAD", "OPTIONS"})


def _is_api(request: web.Request) -> bool:
    # The raw path and the matched route both count, so no spelling of a path slips past.
    path = request.path
    if path == API_PREFIX or path.startswith(API_PREFIX + "/"):
        return True
    resource = request.match_info.route.resource
    return resource is not None and resource.canonical.startswith(API_PREFIX + "/")


def _token_matches(header: str, token: bytes) -> bool:
    scheme, _, given = header.partition(" ")
    if scheme.lower() != "bearer":
        return False
    # Constant-time: the comparison must not reveal how much of a guess was right.
    return hmac.compare_digest(given.strip().encode("utf-8"), token)


@web.middleware
async def bearer_auth(request: web.Request, handler: Handler) -> web.StreamResponse:
    token = context_of(request).api_token
    if token is None or not _is_api(request):
        return await handler(request)
    header = request.headers.get("Authorization")
    if header is None:
        return json_error(
            401, "unauthorized", "send Authorization: Bearer <token>", headers={"WWW-Authenticate": "Bearer"}
        )
    if not _token_matches(header, token):
        challenge = 'Bearer error="invalid_token"'
        return json_error(401, "unauthorized", "the bearer token is not valid", headers={"WWW-Authenticate": challenge})
    return await handler(request)


@web.middleware
async def refuse_changes_while_draining(request: web.Request, handler: Handler) -> web.StreamResponse:
    if context_of(request).draining and request.method not in _READ_ONLY and _is_api(request):
        detail = "the service is draining; try another instance"
        return json_error(503, "shutting down", detail, headers={"Retry-After": "5"})
    return await handler(request)
