"""`GET /`: a minimal page listing the streams (the WebRTC page replaces it later).

With an API token configured the page shows no stream data: a browser cannot send the
bearer token on a plain page load, and the page must not leak what the API protects.
"""

from __future__ import annotations

import base64
import hashlib
from html import escape

from aiohttp import web

from realtime.http.context import context_of
from realtime.http.headers import CONTENT_SECURITY_POLICY

_STYLE = """body{font-family:system-ui,sans-serif;margin:2rem}table{border-collapse:collapse}
td,th{padding:.3rem .8rem;border-bottom:1px solid #ddd;text-align:left}"""
# The one inline style block, allowed by its hash; no inline script or other style can run.
_STYLE_HASH = base64.b64encode(hashlib.sha256(_STYLE.encode()).digest()).decode()
PAGE_CSP = f"{CONTENT_SECURITY_POLICY}; style-src 'sha256-{_STYLE_HASH}'"

_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>vidsentry</title>
<style>{style}</style></head>
<body><h1>vidsentry</h1>{content}
<p>API: <code>/api/streams</code> · metrics: <code>/metrics</code> ·
health: <code>/healthz</code>, <code>/readyz</code></p>
</body></html>
"""


async def index(request: web.Request) -> web.Response:
    ctx = context_of(request)
    if ctx.api_token is not None:
        content = "<p>Stream data needs the API token: use <code>/api/streams</code> with a bearer token.</p>"
    else:
        views = ctx.registry.views()
        rows = "".join(
            f"<tr><td>{escape(v.stream_id)}</td><td>{escape(v.shown_url or v.settings.kind)}</td>"
            f"<td>{escape(v.state)}</td>"
            f"<td>{escape(v.reason or '')}</td><td>{v.counters.get('frames_processed', 0):.0f}</td></tr>"
            for v in views
        )
        content = (
            "<table><tr><th>stream</th><th>source</th><th>state</th><th>reason</th><th>frames processed</th></tr>"
            f"{rows}</table>"
            if views
            else "<p>No streams. Add one with <code>POST /api/streams</code>.</p>"
        )
    page = _PAGE.format(style=_STYLE, content=content)
    return web.Response(text=page, content_type="text/html", headers={"Content-Security-Policy": PAGE_CSP})


def add_routes(app: web.Application) -> None:
    app.router.add_get("/", index)
