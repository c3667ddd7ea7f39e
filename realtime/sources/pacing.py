"""Real-time pacing for file playback (`--realtime`): deliver frames the way a camera would.

The first frame goes out at once and fixes the mapping media time -> wall clock; every
later frame waits until `first_wall + (pts - first_pts)`. A consumer that falls behind is
not compensated for by slowing the clock (a camera would not wait either): late frames go
out immediately and the lossy mailbox drops what nobody took. A jump back in time (a loop,
a discontinuity) re-anchors the clock.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

REANCHOR_BACKWARDS_S = 1.0


class RealtimePacer:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._anchor: tuple[float, float] | None = None  # (wall, pts)
        self._last_pts: float | None = None

    def wait(self, pts: float, stop: threading.Event) -> bool:
        """Sleep until `pts` is due. Returns False if `stop` was set meanwhile."""
        now = self._clock()
        if self._anchor is None or (self._last_pts is not None and pts < self._last_pts - REANCHOR_BACKWARDS_S):
            self._anchor = (now, pts)
        self._last_pts = pts
        wall0, pts0 = self._anchor
        delay = wall0 + (pts - pts0) - now
        if delay > 0:
            return not stop.wait(delay)
        return not stop.is_set()

    def reset(self) -> None:
        self._anchor = None
        self._last_pts = None


class NoPacing:
    """As fast as the consumer takes frames."""

    def wait(self, pts: float, stop: threading.Event) -> bool:
        return not stop.is_set()

    def reset(self) -> None:
        return None
