"""The clips API: list, read, download (HTTP Range, so a browser's player can seek) and delete the
clips the clips capability wrote (pipelines/clips).

    GET    /api/clips?stream=&alert=&since=&until=   newest first; since/until: epoch seconds the clip was written
    GET    /api/clips/{id}                           metadata and links
    GET    /api/clips/{id}.mp4                       the video (206 for a Range, 416 for one past the end)
    DELETE /api/clips/{id}

Only ids the store lists are served (32 hex digits), so no request names a file by itself.
Downloads at once are bounded: past `MAX_DOWNLOADS` a request gets 503 with a Retry-After.
"""

from __future__ import annotations

import asyncio
import math
from typing import Any

from aiohttp import web

from pipelines.clips.engine import ClipEngine
from pipelines.clips.store import CLIP_ID, ClipInfo
from realtime.http.errors import ApiError

MAX_DOWNLOADS = 8
MAX_LISTED = 1000


class ClipsApi:
    def __init__(self, engine: ClipEngine, *, max_downloads: int = MAX_DOWNLOADS) -> None:
        self.store = engine.store
        self.max_downloads = max_downloads
        self.downloads = 0
        self.refused = 0

    async def list_clips(self, request: web.Request) -> web.Response:
        query = request.query
        since, until = _number(query, "since"), _number(query, "until")
        stream, alert = query.get("stream"), query.get("alert")
        clips = [
            c for c in self.store.list(stream)
            if (since is None or c.created_at >= since) and (until is None or c.created_at <= until)
            and (alert is None or alert in c.alert_ids)
        ]
        clips.reverse()
        return web.json_response({"clips": [_view(c) for c in clips[:MAX_LISTED]], "total": len(clips)},
                                 headers={"Cache-Control": "no-store"})

    async def clip(self, request: web.Request) -> web.StreamResponse:
        name = request.match_info["name"]
        if name.endswith(".mp4"):
            return await self._video(request, self._known(name.removesuffix(".mp4")))
        return web.json_response(_view(self._known(name)), headers={"Cache-Control": "no-store"})

    async def delete(self, request: web.Request) -> web.Response:
        info = self._known(request.match_info["name"])
        await asyncio.to_thread(self.store.delete, info.id)
        return web.Response(status=204)

    def _known(self, clip_id: str) -> ClipInfo:
        info = self.store.get(clip_id) if CLIP_ID.match(clip_id) else None
        if info is None:
            raise ApiError(404, "unknown clip", {"id": clip_id[:64]})
        return info

    async def _video(self, request: web.Request, info: ClipInfo) -> web.StreamResponse:
        path = self.store.path(info.id)
        if path is None:
            raise ApiError(404, "unknown clip", {"id": info.id})
        if self.downloads >= self.max_downloads:
            self.refused += 1
            raise ApiError(503, "too many clip downloads at once; retry shortly",
                           {"max_downloads": self.max_downloads}, headers={"Retry-After": "1"})
        self.downloads += 1
        try:
            response = web.FileResponse(path, headers={"Content-Type": "video/mp4", "Cache-Control": "no-store"})
            await response.prepare(request)  # sends the file (or the Range) before the slot is given back
            return response
        finally:
            self.downloads -= 1


def _number(query: Any, key: str) -> float | None:
    raw = query.get(key)
    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise ApiError(400, f"{key}: expected epoch seconds", {key: str(raw)[:64]})
    return value


def _view(info: ClipInfo) -> dict[str, Any]:
    return {**info.to_json(), "links": {"self": f"/api/clips/{info.id}", "mp4": f"/api/clips/{info.id}.mp4"}}


def add_routes(app: web.Application, engine: ClipEngine) -> ClipsApi:
    api = ClipsApi(engine)
    app.router.add_get("/api/clips", api.list_clips)
    app.router.add_get("/api/clips/{name}", api.clip)
    app.router.add_delete("/api/clips/{name}", api.delete)
    return api
