"""Rules on real footage: vtest.avi through the real people model and the real tracker."""

from __future__ import annotations

from collections import Counter

import pytest

from pipelines.clock import Moment
from pipelines.rules.engine import RuleEngine
from pipelines.rules.types import AlertChange, AlertEventKind, tracked_objects
from pipelines.tracker import ByteTracker, LifecycleKind
from tests.pipelines.rules.script import rules
from tests.support.vtest import VtestDetections

# The right part of the plaza (the frame is 768 x 576): people walk in and out of it...
PLAZA_EAST = [[580, 140], [768, 140], [768, 420], [580, 420]]
# ...and across this line, in both directions.
CROSSING = [[600, 140], [600, 420]]


@pytest.fixture(scope="module")
def alerts(vtest_detections: VtestDetections) -> list[AlertChange]:
    names = vtest_detections.names
    engine = RuleEngine(
        "plaza",
        rules(
            {"id": "east", "type": "zone", "polygon": PLAZA_EAST, "events": ["enter", "exit"]},
            {"id": "crossing", "type": "line", "points": CROSSING, "direction": "any"},
            {"id": "fallen", "type": "fall", "for_s": 2},
        ),
        names,
    )
    tracker = ByteTracker()
    changes: list[AlertChange] = []
    now = Moment(0.0, 0.0)
    for frame in vtest_detections.frames:
        now = Moment(frame.pts, frame.pts)
        out = tracker.update(frame.detections, now.t)
        ended = [e.track_id for e in out.events if e.kind is LifecycleKind.END]
        objects = tracked_objects(tracker.active_tracks, names)
        changes += engine.evaluate(now, objects, ended=ended, frame_size=(frame.shape[1], frame.shape[0]))
    return changes + engine.finish(now)


def of(changes: list[AlertChange], rule_id: str, kind: AlertEventKind = AlertEventKind.START) -> list[AlertChange]:
    return [c for c in changes if c.rule_id == rule_id and c.kind is kind]


def test_people_walking_into_the_zone_are_entries_once_per_track(alerts: list[AlertChange]) -> None:
    entries = [c for c in of(alerts, "east") if c.evidence["trigger"] == "enter"]
    assert len(entries) >= 3, entries
    per_track = Counter(c.track_ids for c in entries)
    assert max(per_track.values()) == 1, per_track
    for entry in entries:
        x1, _, x2, y2 = entry.evidence["objects"][0]["box"]
        assert (x1 + x2) / 2 >= 580 - 15 and 140 - 15 <= y2 <= 420 + 15  # feet in (or at the band of) the zone


def test_people_crossing_the_line_are_counted_once_per_track(alerts: list[AlertChange]) -> None:
    crossings = of(alerts, "crossing")
    assert len(crossings) >= 2, crossings
    assert max(Counter(c.track_ids for c in crossings).values()) == 1
    assert {c.evidence["trigger"] for c in crossings} == {"a_to_b", "b_to_a"}  # people walk both ways here
    assert len(of(alerts, "crossing", AlertEventKind.END)) == len(crossings)


def test_fall_alerts_only_for_tracks_held_as_fall(alerts: list[AlertChange]) -> None:
    falls = of(alerts, "fallen")
    # The model holds one object near the bottom-left as `Fall` through the whole clip.
    assert len(falls) >= 1 and all(c.class_name == "Fall" for c in falls)
    assert max(Counter(c.track_ids for c in falls).values()) == 1
    assert all(c.evidence["held_s"] >= 2.0 for c in falls)


def test_every_start_has_exactly_one_end_with_its_id(alerts: list[AlertChange]) -> None:
    started = [c.alert_id for c in alerts if c.kind is AlertEventKind.START]
    ended = [c.alert_id for c in alerts if c.kind is AlertEventKind.END]
    assert len(set(started)) == len(started) and sorted(started) == sorted(ended)
