"""Events with free-form bodies, for tests of what carries events (the bus, fan-out, DataChannel),
where the body's kind matters and its fields do not. Stages and their tests use the typed bodies
of `pipelines.event_bodies`; `alert_event` is one such, for what follows alerts' starts and ends
(the fan-out's open alerts, the event stream)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from pipelines.event_bodies import AlertBody
from pipelines.events import Event, EventBody, EventKind, new_event_id


@dataclass(frozen=True, slots=True)
class AnyBody(EventBody):
    kind: EventKind  # type: ignore[misc]  # an instance's kind, where real bodies fix it per class
    values: dict[str, Any] = field(default_factory=dict)

    def fields(self) -> dict[str, Any]:
        return dict(self.values)


def any_event(
    kind: EventKind,
    stream_id: str = "cam1",
    data: dict[str, Any] | None = None,
    *,
    pts: float | None = 1.0,
    captured_at: float | None = None,
    id: str | None = None,
) -> Event:
    return Event(
        stream_id=stream_id,
        pts=pts,
        captured_at=time.time() if captured_at is None else captured_at,
        body=AnyBody(kind, dict(data or {})),
        id=id or new_event_id(),
    )


def alert_event(stream_id: str, alert_id: str, event: str, *, captured_at: float | None = None) -> Event:
    """A typed alert's `start` or `end` (one rule, one person)."""
    ended = event == "end"
    body = AlertBody(
        alert_id=alert_id, rule_id="someone", rule_type="present", event=event, severity="critical", track_ids=(1,),
        class_name="person", evidence={}, started_pts=1.0, ended_pts=2.0 if ended else None,
        duration_s=1.0 if ended else None, snapshot=None,
    )
    return Event(stream_id=stream_id, pts=1.0, captured_at=time.time() if captured_at is None else captured_at,
                 body=body)
