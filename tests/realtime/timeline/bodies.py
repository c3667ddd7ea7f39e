"""Event bodies as the service publishes them (the real builders and the real CloudEvents encoding)."""

from __future__ import annotations

import json
from typing import Any

from pipelines.clips.stage import clip_event
from pipelines.clips.store import ClipInfo
from pipelines.event_bodies import caption_event, description_event, transcript_event
from pipelines.events import Event
from realtime.bus.cloudevents import encode


def wire(event: Event, *, published_at: float | None = None) -> tuple[str, str, dict[str, Any]]:
    """(event id, kind, body) as a consumer reads them off NATS."""
    payload, headers = encode(event, "test", published_at if published_at is not None else event.captured_at)
    return headers["ce-id"], event.kind.value, json.loads(payload)


def caption(stream: str, segment: str, text: str, start: float, *, at: float, step: float = 0.4) -> Event:
    words = [(f" {w}", start + i * step, start + i * step + step * 0.8, 0.9) for i, w in enumerate(text.split())]
    return caption_event(stream, segment_id=segment, words=words, language="en", model="tiny.en", captured_at=at)


def transcript(stream: str, utterance: str, replaces: list[str], text: str, start: float, *, at: float) -> Event:
    words = [(f" {w}", start + i * 0.4, start + i * 0.4 + 0.32, 0.9) for i, w in enumerate(text.split())]
    return transcript_event(stream, utterance_id=utterance, replaces=replaces, words=words, start=start,
                            end=words[-1][2], revised=True, changed=True, language="en", model="tiny.en",
                            captured_at=at)


def description(stream: str, text: str, start: float, end: float, *, at: float) -> Event:
    return description_event(stream, text=text, fields=None, window_start_pts=start, window_end_pts=end, frames=4,
                             epoch=0, prompt_tokens=100, cached_tokens=80, latency_ms=120.0, model="sim",
                             captured_at=at)


def clip(stream: str, clip_id: str, start: float, end: float, *, at: float) -> Event:
    info = ClipInfo(clip_id, stream, start, end, end - start, 1000, "h264", 640, 480, ("a1",), at)
    return clip_event(info, captured_at=at)
