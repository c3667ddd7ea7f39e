"""Tracker behaviour on scripted detections: ids, lifecycle events, occlusion, bounds."""

from __future__ import annotations

import numpy as np

from engines.types import Detections
from pipelines.tracker import ByteTracker, LifecycleKind, TrackerConfig, iou_matrix

DT = 0.1  # 10 fps


def dets(*objects: tuple[float, float, float, float, float, int]) -> Detections:
    if not objects:
        return Detections.empty()
    arr = np.array(objects, dtype=np.float32)
    return Detections(boxes=arr[:, :4], scores=arr[:, 4], class_ids=arr[:, 5].astype(np.int32))


def walker(x: float, y: float = 100, score: float = 0.8, cls: int = 0) -> tuple[float, ...]:
    return (x, y, x + 40, y + 100, score, cls)


def test_iou_matrix_basics() -> None:
    a = np.array([[0, 0, 10, 10]], np.float32)
    b = np.array([[0, 0, 10, 10], [5, 0, 15, 10], [20, 20, 30, 30]], np.float32)
    np.testing.assert_allclose(iou_matrix(a, b)[0], [1.0, 50 / 150, 0.0], rtol=1e-6)


def test_walking_person_keeps_one_id_and_updates_only_on_meaningful_moves() -> None:
    tracker = ByteTracker()
    ids, events = set(), []
    for i in range(40):
        out = tracker.update(dets(walker(10 + 5 * i)), pts=i * DT)
        ids.update(t for t in out.track_ids if t is not None)
        events += out.events
    assert ids == {1}
    kinds = [e.kind for e in events]
    assert kinds[0] == LifecycleKind.NEW and kinds.count(LifecycleKind.NEW) == 1
    updates = [e for e in events if e.kind == LifecycleKind.UPDATE]
    # 195 px travelled with a ~63 px box: a handful of position updates, not one per frame.
    assert 2 <= len(updates) <= 8
    assert all("position" in e.changed for e in updates)


def test_still_object_produces_no_updates() -> None:
    tracker = ByteTracker()
    events = []
    for i in range(50):
        jitter = (i % 3) - 1  # a pixel of detector noise
        events += tracker.update(dets(walker(100 + jitter)), pts=i * DT).events
    assert [e.kind for e in events] == [LifecycleKind.NEW]


def test_short_occlusion_keeps_id_and_long_loss_ends_track() -> None:
    cfg = TrackerConfig(lost_timeout_s=1.0)
    tracker = ByteTracker(cfg)
    for i in range(10):
        tracker.update(dets(walker(10 + 4 * i)), pts=i * DT)
    for i in range(10, 15):  # 0.5 s hidden behind a sign
        assert tracker.update(dets(), pts=i * DT).events == []
    out = tracker.update(dets(walker(10 + 4 * 15)), pts=15 * DT)
    assert out.track_ids == [1]
    ended = []
    for i in range(16, 40):
        ended += [e for e in tracker.update(dets(), pts=i * DT).events if e.kind == LifecycleKind.END]
    assert len(ended) == 1 and ended[0].track_id == 1 and ended[0].reason == "lost"


def test_low_score_detection_keeps_live_track() -> None:
    tracker = ByteTracker()
    for i in range(5):
        tracker.update(dets(walker(10 + 3 * i)), pts=i * DT)
    out = tracker.update(dets(walker(25, score=0.2)), pts=5 * DT)
    assert out.track_ids == [1]
    # ...but a low-score detection alone never starts a track.
    out = tracker.update(dets(walker(28), walker(400, score=0.2)), pts=6 * DT)
    assert out.track_ids == [1, None]


def test_single_frame_false_positive_is_never_announced() -> None:
    tracker = ByteTracker()
    tracker.update(dets(walker(10)), pts=0.0)
    events = tracker.update(dets(walker(12), walker(500)), pts=DT).events
    for i in range(2, 30):
        events += tracker.update(dets(walker(10 + 2 * i)), pts=i * DT).events
    assert {e.track_id for e in events} == {1}


def test_crossing_people_keep_their_ids() -> None:
    tracker = ByteTracker()
    history: dict[int, list[float]] = {}
    for i in range(40):
        a = walker(50 + 8 * i, y=100)
        b = walker(370 - 8 * i, y=130)
        out = tracker.update(dets(a, b), pts=i * DT)
        for track_id, box in zip(out.track_ids, (a, b), strict=True):
            if track_id is not None:
                history.setdefault(track_id, []).append(box[0])
    assert set(history) == {1, 2}
    # Each id's x-positions move monotonically in one direction: no swap at the crossing.
    for xs in history.values():
        steps = np.sign(np.diff(xs))
        assert abs(steps.sum()) == len(steps)


def test_class_flicker_is_smoothed_but_a_real_change_is_reported() -> None:
    tracker = ByteTracker()
    events = []
    for i in range(20):
        cls = 1 if i == 10 else 0  # one frame says "Fall"
        events += tracker.update(dets(walker(100, cls=cls)), pts=i * DT).events
    assert not any("class" in e.changed for e in events)
    for i in range(20, 30):
        events += tracker.update(dets(walker(100, cls=1)), pts=i * DT).events
    changes = [e for e in events if "class" in e.changed]
    assert len(changes) == 1 and changes[0].class_id == 1


def test_finish_ends_every_announced_track() -> None:
    tracker = ByteTracker()
    for i in range(3):
        tracker.update(dets(walker(10), walker(300)), pts=i * DT)
    ends = tracker.finish()
    assert sorted(e.track_id for e in ends) == [1, 2]
    assert {e.reason for e in ends} == {"stream_stopped"} and tracker.active_tracks == []


def test_track_count_is_bounded() -> None:
    tracker = ByteTracker(TrackerConfig(max_tracks=5))
    for i in range(3):
        boxes = [walker(60 * k, y=10 + 2 * i) for k in range(8)]
        out = tracker.update(dets(*boxes), pts=i * DT)
    assert len(tracker._tracks) <= 5
    assert tracker.evicted >= 3
    # Established tracks win over newcomers; a never-announced track ends silently.
    assert sorted(t for t in out.track_ids if t is not None) == [1, 2, 3, 4, 5]
    assert not any(e.reason == "evicted" for e in out.events)
