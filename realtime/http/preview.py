"""`GET /api/streams/{id}/frame.jpg`: the newest frame the detector processed, as JPEG; with
`?pts=T`, the picture on screen at media time T, decoded from the stream's clip buffer while it
still holds it (404 saying what it holds when it does not; 409 for a stream that keeps none).

The page's camera view polls this a couple of times a second and draws the boxes of the
`detections` event whose `frame_seq` matches `X-Frame-Seq` (`X-Inference` says whether the model
measured that frame's boxes or the tracker predicted them). Encoding is the expensive part, so
it happens at most once per stream per `ENCODE_WINDOW_S` and only for a frame not yet encoded:
every viewer inside the window gets the same bytes, and viewers that arrive while an encode is
running wait for that one. The cache holds one JPEG per running stream and forgets streams that
have gone.
"""

from __future__ import annotations

import asyncio
import time
import weakref
from dataclasses import dataclass, field

import cv2
import numpy as np
from aiohttp import web

from pipelines.clips.stage import ExportRefused
from pipelines.frames import VideoFrame
from pipelines.tasks import TaskOwner
from realtime.http.api import require_local_stream, stream_id_of, unknown_stream
from realtime.http.clips import clip_stage, query_number
from realtime.http.context import context_of
from realtime.http.errors import ApiError
from realtime.streams.registry import StreamRegistry, UnknownStream
from realtime.streams.runner import StreamRunner

ENCODE_WINDOW_S = 0.5  # the page polls at ~2/s; a faster poller sees the same frame twice
JPEG_QUALITY = 80


@dataclass(frozen=True, slots=True)
class Preview:
    seq: int
    pts: float
    jpeg: bytes
    made_at: float  # time.monotonic() of the encode
    inference: str = "measured"  # "predicted": the frame's boxes are the tracker's, the model skipped it


@dataclass(eq=False)
class _Entry:
    # Weak: a stream deleted and added again under the same id is a new run with its own seq.
    run: weakref.ref[StreamRunner]
    latest: Preview | None = None
    pending: asyncio.Future[Preview] | None = field(default=None, repr=False)


def encode_jpeg(frame: VideoFrame, quality: int = JPEG_QUALITY, inference: str = "measured") -> Preview:
    bgr = cv2.cvtColor(frame.image, cv2.COLOR_RGB2BGR)
    ok, data = cv2.imencode(".jpg", bgr, [cv2.IMWRITE_JPEG_QUALITY, quality])
    if not ok:
        raise RuntimeError(f"JPEG encoding failed for frame {frame.seq}")
    return Preview(frame.seq, frame.pts, np.asarray(data).tobytes(), time.monotonic(), inference)


class FramePreviews:
    """One JPEG per running stream, shared by every viewer; `encodes` counts the encodes done."""

    def __init__(self, window_s: float = ENCODE_WINDOW_S) -> None:
        self.window_s = window_s
        self.encodes = 0
        self._tasks = TaskOwner("frame previews")  # the encodes viewers share
        self._entries: dict[str, _Entry] = {}

    def __len__(self) -> int:
        return len(self._entries)

    async def latest(self, stream_id: str, runner: StreamRunner, registry: StreamRegistry) -> Preview | None:
        """The stream's newest processed frame as JPEG; None while it has processed none."""
        loop = runner.frame_loop
        frame = loop.last_frame if loop is not None else None
        inference = loop.last_inference if loop is not None else "measured"
        entry = self._entries.get(stream_id)
        if entry is None or entry.run() is not runner:
            self._forget_gone(registry)
            entry = self._entries[stream_id] = _Entry(weakref.ref(runner))
        if entry.pending is not None:  # an encode is running: share it
            return await asyncio.shield(entry.pending)
        latest = entry.latest
        if frame is None:
            return latest
        if latest is not None and (latest.seq == frame.seq or time.monotonic() - latest.made_at < self.window_s):
            return latest
        entry.pending = self._tasks.spawn(self._encode(entry, frame, inference), f"{stream_id}-preview", awaited=True)
        # Shielded: a viewer that leaves mid-encode must not cancel it for the others.
        return await asyncio.shield(entry.pending)

    async def _encode(self, entry: _Entry, frame: VideoFrame, inference: str) -> Preview:
        self.encodes += 1
        try:
            preview = await asyncio.to_thread(encode_jpeg, frame, JPEG_QUALITY, inference)
        finally:
            entry.pending = None
        entry.latest = preview
        return preview

    def forget(self, stream_id: str) -> None:
        self._entries.pop(stream_id, None)

    async def aclose(self) -> None:
        """Cancel an encode still running and wait for it (the server is shutting down)."""
        await self._tasks.cancel_all()

    def _forget_gone(self, registry: StreamRegistry) -> None:
        # Runs whenever an entry is made, so the cache never holds more than the streams running.
        for stream_id, entry in list(self._entries.items()):
            run = entry.run()
            if run is None or registry.runner(stream_id) is not run:
                del self._entries[stream_id]


PREVIEWS = web.AppKey("vidsentry_frame_previews", FramePreviews)


async def frame_at(request: web.Request, stream_id: str) -> web.Response:
    """`?pts=`: the picture on screen at that media time, decoded from the stream's clip buffer."""
    ctx = context_of(request)
    t = query_number(request.query, "pts", "media seconds (as events' pts)")
    assert t is not None  # the caller saw `pts` in the query
    require_local_stream(request, stream_id, "a picture from its buffer")
    stage = clip_stage(ctx.registry, stream_id)
    if stage is None:
        raise ApiError(409, "this stream keeps no buffer of its video here (clips.enabled, a source with "
                            "encoded packets, running on this worker): only its newest frame is served",
                       {"id": stream_id})
    try:
        jpeg, at = await stage.still(t)
    except ExportRefused as exc:
        raise ApiError(404, str(exc), {"id": stream_id, "pts": t}) from None
    return web.Response(body=jpeg, content_type="image/jpeg",
                        headers={"Cache-Control": "no-store", "X-Frame-Pts": f"{at:.3f}"})


async def frame_jpeg(request: web.Request) -> web.Response:
    ctx = context_of(request)
    stream_id = stream_id_of(request)
    if "pts" in request.query:
        return await frame_at(request, stream_id)
    runner = ctx.registry.runner(stream_id)
    previews = request.app[PREVIEWS]
    preview = None
    if runner is not None:
        preview = await previews.latest(stream_id, runner, ctx.registry)
    else:
        previews.forget(stream_id)
        try:
            ctx.registry.get(stream_id)
        except UnknownStream:
            raise unknown_stream(stream_id) from None
    if preview is None:
        raise ApiError(404, "no frame yet", {"id": stream_id, "message": "the detector has processed no frame of it"})
    return web.Response(
        body=preview.jpeg,
        content_type="image/jpeg",
        headers={
            "Cache-Control": "no-store",
            "X-Frame-Seq": str(preview.seq),
            "X-Frame-Pts": f"{preview.pts:.3f}",
            "X-Inference": preview.inference,
        },
    )


def add_routes(app: web.Application) -> None:
    previews = app[PREVIEWS] = FramePreviews()

    async def close_previews(_app: web.Application) -> None:
        await previews.aclose()

    app.on_cleanup.append(close_previews)
    app.router.add_get("/api/streams/{stream_id}/frame.jpg", frame_jpeg)
