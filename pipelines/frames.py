"""The typed data that flows between stages.

Times: `pts` is media time in seconds (from the container / RTP clock, rebased so a
session starts near 0); `captured_at` is wall-clock epoch seconds (time.time()) at the
moment the decoded frame or audio reached the service. Both travel with every result. A frame
also carries `captured_mono`, the monotonic clock at that moment: latencies are measured from it,
so a step of the wall clock never reads as latency (`captured_at` stays what the wire carries).
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Annotated

import numpy as np
from pydantic import AfterValidator

from engines.types import Detections
from pipelines.errors import PipelineError

STREAM_ID_PATTERN = re.compile(r"[A-Za-z0-9_-]{1,64}")
AUDIO_SAMPLE_RATE = 16_000


class InvalidStreamId(PipelineError, ValueError):
    pass


def validate_stream_id(stream_id: str) -> str:
    if not isinstance(stream_id, str) or not STREAM_ID_PATTERN.fullmatch(stream_id):
        raise InvalidStreamId(
            f"invalid stream id {stream_id!r}: use 1-64 characters from A-Z a-z 0-9 _ -"
        )
    return stream_id


# The one validated stream id type for settings and API bodies.
StreamId = Annotated[str, AfterValidator(validate_stream_id)]


class DeferredImage:
    """A decoded picture whose conversion to RGB runs once, on first use, in whichever thread needs
    it first: under the compute budget most frames are never looked at (the tracker predicts their
    boxes), and converting every one cost the cores the detector could have used."""

    __slots__ = ("_convert", "_lock", "_rgb", "height", "width")

    def __init__(self, width: int, height: int, convert: Callable[[], np.ndarray]) -> None:
        self.width = width
        self.height = height
        self._convert: Callable[[], np.ndarray] | None = convert
        self._rgb: np.ndarray | None = None
        self._lock = threading.Lock()

    @property
    def converted(self) -> bool:
        return self._rgb is not None

    def rgb(self) -> np.ndarray:
        """H x W x 3 uint8 RGB, C-contiguous; the same array on every call."""
        with self._lock:
            if self._rgb is None:
                assert self._convert is not None
                self._rgb = np.ascontiguousarray(self._convert())
                self._convert = None  # the decoder's frame is not needed any more
            return self._rgb


def as_rgb(pixels: np.ndarray | DeferredImage) -> np.ndarray:
    return pixels if isinstance(pixels, np.ndarray) else pixels.rgb()


@dataclass(frozen=True, slots=True)
class VideoFrame:
    stream_id: str
    seq: int  # per-stream counter of frames that reached the service, never reset
    pts: float
    captured_at: float
    # H x W x 3 uint8 RGB, C-contiguous, or a decoded picture converted to that on first use
    pixels: np.ndarray | DeferredImage
    t: float | None = None  # the stream clock's time (pipelines.clock), stamped by the graph's frame tee
    # time.monotonic() when it reached the service: the origin of its latency. Sources stamp it
    # beside `captured_at`; a frame built without one (a test, a bench) reads "now".
    captured_mono: float = field(default_factory=time.monotonic)

    @property
    def image(self) -> np.ndarray:
        """The RGB picture (converted now if it was not yet)."""
        return as_rgb(self.pixels)

    @property
    def width(self) -> int:
        pixels = self.pixels
        return int(pixels.shape[1]) if isinstance(pixels, np.ndarray) else pixels.width

    @property
    def height(self) -> int:
        pixels = self.pixels
        return int(pixels.shape[0]) if isinstance(pixels, np.ndarray) else pixels.height


@dataclass(frozen=True, slots=True)
class AudioChunk:
    stream_id: str
    pts: float
    captured_at: float
    samples: np.ndarray  # float32 mono in [-1, 1] at `sample_rate`
    sample_rate: int = AUDIO_SAMPLE_RATE

    @property
    def duration(self) -> float:
        return float(self.samples.shape[0]) / self.sample_rate


class StreamState(StrEnum):
    CONNECTING = "connecting"
    LIVE = "live"
    STALLED = "stalled"
    RECONNECTING = "reconnecting"
    STOPPED = "stopped"
    FAILED = "failed"


@dataclass(frozen=True, slots=True)
class StatusChange:
    stream_id: str
    state: StreamState
    previous: StreamState | None
    at: float  # wall clock
    reason: str | None = None
    attempt: int = 0  # connect attempts since the last time the stream was live
    retry_in: float | None = None  # seconds until the next connect attempt, when reconnecting


@dataclass(frozen=True, slots=True)
class FrameResult:
    """One processed frame: what the detector saw (or, on a frame it skipped, where the tracker
    predicts the tracks are), and when."""

    frame_seq: int
    stream_id: str
    pts: float
    t: float  # the frame's moment on the stream clock (see pipelines.clock.Moment)
    captured_at: float
    width: int
    height: int
    detections: Detections
    inference_ms: float
    predicted: bool = False  # no model call: the boxes are tracker predictions
