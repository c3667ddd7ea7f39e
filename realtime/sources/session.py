"""The contract between the supervisor and a reader backend.

A backend session is a blocking object driven from one worker thread:

    session.open()                      # connect / probe; raises SourceError
    session.run(video_out, audio_out, stop)   # until EOF (returns), error (SourceError) or stop
    session.close()                     # always, from the same thread

`interrupt()` is the only method that may be called from another thread: it asks `run`
(and, where the backend can, a pending `open`) to return soon.

Sessions hand out plain decoded media through callables; the supervisor's feed
(realtime.sources.attempt.Feed) turns that into `VideoFrame` / `AudioChunk` (it owns the
per-stream sequence numbers, across reconnects). A sink returning
False means "nobody wants more": the session returns from `run` at once.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from engines.media.remux import EncodedPacket
from pipelines.frames import DeferredImage
from realtime.errors import ServiceError

# (image H x W x 3 uint8 RGB or one converted on first use, pts seconds, captured_at epoch seconds) -> keep going?
VideoSink = Callable[[np.ndarray | DeferredImage, float, float], bool]
# (samples float32 mono 16 kHz, pts seconds, captured_at epoch seconds) -> keep going?
AudioSink = Callable[[np.ndarray, float, float], bool]
# (pts seconds in the frames' timeline, an encoded video packet as demuxed): for clips, remuxed later
PacketSink = Callable[[float, EncodedPacket], None]


class SourceError(ServiceError):
    """A source could not be opened or read. `str(error)` is a one-line, user-facing reason
    that never contains a password."""


class BackendUnavailable(SourceError):
    """The requested reader backend is not installed on this machine."""


@dataclass(frozen=True, slots=True)
class SessionOptions:
    open_timeout_s: float = 10.0  # connect + probe of a network source
    read_timeout_s: float = 5.0  # no data this long on an open network source -> SourceError
    want_audio: bool = True  # decode audio at all (False: video only)
    latency_ms: int = 200  # jitter buffer for RTP sources (GStreamer)


class SourceSession(Protocol):
    corrupt_packets: int  # packets / frames skipped because they did not decode

    def open(self) -> None: ...

    def run(
        self,
        video_out: VideoSink,
        audio_out: AudioSink | None,
        stop: threading.Event,
        packets_out: PacketSink | None = None,  # a session that demuxes puts each video packet here
    ) -> None: ...

    def interrupt(self) -> None: ...

    def close(self) -> None: ...


class PtsOrigin:
    """Rebases network timestamps so each session starts near 0 (files keep their own).

    One origin is shared by video and audio so they stay in sync.
    """

    def __init__(self, rebase: bool) -> None:
        self._rebase = rebase
        self._origin: float | None = None

    def __call__(self, seconds: float) -> float:
        if not self._rebase:
            return seconds
        if self._origin is None:
            self._origin = seconds
        return seconds - self._origin


def check_complete(last_pts: float | None, duration: float | None) -> None:
    """At a file's end: SourceError if its video stopped well before the duration its header
    declares (a truncated or damaged file). What was decodable has been delivered by then."""
    if duration is None or duration <= 0:
        return
    reached = last_pts if last_pts is not None else 0.0
    if duration - reached > max(2.0, 0.05 * duration):
        raise SourceError(f"file ended early at {reached:.1f} s of {duration:.1f} s (truncated or corrupt)")
