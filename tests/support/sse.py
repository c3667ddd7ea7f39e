"""Reading a server-sent event stream in tests, as a browser's EventSource would: one dict per
event with its `event` name (`message` when the server names none), its `data` parsed as JSON
and its `id` when it has one; comments and a bare `retry:` are not events."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp


async def sse_events(response: aiohttp.ClientResponse) -> AsyncIterator[dict[str, Any]]:
    """The response's events as they arrive, until it ends."""
    event: dict[str, Any] = {}
    async for raw in response.content:
        line = raw.decode().rstrip("\n")
        if not line:
            if "event" in event or "data" in event:
                yield {"event": "message", **event}
            event = {}
        elif not line.startswith(":"):
            name, _, value = line.partition(": ")
            event[name] = json.loads(value) if name == "data" else value


async def read_sse(response: aiohttp.ClientResponse, into: list[dict[str, Any]]) -> None:
    """Append the response's events to `into` until it ends (run it as a task beside the test)."""
    async for event in sse_events(response):
        into.append(event)
