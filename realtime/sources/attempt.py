"""The reader side of a supervised stream: each connect attempt's session on its own thread.

Each connect attempt is a backend session (see session.py) driven by a dedicated daemon
thread. Frames go through the caller's frame / audio inputs (the graph's tees, or a
`FrameMailbox` / `AudioBuffer`); the `Feed` owns the per-stream frame sequence number, so it
never resets across reconnects. A session that is replaced or stopped is signalled (stop event +
`interrupt()`) and waited for a bounded time by the supervisor; if it is stuck in a blocking read
it is abandoned: it is no longer the current attempt, so it can no longer deliver frames, and it
ends at its own read timeout.

The threads reach the event loop only through `call_soon_threadsafe`, so the supervisor's state
machine (supervisor.py) runs on the loop thread alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from engines.media.remux import EncodedPacket
from pipelines.frames import AudioChunk, DeferredImage, VideoFrame
from pipelines.graph.source import AudioInput, FrameInput, PacketInput
from realtime.sources.pacing import NoPacing, RealtimePacer
from realtime.sources.session import BackendUnavailable, PacketSink, SourceError, SourceSession, VideoSink
from realtime.sources.spec import SourceSpec

log = logging.getLogger("realtime.sources.supervisor")  # one log name for the whole supervisor


@dataclass(eq=False)
class Attempt:
    """One connect attempt: a session, its thread and what the thread reports."""

    number: int
    session: SourceSession
    stop: threading.Event = field(default_factory=threading.Event)
    frames: int = 0
    last_frame_at: float = field(default_factory=time.monotonic)
    gap_limit: float = float("inf")  # a silence between two frames longer than this is a stall
    long_gaps: int = 0  # such silences, counted by the reader thread
    long_gap_s: float = 0.0  # the latest one
    first_frame_at: float | None = None
    delivering: bool = False  # inside pacing / a blocking put: the source is not stalled
    opened: bool = False
    done: asyncio.Future[str | None] | None = None  # result: error text, or None at a clean end
    permanent: bool = False  # the error cannot go away by retrying (backend missing)


class Feed:
    """What one stream's connect attempts share: the inputs, the frame numbering, the current
    attempt and the counters the reader threads keep. Only the current attempt delivers."""

    def __init__(
        self,
        stream_id: str,
        spec: SourceSpec,
        backend: str,
        *,
        video: FrameInput,
        audio: AudioInput | None,
        packets: PacketInput | None,
        realtime: bool,
        max_frames: int | None,
        stop_requested: threading.Event,
        wake: Callable[[], None],
    ) -> None:
        self.stream_id = stream_id
        self.spec = spec
        self.backend = backend
        self.realtime = realtime
        self.max_frames = max_frames
        self.current: Attempt | None = None
        self.end_reason: str | None = None  # why the reader stopped by itself (limit, closed)
        self.frames = 0  # video frames handed to the video input
        self.audio_seconds = 0.0  # audio handed to the audio input
        self.connects = 0  # sessions that opened
        self._video = video
        self._audio = audio
        self._packets = packets  # encoded packets for clips, straight from the reader thread
        self._stop_requested = stop_requested  # the supervisor's: set by stop()
        self._wake = wake  # wakes the supervisor's watch; called on the event loop
        self._corrupt_done = 0  # corrupt packets of finished attempts
        self._seq = 0
        self._seq_lock = threading.Lock()

    @property
    def corrupt_packets(self) -> int:
        current = self.current
        live_corrupt = current.session.corrupt_packets if current is not None else 0
        return self._corrupt_done + live_corrupt

    def start(self, number: int, session: SourceSession, gap_limit: float, loop: asyncio.AbstractEventLoop) -> Attempt:
        """Make `session` the current attempt and start its reader thread."""
        attempt = Attempt(number=number, session=session, gap_limit=gap_limit)
        attempt.done = loop.create_future()
        self.current = attempt
        thread = threading.Thread(
            target=self._reader_main, args=(attempt, loop), name=f"source-{self.stream_id}-{number}", daemon=True
        )
        thread.start()
        return attempt

    def finished(self, attempt: Attempt) -> None:
        """The supervisor is done with `attempt`: count its corrupt packets, and it is no longer current."""
        self._corrupt_done += attempt.session.corrupt_packets
        self.current = None if self.current is attempt else self.current

    def close_outputs(self) -> None:
        self._video.close()
        if self._audio is not None:
            self._audio.close()

    # -- the reader thread --------------------------------------------------------------

    def _reader_main(self, attempt: Attempt, loop: asyncio.AbstractEventLoop) -> None:
        session = attempt.session
        error: str | None = None
        try:
            session.open()
            attempt.opened = True
            _call_soon(loop, self._on_opened, attempt)
            session.run(
                self._video_sink(attempt, loop),
                self._audio_sink(attempt),
                attempt.stop,
                packets_out=self._packet_sink(attempt),
            )
        except SourceError as exc:
            error = self.spec.redact(str(exc))
            attempt.permanent = isinstance(exc, BackendUnavailable)
        except Exception as exc:  # a bug in a backend must not take the supervisor down
            error = f"internal error in the {self.backend} reader: {self.spec.redact(str(exc)) or type(exc).__name__}"
            log.error(
                "reader crashed",
                extra={
                    "stream_id": self.stream_id,
                    "source": self.spec.display,
                    "traceback": self.spec.redact("".join(traceback.format_exception(exc))),
                },
            )
        finally:
            try:
                session.close()
            except Exception as exc:
                log.warning(
                    "closing the reader failed",
                    extra={"stream_id": self.stream_id, "error": self.spec.redact(repr(exc))},
                )
            assert attempt.done is not None
            _call_soon(loop, _resolve, attempt.done, error)
            _call_soon(loop, self._wake)

    def _on_opened(self, attempt: Attempt) -> None:
        self.connects += 1
        log.debug(
            "source opened",
            extra={
                "stream_id": self.stream_id,
                "source": self.spec.display,
                "backend": self.backend,
                "attempt": attempt.number,
            },
        )

    def _packet_sink(self, attempt: Attempt) -> PacketSink | None:
        packets = self._packets
        if packets is None:
            return None

        def put(t: float, packet: EncodedPacket) -> None:
            if not attempt.stop.is_set():  # an abandoned reader's packets go nowhere
                packets.put(t, packet)

        return put

    def _video_sink(
        self, attempt: Attempt, loop: asyncio.AbstractEventLoop
    ) -> VideoSink:
        pacer = RealtimePacer() if self.realtime else NoPacing()

        def deliver(image: np.ndarray | DeferredImage, pts: float, captured_at: float) -> bool:
            if attempt is not self.current or attempt.stop.is_set():
                return False
            gap = time.monotonic() - attempt.last_frame_at
            if attempt.frames and gap > attempt.gap_limit:
                attempt.long_gap_s = gap
                attempt.long_gaps += 1
            attempt.delivering = True
            captured_mono = time.monotonic()  # beside captured_at: the origin of the frame's latency
            try:
                if not pacer.wait(pts, attempt.stop):
                    return False
                if self.realtime:
                    captured_at = time.time()  # a paced file "arrives" when its frame is due
                    captured_mono = time.monotonic()
                elif self.spec.is_file and isinstance(image, DeferredImage):
                    # A file read as fast as it goes has every frame measured: convert it here, on
                    # this thread, beside the model's calls rather than inside them.
                    image.rgb()
                with self._seq_lock:
                    if attempt is not self.current:
                        return False
                    seq = self._seq
                    self._seq += 1
                frame = VideoFrame(self.stream_id, seq, pts, captured_at, image, captured_mono=captured_mono)
                if not self._video.put(frame):
                    if not self._stop_requested.is_set():
                        self.end_reason = "the frame consumer closed its mailbox"
                    return False
            finally:
                attempt.delivering = False
                attempt.last_frame_at = time.monotonic()
            self.frames += 1
            attempt.frames += 1
            if attempt.frames == 1:
                attempt.first_frame_at = attempt.last_frame_at
                _call_soon(loop, self._wake)
            if self.max_frames is not None and self.frames >= self.max_frames:
                self.end_reason = f"frame limit reached ({self.max_frames} frames)"
                return False
            return True

        return deliver

    def _audio_sink(self, attempt: Attempt) -> Callable[[np.ndarray, float, float], bool] | None:
        audio = self._audio
        if audio is None:
            return None

        def deliver(samples: np.ndarray, pts: float, captured_at: float) -> bool:
            if attempt is not self.current or attempt.stop.is_set():
                return False
            chunk = AudioChunk(self.stream_id, pts, captured_at, samples)
            if audio.put(chunk):  # a closed audio buffer only ends audio, video goes on
                self.audio_seconds += chunk.duration
            return True

        return deliver


def _call_soon(loop: asyncio.AbstractEventLoop, callback: Callable[..., Any], *args: Any) -> None:
    with contextlib.suppress(RuntimeError):  # the loop is gone: nobody is listening any more
        loop.call_soon_threadsafe(callback, *args)


def _resolve(future: asyncio.Future[str | None], error: str | None) -> None:
    if not future.done():
        future.set_result(error)
