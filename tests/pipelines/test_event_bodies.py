"""Typed event bodies: one per kind, read by stages as fields, laid out once on the wire."""

from __future__ import annotations

import dataclasses
import json
import sys

import numpy as np
import pytest

from engines.types import Detections
from pipelines import event_bodies
from pipelines.capabilities import CAPABILITIES
from pipelines.event_bodies import DetectedObject, DetectionsBody, caption_event, detections_event
from pipelines.events import KINDS, EventBody, EventKind
from pipelines.frames import FrameResult
from realtime.bus.cloudevents import LEASE_HEADER, encode


def _bodies(cls: type[EventBody]) -> list[type[EventBody]]:
    return [c for sub in cls.__subclasses__() for c in (sub, *_bodies(sub))]


# Every body the build has: the core kinds' (pipelines.event_bodies) and each capability's own
# (imported with the registry, e.g. pipelines.clips.stage.ClipBody); SpokenBody is no kind.
# (A slotted dataclass is a new class: the one the module names is the one that counts.)
BODIES = [c for c in _bodies(EventBody)
          if "kind" in vars(c) and c.__module__.startswith("pipelines.")
          and getattr(sys.modules[c.__module__], c.__qualname__, None) is c]


def detections(*, predicted: bool = False) -> FrameResult:
    dets = Detections(np.array([[10.04, 20.0, 110.26, 220.5], [1, 2, 3, 4]], np.float32),
                      np.array([0.87654, 0.4], np.float32), np.array([0, 7], np.int32))
    return FrameResult(12, "door", 1.5, 1.5, 1_800_000_000.0, 640, 480, dets, inference_ms=21.456, predicted=predicted)


def test_every_kind_has_one_typed_body() -> None:
    assert CAPABILITIES  # the registry imported every capability's package, its bodies with it
    kinds = [body.kind for body in BODIES]
    assert sorted(kinds) == sorted(KINDS)  # each kind once, none without a body
    assert all(dataclasses.is_dataclass(body) and body.__dataclass_params__.frozen for body in BODIES)  # type: ignore[attr-defined]


def test_a_detections_event_with_a_mask_under_a_lease_has_the_contracts_bytes() -> None:
    event = detections_event(detections(predicted=True), [3, None], {0: "person"}, model="people.onnx",
                             backend="onnxruntime-cpu", batch_size=2)
    assert isinstance(event.body, DetectionsBody) and event.kind is EventKind.DETECTIONS
    first = event.body.objects[0]
    assert first.class_name == "person" and first.box == (10.0, 20.0, 110.3, 220.5) and first.predicted
    masked = dataclasses.replace(first, mask={"size": [480, 640], "counts": "abc"}, mask_frame_seq=11)
    body = dataclasses.replace(event.body, objects=(masked, *event.body.objects[1:]))
    enriched = dataclasses.replace(event, body=body, lease=41)
    payload, headers = encode(enriched, "n1", 1_800_000_000.25)
    assert payload.decode() == (
        '{"frame_seq":12,"width":640,"height":480,"model":"people.onnx","backend":"onnxruntime-cpu",'
        '"inference_ms":21.46,"batch_size":2,"inference":"predicted","objects":['
        '{"class":"person","class_id":0,"score":0.8765,"box":[10.0,20.0,110.3,220.5],"track_id":3,"predicted":true,'
        '"mask":{"size":[480,640],"counts":"abc"},"mask_frame_seq":11},'
        '{"class":"7","class_id":7,"score":0.4,"box":[1.0,2.0,3.0,4.0],"track_id":null,"predicted":true}],'
        '"lease_revision":41,"stream_id":"door","pts":1.5,"captured_at":"2027-01-15T08:00:00.000Z",'
        '"published_at":"2027-01-15T08:00:00.250Z"}'
    )
    assert headers[LEASE_HEADER] == "41"
    # The enrichment made a new event: the one observers may already hold is as it was.
    assert "mask" not in event.data["objects"][0] and LEASE_HEADER not in encode(event, "n1", 1.8e9)[1]


def test_a_measured_object_without_mask_carries_neither_flag() -> None:
    obj = DetectedObject("person", 0, 0.9, (1.0, 2.0, 3.0, 4.0), None)
    assert obj.fields() == {"class": "person", "class_id": 0, "score": 0.9, "box": [1.0, 2.0, 3.0, 4.0],
                            "track_id": None}


def test_bodies_are_immutable_and_words_are_typed() -> None:
    event = caption_event("door", segment_id="s1", words=[(" Hello", 1.0, 1.4, 0.9), (" there.", 1.5, 1.9, 0.8)],
                          language="en", model="tiny.en", captured_at=1.8e9)
    body = event.body
    assert isinstance(body, event_bodies.CaptionBody)
    assert body.text == "Hello there." and [w.word for w in body.spoken.words] == ["Hello", "there."]
    with pytest.raises(dataclasses.FrozenInstanceError):
        body.segment_id = "s2"  # type: ignore[misc]
    assert json.loads(encode(event, "n1", 1.8e9)[0])["words"][1] == {
        "word": "there.", "start": 1.5, "end": 1.9, "probability": 0.8}
