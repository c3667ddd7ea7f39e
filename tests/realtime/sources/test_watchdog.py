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

    def frame(self, at: float) -> None:
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
