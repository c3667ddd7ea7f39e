"""`POST /api/webrtc/offer` and `POST /api/webrtc/close`: sessions made and ended over HTTP.

The offer is non-trickle: the page waits for its ICE gathering to complete and sends one
offer; the answer carries every server candidate. The answer also carries the session's
`close_token`, which the page's `pagehide` beacon sends back to `/api/webrtc/close`: a beacon
can set no header, so that route takes the token in its body instead of the bearer token and
accepts any content type (the token is the secret; a cross-site page cannot know it).

An offer may carry the stream's own settings of a capability (`"captions": {"language": "es"}`):
checked against the service's open engines as a stream added through the API is (a model it has
not installed, a language tiny.en cannot caption), a 400 before negotiation.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from typing import Any

from aiohttp import web

from realtime.config import describe_problems
from realtime.config_checks import own_settings_problems
from realtime.http.api import read_json_object
from realtime.http.context import context_of
from realtime.http.errors import ApiError
from realtime.http.guards import BEACON_ROUTE
from realtime.streams.registry import RegistryClosed, StreamExists, StreamLimitReached
from realtime.webrtc.offer import BadOffer, Offer, parse_offer
from realtime.webrtc.sessions import (
    NegotiationFailed,
    SessionExists,
    SessionLimitReached,
    SessionsClosed,
    SessionTable,
    TooManyConnecting,
)

SESSIONS = web.AppKey("vidsentry_webrtc_sessions", SessionTable)
OFFER_EXAMPLE = '{"sdp": "v=0 ...", "type": "offer"}'
CLOSE_FIELDS = ("stream_id", "close_token")


def _shutting_down() -> ApiError:
    return ApiError(503, "shutting down", "the service is draining", headers={"Retry-After": "5"})


@contextlib.contextmanager
def refusals() -> Iterator[None]:
    """What opening a session can refuse, as the answers the API gives: the offer route and WHIP's
    `POST /whip/{stream}` answer alike."""
    try:
        yield
    except BadOffer as exc:
        raise ApiError(400, f"invalid offer: {exc}", {"field": exc.field, "message": exc.message}) from None
    except TooManyConnecting as exc:  # connecting sessions connect or time out within seconds
        detail = {"limit": exc.limit, "setting": exc.setting}
        raise ApiError(503, str(exc), detail, headers={"Retry-After": "2"}) from None
    except SessionLimitReached as exc:
        detail = {"limit": exc.limit, "setting": exc.setting}
        raise ApiError(503, str(exc), detail, headers={"Retry-After": "10"}) from None
    except (SessionExists, StreamExists) as exc:
        raise ApiError(409, "stream exists", {"id": str(exc)}) from None
    except StreamLimitReached as exc:
        raise ApiError(429, str(exc), {"limit": exc.limit, "setting": exc.setting}) from None
    except NegotiationFailed as exc:
        raise ApiError(503, f"negotiation failed: {exc}", None, headers={"Retry-After": "5"}) from None
    except (SessionsClosed, RegistryClosed):
        raise _shutting_down() from None


def check_own_settings(request: web.Request, offer: Offer) -> None:
    """The offer's own settings against the engines this service has open (see the docstring)."""
    if not offer.own:
        return
    settings = offer.stream_settings(offer.stream_id or "webrtc")
    problems = [problem for _, problem in own_settings_problems([settings], context_of(request).engines)]
    if problems:
        raise ApiError(400, f"invalid offer: {describe_problems(problems)}", problems)


async def create_session(request: web.Request) -> web.Response:
    table = request.app[SESSIONS]
    body = await read_json_object(request, what="offer object", example=OFFER_EXAMPLE)
    with refusals():
        settings = table.settings
        offer = parse_offer(body, max_sdp_bytes=settings.max_sdp_bytes, max_candidates=settings.max_ice_candidates)
        check_own_settings(request, offer)
        answer = await table.open(offer, client=str(request.remote or ""))
    return web.json_response(
        {"sdp": answer.sdp, "type": "answer", "stream_id": answer.stream_id, "close_token": answer.close_token},
        status=201,
        headers={"Location": f"/api/streams/{answer.stream_id}"},
    )


def _close_fields(raw: bytes) -> tuple[str, str]:
    try:
        body: Any = json.loads(raw)
    except (ValueError, RecursionError):
        body = None
    if not isinstance(body, dict) or not all(isinstance(body.get(name), str) for name in CLOSE_FIELDS):
        raise ApiError(400, "bad close request", {"expected": {name: "string" for name in CLOSE_FIELDS}})
    return body["stream_id"], body["close_token"]


async def close_session(request: web.Request) -> web.Response:
    stream_id, token = _close_fields(await request.read())
    if not request.app[SESSIONS].close_with_token(stream_id, token):
        # The same answer for an unknown id and a wrong token: this route needs no bearer token,
        # so it must not tell which session ids exist.
        raise ApiError(403, "no session with this stream id and close token", {"stream_id": stream_id})
    return web.Response(status=204)


async def client_config(request: web.Request) -> web.Response:
    """What the page needs before its offer: the ICE servers (TURN credentials included, so this
    sits behind the bearer token like the rest of /api)."""
    servers = [
        {
            "urls": list(server.urls),
            **({"username": server.username} if server.username else {}),
            **({"credential": server.credential.get_secret_value()} if server.credential else {}),
        }
        for server in request.app[SESSIONS].settings.ice_servers
    ]
    return web.json_response({"ice_servers": servers}, headers={"Cache-Control": "no-store"})


def add_routes(app: web.Application, table: SessionTable) -> None:
    app[SESSIONS] = table
    app.router.add_get("/api/webrtc/config", client_config)
    app.router.add_post("/api/webrtc/offer", create_session)
    app.router.add_post("/api/webrtc/close", close_session, name=BEACON_ROUTE)
