"""WHIP (RFC 9725): `POST /whip/{stream}` with an SDP offer makes a browser session, so that OBS,
GStreamer's WHIP sinks, FFmpeg and `simple-whip-client` publish to the service the way the page
does, and the page's Go-live uses the same path.

A WHIP session is the same session object as one made by `POST /api/webrtc/offer`: the same
table, the same bounds, the same graph; only the signalling differs. The offer is the request
body (`application/sdp`), the answer the response body, and the session a resource of its own,
`/whip/{stream}/{resource}`, named in `Location`: `DELETE` on it ends the session, `PATCH`
trickles the client's ICE candidates into it (`application/trickle-ice-sdpfrag`; an ICE restart
is answered 422: the session keeps its credentials). The resource id is random, so knowing a
stream id is not enough to end or trickle into its session. The answer carries every server
candidate (the service gathers before answering), so PATCH answers 204 with nothing to send
back. The configured ICE servers go out as `Link: <url>; rel="ice-server"` headers, behind the
bearer token like `/api/webrtc/config`. OPTIONS answers without a token (a CORS preflight carries
none) with the methods and bodies the resource takes, and adds the `Link` headers only when the
token is sent (clients that configure ICE from OPTIONS, as `simple-whip-client -f` does).

The page's `pagehide` beacon cannot send headers, so the 201 also carries the session's close
token in `Vidsentry-Close-Token` for `POST /api/webrtc/close`.

A WHIP client sends nothing but SDP, so the endpoint URL carries the stream's own settings, as an
offer's JSON fields do: `/whip/cam?captions.language=es&captions.translate=en` (the URL is what a
user pastes into OBS).
"""

from __future__ import annotations

from aiohttp import web
from multidict import CIMultiDict

from pipelines.frames import InvalidStreamId, validate_stream_id
from realtime.http.errors import ApiError
from realtime.http.guards import token_given
from realtime.http.signalling import SESSIONS, check_own_settings, refusals
from realtime.webrtc.offer import BadOffer, own_switches, parse_offer
from realtime.webrtc.session import WebRtcSession
from realtime.webrtc.sessions import IceRestartRefused
from realtime.webrtc.trickle import parse_fragment

WHIP_PREFIX = "/whip"
SDP = "application/sdp"
SDP_FRAGMENT = "application/trickle-ice-sdpfrag"
CLOSE_TOKEN_HEADER = "Vidsentry-Close-Token"
ENDPOINT_METHODS = "OPTIONS, POST"
RESOURCE_METHODS = "OPTIONS, PATCH, DELETE"


def stream_id_of(request: web.Request, protocol: str = "WHIP") -> str:
    """The `{stream}` of a WHIP or WHEP URL, checked (400)."""
    stream_id = request.match_info["stream"]
    try:
        validate_stream_id(stream_id)
    except InvalidStreamId:
        raise ApiError(400, f"invalid stream id in the {protocol} URL", "use 1-64 characters from A-Z a-z 0-9 _ -") \
            from None
    return stream_id


def _stream_id(request: web.Request) -> str:
    return stream_id_of(request)


def require_type(request: web.Request, content_type: str, accept_header: str) -> None:
    """415 unless the body is `content_type` (`accept_header` names what is accepted)."""
    if request.content_type != content_type:
        detail = {"expected": content_type, "content_type": request.headers.get("Content-Type")}
        raise ApiError(415, f"unsupported media type: send the body as {content_type}", detail,
                       headers={accept_header: content_type})


async def read_text(request: web.Request, what: str) -> str:
    """The body as text; 400 when empty or not UTF-8."""
    raw = await request.read()
    if not raw:
        raise ApiError(400, f"missing body: send the {what}", {"content_type": request.content_type})
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ApiError(400, f"the {what} is not UTF-8 text", None) from None


def ice_server_links(request: web.Request) -> list[str]:
    """One `Link` value per configured ICE server URL (RFC 9725 §4.6), credentials included."""
    links = []
    for server in request.app[SESSIONS].settings.ice_servers:
        params = ""
        if server.username and server.credential:
            username = server.username.replace('"', "")
            credential = server.credential.get_secret_value().replace('"', "")
            params = f'; username="{username}"; credential="{credential}"; credential-type="password"'
        links += [f'<{url}>; rel="ice-server"{params}' for url in server.urls]
    return links


async def endpoint_options(request: web.Request) -> web.Response:
    _stream_id(request)
    return endpoint_answer(request)


def endpoint_answer(request: web.Request) -> web.Response:
    """OPTIONS on a WHIP or WHEP endpoint: what it takes, and the ICE servers to a token holder."""
    headers: CIMultiDict[str] = CIMultiDict({"Allow": ENDPOINT_METHODS, "Accept-Post": SDP})
    if token_given(request):  # clients that configure ICE from OPTIONS (simple-whip-client -f) send the token
        headers["Cache-Control"] = "no-store"
        for link in ice_server_links(request):
            headers.add("Link", link)
    return web.Response(status=204, headers=headers)


