"""Which frames the describer keeps: often while something happens, seldom while nothing does.

A frame is taken at most every `min_interval_s` of stream time, and at least every
`max_interval_s`. In between, one is taken as soon as there is a reason: a track started or
ended, an alert changed, or the picture moved (the mean grey-level difference of a small
thumbnail against the last frame taken). A quiet corridor then costs a frame every ten seconds;
someone walking through it, a frame a second.
"""

from __future__ import annotations

import cv2
import numpy as np

from pipelines.frames import DeferredImage, as_rgb

THUMB_SIZE = (32, 18)  # width, height: enough to see a person cross the frame, cheap to compare


MOTION_CHECK_S = 0.25  # the picture is compared at most this often (it runs on the event loop)


def thumbnail(image: np.ndarray) -> np.ndarray:
    """A small grey picture of an RGB frame, as float32 (0-255). Every few pixels are taken
    before the area resize, so a 4K frame costs about what a small one does."""
    step = max(1, image.shape[0] // (THUMB_SIZE[1] * 8))
    small = cv2.resize(image[::step, ::step], THUMB_SIZE, interpolation=cv2.INTER_AREA)
    return np.asarray(small, np.float32).mean(axis=2)


class FrameSampler:
    """Pure: time only moves with the `t` passed in (the stream clock)."""

    def __init__(self, min_interval_s: float, max_interval_s: float, motion_threshold: float) -> None:
        self.min_interval_s = min_interval_s
        self.max_interval_s = max_interval_s
        self.motion_threshold = motion_threshold
        self._last_t: float | None = None
        self._last_thumb: np.ndarray | None = None
        self._activity = False
        self._motion_checked = float("-inf")
        self.reasons: dict[str, int] = {"first": 0, "max_interval": 0, "activity": 0, "motion": 0}

    def note_activity(self) -> None:
        """Something happened (a track or an alert changed): take the next frame allowed."""
        self._activity = True

    def offer(self, t: float, image: np.ndarray | DeferredImage | None = None) -> bool:
        """Should the frame at `t` be taken? `image` (RGB, or a frame's picture, converted only when
        looked at) is looked at for motion only when nothing else decides, and to remember a frame
        taken; None skips both."""
        last = self._last_t
        if last is None:
            reason = "first"
        elif t - last < self.min_interval_s:
            return False
        elif t - last >= self.max_interval_s:
            reason = "max_interval"
        elif self._activity:
            reason = "activity"
        elif image is not None and t - self._motion_checked >= MOTION_CHECK_S and self._moved(t, as_rgb(image)):
            reason = "motion"
        else:
            return False
        self._take(t, None if image is None else as_rgb(image), reason)
        return True

    def overdue(self, t: float) -> bool:
        """No frame yet, or none for max_interval_s: the frame at `t` is taken whatever else holds."""
        return self._last_t is None or t - self._last_t >= self.max_interval_s

    def _moved(self, t: float, image: np.ndarray) -> bool:
        self._motion_checked = t
        if self._last_thumb is None:
            return False
        thumb = thumbnail(image)
        return float(np.abs(thumb - self._last_thumb).mean()) >= self.motion_threshold

    def _take(self, t: float, image: np.ndarray | None, reason: str) -> None:
        self._last_t = t
        self._activity = False
        if image is not None:
            self._last_thumb = thumbnail(image)
        self.reasons[reason] += 1
