"""A capability that exists only in tests, to prove the page is open: it brings one event kind
(`probe`), one route that publishes it, and one card on the page, declared in its own
`ServicePlugin` and shown by its own module (probe.js, beside this file). Nothing of the project
names it: a test lists it with the service's plugins, as one registry line would.

Until event kinds are declared by their bodies, the closed `EventKind` enum is given a `probe`
member for the test's duration (`probe_kind`); the page and its router never look at the enum.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from aiohttp import web

from pipelines.events import Event, EventBody, EventKind
from realtime.http.page import Panel
from realtime.service.plugin import Attached, PluginContext, ServicePlugin

NAME = "probe"
# Made without the enum's metaclass: EventKind(PROBE) is PROBE; EventKind("probe") while registered.
PROBE = str.__new__(EventKind, NAME)
PROBE._name_ = NAME.upper()
PROBE._value_ = NAME


@contextlib.contextmanager
def probe_kind() -> Iterator[EventKind]:
    EventKind._value2member_map_[NAME] = PROBE
    try:
        yield PROBE
    finally:
        del EventKind._value2member_map_[NAME]


@dataclass(frozen=True, slots=True)
class ProbeBody(EventBody):
    kind: ClassVar[EventKind] = PROBE
    text: str

    def fields(self) -> dict[str, Any]:
        return {"text": self.text}


def attach(ctx: PluginContext) -> Attached:
    fanout = ctx.http.fanout

    async def publish(request: web.Request) -> web.Response:
        # The stream's events as its pipeline would hand them on: to NATS, SSE viewers and DataChannels.
        body = await request.json()
        await fanout.publish(Event(request.match_info["stream_id"], None, time.time(), ProbeBody(str(body["text"]))))
        return web.json_response({"published": True}, status=202)

    def routes(app: web.Application) -> None:
        app.router.add_post("/api/probe/{stream_id}", publish)

    return Attached(routes=routes)


PANEL = Panel(NAME, "Probe", Path(__file__).with_name("probe.js"), kinds=(NAME,))

PLUGIN = ServicePlugin(NAME, attach, panels=(PANEL,))
