"""One stream's timeline: a media clock that never runs backwards, and the moment of each frame.

Network sources rebase pts to about 0 on every (re)connect. Anything that measures time
in media seconds (track loss timeouts, durations) would then see time stand still or run
backwards until pts caught up. The clock follows pts while it advances; when pts jumps
back, it continues from where it was plus the wall-clock time that passed meanwhile.

A stream has one clock (`StageContext.clock`): the graph's frame tee stamps each frame with its
time (`VideoFrame.t`) as the source delivers it, so every stage reads the same moment for the same
frame, however late it takes it. The source's reader thread stamps while the frame loop may move
the clock on through an outage (`idle`), hence the lock.

The process's two clocks come through one injectable `Clock`: the wall clock only for timestamps
that leave the process (`captured_at`, event times), the monotonic clock for every duration and
latency, so an NTP step moves a timestamp but never shows up as latency. Tests hand in their own
to step either one.
"""

from __future__ import annotations

import threading
from time import monotonic as _monotonic
from time import time as _wall
from typing import NamedTuple, Protocol

# A backwards step larger than this is a restart of the source's clock, not jitter.
REBASE_THRESHOLD_S = 0.5


class Clock(Protocol):
    def wall(self) -> float:
        """Epoch seconds: for timestamps only; it can step (NTP, an operator)."""
        ...

    def monotonic(self) -> float:
        """Seconds from an arbitrary origin that never steps: for durations and latencies."""
        ...


class SystemClock:
    def wall(self) -> float:
        return _wall()

    def monotonic(self) -> float:
        return _monotonic()


SYSTEM_CLOCK: Clock = SystemClock()


class Moment(NamedTuple):
    """When a frame happened, twice. `t` is the stream clock (never runs backwards; the tracker,
    rules and every later stage time durations, timeouts and cooldowns with it); `pts` is the
    frame's media time, which restarts after a reconnect (events report it). The frame loop
    computes it once per frame and hands the same value to every stage."""

    t: float
    pts: float


class StreamClock:
    def __init__(self) -> None:
        self._offset = 0.0
        self._last_time: float | None = None
        self._last_captured_at = 0.0
        self._lock = threading.Lock()

    def __call__(self, pts: float, captured_at: float) -> float:
        with self._lock:
            return self._advance(pts, captured_at)

    def _advance(self, pts: float, captured_at: float) -> float:
        time = pts + self._offset
        if self._last_time is not None and time < self._last_time - REBASE_THRESHOLD_S:
            gap = max(0.0, captured_at - self._last_captured_at)
            self._offset = self._last_time + gap - pts
            time = pts + self._offset
        elif self._last_time is not None:
            time = max(time, self._last_time)  # small jitter: hold, never step back
        self._last_time, self._last_captured_at = time, captured_at
        return time

    def moment(self, pts: float, captured_at: float) -> Moment:
        return Moment(self(pts, captured_at), pts)

    def moment_of(self, pts: float, captured_at: float, t: float | None) -> Moment:
        """A frame's moment: the time its tee stamped (`t`), or, for a frame that came by no tee
        (a stage driven directly), this clock's reading now."""
        return Moment(t, pts) if t is not None else self.moment(pts, captured_at)

    def idle(self, wall: float) -> float | None:
        """The stream time now, while no frame arrives (an outage): the last frame's time plus the
        wall-clock time since it came. The clock moves on to it, so the next frame never reads
        earlier. None before the first frame."""
        with self._lock:
            if self._last_time is None:
                return None
            time = self._last_time + max(0.0, wall - self._last_captured_at)
            self._last_time, self._last_captured_at = time, max(wall, self._last_captured_at)
            return time
