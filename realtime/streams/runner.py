"""One stream's graph, owned as one unit: source supervisor → mailbox → frame loop → sink.

A stream never raises into its caller: whatever goes wrong with its source or its
processing ends in a final state (`stopped` or `failed`) with a reason, so one bad
camera can never take down the others running beside it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from pipelines.detect import DetectionBatcher
from pipelines.event_bodies import status_event
from pipelines.events import EventSink
from pipelines.frame_loop import AudioMeter, FrameLoop, FrameObserver
from pipelines.frames import StatusChange, StreamState, validate_stream_id
from pipelines.mailbox import AudioBuffer, FrameMailbox
from pipelines.rules.snapshots import SnapshotStore
from pipelines.rules.specs import RuleSpec
from pipelines.tracker import TrackerConfig
from realtime.sources.spec import SourceSpec, parse_source
from realtime.sources.supervisor import CameraSupervisor, SupervisorPolicy

log = logging.getLogger(__name__)

STATUS_QUEUE_LIMIT = 256  # status changes waiting to be published; a flapping camera drops oldest
AUDIO_BUFFER_SECONDS = 30.0


@dataclass(frozen=True, slots=True)
class StreamSpec:
    """What a user asks for: one source and how to process it."""

    stream_id: str
    url: str
    ingest: str = "pyav"  # "pyav" | "gstreamer"
    realtime: bool = False  # pace files like a live camera (live sources are always real time)
    audio: bool = True
    detect_fps: float | None = None
    policy: SupervisorPolicy = field(default_factory=SupervisorPolicy)
    tracker: TrackerConfig = field(default_factory=TrackerConfig)
    rules: tuple[RuleSpec, ...] = ()

    def validated(self) -> SourceSpec:
        """Check the id and URL; raises ValueError subclasses with a one-line reason."""
        validate_stream_id(self.stream_id)
        return parse_source(self.url)


@dataclass(frozen=True, slots=True)
class StreamCounters:
    """One stream's counters and queue depths: cheap to read, so metrics scrapes can."""

    frames_in: int = 0
    frames_processed: int = 0
    frames_dropped: int = 0  # replaced in the mailbox before the detector took them
    frames_skipped: int = 0  # left out by the detect_fps cap
    frames_failed: int = 0
    detections: int = 0
    tracks: int = 0
    track_events: int = 0
    alerts: int = 0
    reconnects: int = 0
    stalls: int = 0
    corrupt_packets: int = 0
    audio_seconds: float = 0.0
    audio_dropped_seconds: float = 0.0
    status_events_dropped: int = 0
    # Queue depths right now.
    mailbox_depth: int = 0
    audio_buffered_s: float = 0.0
    status_queue_depth: int = 0


@dataclass(frozen=True, slots=True)
class StreamSummary(StreamCounters):
    """The counters plus rates and latency percentiles (sorts the latency windows: not per scrape)."""

    stream_id: str = ""
    state: str = ""
    reason: str | None = None
    elapsed_s: float = 0.0
    fps_processed: float = 0.0
    latency_p50_ms: float | None = None
    latency_p99_ms: float | None = None
    inference_p50_ms: float | None = None


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return round(ordered[index], 2)


