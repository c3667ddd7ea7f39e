"""What of an event the timeline keeps: one searchable entry per event worth finding again.

An entry is the event's words (what was said, what the VLM saw, why an alert fired, which
object came and went) plus what a hit needs to point at the moment: the stream, its media time
span, the wall time, and per kind a little more (a caption's word times, so a hit lands on the
word that matched; a clip's span, so any hit inside it links to the video). Everything else of
the event stays in JetStream. Tracks are kept once, when they end, as a summary: their updates
would drown every other kind.

What is kept of each kind is its body's declaration (`EventBody.search`, in the package that
declares the kind), read here from the stored wire body: a capability's kind is searchable without
an edit here, and the kinds the timeline reads are those whose bodies say how.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pipelines.event_bodies import search_number
from pipelines.events import KINDS, EventKind, body_of
from realtime.errors import ServiceError

MAX_TEXT_CHARS = 8192  # one entry's searchable text; a longer description is cut, not refused


def consumed_kinds() -> tuple[EventKind, ...]:
    """The kinds the timeline reads: those whose bodies say what of them is kept."""
    return tuple(kind for kind in KINDS if body_of(kind).searched())


def indexed_kinds() -> tuple[EventKind, ...]:
    """The kinds a search may filter on: those read, less those found as another kind (a
    transcript is found as captions)."""
    return tuple(kind for kind in consumed_kinds() if not _found_as_other(kind))


def _found_as_other(kind: EventKind) -> bool:
    return body_of(kind).found_as not in (None, kind)


@dataclass(frozen=True, slots=True)
class Entry:
    event_id: str
    stream_id: str
    kind: EventKind
    pts: float | None  # media seconds where it starts
    end_pts: float | None
    wall: float  # epoch seconds the media reached the service
    text: str
    extra: Mapping[str, Any]  # per kind: `times` (captions' words), `clip_id` (clips), `alert_id`, ...
    replaces: tuple[str, ...] = ()  # a transcript's: the event ids of the captions it replaces


class NotIndexed(ServiceError):
    """An event the timeline skips (a kind it does not keep, a track update, a body it cannot read)."""


def entry_of(event_id: str, kind: str, body: Mapping[str, Any]) -> Entry:
    """The entry for one event as it was published (the CloudEvents body: data + envelope fields);
    NotIndexed when the event is not one to keep."""
    try:
        kind_ = EventKind(kind)
    except ValueError:
        raise NotIndexed(f"kind {kind!r}") from None
    declared = body_of(kind_)
    if not declared.searched():
        raise NotIndexed(f"kind {kind!r}")
    try:
        stream_id = str(body["stream_id"])
        wall = _epoch(body["captured_at"])
        found = declared.search(body, stream_id=stream_id, pts=search_number(body.get("pts")))
    except (KeyError, TypeError, ValueError) as exc:
        raise NotIndexed(f"{kind} event {event_id}: unreadable body ({exc.__class__.__name__}: {exc})") from None
    if found is None:
        raise NotIndexed(f"{kind} event {event_id}: not kept (its body says so: a track update, say)")
    text = " ".join(found.text.split())[:MAX_TEXT_CHARS]
    if not text:
        raise NotIndexed(f"{kind} event {event_id}: no text")
    as_kind = EventKind(declared.found_as) if declared.found_as is not None else kind_
    return Entry(event_id, stream_id, as_kind, found.start, found.end, wall, text, found.extra,
                 found.replaces)


def _epoch(value: Any) -> float:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    return datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()
