"""`GET /api/streams/{id}/captions.vtt`: the stream's recent final captions as WebVTT."""

from __future__ import annotations

from aiohttp import web

from realtime.http.api import stream_id_of, unknown_stream
from realtime.http.context import context_of
from realtime.streams.transcripts import TranscriptStore, to_webvtt

TRANSCRIPTS = web.AppKey("vidsentry_transcripts", TranscriptStore)


async def captions_vtt(request: web.Request) -> web.Response:
    stream_id = stream_id_of(request)
    if stream_id not in context_of(request).registry:
        raise unknown_stream(stream_id)
    text = to_webvtt(request.app[TRANSCRIPTS].cues(stream_id))
    return web.Response(text=text, content_type="text/vtt", charset="utf-8", headers={"Cache-Control": "no-store"})


def add_routes(app: web.Application, store: TranscriptStore) -> None:
    app[TRANSCRIPTS] = store
    app.router.add_get("/api/streams/{stream_id}/captions.vtt", captions_vtt)
