"""The clips API: list, read, download (HTTP Range, so a browser's player can seek) and delete the
clips the clips capability wrote (pipelines/clips).

    GET    /api/clips?stream=&alert=&since=&until=   newest first; since/until: epoch seconds the clip was written
    GET    /api/clips/{id}                           metadata and links
    GET    /api/clips/{id}.mp4                       the video (206 for a Range, 416 for one past the end);
                                                     a clip marked `redact_on_export` is redacted first (once)
    GET    /api/clips/{id}.json                      every frame's objects in the clip, on its time
    GET    /api/clips/{id}.vtt                       its captions as WebVTT, on its time (404 without speech)
    GET    /api/clips/{id}.events.json               its alerts (evidence, reasons, snapshots) and the scene
                                                     descriptions of its span, on its time (404 without any)
    DELETE /api/clips/{id}
    POST   /api/clips/{id}/redact {"classes"}        a copy with those classes' boxes pixelated (re-encoded),
                                                     except the tracks its alerts are about
    POST   /api/streams/{id}/clips {"start", "end"}  a clip of any span still in the stream's buffer (media seconds)

In a fleet every worker lists and serves every clip: the clips of the fleet's bucket are listed
with this worker's, and one recorded elsewhere is fetched into this worker's store the first time
it is asked for (realtime.fleet.clips); while the bucket is unreachable the list holds this
worker's clips and says `"partial": true`, and a clip only there is a 503 with Retry-After.

Only ids the store lists are served (32 hex digits), so no request names a file by itself. With
clips off the routes still answer (an empty list that says `"enabled": false`, 404 for an id, 409
for an export), so a client need not know the configuration to ask.
Downloads at once are bounded: past `MAX_DOWNLOADS` a request gets 503 with a Retry-After.
"""

from __future__ import annotations

import asyncio
import math
import uuid
from collections.abc import Callable
from typing import Any

from aiohttp import web

from pipelines.clips.engine import ClipEngine
from pipelines.clips.stage import STAGE_NAME, ClipStage, ExportRefused, clip_view
from pipelines.clips.store import CLIP_ID, ClipInfo
from realtime.fleet.clips import ClipsUnavailable, ExportForwardRefused, FleetClips
from realtime.http.api import owner_elsewhere, read_json_object, runs_elsewhere, stream_id_of
from realtime.http.context import context_of
from realtime.http.errors import ApiError
from realtime.streams.registry import StreamRegistry

MAX_DOWNLOADS = 8
MAX_LISTED = 1000
MAX_REDACT_CLASSES = 32
REDACT_EXAMPLE = '{"classes": ["person"]}'
SPAN_EXAMPLE = '{"start": 12.5, "end": 30.0}'
# URL suffix, file suffix, type; the longer suffix first (".events.json" also ends in ".json").
SIDECARS = ((".events.json", ".events.json", "application/json"), (".json", ".boxes.json", "application/json"),
            (".vtt", ".vtt", "text/vtt"))


