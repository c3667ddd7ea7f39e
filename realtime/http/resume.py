"""What a viewer reconnecting with `Last-Event-ID` missed: the durable events after that id.

Only durable kinds (tracks, alerts, status, captions, descriptions) can be resumed; live-only
ones (detections, partials) are gone once sent. The source is JetStream (`history.py`), bounded
by `http.sse_resume_window_s` and `http.sse_resume_max_events`, topped up from the fan-out's
recent durable events that the broker has not stored yet; without JetStream (an outage) the
recent events alone serve an id among them. The viewer is registered before any of this is
read, so what is published meanwhile waits in its queue, and whatever was replayed is skipped
there (`sent`): no gap, no duplicate.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from typing import Any

from pipelines.events import Event
from realtime.http.history import HistoryUnavailable, JetStreamHistory, Scan
from realtime.streams.fanout import EventFanout, SseMessage

log = logging.getLogger(__name__)

_EVENT_ID = re.compile(r"[!-~]{1,256}")  # what cloudevents.encode accepts as an id


@dataclass(frozen=True, slots=True)
class ResumeSettings:
    window_s: float = 600.0  # http.sse_resume_window_s; 0: off
    max_events: int = 1000  # http.sse_resume_max_events


@dataclass(slots=True)
class Resumed:
    messages: list[SseMessage] = field(default_factory=list)
    sent: set[str] = field(default_factory=set)  # ids replayed; the live queue skips them
    summary: dict[str, Any] = field(default_factory=dict)  # the `resume` event's data


async def resume(
    last_id: str,
    stream_id: str,
    *,
    recent: list[Event],
    fanout: EventFanout,
    history: JetStreamHistory | None,
    settings: ResumeSettings,
) -> Resumed:
    """The durable events after `last_id`; `recent` is the fan-out's snapshot taken when the viewer
    was registered (so anything newer is in the viewer's queue)."""
    summary: dict[str, Any] = {"last_event_id": last_id[:256], "found": False, "replayed": 0, "skipped": 0}
    if settings.window_s <= 0 or settings.max_events <= 0:
        return Resumed(summary={**summary, "reason": "resuming is off (http.sse_resume_window_s)"})
    if not _EVENT_ID.fullmatch(last_id):
        return Resumed(summary={**summary, "reason": "not an event id"})
    recent_ids = [event.id for event in recent]
    scan: Scan | None = None
    if history is not None:
        try:
            scan = await history.after(
                stream_id, last_id, window_s=settings.window_s, max_events=settings.max_events, watch=set(recent_ids)
            )
        except HistoryUnavailable as exc:
            log.warning("resume without JetStream", extra={"stream_id": stream_id, "reason": str(exc)})
            summary["history"] = str(exc)

    # The recent events to add: those after last_id (all of them when it is older than the ring),
    # less the ones JetStream already gave.
    position = recent_ids.index(last_id) + 1 if last_id in recent_ids else 0
    messages: list[SseMessage]
    if scan is not None and scan.found:
        extra = [e for e in recent[position:] if e.id not in scan.stored]
        messages = scan.messages + [fanout.message(e) for e in extra]
        skipped = scan.skipped
    elif position:
        messages = [fanout.message(e) for e in recent[position:]]
        skipped = 0
    else:
        reason = f"not among the stream's durable events of the last {settings.window_s:g} s"
        return Resumed(summary={**summary, "reason": reason})
    if len(messages) > settings.max_events:
        skipped += len(messages) - settings.max_events
        messages = messages[-settings.max_events :]
    summary.update(found=True, replayed=len(messages), skipped=skipped)
    return Resumed(messages, {m.id for m in messages if m.id}, summary)
