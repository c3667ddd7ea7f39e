"""The sink a fleet-owned stream publishes through: events pass only while this worker's lease
on the stream is valid, and carry its fencing token.

Past the lease's validity (a renewal failed, the process was paused, NATS was unreachable)
every event is dropped at once, before it reaches NATS or a viewer: the stream is stopped
within one renewal interval, but nothing it makes meanwhile goes out as the owner's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from pipelines.events import Event, EventSink


class FencedSink:
    """One run's sink: bound to the lease the run started under, so a run still stopping after
    its stream was lost and taken back never publishes under the newer lease."""

    def __init__(self, sink: EventSink, token: Callable[[], int | None], on_fenced: Callable[[], None]) -> None:
        self._sink = sink
        self._token = token  # the lease's fencing token while it is valid, else None
        self._bound = token()
        self._on_fenced = on_fenced

    async def publish(self, event: Event) -> None:
        token = self._token()
        if token is None or token != self._bound:
            self._on_fenced()
            return
        # On the wire as the body's `lease_revision` and the `ce-leaserev` header (realtime.bus.cloudevents).
        await self._sink.publish(dataclasses.replace(event, lease=token))
