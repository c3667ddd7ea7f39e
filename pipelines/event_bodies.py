"""Per-kind event bodies: typed between stages, JSON at the bus edge (`Event.data`).

Each body is a frozen dataclass holding the values as they go on the wire (rounded once, here),
and `fields()` lays them out as the contract names and orders them (docs/events.md; the CloudEvents
contract tests compare bytes). Optional fields that are absent on the wire are None or empty here.
The builders below make bodies from what the stages hold (a frame's result, a track's change, an
alert's change, timed words). A kind is declared by its body (`spec`), and a body that is worth
finding again says what the timeline keeps of it (`search`, read from the stored wire body).
`CORE_BODIES` are the kinds every build has; a capability lists its own (pipelines.capability).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from engines.types import Detections
from pipelines.events import Delivery, Event, EventBody, Findable, KindSpec
from pipelines.frames import FrameResult, StatusChange
from pipelines.rules.types import AlertChange
from pipelines.tracker import TrackEvent

Box = tuple[float, float, float, float]  # x1, y1, x2, y2 in source pixels, to 0.1 px


def _box(values: Any) -> Box:
    x1, y1, x2, y2 = (round(float(v), 1) for v in values)
    return (x1, y1, x2, y2)


def _pts(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def class_name(names: Mapping[int, str], class_id: int) -> str:
    return names.get(class_id, str(class_id))


MAX_SEARCH_WORDS = 2000  # words (or replaced ids) of one body the timeline reads; a longer list is cut


def search_number(value: Any) -> float | None:
    """A number of a stored body, for the timeline (None: absent, a bool, or not finite)."""
    if value is None or isinstance(value, bool):
        return None
    number = float(value)
    return number if math.isfinite(number) else None


@dataclass(frozen=True, slots=True)
class DetectedObject:
    class_name: str
    class_id: int
    score: float
    box: Box
    track_id: int | None
    predicted: bool = False  # the tracker's prediction on a frame the model skipped
    mask: Mapping[str, Any] | None = None  # COCO RLE of the object's track (the segmentation stage)
    mask_frame_seq: int | None = None  # the frame that mask was computed on

    def fields(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "class": self.class_name,
            "class_id": self.class_id,
            "score": self.score,
            "box": list(self.box),
            "track_id": self.track_id,
        }
        if self.predicted:
            out["predicted"] = True
        if self.mask is not None:
            out["mask"] = self.mask
            out["mask_frame_seq"] = self.mask_frame_seq
        return out


@dataclass(frozen=True, slots=True)
class DetectionsBody(EventBody):
    spec: ClassVar[KindSpec] = KindSpec("detections", durable=False, delivery=Delivery.LATEST)
    frame_seq: int
    width: int
    height: int
    model: str
    backend: str
    inference_ms: float
    batch_size: int
    inference: Literal["measured", "predicted"]
    objects: tuple[DetectedObject, ...]

    def fields(self) -> dict[str, Any]:
        return {
            "frame_seq": self.frame_seq,
            "width": self.width,
            "height": self.height,
            "model": self.model,
            "backend": self.backend,
            "inference_ms": self.inference_ms,
            "batch_size": self.batch_size,
            "inference": self.inference,
            "objects": [obj.fields() for obj in self.objects],
        }


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
    objects = tuple(
        DetectedObject(
            class_name=class_name(names, int(dets.class_ids[i])),
            class_id=int(dets.class_ids[i]),
            score=round(float(dets.scores[i]), 4),
            box=_box(dets.boxes[i]),
            track_id=track_ids[i],
            predicted=result.predicted,  # a frame the model skipped: every box is the tracker's prediction
        )
        for i in range(len(dets))
    )
    body = DetectionsBody(
        frame_seq=result.frame_seq,
        width=result.width,
        height=result.height,
        model=model,
        backend=backend,
        inference_ms=round(result.inference_ms, 2),
        batch_size=batch_size,
        inference="predicted" if result.predicted else "measured",
        objects=objects,
    )
    return Event(stream_id=result.stream_id, pts=result.pts, captured_at=result.captured_at, body=body)


@dataclass(frozen=True, slots=True)
class TrackBody(EventBody):
    spec: ClassVar[KindSpec] = KindSpec("tracks", durable=True, delivery=Delivery.EVERY)
    event: str  # new | update | end (pipelines.tracker.LifecycleKind)
    track_id: int
    class_name: str
    class_id: int
    score: float
    box: Box
    first_seen_pts: float
    last_seen_pts: float
    duration_s: float
    hits: int
    changed: tuple[str, ...] = ()  # an update: what changed
    reason: str | None = None  # an end: why

    def fields(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "event": self.event,
            "track_id": self.track_id,
            "class": self.class_name,
            "class_id": self.class_id,
            "score": self.score,
            "box": list(self.box),
            "first_seen_pts": self.first_seen_pts,
            "last_seen_pts": self.last_seen_pts,
            "duration_s": self.duration_s,
            "hits": self.hits,
        }
        if self.changed:
            out["changed"] = list(self.changed)
        if self.reason:
            out["reason"] = self.reason
        return out

    @classmethod
    def search(cls, data: Mapping[str, Any], *, stream_id: str, pts: float | None) -> Findable | None:
        if data.get("event") != "end":
            return None  # a track update: tracks are kept when they end
        first, last = search_number(data.get("first_seen_pts")), search_number(data.get("last_seen_pts"))
        seen = f"{last - first:.0f} s" if first is not None and last is not None else "briefly"
        text = f"{data.get('class')} track {data.get('track_id')} seen for {seen}"
        if data.get("reason"):
            text += f", {data['reason']}"
        return Findable(text, first, last, {"track_id": data.get("track_id")})


def track_event(
    stream_id: str, change: TrackEvent, names: Mapping[int, str], *, pts: float, captured_at: float
) -> Event:
    body = TrackBody(
        event=change.kind.value,
        track_id=change.track_id,
        class_name=class_name(names, change.class_id),
        class_id=change.class_id,
        score=round(change.score, 4),
        box=_box(change.box),
        first_seen_pts=round(change.first_seen_pts, 3),
        last_seen_pts=round(change.last_seen_pts, 3),
        duration_s=round(change.last_seen_pts - change.first_seen_pts, 3),
        hits=change.hits,
        changed=tuple(change.changed),
        reason=change.reason,
    )
    return Event(stream_id=stream_id, pts=pts, captured_at=captured_at, body=body)


@dataclass(frozen=True, slots=True)
class StatusBody(EventBody):
    spec: ClassVar[KindSpec] = KindSpec("status", durable=True, delivery=Delivery.EVERY)
    state: str
    previous: str | None
    reason: str | None
    attempt: int
    retry_in: float | None
    source: str

    def fields(self) -> dict[str, Any]:
        return {
            "state": self.state,
            "previous": self.previous,
            "reason": self.reason,
            "attempt": self.attempt,
            "retry_in": self.retry_in,
            "source": self.source,
        }


def status_event(change: StatusChange, *, source: str) -> Event:
    body = StatusBody(
        state=change.state.value,
        previous=change.previous.value if change.previous else None,
        reason=change.reason,
        attempt=change.attempt,
        retry_in=change.retry_in,
        source=source,
    )
    return Event(stream_id=change.stream_id, pts=None, captured_at=change.at, body=body)


@dataclass(frozen=True, slots=True)
class AlertBody(EventBody):
    spec: ClassVar[KindSpec] = KindSpec("alerts", durable=True, delivery=Delivery.CRITICAL)
    alert_id: str
    rule_id: str
    rule_type: str
    event: str  # start | end
    severity: str
    track_ids: tuple[int, ...]
    class_name: str | None
    evidence: Mapping[str, Any]
    started_pts: float
    ended_pts: float | None  # an end only
    duration_s: float | None  # an end only
    snapshot: str | None  # the snapshot's reference, when the rule asked for one and it was stored

    def fields(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "alert_id": self.alert_id,
            "rule_id": self.rule_id,
            "rule_type": self.rule_type,
            "event": self.event,
            "severity": self.severity,
            "track_ids": list(self.track_ids),
            "class": self.class_name,
            "evidence": dict(self.evidence),
            "started_pts": self.started_pts,
        }
        if self.ended_pts is not None:
            out["ended_pts"] = self.ended_pts
        if self.duration_s is not None:
            out["duration_s"] = self.duration_s
        out["snapshot"] = self.snapshot
        return out

    @classmethod
    def search(cls, data: Mapping[str, Any], *, stream_id: str, pts: float | None) -> Findable:
        evidence = data.get("evidence") if isinstance(data.get("evidence"), Mapping) else {}
        assert isinstance(evidence, Mapping)
        state = "started" if data.get("event") == "start" else "ended"
        words = [f"alert {data.get('rule_id')} {state}", f"rule {data.get('rule_type')}"]
        if data.get("class"):
            words.append(str(data["class"]))
        for key in ("question", "reason", "answer"):  # a VLM check says why in its own words
            if isinstance(evidence.get(key), str):
                words.append(evidence[key])
        start = search_number(data.get("started_pts"))
        end = search_number(data.get("ended_pts"))
        extra = {"alert_id": str(data.get("alert_id")), "rule_id": str(data.get("rule_id")), "event": data.get("event")}
        if isinstance(data.get("snapshot"), str):
            extra["snapshot"] = data["snapshot"]  # the frame it fired on (the snapshot store's reference)
        return Findable(". ".join(words), start if start is not None else pts, end, extra)


def alert_event(stream_id: str, change: AlertChange, *, captured_at: float, snapshot: str | None) -> Event:
    """`start` when a rule fires, `end` when it clears; both carry the alert's stable id.

    The event id is derived from the alert id, so a start or end published twice (a retry,
    a replay) is dropped by JetStream's duplicate window instead of reaching subscribers twice.
    """
    body = AlertBody(
        alert_id=change.alert_id,
        rule_id=change.rule_id,
        rule_type=change.rule_type,
        event=change.kind.value,
        severity=change.severity,
        track_ids=tuple(change.track_ids),
        class_name=change.class_name,
        evidence=dict(change.evidence),
        started_pts=round(change.started_pts, 3),
        ended_pts=_pts(change.ended_pts),
        duration_s=change.duration_s,
        snapshot=snapshot,
    )
    return Event(
        stream_id=stream_id,
        pts=change.pts,
        captured_at=captured_at,
        body=body,
        id=f"alert-{change.alert_id}-{change.kind.value}",
    )


@dataclass(frozen=True, slots=True)
class PartialBody(EventBody):
    """Tentative text of the caption segment `segment_id`; a higher `revision` replaces it."""

    spec: ClassVar[KindSpec] = KindSpec("partials", durable=False, delivery=Delivery.LATEST)
    segment_id: str
    text: str
    start: float
    end: float
    revision: int
    language: str = "en"  # as the decode heard it (with captions.language auto: detected)

    def fields(self) -> dict[str, Any]:
        return {"segment_id": self.segment_id, "text": self.text, "start": self.start, "end": self.end,
                "revision": self.revision, "language": self.language}


def partial_event(
    stream_id: str,
    *,
    segment_id: str,
    text: str,
    start: float,
    end: float,
    revision: int,
    captured_at: float,
    language: str = "en",
) -> Event:
    body = PartialBody(segment_id=segment_id, text=text, start=round(start, 3), end=round(end, 3), revision=revision,
                       language=language)
    return Event(stream_id=stream_id, pts=start, captured_at=captured_at, body=body)


def caption_event_id(stream_id: str, segment_id: str) -> str:
    return f"caption-{stream_id}-{segment_id}"


TimedWords = Sequence[tuple[str, float, float, float]]  # (word, start, end, probability), media seconds


@dataclass(frozen=True, slots=True)
class SpokenWord:
    word: str  # without the leading space the recognizer gives it
    start: float
    end: float
    probability: float

    def fields(self) -> dict[str, Any]:
        return {"word": self.word, "start": self.start, "end": self.end, "probability": self.probability}


@dataclass(frozen=True, slots=True)
class Spoken:
    """What captions and transcripts share: the text, its span and each word's times."""

    text: str
    start: float
    end: float
    words: tuple[SpokenWord, ...]

    @classmethod
    def of(cls, words: TimedWords, start: float, end: float) -> Spoken:
        return cls(
            text="".join(w[0] for w in words).strip(),
            start=round(start, 3),
            end=round(end, 3),
            words=tuple(SpokenWord(w[0].strip(), round(w[1], 3), round(w[2], 3), round(w[3], 3)) for w in words),
        )

    def fields(self) -> dict[str, Any]:
        return {"text": self.text, "start": self.start, "end": self.end, "words": [w.fields() for w in self.words]}


