"""Events as the pipelines produce them, before the bus wraps them in CloudEvents."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol


class EventKind(StrEnum):
    DETECTIONS = "detections"
    TRACKS = "tracks"
    ALERTS = "alerts"
    PARTIALS = "partials"
    CAPTIONS = "captions"
    DESCRIPTIONS = "descriptions"
    STATUS = "status"


# Kinds that must survive a subscriber or broker outage: JetStream, acked.
DURABLE_KINDS: frozenset[EventKind] = frozenset(
    {EventKind.TRACKS, EventKind.ALERTS, EventKind.CAPTIONS, EventKind.DESCRIPTIONS, EventKind.STATUS}
)


def new_event_id() -> str:
    return uuid.uuid4().hex


@dataclass(frozen=True, slots=True)
class Event:
    kind: EventKind
    stream_id: str
    pts: float | None  # media seconds; None for events not tied to media (e.g. status)
    captured_at: float  # wall-clock epoch seconds the underlying media reached the service
    data: Mapping[str, Any]  # per-kind body fields (JSON-serialisable)
    id: str = field(default_factory=new_event_id)

    @property
    def durable(self) -> bool:
        return self.kind in DURABLE_KINDS


class EventSink(Protocol):
    """Where pipelines hand events; `realtime` provides the NATS implementation.

    `publish` must not block the event loop for long: implementations queue and return.
    """

    async def publish(self, event: Event) -> None: ...
