"""AlertPublisher: alert changes → `alerts` events, with a snapshot of the triggering frame.

A snapshot must never hold up the frame loop, so a start that wants one is handed to a
background task (at most `max_in_flight` at a time) which encodes the frame, stores it, and
then publishes the start carrying the reference. Anything that goes wrong there (store down,
slow, over the bound) costs only the picture: the start still goes out, with `snapshot: null`,
and the miss is counted. An end never overtakes its own start: while a start waits for its
snapshot, changes of the same alert queue behind it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass

import cv2
import numpy as np

from pipelines.event_bodies import alert_event
from pipelines.events import EventSink
from pipelines.frames import VideoFrame
from pipelines.rules.snapshots import SnapshotStore
from pipelines.rules.types import AlertChange, AlertEventKind

log = logging.getLogger(__name__)

DEFAULT_MAX_IN_FLIGHT = 4
DEFAULT_SNAPSHOT_TIMEOUT_S = 5.0
DEFAULT_JPEG_QUALITY = 85


@dataclass(slots=True)
class AlertStats:
    started: int = 0
    ended: int = 0
    snapshots_stored: int = 0
    snapshots_failed: int = 0  # encoding or storing raised or took longer than the timeout
    snapshots_skipped: int = 0  # no store configured, or too many snapshots already in flight


def encode_jpeg(image: np.ndarray, quality: int = DEFAULT_JPEG_QUALITY) -> bytes:
    """An RGB frame as JPEG bytes."""
    bgr = cv2.cvtColor(image, cv2.COLOR_RGB2BGR)  # OpenCV encodes BGR
    ok, buffer = cv2.imencode(".jpg", bgr, [cv2.IMWRITE_JPEG_QUALITY, quality])
    if not ok:
        raise ValueError("JPEG encoding failed")
    return bytes(buffer)


def snapshot_key(stream_id: str, alert_id: str) -> str:
    return f"{stream_id}/{alert_id}.jpg"


class AlertPublisher:
    """Publishes one stream's alert changes to `sink`. Snapshot tasks run in `tasks`, which
    the owner awaits on shutdown (each task is bounded by `timeout_s`)."""

    def __init__(
        self,
        stream_id: str,
        sink: EventSink,
        tasks: asyncio.TaskGroup,
        snapshots: SnapshotStore | None = None,
        *,
        max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
        timeout_s: float = DEFAULT_SNAPSHOT_TIMEOUT_S,
        jpeg_quality: int = DEFAULT_JPEG_QUALITY,
        stats: AlertStats | None = None,
    ) -> None:
        self.stream_id = stream_id
        self.sink = sink
        self.snapshots = snapshots
        self.max_in_flight = max_in_flight
        self.timeout_s = timeout_s
        self.jpeg_quality = jpeg_quality
        self.stats = stats if stats is not None else AlertStats()
        self._tasks = tasks
        self._in_flight = 0
        # alert id → changes of that alert waiting for its start (which waits for a snapshot)
        self._waiting: dict[str, list[tuple[AlertChange, float]]] = {}
        self._references: dict[str, str] = {}  # open alert → its snapshot, repeated on the end

    @property
    def in_flight(self) -> int:
        return self._in_flight

    async def publish(
        self,
        changes: Sequence[AlertChange],
        *,
        captured_at: float,
        frame: VideoFrame | None = None,
        jpeg: bytes | None = None,
    ) -> None:
        """Publish `changes`, decided on `frame` (the one a snapshot shows; None at shutdown).
        `jpeg`: that frame encoded already (the describer's), stored as it is."""
        wanting = [c for c in changes if c.kind is AlertEventKind.START and c.snapshot]
        if wanting:
            if self.snapshots is None or frame is None or self._in_flight >= self.max_in_flight:
                self.stats.snapshots_skipped += len(wanting)
            else:
                for change in wanting:
                    self._waiting[change.alert_id] = []
                self._in_flight += 1
                self._tasks.create_task(
                    self._snapshot_then_publish(wanting, frame, self.snapshots, jpeg),
                    name=f"{self.stream_id}-alert-snapshot",
                )
                deferred = {id(c) for c in wanting}
                changes = [c for c in changes if id(c) not in deferred]
        for change in changes:
            queue = self._waiting.get(change.alert_id)
            if queue is not None:
                queue.append((change, captured_at))
            else:
                await self._emit(change, captured_at)

    async def _snapshot_then_publish(
        self, starts: list[AlertChange], frame: VideoFrame, store: SnapshotStore, jpeg: bytes | None = None
    ) -> None:
        reference: str | None = None
        try:
            async with asyncio.timeout(self.timeout_s):
                # Encoding a full frame (and converting a predicted one to RGB) takes milliseconds
                # of CPU: keep both off the event loop.
                if jpeg is None:
                    quality = self.jpeg_quality
                    jpeg = await asyncio.to_thread(lambda: encode_jpeg(frame.image, quality))
                reference = await store.put(snapshot_key(self.stream_id, starts[0].alert_id), jpeg)
            self.stats.snapshots_stored += 1
        except Exception as exc:  # the alert matters more than its picture
            self.stats.snapshots_failed += 1
            log.warning(
                "alert snapshot failed",
                extra={"stream_id": self.stream_id, "error": repr(exc) or type(exc).__name__},
            )
        finally:
            self._in_flight -= 1
        # Every start of this frame shares the one picture.
        for start in starts:
            await self._emit_quietly(start, frame.captured_at, reference)
            queue = self._waiting[start.alert_id]
            while queue:  # the frame loop may append while we publish; no await between check and del
                change, captured_at = queue.pop(0)
                await self._emit_quietly(change, captured_at)
            del self._waiting[start.alert_id]

    async def _emit_quietly(self, change: AlertChange, captured_at: float, reference: str | None = None) -> None:
        # In a background task an exception would tear down the stream's task group; the frame
        # loop's own publishes raise as they always have.
        try:
            await self._emit(change, captured_at, reference)
        except Exception as exc:
            log.warning("alert publish failed", extra={"stream_id": self.stream_id, "error": repr(exc)})

    async def _emit(self, change: AlertChange, captured_at: float, reference: str | None = None) -> None:
        if change.kind is AlertEventKind.START:
            self.stats.started += 1
            if reference is not None:
                self._references[change.alert_id] = reference
        else:
            self.stats.ended += 1
            reference = self._references.pop(change.alert_id, None)
        await self.sink.publish(alert_event(self.stream_id, change, captured_at=captured_at, snapshot=reference))