@dataclass(frozen=True, slots=True)
class SpokenBody(EventBody):
    """What a caption and a transcript share: the words, their language and the model that heard them."""

    spoken: Spoken
    language: str
    model: str

    @property
    def text(self) -> str:
        return self.spoken.text


@dataclass(frozen=True, slots=True)
class CaptionBody(SpokenBody):
    """Final text of the caption segment `segment_id`: never changed afterwards."""

    spec: ClassVar[KindSpec] = KindSpec("captions", durable=True, delivery=Delivery.CRITICAL)
    segment_id: str

    def fields(self) -> dict[str, Any]:
        return {"segment_id": self.segment_id, **self.spoken.fields(), "language": self.language, "model": self.model}

    @classmethod
    def search(cls, data: Mapping[str, Any], *, stream_id: str, pts: float | None) -> Findable:
        words = [
            ("".join(str(w["word"]).split()), float(w["start"]), float(w["end"]))
            for w in list(data.get("words") or ())[:MAX_SEARCH_WORDS] if str(w["word"]).strip()
        ]
        # The text is the words joined by spaces, so a hit's position in it names the word, and `times`
        # (each word's start and end, media seconds) its moment. Times only: the words are the text.
        text = " ".join(w[0] for w in words) if words else str(data["text"])
        times = [[round(start, 3), round(end, 3)] for _, start, end in words]
        extra: dict[str, Any] = {"times": times}
        if isinstance(data.get("language"), str):
            extra["language"] = data["language"][:8]
        return Findable(text, search_number(data.get("start")), search_number(data.get("end")), extra)


