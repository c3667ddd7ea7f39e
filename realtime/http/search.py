"""`GET /api/search`: the timeline's hits for a query (realtime.timeline.search says the parameters).

With the timeline off the route still answers, 409 saying so, so a client need not know the
configuration to ask. A query the index cannot rank in its time limit is a 400 that says to
narrow it; a query's syntax errors are 400s naming the parameter.
"""

from __future__ import annotations

from aiohttp import web

from realtime.http.context import context_of
from realtime.http.errors import ApiError
from realtime.timeline.index import QueryTooBroad
from realtime.timeline.search import SearchRequestError, answer, query_getter, read_request
from realtime.timeline.timeline import Timeline


class SearchApi:
    def __init__(self, timeline: Timeline | None) -> None:
        self.timeline = timeline

    async def search(self, request: web.Request) -> web.Response:
        if self.timeline is None:
            raise ApiError(409, "search is off on this service (timeline.enabled)")
        try:
            search = read_request(query_getter(request.query))
        except SearchRequestError as exc:
            self.timeline.index.stats.refused += 1
            raise ApiError(400, f"invalid search: {exc}", [{"field": exc.field, "message": str(exc)}]) from None
        try:
            hits, more = await self.timeline.search(search)
        except QueryTooBroad as exc:
            self.timeline.index.stats.refused += 1
            raise ApiError(400, f"{exc}: add words, a stream, a kind or a time range", {"q": search.text[:200]}) \
                from None
        registry = context_of(request).registry
        body = answer(search, hits, more, live=lambda stream_id: stream_id in registry)
        timeline = self.timeline
        body["index"] = {"entries": timeline.index.stats.entries, "caught_up": timeline.indexer.stats.caught_up}
        return web.json_response(body, headers={"Cache-Control": "no-store"})


def add_routes(app: web.Application, timeline: Timeline | None) -> SearchApi:
    api = SearchApi(timeline)
    app.router.add_get("/api/search", api.search)
    return api
