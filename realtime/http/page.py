"""`GET /` and `/static/{name}`: the page, plain HTML + JS + CSS shipped inside the package.

The page holds no stream data itself: its script reads `/api` like any client (with the bearer
token when one is configured), so the page needs no token and leaks nothing. There is no inline
script or style, so the default `Content-Security-Policy` (`default-src 'self'`) covers it.
Only the files named here are served; they are read once, on first use.
"""

from __future__ import annotations

import hashlib
from functools import cache
from importlib import resources

from aiohttp import web

STATIC_TYPES = {
    "index.html": "text/html",
    "app.js": "text/javascript",
    "clips.js": "text/javascript",
    "timeline.js": "text/javascript",
    "sse.js": "text/javascript",
    "api.js": "text/javascript",
    "overlay.js": "text/javascript",
    "masks.js": "text/javascript",
    "alerts.js": "text/javascript",
    "scene.js": "text/javascript",
    "captions.js": "text/javascript",
    "golive.js": "text/javascript",
    "streams.js": "text/javascript",
    "watch.js": "text/javascript",
    "app.css": "text/css",
    "icon.svg": "image/svg+xml",
}


@cache
def static_file(name: str) -> tuple[bytes, str]:
    """The file's bytes and its ETag."""
    data = resources.files("realtime.http").joinpath("static", name).read_bytes()
    return data, '"' + hashlib.sha256(data).hexdigest()[:32] + '"'


def _serve(request: web.Request, name: str) -> web.Response:
    data, etag = static_file(name)
    # no-cache: revalidated on every load (a 304 when unchanged), so a restarted service never
    # runs an old script against a new API.
    headers = {"Cache-Control": "no-cache", "ETag": etag}
    if etag in request.headers.get("If-None-Match", ""):
        return web.Response(status=304, headers=headers)
    return web.Response(body=data, content_type=STATIC_TYPES[name], charset="utf-8", headers=headers)


async def index(request: web.Request) -> web.Response:
    return _serve(request, "index.html")


async def static(request: web.Request) -> web.Response:
    name = request.match_info["name"]
    if name not in STATIC_TYPES or name == "index.html":
        raise web.HTTPNotFound()
    return _serve(request, name)


def add_routes(app: web.Application) -> None:
    app.router.add_get("/", index)
    app.router.add_get("/static/{name}", static)