def caption_event(
    stream_id: str,
    *,
    segment_id: str,
    words: TimedWords,
    language: str,
    model: str,
    captured_at: float,
) -> Event:
    start, end = words[0][1], words[-1][2]
    body = CaptionBody(segment_id=segment_id, spoken=Spoken.of(words, start, end), language=language, model=model)
    return Event(stream_id=stream_id, pts=start, captured_at=captured_at, body=body,
                 id=caption_event_id(stream_id, segment_id))


@dataclass(frozen=True, slots=True)
class TranscriptBody(SpokenBody):
    """An utterance (or a piece of a long one) as kept: decoded whole once it ended, replacing the
    caption segments `replaces` wherever captions are read back."""

    spec: ClassVar[KindSpec] = KindSpec("transcript", durable=True, delivery=Delivery.CRITICAL)
    found_as: ClassVar[str | None] = "captions"  # kind filters and links are the captions'
    utterance_id: str
    replaces: tuple[str, ...]
    revised: bool  # False: the whole decode failed or looked wrong, and the finals' words are repeated
    changed: bool  # its words differ from the finals'

    def fields(self) -> dict[str, Any]:
        return {
            "utterance_id": self.utterance_id,
            **self.spoken.fields(),
            "replaces": list(self.replaces),
            "revised": self.revised,
            "changed": self.changed,
            "language": self.language,
            "model": self.model,
        }

    @classmethod
    def search(cls, data: Mapping[str, Any], *, stream_id: str, pts: float | None) -> Findable:
        """Found as the captions it replaces wherever captions are read back (kind filters and links
        are the same)."""
        said = CaptionBody.search(data, stream_id=stream_id, pts=pts)
        replaced = list(data.get("replaces") or ())[:MAX_SEARCH_WORDS]
        replaces = tuple(caption_event_id(stream_id, str(s)) for s in replaced)
        return Findable(said.text, said.start, said.end, {**said.extra, "transcript": True}, replaces)


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
    body = TranscriptBody(
        utterance_id=utterance_id,
        spoken=Spoken.of(words, start, end),
        replaces=tuple(replaces),
        revised=revised,
        changed=changed,
        language=language,
        model=model,
    )
    return Event(stream_id=stream_id, pts=start, captured_at=captured_at, body=body,
                 id=f"transcript-{stream_id}-{utterance_id}")


