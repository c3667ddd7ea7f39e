"""Types and limits shared by the HTTP modules."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

MAX_BODY_BYTES = 64 * 1024  # a stream object is a few hundred bytes; anything near this is not one
