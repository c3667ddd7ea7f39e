"""The timeline's routes: `GET /api/search` (realtime.timeline.search says the parameters) and
`POST /api/ask` (realtime.timeline.ask says how an answer is made and checked).

    POST /api/ask {"question", "streams"?: [ids], "since"?, "until"?}
        200 JSON: the answer, its claims and their citations, what the check dropped
        with `Accept: text/event-stream`: events `evidence` (the retrieved entries), `delta`
        (answer text as it is generated), `restart` (a retry: forget the deltas so far),
        then `answer` (the same JSON) or `error` ({"error", "status"})

With the timeline off both answer 409 saying so; `ask` without a VLM is 409 too. A query's or a
question's faults are 400s naming the field; a VLM outage is 503. Asks at once are bounded
(`MAX_ASKS`): past it, 503 with Retry-After.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from aiohttp import web

from pipelines.tasks import TaskOwner
from realtime.http.api import read_json_object
from realtime.http.clips import clip_stage
from realtime.http.context import context_of
from realtime.http.errors import ApiError
from realtime.streams.registry import StreamRegistry
from realtime.timeline.ask import Asker, AskError
from realtime.timeline.errors import IndexUnavailable, QueryTooBroad, RemoteRefusal
from realtime.timeline.index import Filters, Hit
from realtime.timeline.search import (
    SearchRequestError,
    answer,
    check_streams,
    hit_view,
    parse_time,
    query_getter,
    read_request,
)
from realtime.timeline.timeline import Timeline

MAX_ASKS = 2  # each holds the VLM for seconds
ASK_EXAMPLE = '{"question": "when was the parcel delivered?", "streams": ["door"], "since": "24h"}'


class TimelineApi:
    def __init__(self, timeline: Timeline | None, asker: Asker | None) -> None:
        self.timeline = timeline
        self.asker = asker
        self.asking = 0

    def _timeline(self) -> Timeline:
        if self.timeline is None:
            raise ApiError(409, "search is off on this service (timeline.enabled)")
        return self.timeline

    async def search(self, request: web.Request) -> web.Response:
        timeline = self._timeline()
        try:
            search = read_request(query_getter(request.query))
        except SearchRequestError as exc:
            timeline.index.stats.refused += 1
            raise ApiError(400, f"invalid search: {exc}", [{"field": exc.field, "message": str(exc)}]) from None
        try:
            hits, more, index = await timeline.search(search)
        except QueryTooBroad as exc:
            timeline.index.stats.refused += 1
            raise ApiError(400, f"{exc}: add words, a stream, a kind or a time range", {"q": search.text[:200]}) \
                from None
        except RemoteRefusal as exc:
            raise ApiError(400, f"invalid search: {exc}") from None
        except IndexUnavailable as exc:
            raise ApiError(503, str(exc), headers={"Retry-After": "2"}) from None
        registry = context_of(request).registry
        body = answer(search, hits, more, live=lambda stream_id: stream_id in registry,
                      buffered=lambda stream_id, t: _buffered(registry, stream_id, t))
        body["index"] = index
        return web.json_response(body, headers={"Cache-Control": "no-store"})

    async def ask(self, request: web.Request) -> web.StreamResponse:
        self._timeline()
        if self.asker is None:
            raise ApiError(409, "asking needs a VLM: configure vlm.endpoints (or --vlm-url)")
        body = await read_json_object(request, what="question", example=ASK_EXAMPLE)
        question, filters = _question(body)
        if self.asking >= MAX_ASKS:
            self.asker.stats.refused += 1
            raise ApiError(503, "questions are being answered; retry shortly", {"max_asks": MAX_ASKS},
                           headers={"Retry-After": "2"})
        registry = context_of(request).registry

        def live(stream_id: str) -> bool:
            return stream_id in registry

        self.asking += 1
        try:
            if "text/event-stream" in request.headers.get("Accept", ""):
                return await self._ask_streamed(request, question, filters, live)
            try:
                result = await self.asker.ask(question, filters)
            except AskError as exc:
                raise ApiError(exc.status, str(exc)) from None
            return web.json_response(result.view(live), headers={"Cache-Control": "no-store"})
        finally:
            self.asking -= 1

    async def _ask_streamed(self, request: web.Request, question: str, filters: Filters,
                            live: Any) -> web.StreamResponse:
        asker = self.asker
        assert asker is not None
        # Bounded by what one answer can be: the retrieved evidence, the answer's tokens, one result.
        queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()

        def on_delta(piece: str | None) -> None:
            queue.put_nowait(("restart", {}) if piece is None else ("delta", {"text": piece}))

        def on_evidence(hits: list[Hit]) -> None:
            queue.put_nowait(("evidence", {"evidence": [hit_view(h, live=live) for h in hits]}))

        async def run() -> None:
            try:
                result = await asker.ask(question, filters, on_delta=on_delta, on_evidence=on_evidence)
                queue.put_nowait(("answer", result.view(live)))
            except AskError as exc:
                queue.put_nowait(("error", {"error": str(exc), "status": exc.status}))

        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-store"})
        await response.prepare(request)
        asking = TaskOwner("search")
        asking.spawn(run(), "ask")
        try:
            while True:
                kind, data = await queue.get()
                await response.write(f"event: {kind}\ndata: {json.dumps(data)}\n\n".encode())
                if kind in ("answer", "error"):
                    break
        finally:
            await asking.cancel_all()
        await response.write_eof()
        return response


def _buffered(registry: StreamRegistry, stream_id: str, t: float) -> bool:
    stage = clip_stage(registry, stream_id)
    return stage is not None and stage.holds(t)


def _question(body: dict[str, Any]) -> tuple[str, Filters]:
    unknown = sorted(set(body) - {"question", "streams", "since", "until"})
    if unknown:
        raise ApiError(400, f"invalid question: unknown field {unknown[0][:40]!r}",
                       [{"field": unknown[0][:40], "message": "not a field of a question"}])
    question = body.get("question")
    if not isinstance(question, str) or not question.strip():
        raise ApiError(400, "invalid question: question: the question, as text",
                       [{"field": "question", "message": "a non-empty string"}])
    streams = body.get("streams", [])
    now = time.time()
    try:
        if not isinstance(streams, list):
            raise SearchRequestError("streams: a list of stream ids", "streams")
        check_streams(streams)
        since, until = (parse_time([str(body[k])] if body.get(k) is not None else [], k, now)
                        for k in ("since", "until"))
    except SearchRequestError as exc:
        raise ApiError(400, f"invalid question: {exc}", [{"field": exc.field, "message": str(exc)}]) from None
    return question, Filters(streams=tuple(streams), since=since, until=until)


def add_routes(app: web.Application, timeline: Timeline | None, asker: Asker | None = None) -> TimelineApi:
    api = TimelineApi(timeline, asker)
    app.router.add_get("/api/search", api.search)
    app.router.add_post("/api/ask", api.ask)
    return api
