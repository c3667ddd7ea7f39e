"""Events as the pipelines produce them, before the bus wraps them in CloudEvents.

Between stages an event's body is typed (one dataclass per kind, `pipelines.event_bodies`): a
stage reads `event.body` narrowed with `isinstance`, never a dict whose keys it must remember.
The JSON object is made once, at the bus edge (`realtime.bus.cloudevents.encode`), from
`Event.data`; field names and their order there are the wire contract (docs/events.md).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, ClassVar, Protocol


class EventKind(StrEnum):
    DETECTIONS = "detections"
    TRACKS = "tracks"
    ALERTS = "alerts"
    PARTIALS = "partials"
    CAPTIONS = "captions"
    TRANSCRIPT = "transcript"
    DESCRIPTIONS = "descriptions"
    STATUS = "status"
    CLIPS = "clips"


class Delivery(StrEnum):
    """What a reader that falls behind (a browser's DataChannel, an SSE client) may skip."""

    LATEST = "latest"  # a newer event makes a waiting one worthless: only the newest waits
    EVERY = "every"  # each one counts, but it may be dropped (counted) when the reader is far behind
    CRITICAL = "critical"  # never dropped while the reader reads


@dataclass(frozen=True, slots=True)
class KindSpec:
    """One declaration per event kind: the bus, the DataChannel and the run summary read these."""

    kind: EventKind
    durable: bool  # must survive a subscriber or broker outage: JetStream, acked, kept in the outbox
    delivery: Delivery


KINDS: Mapping[EventKind, KindSpec] = {
    spec.kind: spec
    for spec in (
        KindSpec(EventKind.DETECTIONS, durable=False, delivery=Delivery.LATEST),
        KindSpec(EventKind.TRACKS, durable=True, delivery=Delivery.EVERY),
        KindSpec(EventKind.ALERTS, durable=True, delivery=Delivery.CRITICAL),
        KindSpec(EventKind.PARTIALS, durable=False, delivery=Delivery.LATEST),
        KindSpec(EventKind.CAPTIONS, durable=True, delivery=Delivery.CRITICAL),
        KindSpec(EventKind.TRANSCRIPT, durable=True, delivery=Delivery.CRITICAL),
        KindSpec(EventKind.DESCRIPTIONS, durable=True, delivery=Delivery.EVERY),
        KindSpec(EventKind.STATUS, durable=True, delivery=Delivery.EVERY),
        KindSpec(EventKind.CLIPS, durable=True, delivery=Delivery.EVERY),
    )
}


def kinds_where(*, durable: bool | None = None, delivery: Delivery | None = None) -> frozenset[EventKind]:
    return frozenset(
        k for k, spec in KINDS.items()
        if (durable is None or spec.durable == durable) and (delivery is None or spec.delivery is delivery)
    )


DURABLE_KINDS: frozenset[EventKind] = kinds_where(durable=True)


# In a fleet, events carry the revision at which their worker took the stream's lease; larger is newer.
LEASE_FIELD = "lease_revision"


def new_event_id() -> str:
    return uuid.uuid4().hex


class EventBody:
    """One kind's body. Subclasses are frozen dataclasses whose fields are what stages read;
    `fields()` is the JSON object on the wire, in the contract's order."""

    __slots__ = ()
    kind: ClassVar[EventKind]

    def fields(self) -> dict[str, Any]:
        raise NotImplementedError


@dataclass(frozen=True, slots=True)
class Event:
    stream_id: str
    pts: float | None  # media seconds; None for events not tied to media (e.g. status)
    captured_at: float  # wall-clock epoch seconds the underlying media reached the service
    body: EventBody
    id: str = field(default_factory=new_event_id)
    lease: int | None = None  # a fleet stream's fencing token (realtime.fleet), set as it goes out

    @property
    def kind(self) -> EventKind:
        return self.body.kind

    @property
    def durable(self) -> bool:
        return self.kind in DURABLE_KINDS

    @property
    def data(self) -> dict[str, Any]:
        """The body as the JSON object on the wire (made on each call: the bus edge reads it once)."""
        fields = self.body.fields()
        if self.lease is not None:
            fields[LEASE_FIELD] = self.lease
        return fields


class EventSink(Protocol):
    """Where pipelines hand events; `realtime` provides the NATS implementation.

    `publish` must not block the event loop for long: implementations queue and return.
    """

    async def publish(self, event: Event) -> None: ...
