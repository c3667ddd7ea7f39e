"""The detection stage: every frame → detector or tracker prediction → rules → events.

A live stream's loop takes every frame as it comes. It goes to the model when the stream has a
slot free (fewer than the batcher's `in_flight` frames submitted); when the model is busy, the
compute budget is short (pipelines.compute) or `detect_fps` caps it, the frame still goes out, with
the boxes the tracker predicts for it (`inference: predicted`, each object `predicted: true`), and
the rules run on those boxes. So the detection rate follows what the model can give each stream,
continuously, and every frame has boxes. A file read as fast as it goes is different: the model
paces the reader and sees every frame.

Results are handled strictly in frame order: while the tracker, the rules and the publisher work
on one frame, the next ones are already in the model (on a small CPU one frame at a time left the
model idle for that part, and the event loop idle while the model ran); a predicted frame waits
for the measured frames before it. Each frame's moment on the stream's timeline is computed once
and the same value goes to the tracker, the rules and the result handed on; the capture time
travels into every event the frame produces. A detector that is dead (`DetectorFailed`) fails the
stream with its reason rather than leaving it waiting.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from engines.types import Detections
from pipelines.clock import SYSTEM_CLOCK, Clock, Moment, StreamClock
from pipelines.compute import ComputeBudget, Grant
from pipelines.detect import DETECTOR, DetectionBatcher, DetectionOutcome, DetectorFailed
from pipelines.event_bodies import detections_event, track_event
from pipelines.events import EventSink
from pipelines.frames import FrameResult, VideoFrame
from pipelines.graph import StageContext, StageFailed, counter, register_counters
from pipelines.graph.counters import Counters, frame_stage, gauge, queue_depth
from pipelines.graph.stage import FrameObserver
from pipelines.mailbox import FrameMailbox, MailboxClosed
from pipelines.rules.engine import RuleEngine
from pipelines.rules.publishing import AlertPublisher, AlertStats
from pipelines.rules.snapshots import SnapshotStore
from pipelines.rules.specs import RuleSpec
from pipelines.rules.types import AlertChange, tracked_objects
from pipelines.tracker import ByteTracker, LifecycleKind, TrackerConfig, TrackEvent

log = logging.getLogger(__name__)

LATENCY_WINDOW = 4096  # samples kept for percentiles; older ones fall off
# Frames waiting behind a model call to be handled in order (most are predicted ones). A live
# camera adds one per frame interval, so this is seconds of a stuck call; past it frames are dropped.
MAX_WAITING_FRAMES = 64

STAGE_NAME = "detect"

_InFlight = tuple[VideoFrame, "asyncio.Task[DetectionOutcome | Exception] | None"]  # None: predicted

register_counters(
    {
        "frames_processed": frame_stage("processed"),
        "frames_dropped": frame_stage("dropped"),
        "frames_skipped": frame_stage("skipped"),
        "frames_predicted": frame_stage("predicted"),
        "frames_failed": frame_stage("failed"),
        "mailbox_depth": queue_depth("mailbox"),
        "detections": counter("Objects detected"),
        "tracks": counter("Tracks confirmed"),
        "track_events": counter("Track lifecycle events"),
        "tracks_evicted": counter("Tracks ended early because the tracker was at max_tracks"),
        "prediction_error": gauge(
            "Predicted box's distance from its track's next measured box, in box widths (median of recent)"
        ),
    },
    section="tracking",
)
register_counters(
    {
        "alerts": counter("Alerts started"),
        "alerts_suppressed": counter("Alert starts held back by a rule's cooldown"),
        "snapshot_failures": counter("Alert snapshots that could not be stored"),
    },
    section="alerts",
)


@dataclass(slots=True)
class FrameLoopStats:
    frames_processed: int = 0
    frames_skipped: int = 0  # left out of the model on purpose by the detect_fps cap (their boxes are predicted)
    frames_failed: int = 0  # the detector raised on them
    frames_predicted: int = 0  # published with the tracker's predicted boxes: the model skipped them
    frames_dropped: int = 0  # left out while a model call was stuck with MAX_WAITING_FRAMES behind it
    detections: int = 0
    track_events: int = 0
    tracks_started: int = 0
    started_at: float = field(default_factory=time.monotonic)
    # Per processed frame, milliseconds: capture → detections event published; the part spent
    # waiting for the model (mailbox + batch queue); and the model call itself.
    latency_ms: deque[float] = field(default_factory=lambda: deque(maxlen=LATENCY_WINDOW))
    wait_ms: deque[float] = field(default_factory=lambda: deque(maxlen=LATENCY_WINDOW))
    inference_ms: deque[float] = field(default_factory=lambda: deque(maxlen=LATENCY_WINDOW))
    alerts: AlertStats = field(default_factory=AlertStats)  # alert events and their snapshots


class FrameLoop:
    name = STAGE_NAME

    def __init__(
        self,
        stream_id: str,
        mailbox: FrameMailbox,
        batcher: DetectionBatcher,
        sink: EventSink,
        *,
        tracker_config: TrackerConfig | None = None,
        detect_fps: float | None = None,
        rules: Sequence[RuleSpec] = (),
        snapshots: SnapshotStore | None = None,
        on_frame: FrameObserver | None = None,
        clock: StreamClock | None = None,
        system_clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.stream_id = stream_id
        self.system_clock = system_clock  # monotonic for latencies, wall only for timestamps
        self.rules = tuple(rules)
        self.snapshots = snapshots
        self.on_frame = on_frame
        self.mailbox = mailbox
        self.batcher = batcher
        self.sink = sink
        self.tracker = ByteTracker(tracker_config)
        self.clock = clock or StreamClock()  # the stream's timeline: media seconds that survive pts restarts
        self.min_interval = 1.0 / detect_fps if detect_fps else 0.0
        # How often a silent source is checked for tracks to end: a track ends at most this late.
        self.idle_check_s = min(0.25, self.tracker.config.lost_timeout_s / 4)
        self.names: Mapping[int, str] = batcher.detector.info.names
        self.model_name = batcher.detector.info.path.rsplit("/", 1)[-1]
        self.stats = FrameLoopStats()
        self._last_submitted_at: float | None = None
        self._last_frame: VideoFrame | None = None
        self._last_predicted = False
        self._last_moment: Moment | None = None
        self.rule_engine: RuleEngine | None = None
        self.alerts: AlertPublisher | None = None

    @property
    def last_frame(self) -> VideoFrame | None:
        """The newest frame handled, measured or predicted (its `detections` event has the same `frame_seq`)."""
        return self._last_frame

    @property
    def last_inference(self) -> str:
        """Whether the model measured `last_frame`'s boxes or the tracker predicted them."""
        return "predicted" if self._last_predicted else "measured"

    async def run(self) -> None:
        """Process frames until the mailbox is closed and empty, then end open tracks and alerts."""
        # Built here rather than in __init__: rules that do not fit the model (a class it does not
        # have) then fail this stream with a reason, inside its task group, like any stage error.
        if self.rules:
            # The tracker reports ends itself; the engine's own timeout is only a memory bound.
            lost_timeout_s = 2 * self.tracker.config.lost_timeout_s
            self.rule_engine = RuleEngine(self.stream_id, self.rules, self.names, lost_timeout_s=lost_timeout_s)
        # Snapshot tasks live here; leaving the group waits for them (each is time-bounded), so
        # every alert start is out before run() returns.
        async with asyncio.TaskGroup() as background:
            if self.rule_engine is not None:
                self.alerts = AlertPublisher(
                    self.stream_id, self.sink, background, self.snapshots, stats=self.stats.alerts
                )
            try:
                with self.batcher.client():
                    await self._pipeline()
            finally:
                await self._finish_tracks()

    async def _pipeline(self) -> None:
        """Submit frames up to `in_flight` ahead and handle their results in order."""
        slots = asyncio.Semaphore(self.batcher.in_flight)
        submitted: asyncio.Queue[_InFlight | None] = asyncio.Queue()
        arrived = self.mailbox.stats.put  # frames the source had sent when the loop last handled one
        async with asyncio.TaskGroup() as detections:
            detections.create_task(self._submit(slots, submitted, detections), name=f"{self.stream_id}-submit")
            while True:
                try:
                    async with asyncio.timeout(self.idle_check_s):
                        entry = await submitted.get()
                except TimeoutError:  # no frame for a while: an outage must not keep tracks open
                    # Unless a frame came meanwhile: then the loop (its event loop stalled, say) is
                    # behind, not the source silent, and reading the wall clock now would age every
                    # track by the stall and end it as lost. Such a frame is on its way here.
                    if self.mailbox.stats.put != arrived:
                        arrived = self.mailbox.stats.put
                    else:
                        await self._expire_idle()
                    continue
                arrived = self.mailbox.stats.put
                if entry is None:
                    break
                frame, detection = entry
                if detection is None:
                    await self._process_predicted(frame)
                    if self.mailbox.blocking:  # a file's predicted frames hold a slot (see _submit_every_frame)
                        slots.release()
                    continue
                try:
                    outcome = await detection
                finally:
                    slots.release()
                await self._process(frame, outcome)

    async def _submit(
        self, slots: asyncio.Semaphore, submitted: asyncio.Queue[_InFlight | None], group: asyncio.TaskGroup
    ) -> None:
        try:
            if self.mailbox.blocking:
                await self._submit_every_frame(slots, submitted, group)
            elif self.batcher.compute is not None:
                await self._submit_budgeted(self.batcher.compute, slots, submitted, group)
            else:
                await self._submit_live(slots, submitted, group)
        finally:
            submitted.put_nowait(None)

    async def _submit_every_frame(
        self, slots: asyncio.Semaphore, submitted: asyncio.Queue[_InFlight | None], group: asyncio.TaskGroup
    ) -> None:
        """A file read as fast as it goes: the model paces the reader and sees every frame."""
        while True:
            await slots.acquire()
            try:
                frame = await self.mailbox.get()
            except MailboxClosed:
                return
            if self._skip_for_cap(frame):  # detect_fps: boxes predicted, as on a live stream
                # It keeps its slot until it is handled: the reader waits, frames never pile up.
                submitted.put_nowait((frame, None))
                continue
            self._last_submitted_at = frame.captured_at
            submitted.put_nowait((frame, group.create_task(self._detect(frame))))

    async def _submit_live(
        self, slots: asyncio.Semaphore, submitted: asyncio.Queue[_InFlight | None], group: asyncio.TaskGroup
    ) -> None:
        """A live source: every frame is taken as it comes. The model gets it when a slot is free;
        otherwise (the model is busy, the compute budget is short, or detect_fps says so) the frame
        goes out with the tracker's predicted boxes, in order behind the frames still in the model.
        So the detection rate follows what the model can do, per stream, frame by frame."""
        while True:
            try:
                frame = await self.mailbox.get()
            except MailboxClosed:
                return
            if not self._skip_for_cap(frame) and not slots.locked():
                await slots.acquire()  # free: at once
                self._last_submitted_at = frame.captured_at
                submitted.put_nowait((frame, group.create_task(self._detect(frame))))
            else:
                self._predict_later(frame, submitted)

    async def _submit_budgeted(
        self,
        budget: ComputeBudget,
        slots: asyncio.Semaphore,
        submitted: asyncio.Queue[_InFlight | None],
        group: asyncio.TaskGroup,
    ) -> None:
        """A live source beside other models on the CPU: the loop first waits for the compute
        budget to grant the detector threads, then hands the model the newest frame at that moment.
        Frames that arrive meanwhile go out with predicted boxes; no frame ever waits in a queue
        for its turn, so a measured frame is as fresh as the budget allows. Streams waiting for the
        detector are served the one served longest ago first, whatever their frame rates."""
        held: list[VideoFrame] = []  # the newest frame, not yet measured or predicted
        arrived = asyncio.Event()
        closed = False

        async def read() -> None:
            nonlocal closed
            try:
                while True:
                    frame = await self.mailbox.get()
                    if held:
                        self._predict_later(held.pop(), submitted)
                    if self._skip_for_cap(frame):
                        self._predict_later(frame, submitted)
                    else:
                        held.append(frame)
                    arrived.set()
            except MailboxClosed:
                pass
            finally:
                closed = True
                arrived.set()

        group.create_task(read(), name=f"{self.stream_id}-frames")
        last_served: float | None = None
        while True:
            await slots.acquire()
            while not held and not closed:
                arrived.clear()
                await arrived.wait()
            if not held:  # the source ended
                slots.release()
                return
            grant = await budget.acquire_async(DETECTOR, last_served=last_served)
            last_served = grant.started
            if not held:  # a detect_fps-skipped frame came meanwhile and sent the held one to prediction
                budget.release(grant)
                slots.release()
                continue
            frame = held.pop()
            self._last_submitted_at = frame.captured_at
            submitted.put_nowait((frame, group.create_task(self._detect(frame, grant))))

    def _predict_later(self, frame: VideoFrame, submitted: asyncio.Queue[_InFlight | None]) -> None:
        """Queue a frame for predicted boxes, in order behind the frames in the model."""
        if submitted.qsize() >= MAX_WAITING_FRAMES:
            self.stats.frames_dropped += 1  # a model call is stuck: nothing is queued without bound
        else:
            submitted.put_nowait((frame, None))

    async def _detect(self, frame: VideoFrame, grant: Grant | None = None) -> DetectionOutcome | Exception:
        # Returned, not raised: a failed frame is counted in order, and must not cancel the
        # frames in flight beside it.
        try:
            return await self.batcher.detect(frame.pixels, grant)
        except Exception as exc:
            return exc
        finally:
            if grant is not None and self.batcher.compute is not None:
                # Released by the call when it ran; this covers a task cancelled before it did.
                self.batcher.compute.release(grant)

    def _skip_for_cap(self, frame: VideoFrame) -> bool:
        if not self.min_interval or self._last_submitted_at is None:
            return False
        if frame.captured_at - self._last_submitted_at < self.min_interval:
            self.stats.frames_skipped += 1
            return True
        return False

    async def _process(self, frame: VideoFrame, outcome: DetectionOutcome | Exception) -> None:
        if isinstance(outcome, DetectorFailed):  # the shared detector is gone: nothing more can be processed
            raise StageFailed(f"detector failed: {outcome.reason}") from outcome
        if isinstance(outcome, Exception):
            self.stats.frames_failed += 1
            log.warning("detection failed", extra={"stream_id": self.stream_id, "error": repr(outcome)})
            return
        self._last_frame, self._last_predicted = frame, False
        now = self._last_moment = self._moment(frame)
        result = self._result(frame, now, outcome.detections, outcome.inference_ms)
        tracked = self.tracker.update(outcome.detections, now.t)
        alert_changes = self._evaluate_rules(frame, now, tracked.events)
        events = [
            detections_event(
                result,
                tracked.track_ids,
                self.names,
                model=self.model_name,
                backend=self.batcher.detector.backend,
                batch_size=outcome.batch_size,
            )
        ]
        events += [
            track_event(self.stream_id, change, self.names, pts=frame.pts, captured_at=frame.captured_at)
            for change in tracked.events
        ]
        stats = self.stats
        stats.frames_processed += 1
        stats.detections += len(outcome.detections)
        stats.track_events += len(tracked.events)
        stats.tracks_started += sum(1 for e in tracked.events if e.kind == LifecycleKind.NEW)
        await self.sink.publish(events[0])
        latency_ms = self._latency_ms(frame)
        stats.latency_ms.append(latency_ms)
        if self.on_frame is not None:
            self.on_frame(result, latency_ms)
        stats.wait_ms.append((outcome.started_mono - frame.captured_mono) * 1000)
        stats.inference_ms.append(outcome.inference_ms)
        for event in events[1:]:
            await self.sink.publish(event)
        if alert_changes and self.alerts is not None:
            await self.alerts.publish(alert_changes, captured_at=frame.captured_at, frame=frame)

    async def _process_predicted(self, frame: VideoFrame) -> None:
        """A frame the model did not see: the tracks where the tracker predicts them, the rules on
        those boxes, and a `detections` event that says so (`inference: predicted`)."""
        now = self._last_moment = self._moment(frame)
        predicted = self.tracker.predict(now.t)
        tracks = [replace(track, box=box) for track, box in predicted]
        detections = Detections(
            boxes=np.array([t.box for t in tracks], np.float32).reshape(-1, 4),
            scores=np.array([t.score for t in tracks], np.float32),
            class_ids=np.array([t.class_id for t in tracks], np.int32),
        )
        result = self._result(frame, now, detections, 0.0, predicted=True)
        self._last_frame, self._last_predicted = frame, True
        self.stats.frames_predicted += 1
        alert_changes: list[AlertChange] = []
        if self.rule_engine is not None:
            alert_changes = self.rule_engine.evaluate(
                now, tracked_objects(tracks, self.names), ended=[], frame_size=(frame.width, frame.height)
            )
        event = detections_event(
            result,
            [t.track_id for t in tracks],
            self.names,
            model=self.model_name,
            backend=self.batcher.detector.backend,
            batch_size=0,
        )
        await self.sink.publish(event)
        if self.on_frame is not None:
            self.on_frame(result, self._latency_ms(frame))
        if alert_changes and self.alerts is not None:
            await self.alerts.publish(alert_changes, captured_at=frame.captured_at, frame=frame)

    def _latency_ms(self, frame: VideoFrame) -> float:
        """Capture → now on the monotonic clock: a wall-clock step is not latency."""
        return (self.system_clock.monotonic() - frame.captured_mono) * 1000

    def _result(
        self, frame: VideoFrame, now: Moment, detections: Detections, inference_ms: float, *, predicted: bool = False
    ) -> FrameResult:
        return FrameResult(
            frame_seq=frame.seq,
            stream_id=self.stream_id,
            pts=frame.pts,
            t=now.t,
            captured_at=frame.captured_at,
            width=frame.width,
            height=frame.height,
            detections=detections,
            inference_ms=inference_ms,
            predicted=predicted,
        )

    def _evaluate_rules(self, frame: VideoFrame, now: Moment, track_events: list[TrackEvent]) -> list[AlertChange]:
        if self.rule_engine is None:
            return []
        return self.rule_engine.evaluate(
            now,
            tracked_objects(self.tracker.active_tracks, self.names),
            ended=[e.track_id for e in track_events if e.kind is LifecycleKind.END],
            frame_size=(frame.width, frame.height),
        )

    def _moment(self, frame: VideoFrame) -> Moment:
        now = self.clock.moment_of(frame.pts, frame.captured_at, frame.t)
        last = self._last_moment
        # An outage's idle reading may have run the clock past a frame stamped just before it.
        return Moment(last.t, now.pts) if last is not None and now.t < last.t else now

    async def _expire_idle(self) -> None:
        """End tracks (and the alerts that hang on them) unseen for lost_timeout_s of stream time,
        while no frame comes; the stream clock runs on with the wall clock meanwhile."""
        frame = self._last_frame
        if frame is None or not self.tracker.has_tracks:
            return
        t = self.clock.idle(self.system_clock.wall())  # the stream clock is stamped with captured_at
        if t is None:
            return
        ended = self.tracker.expire(t)
        if not ended:
            return
        now = self._last_moment = Moment(t, frame.pts)
        self.stats.track_events += len(ended)
        for change in ended:
            await self.sink.publish(
                track_event(self.stream_id, change, self.names, pts=frame.pts, captured_at=frame.captured_at)
            )
        if self.rule_engine is not None and self.alerts is not None:
            # Nothing was seen: the remaining tracks are held at their last boxes, the ended ones go.
            changes = self.rule_engine.evaluate(now, [], ended=[e.track_id for e in ended])
            if changes:
                await self.alerts.publish(changes, captured_at=frame.captured_at)

    async def _finish_tracks(self) -> None:
        frame = self._last_frame
        pts = frame.pts if frame else 0.0
        captured_at = frame.captured_at if frame else self.system_clock.wall()
        for change in self.tracker.finish():
            self.stats.track_events += 1
            await self.sink.publish(
                track_event(self.stream_id, change, self.names, pts=pts, captured_at=captured_at)
            )
        if self.rule_engine is not None and self.alerts is not None:
            await self.alerts.publish(self.rule_engine.finish(self._last_moment), captured_at=captured_at)

    def stop(self) -> None:
        """Nothing to do: the loop ends when its mailbox closes."""

    def counters(self) -> Counters:
        stats = self.stats
        engine = self.rule_engine
        return {
            "frames_processed": stats.frames_processed,
            "frames_dropped": self.mailbox.stats.dropped + stats.frames_dropped,
            "frames_skipped": stats.frames_skipped,
            "frames_predicted": stats.frames_predicted,
            "frames_failed": stats.frames_failed,
            "mailbox_depth": self.mailbox.pending(),
            "detections": stats.detections,
            "tracks": stats.tracks_started,
            "track_events": stats.track_events,
            "tracks_evicted": self.tracker.evicted,
            "prediction_error": self.tracker.prediction_error,
            "alerts": stats.alerts.started,
            "alerts_suppressed": engine.suppressed if engine is not None else 0,
            "snapshot_failures": stats.alerts.snapshots_failed,
        }


def build(ctx: StageContext) -> FrameLoop:
    spec = ctx.spec
    return FrameLoop(
        spec.stream_id,
        ctx.frames(STAGE_NAME, primary=True),
        ctx.engines.detector,
        ctx.sink,
        tracker_config=spec.tracker,
        detect_fps=spec.detect_fps,
        rules=spec.rules,
        snapshots=ctx.engines.snapshots,
        on_frame=ctx.on_frame,
        clock=ctx.clock,
    )
