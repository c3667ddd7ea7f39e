"""fall held for T, cooldowns, the engine clock across a media-time restart, and the alert body."""

from __future__ import annotations

import pytest

from pipelines.clock import Moment, StreamClock
from pipelines.event_bodies import alert_event
from pipelines.events import EventKind
from tests.pipelines.rules.script import ends, engine, person, run, starts, timeline


def test_fall_held_for_t_fires_once_and_clears() -> None:
    eng = engine({"id": "fallen", "type": "fall", "for_s": 2, "severity": "critical"})
    frames = [(t, [person(1, 400, 400)]) for t in timeline(0, 2)]
    frames += [(t, [person(1, 400, 400, cls="Fall")]) for t in timeline(2, 3)]  # 1 s: too short
    frames += [(t, [person(1, 400, 400)]) for t in timeline(3, 4)]
    frames += [(t, [person(1, 400, 400, cls="Fall")]) for t in timeline(4, 10)]
    frames += [(t, [person(1, 400, 400)]) for t in timeline(10, 12)]
    start, end = run(eng, frames)
    assert start.started_pts == 6.0 and start.severity == "critical" and start.class_name == "Fall"
    assert start.evidence["fall_class"] == "Fall" and start.evidence["objects"][0]["box"] == [375, 300, 425, 400]
    assert end.ended_pts == 10.0 and end.duration_s == 4.0 and end.alert_id == start.alert_id


def test_cooldown_suppresses_a_refire_and_allows_one_after_it() -> None:
    eng = engine({"id": "someone", "type": "present", "cooldown_s": 10, "clear_s": 0})
    seen = [person(1, 400, 400)]
    frames = [(t, seen) for t in timeline(0, 2)]  # alert 1: 0.0 - 2.0
    frames += [(t, []) for t in timeline(2, 3)]
    frames += [(t, seen) for t in timeline(3, 5)]  # back within the cooldown: no alert
    frames += [(t, []) for t in timeline(5, 6)]
    frames += [(t, seen) for t in timeline(6, 14)]  # still there when the cooldown ends at 12.0
    changes = run(eng, frames)
    assert [(c.kind.value, c.pts) for c in changes] == [("start", 0.0), ("end", 2.0), ("start", 12.0)]
    assert eng.suppressed == 2
    assert changes[0].alert_id != changes[2].alert_id


def test_rules_run_on_the_stream_clock_across_a_media_time_restart() -> None:
    # A reconnected camera's pts start again near 0. The rules get the frame loop's moments, whose
    # stream clock (the tracker's too) carries on over the 4 s outage instead of running backwards.
    eng = engine({"id": "someone", "type": "present", "clear_s": 0})
    clock = StreamClock()
    seen = [person(1, 400, 400)]
    moments = [(clock.moment(t, 1000 + t - 100), seen) for t in timeline(100, 105)]  # wall 1000-1004.9
    moments += [(clock.moment(t, 1008.8 + t), seen) for t in timeline(0.1, 3)]  # back at wall 1008.9
    moments += [(clock.moment(3.0, 1011.8), [])]
    changes = []
    for now, objects in moments:
        changes += eng.evaluate(now, objects, ended=[] if objects else [1], frame_size=(1000, 1000))
    start, end = changes
    assert end.pts == 3.0  # the frame the end was decided on, in its own media time
    assert end.duration_s == 11.8  # 4.9 s before the outage, the 4 s outage, 2.9 s after
    # The alert's times are on one timeline (the start's): its end comes after its start, not at
    # the reconnected camera's pts 3.0.
    assert start.started_pts == 100.0 and end.ended_pts == pytest.approx(111.8)


def test_alert_event_body_follows_the_contract() -> None:
    eng = engine({"id": "fallen", "type": "fall", "for_s": 0, "clear_s": 0, "snapshot": True})
    (start,) = eng.evaluate(Moment(1.0, 1.0), [person(4, 400, 400, cls="Fall")])
    (end,) = eng.evaluate(Moment(1.5, 1.5), [person(4, 400, 400)])
    body_start = alert_event("cam", start, captured_at=1e9, snapshot="nats-object://b/k.jpg")
    body_end = alert_event("cam", end, captured_at=1e9 + 0.5, snapshot=None)
    assert body_start.kind is EventKind.ALERTS and body_start.durable and body_start.pts == 1.0
    assert set(body_start.data) == {
        "alert_id", "rule_id", "rule_type", "event", "severity", "track_ids", "class", "evidence",
        "started_pts", "snapshot",
    }  # fmt: skip
    assert body_start.data["event"] == "start" and body_start.data["snapshot"] == "nats-object://b/k.jpg"
    assert body_end.data["event"] == "end" and body_end.data["ended_pts"] == 1.5 and body_end.data["duration_s"] == 0.5
    assert body_start.data["alert_id"] == body_end.data["alert_id"] == start.alert_id
    assert body_start.data["track_ids"] == [4] and body_start.data["class"] == "Fall"
    # Event ids derive from the alert: a re-published start is a JetStream duplicate.
    assert body_start.id == f"alert-{start.alert_id}-start" != body_end.id
    assert start.snapshot and not end.snapshot
    assert len(starts([start])) == 1 and len(ends([end])) == 1
