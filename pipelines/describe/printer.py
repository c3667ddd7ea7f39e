"""What `vidsentry run` prints of the scene descriptions: each one, as it comes, and their count."""

from __future__ import annotations

from pipelines.event_bodies import DescriptionBody
from pipelines.events import Event


class DescriptionLines:
    def __init__(self) -> None:
        self.descriptions = 0

    def see(self, event: Event) -> list[str]:
        if not isinstance(event.body, DescriptionBody):
            return []
        self.descriptions += 1
        return [f"[{event.stream_id} {event.pts or 0.0:7.1f}s] (scene) {event.body.text}"]

    def flush(self) -> list[str]:
        return []

    def counts(self) -> dict[str, int]:
        return {"descriptions": self.descriptions}
