"""The segmentation stage: masks for a stream's tracked objects, in its `detections` events.

The stage enriches the stream's `detections` events (`StageContext.enrich`): before the event
goes out, and before any observer sees it, it is replaced by a copy in which each tracked object
whose track has a mask carries it (`mask`: COCO RLE in frame pixels, `mask_frame_seq`: the frame
it was made on); and the objects that need a new mask (see `cadence`) become the next job for the
shared segmenter, on
that event's own frame (the detect stage's `last_frame` while its event goes out, however far
behind the source the detector runs; no frames are kept here). Segmentation never holds
detections back: a mask arrives with the first `detections` event after it is made, and a slow
segmenter costs masks, not frames. One job waits at most; a newer one replaces it (its objects
counted as skipped).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from pipelines.event_bodies import DetectedObject, DetectionsBody, TrackBody
from pipelines.events import Event
from pipelines.frames import VideoFrame
from pipelines.graph import StageContext, StageFailed, counter, register_counters
from pipelines.graph.counters import Counters
from pipelines.mailbox import FrameMailbox, MailboxClosed
from pipelines.segment.cadence import MaskCadence, TrackedBox, boxes_array
from pipelines.segment.engine import SEGMENTATION, SegmentEngine

log = logging.getLogger(__name__)

STAGE_NAME = "segment"


@runtime_checkable
class ProcessedFrames(Protocol):
    """The detect stage, as seen from here: the frame whose detections event is going out."""

    @property
    def last_frame(self) -> VideoFrame | None: ...


register_counters(
    {
        "masks": counter("Object masks computed by the segmenter"),
        "masks_skipped": counter("Objects that needed a mask but waited (max_per_frame, or a busy segmenter)"),
        "masks_failed": counter("Segmenter calls that failed"),
    },
    section="masks",
)


@dataclass(slots=True)
class _Job:
    frame: VideoFrame
    objects: list[TrackedBox]


class SegmentStage:
    name = STAGE_NAME

    def __init__(
        self, stream_id: str, frames: FrameMailbox, engine: SegmentEngine, detect: ProcessedFrames | None
    ) -> None:
        self.stream_id = stream_id
        self.frames = frames  # only to learn when the stream ends: the pictures come from `detect`
        self.engine = engine
        self.detect = detect
        self.cadence = MaskCadence(engine.settings)
        self._pending: _Job | None = None
        self._wake = asyncio.Event()
        self._done = False
        self.computed = 0
        self.failed = 0
        self.replaced = 0  # objects of a waiting job that a newer job replaced, or whose frame was gone

    # -- seeing the stream's events (synchronous, before they go out) -----------------------

    def enrich(self, event: Event) -> Event:
        """A `detections` event with its tracked objects' masks (a new event: the one given is
        left as it is); a track's end forgets its mask. Every other event passes unchanged."""
        if event.stream_id != self.stream_id:
            return event
        body = event.body
        if isinstance(body, DetectionsBody):
            return self._on_detections(event, body)
        if isinstance(body, TrackBody) and body.event == "end":
            self.cadence.forget(body.track_id)
        return event

    def _on_detections(self, event: Event, body: DetectionsBody) -> Event:
        tracked: list[TrackedBox] = []
        objects: list[DetectedObject] = []
        masked = False
        for obj in body.objects:
            track_id = obj.track_id
            known = self.cadence.mask_of(track_id) if track_id is not None else None
            if track_id is not None:
                tracked.append(TrackedBox(track_id, obj.class_name, obj.box))
            if known is not None and known.rle is not None:
                objects.append(dataclasses.replace(obj, mask=known.rle, mask_frame_seq=known.frame_seq))
                masked = True
            else:
                objects.append(obj)
        if masked:
            event = dataclasses.replace(event, body=dataclasses.replace(body, objects=tuple(objects)))
        self._schedule(tracked, body.frame_seq)
        return event

    def _schedule(self, tracked: list[TrackedBox], frame_seq: int) -> None:
        chosen = self.cadence.choose(tracked)
        if not chosen:
            return
        frame = self.detect.last_frame if self.detect is not None else None
        if frame is None or frame.seq != frame_seq:  # not the event's picture: later, then
            self.cadence.release(chosen)
            self.replaced += len(chosen)
            return
        if self._pending is not None:
            self.cadence.release(self._pending.objects)
            self.replaced += len(self._pending.objects)
        self._pending = _Job(frame, chosen)
        self._wake.set()

    # -- the stage ---------------------------------------------------------------------------

    async def run(self) -> None:
        async with asyncio.TaskGroup() as group:
            group.create_task(self._work(), name=f"{self.stream_id}-segment-worker")
            try:
                while True:
                    await self.frames.get()
            except MailboxClosed:
                pass
            finally:
                self._done = True
                self._wake.set()

    async def _work(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            job, self._pending = self._pending, None
            if job is None:
                if self._done:
                    return
                continue
            try:
                masks = await self.engine.masks(job.frame.pixels, boxes_array(job.objects))
            except Exception as exc:  # a failing model costs masks, never the stream
                self.failed += 1
                self.cadence.release(job.objects)
                log.warning("segmentation failed", extra={"stream_id": self.stream_id, "error": repr(exc)})
                continue
            for obj, mask in zip(job.objects, masks, strict=True):
                self.cadence.store(obj, mask, job.frame.seq)
            self.computed += sum(1 for m in masks if m is not None)

    def stop(self) -> None:
        """Nothing to do: the stage ends when its mailbox closes."""

    def counters(self) -> Counters:
        return {
            "masks": self.computed,
            "masks_skipped": self.cadence.skipped + self.replaced,
            "masks_failed": self.failed,
        }


def build(ctx: StageContext) -> SegmentStage | None:
    engine = ctx.engines.get(SEGMENTATION)
    if engine is None:
        return None
    # A class the detector cannot find would never be segmented: say so (the stream fails with it).
    names = set(ctx.engines.detector.detector.info.names.values())
    unknown = sorted(engine.settings.every_frame_classes - names)
    if unknown:
        raise StageFailed(
            f"segmentation.every_frame_classes: {', '.join(map(repr, unknown))} not among the model's classes "
            f"({', '.join(sorted(names))})"
        )
    detect = ctx.provider(ProcessedFrames)  # type: ignore[type-abstract]  # a protocol is what is asked for
    if detect is None:
        raise StageFailed("segmentation needs a stage before it that says which frame its detections are of")
    stage = SegmentStage(ctx.stream_id, ctx.frames(STAGE_NAME), engine, detect)
    ctx.enrich(stage.enrich)
    return stage
