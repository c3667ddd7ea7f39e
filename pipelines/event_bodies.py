"""Per-kind JSON bodies (the `data` of an Event). Field names are part of the contract."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from engines.types import Detections
from pipelines.events import Event, EventKind
from pipelines.frames import FrameResult, StatusChange
from pipelines.rules.types import AlertChange
from pipelines.tracker import TrackEvent


def _box(values: Any) -> list[float]:
    return [round(float(v), 1) for v in values]


def class_name(names: Mapping[int, str], class_id: int) -> str:
    return names.get(class_id, str(class_id))


def detections_event(
    result: FrameResult,
    track_ids: Sequence[int | None],
    names: Mapping[int, str],
    *,
    model: str,
    backend: str,
    batch_size: int,
) -> Event:
    dets: Detections = result.detections
    objects: list[dict[str, Any]] = [
        {
            "class": class_name(names, int(dets.class_ids[i])),
            "class_id": int(dets.class_ids[i]),
            "score": round(float(dets.scores[i]), 4),
            "box": _box(dets.boxes[i]),
            "track_id": track_ids[i],
        }
        for i in range(len(dets))
    ]
    if result.predicted:  # a frame the model skipped: every box is the tracker's prediction
        for obj in objects:
            obj["predicted"] = True
    return Event(
        kind=EventKind.DETECTIONS,
        stream_id=result.stream_id,
        pts=result.pts,
        captured_at=result.captured_at,
        data={
            "frame_seq": result.frame_seq,
            "width": result.width,
            "height": result.height,
            "model": model,
            "backend": backend,
            "inference_ms": round(result.inference_ms, 2),
            "batch_size": batch_size,
            "inference": "predicted" if result.predicted else "measured",
            "objects": objects,
        },
    )


def track_event(
    stream_id: str, change: TrackEvent, names: Mapping[int, str], *, pts: float, captured_at: float
) -> Event:
    data: dict[str, Any] = {
        "event": change.kind.value,
        "track_id": change.track_id,
        "class": class_name(names, change.class_id),
        "class_id": change.class_id,
        "score": round(change.score, 4),
        "box": _box(change.box),
        "first_seen_pts": round(change.first_seen_pts, 3),
        "last_seen_pts": round(change.last_seen_pts, 3),
        "duration_s": round(change.last_seen_pts - change.first_seen_pts, 3),
        "hits": change.hits,
    }
    if change.changed:
        data["changed"] = list(change.changed)
    if change.reason:
        data["reason"] = change.reason
    return Event(kind=EventKind.TRACKS, stream_id=stream_id, pts=pts, captured_at=captured_at, data=data)


def status_event(change: StatusChange, *, source: str) -> Event:
    return Event(
        kind=EventKind.STATUS,
        stream_id=change.stream_id,
        pts=None,
        captured_at=change.at,
        data={
            "state": change.state.value,
            "previous": change.previous.value if change.previous else None,
            "reason": change.reason,
            "attempt": change.attempt,
            "retry_in": change.retry_in,
            "source": source,
        },
    )


def alert_event(stream_id: str, change: AlertChange, *, captured_at: float, snapshot: str | None) -> Event:
    """`start` when a rule fires, `end` when it clears; both carry the alert's stable id.

    The event id is derived from the alert id, so a start or end published twice (a retry,
    a replay) is dropped by JetStream's duplicate window instead of reaching subscribers twice.
    """
    data: dict[str, Any] = {
        "alert_id": change.alert_id,
        "rule_id": change.rule_id,
        "rule_type": change.rule_type,
        "event": change.kind.value,
        "severity": change.severity,
        "track_ids": list(change.track_ids),
        "class": change.class_name,
        "evidence": dict(change.evidence),
        "started_pts": round(change.started_pts, 3),
    }
    if change.ended_pts is not None:
        data["ended_pts"] = round(change.ended_pts, 3)
    if change.duration_s is not None:
        data["duration_s"] = change.duration_s
    data["snapshot"] = snapshot
    return Event(
        kind=EventKind.ALERTS,
        stream_id=stream_id,
        pts=change.pts,
        captured_at=captured_at,
        data=data,
        id=f"alert-{change.alert_id}-{change.kind.value}",
    )


def partial_event(
    stream_id: str, *, segment_id: str, text: str, start: float, end: float, revision: int, captured_at: float
) -> Event:
    """Tentative text of the caption segment `segment_id`; a higher `revision` replaces it."""
    return Event(
        kind=EventKind.PARTIALS,
        stream_id=stream_id,
        pts=start,
        captured_at=captured_at,
        data={
            "segment_id": segment_id,
            "text": text,
            "start": round(start, 3),
            "end": round(end, 3),
            "revision": revision,
        },
    )


def caption_event_id(stream_id: str, segment_id: str) -> str:
    return f"caption-{stream_id}-{segment_id}"


TimedWords = Sequence[tuple[str, float, float, float]]  # (word, start, end, probability), media seconds


def _spoken(words: TimedWords, start: float, end: float) -> dict[str, Any]:
    """The fields captions and transcripts share: the text, its span and each word's times."""
    return {
        "text": "".join(w[0] for w in words).strip(),
        "start": round(start, 3),
        "end": round(end, 3),
        "words": [
            {"word": w[0].strip(), "start": round(w[1], 3), "end": round(w[2], 3), "probability": round(w[3], 3)}
            for w in words
        ],
    }


