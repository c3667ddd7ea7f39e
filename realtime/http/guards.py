"""Who may call the API, and when: the bearer token, no changes while draining, and no request a
browser was tricked into sending.

With no token (the loopback default) a browser on the same machine is the threat: a page on
another site can send simple requests (a form POST, `text/plain`) and, with DNS rebinding, read
the answers under its own host name. So: a Host must be one this service answers to; an /api
request from another site (`Origin`, `Sec-Fetch-Site`) is refused; a body that changes something
must be `application/json`, which no form can send and no cross-site script can without a CORS
preflight that this service never answers.

The Host check holds for every request the parser lets through: HTTP/0.9 (no headers at all) is
refused with 505, a request without Host (HTTP/1.0 allows that) with 400, and an absolute-form
target (`GET http://name/path`, meant for proxies, whose name would not be the one checked) with
400: this service is no proxy, and only origin-form targets (`/path`) name what it serves.
"""

from __future__ import annotations

import hmac
from urllib.parse import urlsplit

from aiohttp import HttpVersion10, web

from realtime.http.context import context_of
from realtime.http.errors import json_error
from realtime.http.handlers import Handler
from realtime.http.hosts import host_name

API_PREFIX = "/api"
# WHIP (whip.py) is API too: the token, the same-site check and draining hold for it; its bodies
# are SDP, not JSON, which no form can send either (a cross-site script would need a preflight).
WHIP_PREFIX = "/whip"
WHEP_PREFIX = "/whep"  # WHEP (whep.py): the same rules as WHIP
_SDP_PREFIXES = (WHIP_PREFIX, WHEP_PREFIX)
_PREFIXES = (API_PREFIX, *_SDP_PREFIXES)
# A route whose body carries its own secret (a session's close token), for callers that cannot set
# headers: `navigator.sendBeacon` sends neither a bearer token nor a JSON content type.
BEACON_ROUTE = "webrtc-close"
_READ_ONLY = frozenset({"GET", "HEAD", "OPTIONS"})
_WITH_BODY = frozenset({"POST", "PUT", "PATCH"})
JSON = "application/json"


def _is_api(request: web.Request) -> bool:
    # The raw path and the matched route both count, so no spelling of a path slips past.
    path = request.path
    if any(path == prefix or path.startswith(prefix + "/") for prefix in _PREFIXES):
        return True
    resource = request.match_info.route.resource
    return resource is not None and resource.canonical.startswith(tuple(prefix + "/" for prefix in _PREFIXES))


def _is_whip(request: web.Request) -> bool:
    """A WHIP or WHEP URL: SDP bodies, and an OPTIONS without the token."""
    path = request.path
    resource = request.match_info.route.resource
    return any(path == prefix or path.startswith(prefix + "/") for prefix in _SDP_PREFIXES) or (
        resource is not None and resource.canonical.startswith(tuple(prefix + "/" for prefix in _SDP_PREFIXES))
    )


def _is_beacon(request: web.Request) -> bool:
    return request.match_info.route.name == BEACON_ROUTE


def _token_matches(header: str, token: bytes) -> bool:
    scheme, _, given = header.partition(" ")
    if scheme.lower() != "bearer":
        return False
    # aiohttp hands undecodable header bytes over as surrogates; surrogateescape gives the raw bytes
    # back, which can never equal a UTF-8 token, instead of raising (a 500).
    raw = given.strip().encode("utf-8", "surrogateescape")
    # Constant-time: the comparison must not reveal how much of a guess was right.
    return hmac.compare_digest(raw, token)


def token_given(request: web.Request) -> bool:
    """Whether the request carries the API token (or none is configured): for a route the token
    does not guard, whose answer says more to a caller that has it."""
    token = context_of(request).api_token
    header = request.headers.get("Authorization")
    return token is None or (header is not None and _token_matches(header, token))


@web.middleware
async def bearer_auth(request: web.Request, handler: Handler) -> web.StreamResponse:
    token = context_of(request).api_token
    if token is None or not _is_api(request) or _is_beacon(request):
        return await handler(request)
    if request.method == "OPTIONS" and _is_whip(request):
        return await handler(request)  # a CORS preflight carries no token; OPTIONS tells no secret
    header = request.headers.get("Authorization")
    if header is None and request.method in ("GET", "HEAD") and "sig" in request.query:
        if context_of(request).signer.valid(request.path, request.query):
            return await handler(request)  # a signed link: exactly this path, for a while
        return json_error(401, "unauthorized", "the signed link is not valid or has expired; reload the clip")
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


# -- Host: DNS rebinding ---------------------------------------------------------------------




def _unchecked_request(request: web.Request) -> web.Response | None:
    """The answer to a request whose Host cannot be checked (see the module docstring), or None."""
    if request.version < HttpVersion10:
        version = {"version": f"HTTP/{request.version.major}.{request.version.minor}"}
        return json_error(505, "HTTP version not supported: use HTTP/1.0 or later with a Host header", version)
    if not request.raw_path.startswith("/"):
        how = "send the path only (GET /api/streams), with the name in the Host header"
        return json_error(400, "absolute-form request target refused: this service is no proxy", how)
    if request.headers.get("Host") is None:
        return json_error(400, "missing Host header", {"header": "Host"})
    return None


@web.middleware
async def known_hosts_only(request: web.Request, handler: Handler) -> web.StreamResponse:
    refusal = _unchecked_request(request)
    if refusal is not None:
        refusal.force_close()  # a client that speaks like this gets no second request on the connection
        return refusal
    host = request.headers.get("Host")
    if not context_of(request).hosts.allows(host):
        detail = {"host": host, "setting": "http.allowed_hosts"}
        return json_error(421, "unknown host: add the name to http.allowed_hosts if it is this service", detail)
    return await handler(request)


# -- Origin / Sec-Fetch-Site: cross-site requests -------------------------------------------------


def _origin_allowed(origin: str, request: web.Request) -> bool:
    if origin == "null":  # sandboxed frames, file:// pages: never this service's own page
        return False
    parts = urlsplit(origin)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        return False
    host = request.headers.get("Host")
    if host is not None and parts.netloc.lower() == host.strip().lower():
        return True  # same origin
    # A name the operator listed is a front end of this service (a proxy with another host:port).
    return host_name(parts.netloc) in context_of(request).hosts.listed


@web.middleware
async def same_site_only(request: web.Request, handler: Handler) -> web.StreamResponse:
    if _is_api(request):
        if request.headers.get("Sec-Fetch-Site", "").strip().lower() == "cross-site":
            return json_error(403, "cross-site request refused", {"header": "Sec-Fetch-Site"})
        origin = request.headers.get("Origin")
        if origin is not None and not _origin_allowed(origin.strip(), request):
            return json_error(403, "cross-site request refused", {"header": "Origin", "origin": origin})
    return await handler(request)


# -- Content-Type: no form can send JSON ---------------------------------------------------------


@web.middleware
async def json_bodies_only(request: web.Request, handler: Handler) -> web.StreamResponse:
    # Only requests that reach a route: an unknown path or method stays a 404 / 405.
    reaches_route = request.match_info.http_exception is None
    if (
        request.method in _WITH_BODY
        and reaches_route
        and _is_api(request)
        and request.content_type != JSON
        and not _is_beacon(request)
        and not _is_whip(request)  # SDP bodies; whip.py checks their content types
    ):
        detail = {"expected": JSON, "content_type": request.headers.get("Content-Type")}
        return json_error(415, f"unsupported media type: send the body as {JSON}", detail)
    return await handler(request)
