"""Security headers on every response: nothing here may be framed, sniffed into another type,
loaded by another site, or leak its URL in a Referer."""

from __future__ import annotations

from aiohttp import web

# The page loads its script, style and icon from /static with no inline code, so 'self' is all it
# needs; the rest is JSON, text, images and event streams, which need nothing at all. Clips play
# from their own paths on this origin (signed links when there is a token: realtime/http/signed.py).
CONTENT_SECURITY_POLICY = (
    "default-src 'self'; object-src 'none'; base-uri 'none'; frame-ancestors 'none'; "
    "form-action 'self'"
)

SECURITY_HEADERS: dict[str, str] = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cross-Origin-Resource-Policy": "same-origin",
    "Cross-Origin-Opener-Policy": "same-origin",
}


async def add_security_headers(request: web.Request, response: web.StreamResponse) -> None:
    """on_response_prepare: every response, errors and event streams included; a handler's own
    value (the page's CSP) wins."""
    for name, value in SECURITY_HEADERS.items():
        response.headers.setdefault(name, value)
