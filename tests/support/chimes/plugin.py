"""Chimes in the service: each stream's recent chimes, kept from the events and listed over HTTP, and
a card on the page (chimes.js, beside this file) that shows the last one."""

from __future__ import annotations

from collections import deque
from pathlib import Path

from aiohttp import web

from pipelines.events import Event
from realtime.http.page import Panel
from realtime.service.plugin import Attached, PluginContext, ServicePlugin
from tests.support.chimes.body import ChimeBody

RECENT = 16  # chimes kept per stream


class RecentChimes:
    def __init__(self) -> None:
        self.streams: dict[str, deque[dict[str, object]]] = {}

    def tap(self, event: Event) -> None:
        if isinstance(event.body, ChimeBody):
            kept = self.streams.setdefault(event.stream_id, deque(maxlen=RECENT))
            kept.append({"id": event.id, "pts": event.pts, **event.body.fields()})

    def forget(self, stream_id: str) -> None:
        self.streams.pop(stream_id, None)

    def add_routes(self, app: web.Application) -> None:
        async def recent(request: web.Request) -> web.Response:
            stream_id = request.match_info["stream_id"]
            return web.json_response({"stream_id": stream_id, "chimes": list(self.streams.get(stream_id, ()))})

        app.router.add_get("/api/streams/{stream_id}/chimes", recent)


def attach(_ctx: PluginContext) -> Attached:
    store = RecentChimes()
    return Attached(taps=(store.tap,), routes=store.add_routes, forget=(store.forget,), state=store)


PANEL = Panel("chimes", "Chimes", Path(__file__).with_name("chimes.js"), kinds=("chimes",))

PLUGIN = ServicePlugin("chimes", attach, panels=(PANEL,))
