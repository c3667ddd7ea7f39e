"""present / absent / count on scripted scenes: thresholds held for N seconds, clear times."""

from __future__ import annotations

from pipelines.clock import Moment
from tests.pipelines.rules.script import ends, engine, person, run, starts, timeline

CROWD = [person(1, 100, 500), person(2, 300, 500), person(3, 500, 500)]


def test_count_above_for_n_seconds() -> None:
    eng = engine({"id": "crowd", "type": "count", "above": 2, "for_s": 3})
    frames = [(t, CROWD[:2]) for t in timeline(0, 1)]
    frames += [(t, CROWD) for t in timeline(1, 10)]
    frames += [(t, CROWD[:2]) for t in timeline(10, 13)]
    changes = run(eng, frames)
    start, end = changes
    assert start.started_pts == 4.0 and start.track_ids == (1, 2, 3) and start.class_name == "Normal"
    assert start.evidence["count"] == 3 and start.evidence["threshold"] == {"above": 2}
    assert start.evidence["held_s"] == 3.0
    assert end.ended_pts == 10.0 and end.pts == 11.0 and end.duration_s == 6.0
    assert end.evidence["peak_count"] == 3 and end.evidence["threshold"] == {"above": 2}


def test_count_that_does_not_hold_long_enough_is_not_an_alert() -> None:
    eng = engine({"id": "crowd", "type": "count", "above": 2, "for_s": 3})
    frames = [(t, CROWD if int(t) % 2 == 0 else CROWD[:1]) for t in timeline(0, 20)]  # 1 s on, 1 s off
    assert run(eng, frames) == []


def test_count_below_in_a_zone() -> None:
    desk = [[0, 400], [400, 400], [400, 600], [0, 600]]
    eng = engine({"id": "staffed", "type": "count", "below": 2, "zone": desk, "for_s": 2})
    inside, outside = person(1, 100, 500), person(2, 700, 500)
    frames = [(t, [inside, person(3, 300, 500), outside]) for t in timeline(0, 3)]
    frames += [(t, [inside, outside]) for t in timeline(3, 8)]
    (start,) = run(eng, frames)
    assert start.started_pts == 5.0 and start.track_ids == (1,) and start.evidence["count"] == 1
    assert start.evidence["zone"] == desk


def test_present_and_absent() -> None:
    eng = engine(
        {"id": "someone", "type": "present", "for_s": 1},
        {"id": "nobody", "type": "absent", "for_s": 2, "classes": ["Normal"]},
    )
    frames = [(t, []) for t in timeline(0, 3)]
    frames += [(t, [person(1, 400, 400)]) for t in timeline(3, 6)]
    changes = run(eng, frames, finish=True)
    assert [(c.rule_id, c.kind.value, c.pts) for c in changes] == [
        ("nobody", "start", 2.0),
        ("someone", "start", 4.0),
        ("nobody", "end", 4.0),  # cleared at 3.0, announced after clear_s
        ("someone", "end", 5.9),
    ]
    assert changes[0].class_name == "Normal" and changes[0].track_ids == ()
    assert changes[2].ended_pts == 3.0 and changes[3].evidence["reason"] == "stream_stopped"


def test_flicker_shorter_than_the_clear_time_keeps_one_alert() -> None:
    eng = engine({"id": "someone", "type": "present", "clear_s": 1.0})
    frames = [(t, [] if round(t * 10) % 7 == 0 else [person(1, 400, 400)]) for t in timeline(0, 30)]
    # A missing detection here is an object the tracker has not ended: it stays counted.
    assert len(starts(run(eng, frames, finish=True, end_missing=False))) == 1
    eng = engine({"id": "someone", "type": "present", "clear_s": 1.0})
    changes = []
    for t in timeline(0, 30):
        seen = round(t * 10) % 7 != 0
        changes += eng.evaluate(Moment(t, t), [person(1, 400, 400)] if seen else [], ended=[] if seen else [1])
    # Even when the tracker does end it for a frame, the alert about the stream rides over the gap.
    assert len(starts(changes)) == 1 and not ends(changes)
