"""The frame watchdog on its own, on a scripted clock: no RTSP server, no threads."""

from __future__ import annotations

from dataclasses import dataclass

from realtime.sources.supervisor import _StallWatch


@dataclass
class Reader:
    """What the watchdog reads of a connect attempt."""

    frames: int = 0
    last_frame_at: float = 0.0
    delivering: bool = False
    gap_limit: float = float("inf")
    long_gaps: int = 0
    long_gap_s: float = 0.0

    def frame(self, at: float) -> None:
        """A frame arrives; as the reader thread does, count a silence before it past `gap_limit`."""
        if self.frames and at - self.last_frame_at > self.gap_limit:
            self.long_gaps += 1
            self.long_gap_s = at - self.last_frame_at
        self.frames += 1
        self.last_frame_at = at


def test_silence_past_the_watchdog_is_a_stall_and_two_frames_end_it() -> None:
    watch = _StallWatch(watchdog_s=5.0)
    reader = Reader()
    reader.frame(at=0.0)
    assert watch.update(reader, 4.9) is None
    assert watch.update(reader, 5.1) == "stalled" and watch.quiet_for == 5.1
    assert watch.update(reader, 6.0) is None  # reported once
    assert round(watch.stalled_for(8.0), 6) == 2.9
    reader.frame(at=8.0)  # one frame flushed out of a dying decoder does not end the stall
    assert watch.update(reader, 8.0) is None
    reader.frame(at=8.1)
    assert watch.update(reader, 8.1) == "resumed" and watch.stalled_for(8.2) == 0.0


def test_time_spent_delivering_is_the_consumers_not_the_sources() -> None:
    # Pacing a file or waiting on a slow consumer is not the camera going quiet.
    watch = _StallWatch(watchdog_s=1.0)
    reader = Reader(delivering=True)
    reader.frame(at=0.0)
    assert watch.update(reader, 30.0) is None and watch.quiet_for == 0.0
    reader.delivering = False
    assert watch.update(reader, 30.0) == "stalled"


def test_a_steady_source_never_stalls() -> None:
    watch = _StallWatch(watchdog_s=0.5)
    reader = Reader()
    for tick in range(100):
        reader.frame(at=tick * 0.1)
        assert watch.update(reader, tick * 0.1 + 0.05) is None


def test_a_silence_ended_before_the_watchdog_looked_is_still_a_stall() -> None:
    # PyAV's read timeout hands out one buffered frame just as the watchdog is due: the silence
    # before it was a stall all the same, and that one frame does not end it.
    watch = _StallWatch(watchdog_s=5.0)
    reader = Reader(gap_limit=5.0)
    reader.frame(at=0.0)
    assert watch.update(reader, 4.9) is None
    reader.frame(at=5.02)
    assert watch.update(reader, 5.03) == "stalled" and watch.quiet_for == 5.02
    assert watch.update(reader, 9.0) is None
    reader.frame(at=9.5)  # the next real frames end it
    reader.frame(at=9.6)
    assert watch.update(reader, 9.6) == "resumed"
    assert watch.update(reader, 9.7) is None  # the gap before 9.5 was seen while stalled


def test_the_watchdog_is_due_exactly_watchdog_s_after_the_last_frame() -> None:
    watch = _StallWatch(watchdog_s=5.0)
    reader = Reader()
    reader.frame(at=10.0)
    assert watch.due_in(reader, 12.0) == 3.0
    assert watch.update(reader, 15.01) == "stalled" and watch.due_in(reader, 15.01) is None


def test_the_restart_is_due_exactly_stall_restart_s_after_the_stall() -> None:
    # The supervisor wakes then rather than on its next tick: the reader's own timeout is close behind.
    watch = _StallWatch(watchdog_s=5.0)
    reader = Reader()
    reader.frame(at=10.0)
    assert watch.restart_due_in(4.0, 12.0) is None  # not stalled
    assert watch.update(reader, 15.5) == "stalled"
    assert watch.restart_due_in(4.0, 16.5) == 3.0
    assert watch.restart_due_in(4.0, 21.0) == 0.0