@dataclass(frozen=True, slots=True)
class TranslationBody(EventBody):
    """English text of one transcript's speech (`captions.translate: en`): the same span of media
    time as the transcript `utterance_id`, decoded again with Whisper's translate task. Speech in
    English is its transcript's text, not decoded again."""

    spec: ClassVar[KindSpec] = KindSpec("translations", durable=True, delivery=Delivery.EVERY)
    utterance_id: str
    text: str
    start: float
    end: float
    language: str  # the track's: "en"
    spoken_language: str  # the transcript's
    model: str

    def fields(self) -> dict[str, Any]:
        return {
            "utterance_id": self.utterance_id,
            "text": self.text,
            "start": self.start,
            "end": self.end,
            "language": self.language,
            "spoken_language": self.spoken_language,
            "model": self.model,
        }

    @classmethod
    def search(cls, data: Mapping[str, Any], *, stream_id: str, pts: float | None) -> Findable:
        extra = {k: str(data[k])[:8] for k in ("language", "spoken_language") if isinstance(data.get(k), str)}
        return Findable(str(data["text"]), search_number(data.get("start")), search_number(data.get("end")),
                        {**extra, "utterance_id": str(data.get("utterance_id", ""))[:64]})


def translation_event(
    stream_id: str,
    *,
    utterance_id: str,
    text: str,
    start: float,
    end: float,
    spoken_language: str,
    model: str,
    captured_at: float,
    language: str = "en",
) -> Event:
    body = TranslationBody(
        utterance_id=utterance_id,
        text=text,
        start=round(start, 3),
        end=round(end, 3),
        language=language,
        spoken_language=spoken_language,
        model=model,
    )
    return Event(stream_id=stream_id, pts=start, captured_at=captured_at, body=body,
                 id=f"translation-{stream_id}-{utterance_id}-{language}")


