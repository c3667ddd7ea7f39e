"""A session's received tracks, read into the stream graph.

aiortc decodes in a thread per receiver and queues every decoded frame for `recv()` without
bound: a reader that falls behind builds seconds of lag. So the video reader always drains
that queue and converts only the newest frame (the others are counted as stale), drops frames
faster than `max_fps` before converting them, and scales frames larger than the limits down.
Audio is resampled once to 16 kHz mono float32, the hand-off camera audio uses; when the stream
wants no audio it is still drained and discarded.

Both tracks share one session timeline: pts is media time rebased so that the session's first
frame of either kind arrives near 0, and `captured_at` is the wall-clock time the frame left
aiortc's queue.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import av
import numpy as np
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack

from pipelines.frames import AUDIO_SAMPLE_RATE, AudioChunk, VideoFrame
from pipelines.graph.source import AudioInput, FrameInput
from realtime.sources.decode import deferred_rgb


@dataclass(frozen=True, slots=True)
class VideoLimits:
    max_width: int
    max_height: int
    max_fps: float


@dataclass(slots=True)
class MediaStats:
    video_frames: int = 0  # received from aiortc
    video_stale: int = 0  # skipped unconverted: a newer frame was already queued
    video_over_rate: int = 0  # skipped unconverted: faster than max_fps
    video_scaled: int = 0  # larger than the limits, scaled down
    frames_in: int = 0  # converted and handed to the graph
    audio_frames: int = 0
    audio_discarded: int = 0  # the stream wants no audio
    audio_seconds: float = 0.0
    extra_frames: int = 0  # of tracks beyond the first video and audio one, discarded
    last_media_at: float | None = None  # monotonic


class SessionClock:
    """Media time of both tracks on one timeline, starting near 0 at the session's first frame."""

    def __init__(self) -> None:
        self._epoch: float | None = None

    def offset(self, first_time: float | None, received: float) -> float:
        """What to add to a track's frame times, given its first frame's time and arrival."""
        if self._epoch is None:
            self._epoch = received
        return (received - self._epoch) - (first_time or 0.0)


def fit(width: int, height: int, limits: VideoLimits) -> tuple[int, int]:
    """The largest even size within the limits with the frame's aspect ratio."""
    scale = min(1.0, limits.max_width / width, limits.max_height / height)
    if scale >= 1.0:
        return width, height
    return max(2, int(width * scale) // 2 * 2), max(2, int(height * scale) // 2 * 2)


def _newest(track: MediaStreamTrack, frame: Any) -> tuple[Any, int, bool]:
    """The newest frame already decoded, how many older ones were skipped, and whether the
    track ended behind them. aiortc keeps them in the track's `_queue` (an asyncio.Queue; a None
    ends the track); without one, the frame is simply the newest known."""
    queue = getattr(track, "_queue", None)
    skipped, ended = 0, False
    while isinstance(queue, asyncio.Queue) and not queue.empty():
        queued = queue.get_nowait()
        if queued is None:
            ended = True
            break
        frame, skipped = queued, skipped + 1
    return frame, skipped, ended


async def read_video(
    track: MediaStreamTrack,
    out: FrameInput,
    *,
    stream_id: str,
    limits: VideoLimits,
    clock: SessionClock,
    stats: MediaStats,
) -> None:
    """Until the track ends or the graph takes no more frames."""
    min_interval = 0.8 / limits.max_fps  # some jitter below the limit is still the limit's rate
    offset: float | None = None
    last_accepted = float("-inf")
    seq = 0
    async for taken, received in _received(track, stats):
        frame, skipped, ended = _newest(track, taken)
        stats.video_frames += 1 + skipped
        stats.video_stale += skipped
        if received - last_accepted < min_interval:
            stats.video_over_rate += 1
        else:
            last_accepted = received
            if offset is None:
                offset = clock.offset(frame.time, received)
            width, height = fit(frame.width, frame.height, limits)
            if (width, height) != (frame.width, frame.height):
                stats.video_scaled += 1
            image = deferred_rgb(frame, width, height)  # converted only if something looks at it
            pts = (frame.time if frame.time is not None else 0.0) + offset
            if not out.put(VideoFrame(stream_id, seq, pts, received, image), timeout=0):
                return
            seq += 1
            stats.frames_in += 1
        if ended:
            return


async def read_audio(
    track: MediaStreamTrack,
    out: AudioInput | None,
    *,
    stream_id: str,
    clock: SessionClock,
    stats: MediaStats,
) -> None:
    """Until the track ends; `out` None: drain and discard (the queue must never grow)."""
    resampler = av.AudioResampler(format="flt", layout="mono", rate=AUDIO_SAMPLE_RATE)
    offset: float | None = None
    async for frame, received in _received(track, stats):
        stats.audio_frames += 1
        if out is None or not isinstance(frame, av.AudioFrame):
            stats.audio_discarded += 1
            continue
        if offset is None:
            offset = clock.offset(frame.time, received)
        pts = (frame.time if frame.time is not None else 0.0) + offset
        for resampled in resampler.resample(frame):
            samples = resampled.to_ndarray().reshape(-1).astype(np.float32, copy=False)
            stats.audio_seconds += samples.shape[0] / AUDIO_SAMPLE_RATE
            if not out.put(AudioChunk(stream_id, pts, received, samples)):
                return


async def drain(track: MediaStreamTrack, stats: MediaStats) -> None:
    """A track nobody reads (a second camera): take its frames so aiortc's queue stays empty."""
    async for _ in _received(track, stats):
        stats.extra_frames += 1


async def _received(track: MediaStreamTrack, stats: MediaStats) -> AsyncIterator[tuple[Any, float]]:
    """Each frame aiortc decoded, with the wall-clock time it was taken, until the track ends."""
    while True:
        try:
            frame = await track.recv()
        except MediaStreamError:
            return
        stats.last_media_at = time.monotonic()
        yield frame, time.time()
