"""`GET /api/streams/{id}/events`: one stream's events as server-sent events.

The first message (`stream`) is the stream as `GET /api/streams/{id}` shows it, so a viewer
knows the state without waiting for the next change. Then every event the stream publishes
follows with the NATS body as `data` and the event kind as the SSE event name. The SSE id is
where a viewer resumes: the ce-id of a durable event, and on a live-only event (detections,
partials) the ce-id of the durable event before it. A viewer that reconnects with
`Last-Event-ID` (as EventSource does) first gets the durable events it missed, from JetStream
(see resume.py), then a `resume` event saying how many and whether the id was found, then the
live events. A viewer that falls behind loses its oldest events and is told how many (`lag`).
A comment line every heartbeat keeps proxies from closing an idle connection and finds
viewers that have gone away; one that stops reading for `http.request_timeout_s` is dropped.
The response ends when the stream is deleted or the service shuts down. A stream or a service
that has as many viewers as it allows answers 429 (JSON, naming the limit) before any header
of the event stream goes out.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging

from aiohttp import web

from pipelines.events import Event
from realtime.http.api import stream_id_of, unknown_stream
from realtime.http.context import HttpContext, context_of
from realtime.http.errors import ApiError
from realtime.http.resume import resume
from realtime.streams.fanout import SseMessage, Viewer, ViewerClosed, ViewerLimitReached
from realtime.streams.registry import UnknownStream

log = logging.getLogger(__name__)

RECONNECT_MS = 3000  # what EventSource waits before reconnecting on its own
HEARTBEAT = b": keep-alive\n\n"


class _Writer:
    """Writes to the response, giving up on a viewer that stops reading."""

    def __init__(self, response: web.StreamResponse, timeout_s: float) -> None:
        self.response = response
        self.timeout_s = timeout_s

    async def write(self, data: bytes) -> None:
        async with asyncio.timeout(self.timeout_s):
            await self.response.write(data)


async def stream_events(request: web.Request) -> web.StreamResponse:
    ctx = context_of(request)
    stream_id = stream_id_of(request)
    try:
        view = ctx.registry.get(stream_id)
    except UnknownStream:
        raise unknown_stream(stream_id) from None
    last_id = request.headers.get("Last-Event-ID")
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
        recent = ctx.fanout.recent(stream_id)  # with the registration, before any await: nothing falls between
        # A viewer joining afresh learns of the alerts already open (one resuming gets them replayed).
        opened = ctx.fanout.open_alerts(stream_id) if last_id is None else []
        log.info(
            "event viewer joined",
            extra={"stream_id": stream_id, "viewers": ctx.fanout.viewer_count, "resuming": last_id is not None},
        )
        writer = _Writer(response, ctx.request_timeout_s)
        try:
            await response.prepare(request)
            first = SseMessage("stream", json.dumps(view.to_json()))
            await writer.write(f"retry: {RECONNECT_MS}\n".encode() + first.encode())
            resume_id = recent[-1].id if recent else ""  # not an older alert's: where the live events are
            for event in opened:
                await writer.write(dataclasses.replace(ctx.fanout.message(event), resume_id=resume_id).encode())
            sent: set[str] = set()
            if last_id is not None:
                sent = await _replay(writer, ctx, stream_id, last_id, recent)
            await _relay(writer, viewer, ctx.sse_heartbeat_s, sent)
        except ConnectionResetError:
            pass  # the viewer went away; leaving the block unregisters it
        except TimeoutError:
            log.warning("event viewer stopped reading; dropped", extra={"stream_id": stream_id})
        except Exception:
            # Headers are out: the JSON error middleware can no longer answer; end this response only.
            log.exception("event stream failed", extra={"stream_id": stream_id})
        finally:
            log.info("event viewer left", extra={"stream_id": stream_id, "dropped": viewer.dropped})
    return response


async def _replay(writer: _Writer, ctx: HttpContext, stream_id: str, last_id: str, recent: list[Event]) -> set[str]:
    resumed = await resume(
        last_id, stream_id, recent=recent, fanout=ctx.fanout, history=ctx.history, settings=ctx.resume
    )
    for message in resumed.messages:
        await writer.write(message.encode())
    await writer.write(SseMessage("resume", json.dumps(resumed.summary), resume_id="").encode())
    log.info("event viewer resumed", extra={"stream_id": stream_id, **resumed.summary})
    return resumed.sent


async def _relay(writer: _Writer, viewer: Viewer, heartbeat_s: float, sent: set[str]) -> None:
    reported = 0
    while True:
        try:
            message = await viewer.next(heartbeat_s)
        except ViewerClosed:
            return
        if viewer.dropped > reported:
            lag = {"dropped": viewer.dropped - reported, "dropped_total": viewer.dropped}
            await writer.write(SseMessage("lag", json.dumps(lag)).encode())
            reported = viewer.dropped
        if message is not None and message.id in sent:
            sent.discard(message.id)  # replayed from JetStream already
            continue
        await writer.write(HEARTBEAT if message is None else message.encode())
