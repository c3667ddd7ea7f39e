"""A bound on each request: reading its body and answering it (`http.request_timeout_s`).

A client that sends its body a byte at a time, or a handler stuck behind something, would
otherwise hold the connection for ever. Event streams are exempt (they are meant to last) and
bound each write instead (sse.py).
"""

from __future__ import annotations

import asyncio

from aiohttp import web

from realtime.http.context import context_of
from realtime.http.errors import ApiError
from realtime.http.handlers import Handler

STREAMING_ROUTE = "events"  # the route name of the event stream


@web.middleware
async def request_deadline(request: web.Request, handler: Handler) -> web.StreamResponse:
    if request.match_info.route.name == STREAMING_ROUTE:
        return await handler(request)
    timeout_s = context_of(request).request_timeout_s
    deadline = asyncio.timeout(timeout_s)
    try:
        async with deadline:
            return await handler(request)
    except TimeoutError:
        if not deadline.expired():
            raise  # the handler's own, not ours
        detail = {"timeout_s": timeout_s, "setting": "http.request_timeout_s"}
        raise ApiError(408, "request timeout", detail, headers={"Connection": "close"}) from None
