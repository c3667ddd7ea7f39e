"""The segmentation stage in a real stream graph (tiny YOLO-seg detector, real tracker, tiny SAM
segmenter on ONNX Runtime), and its cadence on its own."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from engines.registry import create_detector
from engines.segment import open_segmenter, rle
from engines.segment.types import Segmenter
from pipelines.detect import DetectionBatcher
from pipelines.events import Event, EventKind
from pipelines.frames import StatusChange, StreamState, VideoFrame
from pipelines.graph import SharedEngines, SourceOutputs, StageContext, StreamGraph
from pipelines.segment.cadence import MaskCadence, TrackedBox
from pipelines.segment.engine import SEGMENTATION, SegmentEngine, SegmentSettings
from pipelines.stages import DEFAULT_STAGES
from tests.engines.segment import models
from tests.pipelines.test_graph import FakeSource, ListSink, spec


class UntilMasked(FakeSource):
    """A live source that sends frames until `done()` holds, then `after` more (bounded by `most`):
    a mask rides only the events published after it was computed, however long the segmenter took."""

    def __init__(self, done: Callable[[], bool], *, after: int = 10, most: int = 3000, fps: float = 60) -> None:
        super().__init__(most, fps=fps)
        self.done = done
        self.after = after

    async def run(self, outputs: SourceOutputs) -> StreamState:
        outputs.status(StatusChange("cam", StreamState.LIVE, None, time.time()))
        image = np.zeros((48, 64, 3), np.uint8)
        left = self.after
        for seq in range(self.frames):
            if left == 0 or self._stop.is_set():
                break
            if self.done():
                left -= 1
            if not outputs.video.put(VideoFrame("cam", seq, seq / 10, time.time(), image), 5.0):
                break
            self.sent += 1
            await asyncio.sleep(1 / self.fps)
        outputs.status(StatusChange("cam", StreamState.STOPPED, StreamState.LIVE, time.time(), reason="end"))
        return StreamState.STOPPED


class Recording:
    """A real segmenter that also writes down how many boxes each call asked for."""

    def __init__(self, inner: Segmenter) -> None:
        self.inner = inner
        self.kind, self.backend = inner.kind, inner.backend
        self.calls: list[int] = []

    def segment(self, image: np.ndarray, boxes: np.ndarray) -> list[np.ndarray | None]:
        self.calls.append(len(boxes))
        return self.inner.segment(image, boxes)

    def close(self) -> None:
        self.inner.close()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    root = tmp_path_factory.mktemp("seg-stage")
    models.encoder(root / "encoder.onnx")
    models.sam_decoder(root / "decoder.onnx")
    models.yolo_seg(root / "yolo_seg.onnx")
    yield root


async def test_new_tracks_get_one_mask_each_and_events_carry_it(model_dir: Path) -> None:
    segmenter = Recording(
        open_segmenter(
            sam_encoder=model_dir / "encoder.onnx", sam_decoder=model_dir / "decoder.onnx", backend="onnx-cpu"
        )
    )
    engine = SegmentEngine(segmenter, SegmentSettings())
    sink = ListSink()
    observed: list[Event] = []

    def observer_built_first(ctx: StageContext) -> None:  # an observer registered before segmentation's
        ctx.observe(observed.append)

    detector = create_detector(model_dir / "yolo_seg.onnx", "onnx-cpu")  # two still objects on every frame
    try:
        async with DetectionBatcher(detector) as batcher:
            engines = SharedEngines(batcher, opened={SEGMENTATION.name: engine})
            source = UntilMasked(lambda: graph.counters()["masks"] >= 2)
            graph = StreamGraph(spec(), source, [observer_built_first, *DEFAULT_STAGES], engines, sink)
            assert await asyncio.wait_for(graph.run(), 60) is StreamState.STOPPED
            assert source.sent < source.frames, "the two masks never came"
    finally:
        engine.close()
        detector.close()
    assert [s.name for s in graph.stages] == ["detect", "segment"]
    # The boxes never move: each of the two tracks is segmented once, however many frames follow.
    assert sum(segmenter.calls) == 2
    counters = graph.counters()
    assert counters["masks"] == 2 and counters["masks_failed"] == 0
    events = sink.kinds(EventKind.DETECTIONS)
    with_masks = [o for e in events for o in e.data["objects"] if "mask" in o]
    assert with_masks, "no detections event carried a mask"
    for obj in with_masks:
        assert obj["mask"]["size"] == [48, 64] and isinstance(obj["mask"]["counts"], str)
        assert obj["mask_frame_seq"] <= max(e.data["frame_seq"] for e in events)
        mask = rle.decode(obj["mask"])
        ys, xs = np.nonzero(mask)
        x1, y1, x2, y2 = obj["box"]
        assert (
            xs.min() >= np.floor(x1) and xs.max() < np.ceil(x2) and ys.min() >= np.floor(y1) and ys.max() < np.ceil(y2)
        )
    # Enrichment comes before every observer, whatever the build order: they saw what went out.
    assert [e.id for e in observed if e.kind is EventKind.DETECTIONS] == [e.id for e in events]
    assert all(o is s for o, s in zip([e for e in observed if e.kind is EventKind.DETECTIONS], events, strict=True))
    # Objects without a mask keep exactly the fields they always had.
    plain = [o for e in events for o in e.data["objects"] if "mask" not in o]
    assert plain and all(set(o) == {"class", "class_id", "score", "box", "track_id"} for o in plain)


async def test_every_frame_classes_the_model_lacks_fail_the_stream_with_the_key(model_dir: Path) -> None:
    segmenter = open_segmenter(yolo_seg=model_dir / "yolo_seg.onnx", backend="onnx-cpu")
    engine = SegmentEngine(segmenter, SegmentSettings(every_frame_classes=frozenset({"person", "horse"})))
    detector = create_detector(model_dir / "yolo_seg.onnx", "onnx-cpu")
    try:
        async with DetectionBatcher(detector) as batcher:
            engines = SharedEngines(batcher, opened={SEGMENTATION.name: engine})
            graph = StreamGraph(spec(), FakeSource(3), DEFAULT_STAGES, engines, ListSink())
            assert await asyncio.wait_for(graph.run(), 10) is StreamState.FAILED
    finally:
        engine.close()
        detector.close()
    assert graph.reason is not None and "segmentation.every_frame_classes: 'horse'" in graph.reason


def box(track_id: int, x: float, cls: str = "car") -> TrackedBox:
    return TrackedBox(track_id, cls, (x, 0.0, x + 10.0, 10.0))


def test_cadence_new_changed_every_frame_and_budget() -> None:
    cadence = MaskCadence(SegmentSettings(reseg_iou=0.8, max_per_frame=2, every_frame_classes=frozenset({"person"})))
    first = [box(1, 0), box(2, 50), box(3, 100, "person")]
    chosen = cadence.choose(first)
    assert len(chosen) == 2 and cadence.skipped == 1  # three new tracks, a budget of two
    assert cadence.choose(first) == [box(3, 100, "person")]  # the in-flight two are not asked again
    for obj in first:
        cadence.store(obj, {"size": [1, 1], "counts": [1]}, frame_seq=1)
    assert cadence.choose([box(1, 0.5), box(2, 50)]) == []  # barely moved (IoU 0.9): the mask stands
    assert cadence.choose([box(1, 3), box(2, 50)]) == [box(1, 3)]  # IoU 0.54: a new mask
    assert cadence.choose([box(3, 100, "person")]) == [box(3, 100, "person")]  # every frame for persons
    cadence.forget(2)
    assert cadence.mask_of(2) is None and cadence.choose([box(2, 50)]) == [box(2, 50)]


def test_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="max_per_frame"):
        SegmentSettings(max_per_frame=0)
    with pytest.raises(ValueError, match="reseg_iou"):
        SegmentSettings(reseg_iou=0)
