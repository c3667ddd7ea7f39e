"""`GET /api/streams/{id}/captions.vtt`: the stream's recent final captions as WebVTT (all
languages, or `?language=es` for one file per language); `translation.vtt` its English track;
`captions/languages` which languages it has."""

from __future__ import annotations

import re

from aiohttp import web

from realtime.http.api import ApiError, stream_id_of, unknown_stream
from realtime.http.context import context_of
from realtime.streams.transcripts import TranscriptStore, to_webvtt

TRANSCRIPTS = web.AppKey("vidsentry_transcripts", TranscriptStore)
LANGUAGE = re.compile(r"[a-z]{2,3}")  # Whisper's codes: en, es, haw, ...


def _known(request: web.Request) -> str:
    stream_id = stream_id_of(request)
    if stream_id not in context_of(request).registry:
        raise unknown_stream(stream_id)
    return stream_id


def _language(request: web.Request, default: str | None) -> str | None:
    value = request.query.get("language")
    if value is None:
        return default
    if not LANGUAGE.fullmatch(value):
        raise ApiError(400, "invalid language", {"field": "language", "message": "a lower-case code like en or es"})
    return value


def _vtt(text: str) -> web.Response:
    return web.Response(text=text, content_type="text/vtt", charset="utf-8", headers={"Cache-Control": "no-store"})


async def captions_vtt(request: web.Request) -> web.Response:
    stream_id = _known(request)
    return _vtt(to_webvtt(request.app[TRANSCRIPTS].cues(stream_id, _language(request, None))))


async def translation_vtt(request: web.Request) -> web.Response:
    stream_id = _known(request)
    return _vtt(to_webvtt(request.app[TRANSCRIPTS].translations(stream_id, _language(request, "en") or "en")))


async def caption_languages(request: web.Request) -> web.Response:
    return web.json_response(request.app[TRANSCRIPTS].languages(_known(request)))


def add_routes(app: web.Application, store: TranscriptStore) -> None:
    app[TRANSCRIPTS] = store
    app.router.add_get("/api/streams/{stream_id}/captions.vtt", captions_vtt)
    app.router.add_get("/api/streams/{stream_id}/translation.vtt", translation_vtt)
    app.router.add_get("/api/streams/{stream_id}/captions/languages", caption_languages)
