"""Live video for streams whose packets cannot be forwarded: their decoded frames encoded once.

A camera's H.264 packets go to viewers as they came (realtime.webrtc.live). Other streams have no
such packets: a browser session or WHIP ingest arrives decoded by aiortc, GStreamer decodes inside
its pipeline, and an MPEG-4 part 2 or HEVC camera's packets are not something every browser takes.
For them this stage encodes the frames the stream already decodes, once per stream whatever the
number of viewers, into the same H.264 packets the feed forwards, so the viewers' queues, their
skip-to-keyframe and the page's pts mapping (each packet carries its frame's pts) work unchanged.

Cost is the design's constraint, so the encoder:
- runs only while the stream has a viewer: the x264 context opens on the first frame a viewer
  wants and closes at the first frame after the last one left (counted in `live_encoder_starts`);
- encodes on a worker thread, each frame in a BULK turn of the compute budget, shared by weight
  with the detector (the recognizer still goes first), so a viewer never takes the models' time
  unaccounted;
- holds at most one frame: its input is a latest-frame mailbox, so a frame that arrives while the
  previous one is still waiting for its turn or being encoded replaces it and is counted
  (`live_frames_skipped`); nothing queues;
- is cheap: x264 ultrafast, zerolatency (no lookahead, no B-frames: a packet per frame, at once),
  Constrained Baseline (every browser decodes it), one thread, frames wider than
  `webrtc.live_max_width` scaled down inside the encoder's own colour conversion;
- starts a group of pictures every `KEYINT_S` and at once when a viewer joins, so a new viewer's
  first picture comes with the next frame.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import av

from engines.media.encode import EncoderSettings, FrameEncoder
from engines.media.remux import EncodedPacket
from pipelines.compute import ComputeBudget, ModelClaim, Priority
from pipelines.frames import VideoFrame
from pipelines.graph import counter, gauge, register_counters
from pipelines.graph.counters import Counters
from pipelines.mailbox import FrameMailbox, MailboxClosed

log = logging.getLogger(__name__)

STAGE_NAME = "live encoder"
LIVE_ENCODER = "live encoder"  # its name in the compute budget
KEYINT_S = 1.0  # a viewer that lost a packet decodes again within this
LIVE_PROFILE = "baseline"  # x264 writes Constrained Baseline (profile-level-id 42e0xx)

register_counters(
    {
        "live_frames_encoded": counter("Frames encoded to H.264 for live viewers (streams whose packets are not "
                                       "forwarded)"),
        "live_frames_skipped": counter("Frames not encoded for live viewers: the encoder or the compute budget "
                                       "was busy with an earlier frame"),
        "live_encoder_starts": counter("Times the live encoder started (a first viewer came)"),
        "live_encode_cpu_s": counter("CPU seconds the live encoder spent on frames (x264 and the colour conversion, "
                                     "on its own thread): what live video costs this stream beyond its viewers"),
        "live_encoder_running": gauge("1 while the stream's live encoder runs (it has viewers)"),
    },
    section="live",
)


@dataclass(slots=True)
class EncodeTotals:
    """Every stream's live encoders together, for the service's metrics (never decreases but
    `running`)."""

    encoded: int = 0
    skipped: int = 0
    starts: int = 0
    running: int = 0


class LiveEncoder:
    """One stream's frames to H.264 while `wanted()`; each packet to `deliver(pts, packet)` on the
    event loop."""

    name = STAGE_NAME

    def __init__(self, stream_id: str, frames: FrameMailbox, *, wanted: Callable[[], bool],
                 deliver: Callable[[float, EncodedPacket], None], max_width: int,
                 compute: ComputeBudget | None = None, totals: EncodeTotals | None = None) -> None:
        self.stream_id = stream_id
        self.frames = frames
        self._wanted = wanted
        self._deliver = deliver
        self.compute = compute
        if compute is not None:
            compute.add(LIVE_ENCODER, ModelClaim(Priority.BULK))
        self.encoder = FrameEncoder(EncoderSettings(keyint_s=KEYINT_S, profile=LIVE_PROFILE, max_width=max_width))
        self.totals = totals if totals is not None else EncodeTotals()
        self.seen = 0  # frames that reached this stage (viewed or not)
        self.encoded = 0
        self.skipped = 0
        self.starts = 0
        self.cpu_s = 0.0  # thread CPU time of the encodes
        self.failure: str | None = None  # why this stream's frames cannot be encoded, once they could not
        self._dropped_seen = 0
        self._on = False  # between a start and its stop (the x264 context opens on the first frame)
        self._lock = threading.Lock()  # the x264 context: encoded on a worker thread, closed from the loop

    @property
    def running(self) -> bool:
        return self._on

    def keyframe_next(self) -> None:
        """A viewer joined: the next frame starts a group of pictures."""
        self.encoder.keyframe_next()

    async def run(self) -> None:
        try:
            while True:
                frame = await self.frames.get()
                self.seen += 1
                dropped = self.frames.stats.dropped - self._dropped_seen
                self._dropped_seen += dropped
                if self.failure is not None or not self._wanted():
                    self._stop()
                    continue
                if self.running:  # replaced in the mailbox while the previous frame was encoded
                    self.skipped += dropped
                    self.totals.skipped += dropped
                await self._encode(frame)
        except MailboxClosed:
            pass
        finally:
            self._stop()

    def stop(self) -> None:
        """Nothing of its own: the stage ends when its frames end."""

    async def _encode(self, frame: VideoFrame) -> None:
        if not self._on:
            self._on = True
            self.starts += 1
            self.totals.starts += 1
            self.totals.running += 1
            log.info("live encoder started", extra={"stream_id": self.stream_id})
        try:
            packets = await asyncio.to_thread(self._encode_in_turn, frame)
        except (ValueError, OSError, av.error.FFmpegError) as exc:  # live video ends, the stream goes on
            self.failure = f"{type(exc).__name__}: {exc}"
            log.warning("live encoder failed", extra={"stream_id": self.stream_id, "error": self.failure})
            self._stop()
            return
        self.encoded += 1
        self.totals.encoded += 1
        for packet in packets:
            self._deliver(frame.pts, packet)

    def _encode_in_turn(self, frame: VideoFrame) -> list[EncodedPacket]:
        turn = self.compute.turn(LIVE_ENCODER) if self.compute is not None else contextlib.nullcontext()
        with turn, self._lock:
            if not self._on:  # stopped (the stage cancelled) while this frame waited for its turn
                return []
            began = time.thread_time()
            try:
                return self.encoder.encode(frame.image, frame.pts)
            finally:
                self.cpu_s += time.thread_time() - began

    def _stop(self) -> None:
        if not self._on:
            return
        self._on = False
        with self._lock:
            self.encoder.close()
        self.totals.running -= 1
        log.info("live encoder stopped", extra={"stream_id": self.stream_id, "frames": self.encoded})

    def counters(self) -> Counters:
        return {
            "live_frames_encoded": self.encoded,
            "live_frames_skipped": self.skipped,
            "live_encoder_starts": self.starts,
            "live_encode_cpu_s": round(self.cpu_s, 3),
            "live_encoder_running": 1 if self.running else 0,
        }