def caption_event(
    stream_id: str,
    *,
    segment_id: str,
    words: TimedWords,
    language: str,
    model: str,
    captured_at: float,
) -> Event:
    """Final text of the caption segment `segment_id`: never changed afterwards."""
    start, end = words[0][1], words[-1][2]
    return Event(
        kind=EventKind.CAPTIONS,
        stream_id=stream_id,
        pts=start,
        captured_at=captured_at,
        data={
            "segment_id": segment_id,
            **_spoken(words, start, end),
            "language": language,
            "model": model,
        },
        id=caption_event_id(stream_id, segment_id),
    )


def transcript_event(
    stream_id: str,
    *,
    utterance_id: str,
    replaces: Sequence[str],
    words: TimedWords,
    start: float,
    end: float,
    revised: bool,
    changed: bool,
    language: str,
    model: str,
    captured_at: float,
) -> Event:
    """An utterance (or a piece of a long one) as kept: decoded whole once it ended, replacing the
    caption segments `replaces` wherever captions are read back."""
    return Event(
        kind=EventKind.TRANSCRIPT,
        stream_id=stream_id,
        pts=start,
        captured_at=captured_at,
        data={
            "utterance_id": utterance_id,
            **_spoken(words, start, end),
            "replaces": list(replaces),
            "revised": revised,
            "changed": changed,
            "language": language,
            "model": model,
        },
        id=f"transcript-{stream_id}-{utterance_id}",
    )


def description_event(
    stream_id: str,
    *,
    text: str,
    fields: Mapping[str, Any] | None,
    window_start_pts: float | None,
    window_end_pts: float | None,
    frames: int,
    epoch: int,
    prompt_tokens: int,
    cached_tokens: int | None,
    latency_ms: float,
    model: str,
    captured_at: float,
) -> Event:
    """A scene description of the stream's recent frames (and what was said), from the VLM.
    `captured_at` is that of the newest frame it saw; `cached_tokens` is None when the server
    does not report it."""

    def rounded(pts: float | None) -> float | None:
        return None if pts is None else round(pts, 3)

    return Event(
        kind=EventKind.DESCRIPTIONS,
        stream_id=stream_id,
        pts=rounded(window_end_pts),
        captured_at=captured_at,
        data={
            "text": text,
            "fields": dict(fields) if fields is not None else None,
            "window_start_pts": rounded(window_start_pts),
            "window_end_pts": rounded(window_end_pts),
            "frames": frames,
            "epoch": epoch,
            "prompt_tokens": prompt_tokens,
            "cached_tokens": cached_tokens,
            "latency_ms": round(latency_ms, 1),
            "model": model,
        },
    )
