"""One stream's frame loop: newest frame → detector → tracker → rules → events.

The loop takes the newest frame from the mailbox as soon as the previous one is done,
so detection runs on every frame the hardware allows; `detect_fps` caps it lower when
asked. The capture time of the frame travels into every event it produces.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from pipelines.clock import StreamClock
from pipelines.detect import DetectionBatcher
from pipelines.event_bodies import detections_event, track_event
from pipelines.events import EventSink
from pipelines.frames import FrameResult, VideoFrame
from pipelines.mailbox import AudioBuffer, FrameMailbox, MailboxClosed
from pipelines.rules.engine import RuleEngine
from pipelines.rules.publishing import AlertPublisher, AlertStats
from pipelines.rules.snapshots import SnapshotStore
from pipelines.rules.specs import RuleSpec
from pipelines.rules.types import AlertChange, tracked_objects
from pipelines.tracker import ByteTracker, LifecycleKind, TrackerConfig, TrackEvent

log = logging.getLogger(__name__)

LATENCY_WINDOW = 4096  # samples kept for percentiles; older ones fall off

# Called after each processed frame's detections event is published, with the frame's
# result and its capture → publish latency in ms (metrics hang off this).
FrameObserver = Callable[[FrameResult, float], None]


@dataclass(slots=True)
class FrameLoopStats:
    frames_processed: int = 0
    frames_skipped: int = 0  # left out on purpose by the detect_fps cap
    frames_failed: int = 0  # the detector raised on them
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
    ) -> None:
        self.stream_id = stream_id
        self.rules = tuple(rules)
        self.snapshots = snapshots
        self.on_frame = on_frame
        self.mailbox = mailbox
        self.batcher = batcher
        self.sink = sink
        self.tracker = ByteTracker(tracker_config)
        self.clock = StreamClock()  # the tracker's time: media seconds that survive pts restarts
        self.min_interval = 1.0 / detect_fps if detect_fps else 0.0
        self.names: Mapping[int, str] = batcher.detector.info.names
        self.model_name = batcher.detector.info.path.rsplit("/", 1)[-1]
        self.stats = FrameLoopStats()
        self._last_processed_at: float | None = None
        self._last_frame: VideoFrame | None = None
        self.rule_engine: RuleEngine | None = None
        self.alerts: AlertPublisher | None = None

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
                    while True:
                        try:
                            frame = await self.mailbox.get()
                        except MailboxClosed:
                            break
                        if self._skip_for_cap(frame):
                            continue
                        await self._process(frame)
            finally:
                await self._finish_tracks()

    def _skip_for_cap(self, frame: VideoFrame) -> bool:
        if not self.min_interval or self._last_processed_at is None:
            return False
        if frame.captured_at - self._last_processed_at < self.min_interval:
            self.stats.frames_skipped += 1
            return True
        return False

    async def _process(self, frame: VideoFrame) -> None:
        try:
            outcome = await self.batcher.detect(frame.image)
        except Exception as exc:
            self.stats.frames_failed += 1
            log.warning("detection failed", extra={"stream_id": self.stream_id, "error": repr(exc)})
            return
        self._last_processed_at = frame.captured_at
        self._last_frame = frame
        result = FrameResult(
            frame_seq=frame.seq,
            stream_id=self.stream_id,
            pts=frame.pts,
            captured_at=frame.captured_at,
            width=frame.width,
            height=frame.height,
            detections=outcome.detections,
            inference_ms=outcome.inference_ms,
        )
        tracked = self.tracker.update(outcome.detections, self.clock(frame.pts, frame.captured_at))
        alert_changes = self._evaluate_rules(frame, tracked.events)
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
        latency_ms = (time.time() - frame.captured_at) * 1000
        stats.latency_ms.append(latency_ms)
        if self.on_frame is not None:
            self.on_frame(result, latency_ms)
        stats.wait_ms.append((outcome.started_at - frame.captured_at) * 1000)
        stats.inference_ms.append(outcome.inference_ms)
        for event in events[1:]:
            await self.sink.publish(event)
        if alert_changes and self.alerts is not None:
            await self.alerts.publish(alert_changes, captured_at=frame.captured_at, frame=frame)

    def _evaluate_rules(self, frame: VideoFrame, track_events: list[TrackEvent]) -> list[AlertChange]:
        if self.rule_engine is None:
            return []
        return self.rule_engine.evaluate(
            frame.pts,
            tracked_objects(self.tracker.active_tracks, self.names),
            ended=[e.track_id for e in track_events if e.kind is LifecycleKind.END],
            frame_size=(frame.width, frame.height),
        )

    async def _finish_tracks(self) -> None:
        frame = self._last_frame
        pts = frame.pts if frame else 0.0
        captured_at = frame.captured_at if frame else time.time()
        for change in self.tracker.finish():
            self.stats.track_events += 1
            await self.sink.publish(
                track_event(self.stream_id, change, self.names, pts=pts, captured_at=captured_at)
            )
        if self.rule_engine is not None and self.alerts is not None:
            await self.alerts.publish(self.rule_engine.finish(pts), captured_at=captured_at)


@dataclass(slots=True)
class AudioMeterStats:
    chunks: int = 0
    seconds: float = 0.0
    last_pts: float | None = None


class AudioMeter:
    """Consumes a stream's audio so its buffer never fills; counts what arrived.

    The caption loop takes this place when captions are enabled.
    """

    def __init__(self, audio: AudioBuffer) -> None:
        self.audio = audio
        self.stats = AudioMeterStats()

    async def run(self) -> None:
        while True:
            try:
                chunks = await self.audio.get_many()
            except MailboxClosed:
                return
            for chunk in chunks:
                self.stats.chunks += 1
                self.stats.seconds += chunk.duration
                self.stats.last_pts = chunk.pts
