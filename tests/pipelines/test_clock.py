from __future__ import annotations

import pytest

from engines.types import Detections
from pipelines.clock import StreamClock
from pipelines.tracker import ByteTracker, LifecycleKind
from tests.pipelines.test_tracker import dets, walker


def test_follows_pts_while_it_advances() -> None:
    clock = StreamClock()
    assert [clock(p, 100 + p) for p in (0.0, 0.1, 0.2)] == [0.0, 0.1, 0.2]


def test_reconnect_restarting_pts_continues_with_the_wall_time_that_passed() -> None:
    clock = StreamClock()
    clock(0.0, 100.0)
    assert clock(30.0, 130.0) == 30.0
    # The camera dropped; 4 s later a new session starts its pts near zero.
    assert clock(0.05, 134.0) == pytest.approx(34.0)
    assert clock(0.15, 134.1) == pytest.approx(34.1)


def test_small_backward_jitter_never_steps_back() -> None:
    clock = StreamClock()
    clock(5.0, 0.0)
    assert clock(4.9, 0.1) == 5.0


def test_tracks_lost_before_a_reconnect_end_after_it() -> None:
    tracker, clock = ByteTracker(), StreamClock()
    for i in range(10):
        tracker.update(dets(walker(10 + 4 * i)), clock(20 + i * 0.1, 1000 + i * 0.1))
    # Reconnect 3 s later; pts restarts near 0 and the person is gone.
    ended = []
    for i in range(5):
        out = tracker.update(Detections.empty(), clock(i * 0.1, 1004 + i * 0.1))
        ended += [e for e in out.events if e.kind == LifecycleKind.END]
    assert [e.reason for e in ended] == ["lost"]