class StreamRunner:
    def __init__(
        self,
        spec: StreamSpec,
        batcher: DetectionBatcher,
        sink: EventSink,
        *,
        on_status: Callable[[StatusChange], None] | None = None,
        snapshots: SnapshotStore | None = None,
        on_frame: FrameObserver | None = None,
    ) -> None:
        self.spec = spec
        self._snapshots = snapshots
        self._on_frame = on_frame
        self.source = spec.validated()
        self.batcher = batcher
        self.sink = sink
        self._on_status = on_status
        self._status_queue: asyncio.Queue[StatusChange] = asyncio.Queue(STATUS_QUEUE_LIMIT)
        self.status_dropped = 0
        self.state = StreamState.CONNECTING
        self.reason: str | None = None
        self._started = time.monotonic()
        self._stop_requested = False
        self.supervisor: CameraSupervisor | None = None
        self.mailbox: FrameMailbox | None = None
        self.audio: AudioBuffer | None = None
        self.frame_loop: FrameLoop | None = None
        self.audio_meter: AudioMeter | None = None

    @property
    def stream_id(self) -> str:
        return self.spec.stream_id

    def stop(self) -> None:
        self._stop_requested = True
        if self.supervisor is not None:
            self.supervisor.stop()

    async def run(self) -> StreamState:
        spec = self.spec
        blocking = self.source.kind == "file" and not spec.realtime
        self.mailbox = FrameMailbox(blocking=blocking)
        self.audio = AudioBuffer(max_seconds=AUDIO_BUFFER_SECONDS) if spec.audio else None
        self.supervisor = CameraSupervisor(
            spec.stream_id,
            self.source,
            video=self.mailbox,
            audio=self.audio,
            on_status=self._status_changed,
            backend=spec.ingest,
            policy=spec.policy,
            realtime=spec.realtime,
        )
        self.frame_loop = FrameLoop(
            spec.stream_id,
            self.mailbox,
            self.batcher,
            self.sink,
            tracker_config=spec.tracker,
            detect_fps=spec.detect_fps,
            rules=spec.rules,
            snapshots=self._snapshots,
            on_frame=self._on_frame,
        )
        if self._stop_requested:
            self.supervisor.stop()
        status_task = asyncio.create_task(self._publish_status(), name=f"{spec.stream_id}-status")
        try:
            async with asyncio.TaskGroup() as group:
                # The supervisor closes the mailbox and audio buffer when it ends; the frame loop then
                # finishes what is inside, ends open tracks and returns.
                group.create_task(self.supervisor.run(), name=f"{spec.stream_id}-source")
                group.create_task(self.frame_loop.run(), name=f"{spec.stream_id}-frames")
                if self.audio is not None:
                    self.audio_meter = AudioMeter(self.audio)
                    group.create_task(self.audio_meter.run(), name=f"{spec.stream_id}-audio")
        except* Exception as failure:  # a bug in a stage: fail this stream only
            first = failure.exceptions[0]
            log.exception("stream failed", extra={"stream_id": spec.stream_id}, exc_info=first)
            self._status_changed(
                StatusChange(spec.stream_id, StreamState.FAILED, self.state, time.time(), reason=repr(first))
            )
        finally:
            # Let queued status changes out before the publisher task goes.
            await self._status_queue.join()
            status_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await status_task
        return self.state

    def _status_changed(self, change: StatusChange) -> None:
        self.state = change.state
        self.reason = change.reason
        log.info(
            "stream state",
            extra={"stream_id": change.stream_id, "state": change.state.value, "reason": change.reason},
        )
        if self._on_status is not None:
            self._on_status(change)
        if self._status_queue.full():
            self._status_queue.get_nowait()
            self._status_queue.task_done()
            self.status_dropped += 1
        self._status_queue.put_nowait(change)

    async def _publish_status(self) -> None:
        while True:
            change = await self._status_queue.get()
            try:
                await self.sink.publish(status_event(change, source=self.source.display))
            except Exception as exc:
                log.warning("status publish failed", extra={"stream_id": self.stream_id, "error": repr(exc)})
            finally:
                self._status_queue.task_done()

    @property
    def status_queue_depth(self) -> int:
        return self._status_queue.qsize()

    def release(self) -> None:
        """Drop a finished run's parts now rather than at the next full GC pass.

        The supervisor holds this runner's bound status callback, so a finished runner is a
        reference cycle that keeps its last frame (a megabyte or more) alive until a
        generation-2 collection, which may be dozens of runs away: RSS rose 8 % over 200
        add/remove cycles. Read what you need from summary() first.
        """
        self.supervisor = None
        self.frame_loop = None
        self.mailbox = None
        self.audio = None
        self.audio_meter = None

    def counters(self) -> StreamCounters:
        loop = self.frame_loop.stats if self.frame_loop else None
        source = self.supervisor.stats if self.supervisor else None
        audio = self.audio
        return StreamCounters(
            frames_in=source.frames if source else 0,
            frames_processed=loop.frames_processed if loop else 0,
            frames_dropped=self.mailbox.stats.dropped if self.mailbox else 0,
            frames_skipped=loop.frames_skipped if loop else 0,
            frames_failed=loop.frames_failed if loop else 0,
            detections=loop.detections if loop else 0,
            tracks=loop.tracks_started if loop else 0,
            track_events=loop.track_events if loop else 0,
            alerts=loop.alerts.started if loop else 0,
            reconnects=source.reconnects if source else 0,
            stalls=source.stalls if source else 0,
            corrupt_packets=source.corrupt_packets if source else 0,
            audio_seconds=round(audio.stats.seconds_in, 2) if audio else 0.0,
            audio_dropped_seconds=round(audio.stats.seconds_dropped, 2) if audio else 0.0,
            status_events_dropped=self.status_dropped,
            mailbox_depth=self.mailbox.pending() if self.mailbox else 0,
            audio_buffered_s=round(audio.buffered_seconds, 3) if audio else 0.0,
            status_queue_depth=self.status_queue_depth,
        )

    def summary(self) -> StreamSummary:
        elapsed = time.monotonic() - self._started
        counters = self.counters()
        loop = self.frame_loop.stats if self.frame_loop else None
        latency = list(loop.latency_ms) if loop else []
        return StreamSummary(
            **dataclasses.asdict(counters),
            stream_id=self.stream_id,
            state=self.state.value,
            reason=self.reason,
            elapsed_s=round(elapsed, 2),
            fps_processed=round(counters.frames_processed / elapsed, 2) if elapsed > 0 else 0.0,
            latency_p50_ms=percentile(latency, 50),
            latency_p99_ms=percentile(latency, 99),
            inference_p50_ms=percentile(list(loop.inference_ms), 50) if loop else None,
        )
