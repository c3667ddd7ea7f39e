from __future__ import annotations

import threading

import pytest

from realtime.sources.pacing import NoPacing, RealtimePacer


class FakeTime(threading.Event):
    """A clock plus a stop event whose wait() advances the clock instead of sleeping."""

    def __init__(self) -> None:
        super().__init__()
        self.now = 100.0
        self.sleeps: list[float] = []

    def clock(self) -> float:
        return self.now

    def wait(self, timeout: float | None = None) -> bool:
        assert timeout is not None
        self.sleeps.append(round(timeout, 6))
        self.now += timeout
        return self.is_set()


def test_frames_wait_for_their_media_time() -> None:
    fake = FakeTime()
    pacer = RealtimePacer(clock=fake.clock)
    assert all(pacer.wait(pts, fake) for pts in (5.0, 5.1, 5.2, 5.3))
    assert fake.sleeps == pytest.approx([0.1, 0.1, 0.1])  # the first frame goes out at once


def test_a_late_consumer_is_not_compensated_by_slowing_down() -> None:
    fake = FakeTime()
    pacer = RealtimePacer(clock=fake.clock)
    pacer.wait(0.0, fake)
    fake.now += 1.0  # the consumer held the reader for a second
    assert pacer.wait(0.5, fake) and fake.sleeps == []  # overdue: out at once
    assert pacer.wait(1.2, fake) and fake.sleeps == pytest.approx([0.2])  # the clock kept its anchor


def test_a_jump_back_in_time_reanchors() -> None:
    fake = FakeTime()
    pacer = RealtimePacer(clock=fake.clock)
    pacer.wait(60.0, fake)
    pacer.wait(0.0, fake)  # the file looped / timestamps restarted
    pacer.wait(0.1, fake)
    assert fake.sleeps == pytest.approx([0.1])


def test_stop_ends_the_wait() -> None:
    fake = FakeTime()
    pacer = RealtimePacer(clock=fake.clock)
    pacer.wait(0.0, fake)
    fake.set()
    assert pacer.wait(1.0, fake) is False
    assert NoPacing().wait(1.0, fake) is False
