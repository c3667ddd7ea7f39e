"""`GET /api/streams/{id}/description`: the stream's newest scene description (`null` before the
first, or without a VLM); later ones follow on the stream's events as `descriptions`."""

from __future__ import annotations

from aiohttp import web

from realtime.http.api import stream_id_of, unknown_stream
from realtime.http.context import context_of
from realtime.streams.descriptions import LatestDescriptions

DESCRIPTIONS = web.AppKey("vidsentry_descriptions", LatestDescriptions)


async def latest_description(request: web.Request) -> web.Response:
    stream_id = stream_id_of(request)
    if stream_id not in context_of(request).registry:
        raise unknown_stream(stream_id)
    latest = request.app[DESCRIPTIONS].get(stream_id)
    return web.json_response({"stream_id": stream_id, "description": latest}, headers={"Cache-Control": "no-store"})


def add_routes(app: web.Application, store: LatestDescriptions) -> None:
    app[DESCRIPTIONS] = store
    app.router.add_get("/api/streams/{stream_id}/description", latest_description)