@dataclass(frozen=True, slots=True)
class DescriptionBody(EventBody):
    """A scene description of the stream's recent frames (and what was said), from the VLM."""

    spec: ClassVar[KindSpec] = KindSpec("descriptions", durable=True, delivery=Delivery.EVERY)
    text: str
    structured: Mapping[str, Any] | None  # the VLM's `fields` answer, when a schema asked for one
    window_start_pts: float | None
    window_end_pts: float | None
    frames: int
    epoch: int
    prompt_tokens: int
    cached_tokens: int | None  # None: the server does not report it
    latency_ms: float
    model: str

    def fields(self) -> dict[str, Any]:
        return {
            "text": self.text,
            "fields": dict(self.structured) if self.structured is not None else None,
            "window_start_pts": self.window_start_pts,
            "window_end_pts": self.window_end_pts,
            "frames": self.frames,
            "epoch": self.epoch,
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens,
            "latency_ms": self.latency_ms,
            "model": self.model,
        }

    @classmethod
    def search(cls, data: Mapping[str, Any], *, stream_id: str, pts: float | None) -> Findable:
        parts = [str(data["text"])]
        fields = data.get("fields")
        if isinstance(fields, Mapping):  # structured output: its values are words too ("people": 3)
            parts += [f"{key} {value}" for key, value in fields.items() if isinstance(value, str | int | float)]
        start = search_number(data.get("window_start_pts"))
        end = search_number(data.get("window_end_pts"))
        return Findable(". ".join(parts), start if start is not None else pts, end if end is not None else pts)


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
    """`captured_at` is that of the newest frame the description saw."""
    body = DescriptionBody(
        text=text,
        structured=dict(fields) if fields is not None else None,
        window_start_pts=_pts(window_start_pts),
        window_end_pts=_pts(window_end_pts),
        frames=frames,
        epoch=epoch,
        prompt_tokens=prompt_tokens,
        cached_tokens=cached_tokens,
        latency_ms=round(latency_ms, 1),
        model=model,
    )
    return Event(stream_id=stream_id, pts=_pts(window_end_pts), captured_at=captured_at, body=body)


# The kinds every build has, whatever its capabilities (the frame loop's and the sources').
CORE_BODIES: tuple[type[EventBody], ...] = (DetectionsBody, TrackBody, AlertBody, StatusBody)
# The captions capability's kinds (pipelines.captions.capability declares them as its own).
CAPTIONS_BODIES: tuple[type[EventBody], ...] = (PartialBody, CaptionBody, TranscriptBody, TranslationBody)
