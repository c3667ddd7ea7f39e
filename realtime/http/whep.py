"""WHEP (draft-ietf-wish-whep): `POST /whep/{stream}` with a receive-only SDP offer makes a live
viewer of a stream, so that a player (the page's Watch view, or any WHEP client) pulls the
camera's video over WebRTC at its own frame rate.

The shape is WHIP's (whip.py; shared helpers there): the offer is the request body
(`application/sdp`), the answer the `201`'s body, the viewer a resource of its own,
`/whep/{stream}/{resource}`, named in `Location`, with an `ETag`; `DELETE` on it ends the
viewer; the ICE servers go out in `Link` headers; OPTIONS answers without the token. The answer
carries every server candidate and the page sends all of its own in the offer, so trickle is not
supported: a `PATCH` is answered `405` (the draft, like RFC 9725 §4.3.1, allows it).

`GET` on the resource answers the mapping from the RTP timestamps of the frames the player
shows to the pts the stream's events carry (`rtp_origin`, the RTP timestamp of pts 0, null
until the first frame went out): the page draws each frame's boxes with it.

A camera's H.264 packets are forwarded as they came; any other stream's frames are encoded for its
viewers (realtime.webrtc.live_encode). What is refused, and how: an unknown stream `404`; a stream
with no live video (its frames cannot be encoded, or `webrtc.live_encode` is off and its packets are
not H.264) `409` with the reason; an offer
that is not SDP or receives no H.264 video `400`; `webrtc.max_viewers` viewers already `503`
naming the setting.
"""

from __future__ import annotations

from aiohttp import web

from realtime.http.context import context_of
from realtime.http.errors import ApiError
from realtime.http.guards import WHEP_PREFIX, token_given
from realtime.http.signalling import refusals
from realtime.http.whip import SDP, created, endpoint_answer, read_text, require_type, stream_id_of
from realtime.webrtc.live import RTP_CLOCK, LiveView, NotOffered, Viewer, ViewerLimitReached
from realtime.webrtc.offer import parse_offer

LIVE_VIEW = web.AppKey("vidsentry_live_view", LiveView)
ENDPOINT_METHODS = "OPTIONS, POST"
RESOURCE_METHODS = "OPTIONS, GET, DELETE"


def _stream(request: web.Request) -> str:
    stream_id = stream_id_of(request, "WHEP")
    if stream_id not in context_of(request).registry:
        raise ApiError(404, "no such stream", {"id": stream_id})
    return stream_id


LIVE_VIDEO_HEADER = "Vidsentry-Live-Video"


async def endpoint_options(request: web.Request) -> web.Response:
    """As WHIP's; to a token holder it also says whether the stream's video is forwarded, so the
    page asks for live video only where there is some (a refused POST is an error in its console)."""
    stream_id = stream_id_of(request, "WHEP")
    response = endpoint_answer(request)
    if token_given(request):
        if stream_id not in context_of(request).registry:
            response.headers[LIVE_VIDEO_HEADER] = "not offered; no such stream"
        else:
            try:
                feed = request.app[LIVE_VIEW].feed(stream_id)
                ready = feed.ready
                response.headers[LIVE_VIDEO_HEADER] = "offered" if ready else "not offered; no video yet"
            except NotOffered as exc:
                response.headers[LIVE_VIDEO_HEADER] = f"not offered; {exc}"
    return response


async def view(request: web.Request) -> web.Response:
    stream_id = _stream(request)
    require_type(request, SDP, "Accept-Post")
    sdp = await read_text(request, "SDP offer")
    live = request.app[LIVE_VIEW]
    settings = live.settings
    with refusals():  # the same SDP checks and answers as an ingest offer's
        parse_offer({"sdp": sdp, "type": "offer"}, max_sdp_bytes=settings.max_sdp_bytes,
                    max_candidates=settings.max_ice_candidates)
        try:
            answer = await live.open(stream_id, sdp)
        except NotOffered as exc:
            raise ApiError(409, f"no live video for this stream: {exc}", {"id": stream_id}) from None
        except ViewerLimitReached as exc:
            raise ApiError(503, str(exc), {"limit": exc.limit, "setting": exc.setting},
                           headers={"Retry-After": "10"}) from None
    location = f"{WHEP_PREFIX}/{stream_id}/{answer.resource_id}"
    return created(request, location, answer.etag, answer.sdp, {})


def _viewer(request: web.Request) -> Viewer:
    stream_id = stream_id_of(request, "WHEP")
    viewer = request.app[LIVE_VIEW].viewer(stream_id, request.match_info["resource"])
    if viewer is None:
        raise ApiError(404, "no WHEP viewer at this URL (it ended, or it never existed)", {"stream_id": stream_id})
    return viewer


async def resource_options(request: web.Request) -> web.Response:
    return web.Response(status=204, headers={"Allow": RESOURCE_METHODS})


async def clock(request: web.Request) -> web.Response:
    viewer = _viewer(request)
    body = {"stream_id": viewer.stream_id, "rtp_clock_rate": RTP_CLOCK, "rtp_origin": viewer.rtp_origin,
            "packets": viewer.track.stats.packets, "skips": viewer.track.stats.skips}
    return web.json_response(body, headers={"Cache-Control": "no-store"})


async def no_trickle(request: web.Request) -> web.Response:
    _viewer(request)
    raise ApiError(405, "trickle ICE is not supported: the answer carries every candidate; send all of yours "
                        "in the offer", None, headers={"Allow": RESOURCE_METHODS})


async def end(request: web.Request) -> web.Response:
    viewer = _viewer(request)
    request.app[LIVE_VIEW].close(viewer, "deleted")
    return web.Response(status=200)


def add_routes(app: web.Application, live: LiveView) -> None:
    app[LIVE_VIEW] = live
    endpoint = app.router.add_resource(WHEP_PREFIX + "/{stream}")
    endpoint.add_route("OPTIONS", endpoint_options)
    endpoint.add_route("POST", view)
    resource = app.router.add_resource(WHEP_PREFIX + "/{stream}/{resource}")
    resource.add_route("OPTIONS", resource_options)
    resource.add_route("GET", clock)
    resource.add_route("PATCH", no_trickle)
    resource.add_route("DELETE", end)
