"""What of an event the timeline keeps: one searchable entry per event worth finding again.

An entry is the event's words (what was said, what the VLM saw, why an alert fired, which
object came and went) plus what a hit needs to point at the moment: the stream, its media time
span, the wall time, and per kind a little more (a caption's word times, so a hit lands on the
word that matched; a clip's span, so any hit inside it links to the video). Everything else of
the event stays in JetStream. Tracks are kept once, when they end, as a summary: their updates
would drown every other kind.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pipelines.event_bodies import caption_event_id
from pipelines.events import EventKind
from realtime.errors import ServiceError

INDEXED_KINDS: tuple[EventKind, ...] = (
    EventKind.CAPTIONS,
    EventKind.DESCRIPTIONS,
    EventKind.ALERTS,
    EventKind.TRACKS,
    EventKind.CLIPS,
)
# Read as well: an utterance's transcript replaces the entries of the captions it names, as a
# captions entry (kind filters and links are the same).
CONSUMED_KINDS: tuple[EventKind, ...] = (*INDEXED_KINDS, EventKind.TRANSCRIPT)
MAX_TEXT_CHARS = 8192  # one entry's searchable text; a longer description is cut, not refused
MAX_WORDS = 2000


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
    build = _BUILDERS.get(kind_)
    if build is None:
        raise NotIndexed(f"kind {kind!r}")
    try:
        stream_id = str(body["stream_id"])
        wall = _epoch(body["captured_at"])
        pts = _number(body.get("pts"))
        text, start, end, extra = build(body, pts)
        replaces = _replaced(stream_id, body) if kind_ is EventKind.TRANSCRIPT else ()
    except (KeyError, TypeError, ValueError) as exc:
        raise NotIndexed(f"{kind} event {event_id}: unreadable body ({exc.__class__.__name__}: {exc})") from None
    text = " ".join(text.split())[:MAX_TEXT_CHARS]
    if not text:
        raise NotIndexed(f"{kind} event {event_id}: no text")
    return Entry(event_id, stream_id, _ENTRY_KINDS.get(kind_, kind_), start, end, wall, text, extra, replaces)


Built = tuple[str, float | None, float | None, dict[str, Any]]


def _caption(body: Mapping[str, Any], pts: float | None) -> Built:
    words = [
        ("".join(str(w["word"]).split()), float(w["start"]), float(w["end"]))
        for w in list(body.get("words") or ())[:MAX_WORDS] if str(w["word"]).strip()
    ]
    # The text is the words joined by spaces, so a hit's position in it names the word, and `times`
    # (each word's start and end, media seconds) its moment. Times only: the words are the text.
    text = " ".join(w[0] for w in words) if words else str(body["text"])
    times = [[round(start, 3), round(end, 3)] for _, start, end in words]
    return text, _number(body.get("start")), _number(body.get("end")), {"times": times}


def _transcript(body: Mapping[str, Any], pts: float | None) -> Built:
    text, start, end, extra = _caption(body, pts)
    return text, start, end, extra | {"transcript": True}


def _replaced(stream_id: str, body: Mapping[str, Any]) -> tuple[str, ...]:
    return tuple(caption_event_id(stream_id, str(s)) for s in list(body.get("replaces") or ())[:MAX_WORDS])


def _description(body: Mapping[str, Any], pts: float | None) -> Built:
    parts = [str(body["text"])]
    fields = body.get("fields")
    if isinstance(fields, Mapping):  # structured output: its values are words too ("people": 3)
        parts += [f"{key} {value}" for key, value in fields.items() if isinstance(value, str | int | float)]
    start = _number(body.get("window_start_pts"))
    end = _number(body.get("window_end_pts"))
    return ". ".join(parts), start if start is not None else pts, end if end is not None else pts, {}


def _alert(body: Mapping[str, Any], pts: float | None) -> Built:
    evidence = body.get("evidence") if isinstance(body.get("evidence"), Mapping) else {}
    assert isinstance(evidence, Mapping)
    state = "started" if body.get("event") == "start" else "ended"
    words = [f"alert {body.get('rule_id')} {state}", f"rule {body.get('rule_type')}"]
    if body.get("class"):
        words.append(str(body["class"]))
    for key in ("question", "reason", "answer"):  # a VLM check says why in its own words
        if isinstance(evidence.get(key), str):
            words.append(evidence[key])
    start = _number(body.get("started_pts"))
    end = _number(body.get("ended_pts"))
    extra = {"alert_id": str(body.get("alert_id")), "rule_id": str(body.get("rule_id")), "event": body.get("event")}
    if isinstance(body.get("snapshot"), str):
        extra["snapshot"] = body["snapshot"]  # the frame it fired on (the snapshot store's reference)
    return ". ".join(words), start if start is not None else pts, end, extra


def _track(body: Mapping[str, Any], pts: float | None) -> Built:
    if body.get("event") != "end":
        raise NotIndexed("a track update (tracks are kept when they end)")
    first, last = _number(body.get("first_seen_pts")), _number(body.get("last_seen_pts"))
    seen = f"{last - first:.0f} s" if first is not None and last is not None else "briefly"
    text = f"{body.get('class')} track {body.get('track_id')} seen for {seen}"
    if body.get("reason"):
        text += f", {body['reason']}"
    return text, first, last, {"track_id": body.get("track_id")}


def _clip(body: Mapping[str, Any], pts: float | None) -> Built:
    clip_id = str(body["clip_id"])
    alerts = [str(a) for a in body.get("alert_ids") or ()]
    text = f"clip of {body.get('duration_s')} s" + (f" for alert {' '.join(alerts)}" if alerts else "")
    return text, _number(body.get("start_pts")), _number(body.get("end_pts")), {"clip_id": clip_id}


_BUILDERS = {
    EventKind.CAPTIONS: _caption,
    EventKind.TRANSCRIPT: _transcript,
    EventKind.DESCRIPTIONS: _description,
    EventKind.ALERTS: _alert,
    EventKind.TRACKS: _track,
    EventKind.CLIPS: _clip,
}


def _number(value: Any) -> float | None:
    if value is None or isinstance(value, bool):
        return None
    number = float(value)
    return number if math.isfinite(number) else None

_ENTRY_KINDS = {EventKind.TRANSCRIPT: EventKind.CAPTIONS}


def _epoch(value: Any) -> float:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    return datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()