class ClipsApi:
    def __init__(self, engine: ClipEngine | None, *, fleet: FleetClips | None = None,
                 max_downloads: int = MAX_DOWNLOADS) -> None:
        self.store = engine.store if engine is not None else None
        self.fleet = fleet
        self.max_downloads = max_downloads
        self.downloads = 0
        self.refused = 0
        self.redacting = False  # one re-encode at a time: it takes seconds of CPU per clip-minute

    async def list_clips(self, request: web.Request) -> web.Response:
        query = request.query
        since, until = query_number(query, "since"), query_number(query, "until")
        stream, alert = query.get("stream"), query.get("alert")
        if self.store is None:
            return web.json_response({"clips": [], "total": 0, "enabled": False}, headers={"Cache-Control": "no-store"})
        found, complete = await self.fleet.list(stream) if self.fleet is not None else (self.store.list(stream), True)
        clips = [
            c for c in found
            if (since is None or c.created_at >= since) and (until is None or c.created_at <= until)
            and (alert is None or alert in c.alert_ids)
        ]
        clips.reverse()
        body: dict[str, Any] = {"clips": [_view(request, c) for c in clips[:MAX_LISTED]], "total": len(clips),
                                "enabled": True}
        if not complete:
            body["partial"] = True  # the fleet's bucket did not answer: this worker's clips only
        return web.json_response(body, headers={"Cache-Control": "no-store"})

    async def clip(self, request: web.Request) -> web.StreamResponse:
        name = request.match_info["name"]
        if name.endswith(".mp4"):
            return await self._video(request, await self._known(name.removesuffix(".mp4")))
        for suffix, stored, content_type in SIDECARS:
            if name.endswith(suffix):
                info = await self._known(name.removesuffix(suffix))
                assert self.store is not None  # a known clip has a store
                path = self.store.extra(info.id, stored)
                if path is None:
                    raise ApiError(404, f"this clip has no {suffix[1:]}", {"id": info.id})
                return web.FileResponse(path, headers={"Content-Type": content_type, "Cache-Control": "no-store"})
        return web.json_response(_view(request, await self._known(name)), headers={"Cache-Control": "no-store"})

    async def export(self, request: web.Request) -> web.Response:
        stream_id = stream_id_of(request)
        registry = context_of(request).registry
        owner = owner_elsewhere(request, stream_id)
        body = await read_json_object(request, what="span", example=SPAN_EXAMPLE)
        start, end = (_seconds(body, key) for key in ("start", "end"))
        if self.store is None:
            raise ApiError(409, "clips are off on this service (clips.enabled)", {"id": stream_id})
        try:
            if owner is None:
                info = await export_here(registry, stream_id, start, end)
            elif owner and self.fleet is not None:  # its buffer is on the worker running it: asked there
                info = await self.fleet.forward_export(owner, stream_id, start, end)
            else:
                raise runs_elsewhere(stream_id, owner, "cutting a clip of it")
        except ExportRefused as exc:
            raise ApiError(409, str(exc), {"start": start, "end": end}) from None
        except ExportForwardRefused as exc:
            status = exc.status if 400 <= exc.status < 500 else 502
            raise ApiError(status, str(exc), {"start": start, "end": end, "owner": owner}) from None
        except ClipsUnavailable as exc:
            raise ApiError(503, str(exc), {"id": stream_id, "owner": owner}, headers={"Retry-After": "5"}) from None
        view = _view(request, info)
        return web.json_response(view, status=201, headers={"Location": view["links"]["self"]})

    async def redact(self, request: web.Request) -> web.Response:
        source = await self._known(request.match_info["name"])
        assert self.store is not None
        body = await read_json_object(request, what="redaction", example=REDACT_EXAMPLE)
        classes = body.get("classes")
        if (not isinstance(classes, list) or not classes or len(classes) > MAX_REDACT_CLASSES
                or not all(isinstance(c, str) and 0 < len(c) <= 64 for c in classes)):
            raise ApiError(400, "invalid redaction: classes: a list of class names",
                           [{"field": "classes", "message": f"1 to {MAX_REDACT_CLASSES} class names"}])
        info = await self._reencode(self.store.redact, source, uuid.uuid4().hex, classes)
        view = _view(request, info)
        return web.json_response(view, status=201, headers={"Location": view["links"]["self"]})

    async def delete(self, request: web.Request) -> web.Response:
        info = await self._known(request.match_info["name"])
        assert self.store is not None
        if self.fleet is not None:
            try:
                await self.fleet.delete(info.id)
            except ClipsUnavailable as exc:
                raise ApiError(503, str(exc), {"id": info.id}, headers={"Retry-After": "5"}) from None
        else:
            await asyncio.to_thread(self.store.delete, info.id)
        return web.Response(status=204)

    async def _known(self, clip_id: str) -> ClipInfo:
        if self.store is None or not CLIP_ID.match(clip_id):
            raise ApiError(404, "unknown clip", {"id": clip_id[:64]})
        try:  # in a fleet, this worker's store first, then the fleet's bucket
            info = await self.fleet.find(clip_id) if self.fleet is not None else self.store.get(clip_id)
        except ClipsUnavailable as exc:
            raise ApiError(503, str(exc), {"id": clip_id}, headers={"Retry-After": "5"}) from None
        if info is None:
            raise ApiError(404, "unknown clip", {"id": clip_id[:64]})
        return info

    async def _reencode(self, work: Callable[..., ClipInfo | None], *args: Any) -> ClipInfo:
        """Run one redaction (seconds of CPU per clip-minute) off the event loop, one at a time."""
        if self.redacting:
            raise ApiError(503, "a clip is being redacted; retry shortly", headers={"Retry-After": "5"})
        self.redacting = True
        try:
            info = await asyncio.to_thread(work, *args)
        except OSError as exc:
            raise ApiError(507, "the clip could not be written", {"error": str(exc.strerror or exc)}) from None
        finally:
            self.redacting = False
        if info is None:
            raise ApiError(404, "unknown clip")
        return info

    async def _video(self, request: web.Request, info: ClipInfo) -> web.StreamResponse:
        assert self.store is not None
        if info.redact:  # its stream's classes are pixelated before the picture leaves the service
            info = await self._reencode(self.store.redact_for_export, info.id)
        path = self.store.path(info.id)
        if path is None:
            raise ApiError(404, "unknown clip", {"id": info.id})
        if self.downloads >= self.max_downloads:
            self.refused += 1
            raise ApiError(503, "too many clip downloads at once; retry shortly",
                           {"max_downloads": self.max_downloads}, headers={"Retry-After": "1"})
        self.downloads += 1
        return _CountedFile(self, path, headers={"Content-Type": "video/mp4", "Cache-Control": "no-store"})