def own_from_query(request: web.Request) -> dict[str, object]:
    """`?captions.language=es&captions=true` as an offer's fields: {"captions": {"language": "es"}}.
    A switch named alone takes true or false; the offer's checks say what is wrong with the rest."""
    own: dict[str, object] = {}
    switches = own_switches()
    for key, value in request.query.items():
        switch, dot, name = key.partition(".")
        if switch not in switches:
            known = ", ".join(f"{s}.<setting>" for s in sorted(switches)) or "none"
            raise BadOffer(key, f"unknown parameter (the endpoint takes {known})")
        if not dot:
            if value not in ("true", "false"):
                raise BadOffer(key, "a switch alone takes true or false; name a setting as switch.setting=value")
            own[switch] = value == "true"
            continue
        held = own.setdefault(switch, {})
        if not isinstance(held, dict):
            raise BadOffer(key, f"{switch} is given as a switch and as settings")
        held[name] = value
    return own


async def publish(request: web.Request) -> web.Response:
    stream_id = _stream_id(request)
    require_type(request, SDP, "Accept-Post")
    sdp = await read_text(request, "SDP offer")
    table = request.app[SESSIONS]
    settings = table.settings
    with refusals():
        offer = parse_offer({**own_from_query(request), "sdp": sdp, "type": "offer", "stream_id": stream_id},
                            max_sdp_bytes=settings.max_sdp_bytes, max_candidates=settings.max_ice_candidates)
        check_own_settings(request, offer)
        answer = await table.open(offer, client=str(request.remote or ""))
    location = f"{WHIP_PREFIX}/{answer.stream_id}/{answer.resource_id}"
    return created(request, location, answer.etag, answer.sdp,
                   {"Accept-Patch": SDP_FRAGMENT, CLOSE_TOKEN_HEADER: answer.close_token})


def created(request: web.Request, location: str, etag: str, sdp: str, extra: dict[str, str]) -> web.Response:
    """The 201 of a WHIP or WHEP POST: the answer, its resource, and the ICE servers."""
    headers: CIMultiDict[str] = CIMultiDict({"Location": location, "ETag": etag, **extra})
    headers["Cache-Control"] = "no-store"  # the Link headers may carry TURN credentials
    for link in ice_server_links(request):
        headers.add("Link", link)
    headers["Content-Type"] = SDP  # no charset parameter: some clients compare the type exactly
    return web.Response(status=201, body=sdp.encode(), headers=headers)


def _session(request: web.Request) -> WebRtcSession:
    stream_id = _stream_id(request)
    session = request.app[SESSIONS].whip_session(stream_id, request.match_info["resource"])
    if session is None:
        # The same answer for an unknown stream and a wrong resource id: the id is the secret.
        raise ApiError(404, "no WHIP session at this URL (it ended, or it never existed)", {"stream_id": stream_id})
    return session


async def resource_options(request: web.Request) -> web.Response:
    return web.Response(status=204, headers={"Allow": RESOURCE_METHODS, "Accept-Patch": SDP_FRAGMENT})


async def trickle(request: web.Request) -> web.Response:
    session = _session(request)
    require_type(request, SDP_FRAGMENT, "Accept-Patch")
    match = request.headers.get("If-Match")
    if match is not None and match.strip() not in ("*", session.etag):
        raise ApiError(412, "If-Match does not match the session's entity tag", {"etag": session.etag})
    table = request.app[SESSIONS]
    settings = table.settings
    text = await read_text(request, "SDP fragment")
    try:
        fragment = parse_fragment(text, max_bytes=settings.max_sdp_bytes, max_candidates=settings.max_ice_candidates)
        await table.trickle(session, fragment)
    except BadOffer as exc:
        raise ApiError(400, f"invalid SDP fragment: {exc}", {"field": exc.field, "message": exc.message}) from None
    except IceRestartRefused as exc:
        raise ApiError(422, "ICE restarts are not supported: start a new session", str(exc)) from None
    return web.Response(status=204, headers={"ETag": session.etag})


async def end(request: web.Request) -> web.Response:
    session = _session(request)
    session.close("stopped")  # as DELETE /api/streams/{id} ends it
    return web.Response(status=200)


def add_routes(app: web.Application) -> None:
    """Needs signalling.add_routes first (the session table)."""
    endpoint = app.router.add_resource(WHIP_PREFIX + "/{stream}")
    endpoint.add_route("OPTIONS", endpoint_options)
    endpoint.add_route("POST", publish)
    resource = app.router.add_resource(WHIP_PREFIX + "/{stream}/{resource}")
    resource.add_route("OPTIONS", resource_options)
    resource.add_route("PATCH", trickle)
    resource.add_route("DELETE", end)
