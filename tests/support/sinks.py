"""An event sink that keeps what it is given: a stage's or a service's events, read back in tests."""

from __future__ import annotations

from pipelines.events import Event, EventKind


class ListSink:
    def __init__(self) -> None:
        self.events: list[Event] = []

    async def publish(self, event: Event) -> None:
        self.events.append(event)

    def kinds(self, kind: EventKind) -> list[Event]:
        return [e for e in self.events if e.kind is kind]
