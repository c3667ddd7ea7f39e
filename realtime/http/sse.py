"""`GET /api/streams/{id}/events`: one stream's events as server-sent events.

The first message (`stream`) is the stream as `GET /api/streams/{id}` shows it, so a viewer
knows the state without waiting for the next change. Then every event the stream publishes
follows with the NATS body as `data`, the event kind as the SSE event name and `ce-id` as
the SSE id. A viewer that falls behind loses its oldest events and is told how many (`lag`).
A comment line every heartbeat keeps proxies from closing an idle connection and finds
viewers that have gone away. The response ends when the stream is deleted or the service
shuts down. A stream or a service that has as many viewers as it allows answers 429 (JSON,
naming the limit) before any header of the event stream goes out.
"""

from __future__ import annotations

import contextlib
import json
import logging

from aiohttp import web

from realtime.http.api import stream_id_of, unknown_stream
from realtime.http.context import context_of
from realtime.http.errors import ApiError
from realtime.service.registry import UnknownStream
from realtime.streams.fanout import SseMessage, Viewer, ViewerClosed, ViewerLimitReached

log = logging.getLogger(__name__)

RECONNECT_MS = 3000  # what EventSource waits before reconnecting on its own
HEARTBEAT = b": keep-alive\n\n"


async def stream_events(request: web.Request) -> web.StreamResponse:
    ctx = context_of(request)
    stream_id = stream_id_of(request)
    try:
        view = ctx.registry.get(stream_id)
    except UnknownStream:
        raise unknown_stream(stream_id) from None
    response = web.StreamResponse(
        headers={
            "Content-Type": "text/event-stream",
            "Cache-Control": "no-cache",
            "X-Accel-Buffering": "no",  # nginx: do not buffer the stream
        }
    )
    with contextlib.ExitStack() as stack:
        try:
            viewer = stack.enter_context(ctx.fanout.watch(stream_id))
        except ViewerLimitReached as exc:  # not prepared yet: the JSON error middleware answers
            log.warning("event viewer refused", extra={"stream_id": stream_id, "reason": str(exc)})
            raise ApiError(429, str(exc), {"limit": exc.limit, "setting": exc.setting}) from None
        log.info("event viewer joined", extra={"stream_id": stream_id, "viewers": ctx.fanout.viewer_count})
        try:
            await response.prepare(request)
            first = SseMessage("stream", json.dumps(view.to_json()))
            await response.write(f"retry: {RECONNECT_MS}\n".encode() + first.encode())
            await _relay(response, viewer, ctx.sse_heartbeat_s)
        except ConnectionResetError:
            pass  # the viewer went away; leaving the block unregisters it
        except Exception:
            # Headers are out: the JSON error middleware can no longer answer; end this response only.
            log.exception("event stream failed", extra={"stream_id": stream_id})
        finally:
            log.info("event viewer left", extra={"stream_id": stream_id, "dropped": viewer.dropped})
    return response


async def _relay(response: web.StreamResponse, viewer: Viewer, heartbeat_s: float) -> None:
    reported = 0
    while True:
        try:
            message = await viewer.next(heartbeat_s)
        except ViewerClosed:
            return
        if viewer.dropped > reported:
            lag = {"dropped": viewer.dropped - reported, "dropped_total": viewer.dropped}
            await response.write(SseMessage("lag", json.dumps(lag)).encode())
            reported = viewer.dropped
        await response.write(HEARTBEAT if message is None else message.encode())
