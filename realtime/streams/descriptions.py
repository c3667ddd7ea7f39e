"""The newest scene description of every stream, for `GET /api/streams/{id}/description`.

Fed by a tap on the fan-out with every event the streams publish; one description per stream,
replaced by the next and dropped with the stream, so it never grows past the streams running.
A viewer that opens a stream sees what it looks like now without waiting for the next one.
"""

from __future__ import annotations

from typing import Any

from pipelines.event_bodies import DescriptionBody
from pipelines.events import Event


class LatestDescriptions:
    def __init__(self) -> None:
        self._latest: dict[str, dict[str, Any]] = {}

    def tap(self, event: Event) -> None:
        if isinstance(event.body, DescriptionBody):  # as the API shows it: the wire's fields
            self._latest[event.stream_id] = {**event.data, "pts": event.pts, "captured_at": event.captured_at}

    def get(self, stream_id: str) -> dict[str, Any] | None:
        return self._latest.get(stream_id)

    def forget(self, stream_id: str) -> None:
        self._latest.pop(stream_id, None)