class _CountedFile(web.FileResponse):
    """A clip download that gives its slot back once sent (or failed): aiohttp prepares, and so
    sends, a returned file response after the handler is done."""

    def __init__(self, api: ClipsApi, path: Any, **kwargs: Any) -> None:
        super().__init__(path, **kwargs)
        self._api: ClipsApi | None = api

    async def prepare(self, request: web.BaseRequest) -> Any:
        try:
            return await super().prepare(request)
        finally:
            if self._api is not None:
                self._api.downloads -= 1
                self._api = None


def _view(request: web.Request, info: ClipInfo) -> dict[str, Any]:
    """A clip as `clip_view` shows it, plus links a `<video src>` / `<track src>` can open: `play`
    (the MP4) and `play_vtt`, signed when the API needs a token (realtime.http.signed)."""
    view = clip_view(info)
    links = view["links"]
    context = context_of(request)
    for name, plain in (("play", links["mp4"]), ("play_vtt", links.get("vtt"))):
        if plain is not None:
            links[name] = context.signer.sign(plain) if context.api_token is not None else plain
    return view


def _seconds(body: dict[str, Any], key: str) -> float:
    value = body.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ApiError(400, f"invalid span: {key}: a number of media seconds (as events' pts)",
                       [{"field": key, "message": "a finite number"}])
    return float(value)


def query_number(query: Any, key: str, meaning: str = "epoch seconds") -> float | None:
    """A finite number from the query string, None when absent; a 400 naming the key otherwise."""
    raw = query.get(key)
    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise ApiError(400, f"{key}: expected {meaning}", {key: str(raw)[:64]})
    return value




async def export_here(registry: StreamRegistry, stream_id: str, start: float, end: float) -> ClipInfo:
    """A clip of a span of a stream this worker runs; ExportRefused saying why it cannot be cut."""
    stage = clip_stage(registry, stream_id)
    if stage is None:
        raise ExportRefused("this stream keeps no clip buffer here (clips: false on it, or it stopped)")
    return await stage.export(start, end)


def clip_stage(registry: StreamRegistry, stream_id: str) -> ClipStage | None:
    """The stream's clip buffer on this worker, or None (not running here, clips off, a source
    without encoded packets)."""
    runner = registry.runner(stream_id)
    graph = runner.graph if runner is not None else None
    stage = graph.stage(STAGE_NAME) if graph is not None else None
    return stage if isinstance(stage, ClipStage) else None


def add_routes(app: web.Application, engine: ClipEngine | None, fleet: FleetClips | None = None) -> ClipsApi:
    api = ClipsApi(engine, fleet=fleet)
    app.router.add_get("/api/clips", api.list_clips)
    app.router.add_get("/api/clips/{name}", api.clip)
    app.router.add_delete("/api/clips/{name}", api.delete)
    app.router.add_post("/api/streams/{stream_id}/clips", api.export)
    app.router.add_post("/api/clips/{name}/redact", api.redact)
    return api
