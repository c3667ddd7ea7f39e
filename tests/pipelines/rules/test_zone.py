"""Zone rules on scripted tracks: enter / dwell / exit, one alert per stay, no flapping."""

from __future__ import annotations

import random

from pipelines.clock import Moment
from pipelines.rules.types import AlertEventKind
from tests.pipelines.rules.script import FPS, ends, engine, person, run, starts, timeline

SQUARE = [[200, 200], [600, 200], [600, 600], [200, 600]]


def zone(**extra: object) -> dict:
    return {"id": "door", "type": "zone", "polygon": SQUARE, **extra}


def test_enter_dwell_and_exit_with_their_times_and_stable_ids() -> None:
    # settle_s 0: the times below are those of the frames themselves (settling has its own tests).
    eng = engine(zone(events=["enter", "exit", "dwell"], dwell_s=3, clear_s=1, settle_s=0))
    frames = [(t, [person(1, 100, 400)]) for t in timeline(0, 2)]
    frames += [(t, [person(1, 400, 400)]) for t in timeline(2, 8)]
    frames += [(t, [person(1, 700, 400)]) for t in timeline(8, 12)]
    changes = run(eng, frames)
    by_trigger = {(c.evidence["trigger"], c.kind): c for c in changes}
    assert len(changes) == 6 and len(by_trigger) == 6
    enter, enter_end = by_trigger["enter", AlertEventKind.START], by_trigger["enter", AlertEventKind.END]
    dwell, dwell_end = by_trigger["dwell", AlertEventKind.START], by_trigger["dwell", AlertEventKind.END]
    exit_, exit_end = by_trigger["exit", AlertEventKind.START], by_trigger["exit", AlertEventKind.END]
    assert enter.started_pts == 2.0 and dwell.started_pts == 5.0 and exit_.started_pts == 8.0
    # The stay ends when the person left (8.0), announced once the clear time passed (9.0).
    assert enter_end.ended_pts == 8.0 and enter_end.pts == 9.0 and enter_end.duration_s == 6.0
    assert dwell_end.ended_pts == 8.0 and dwell_end.duration_s == 3.0
    assert exit_end.pts == exit_.pts == 8.0 and exit_end.evidence["reason"] == "instant"
    for start, end in ((enter, enter_end), (dwell, dwell_end), (exit_, exit_end)):
        assert start.alert_id == end.alert_id
        assert start.track_ids == end.track_ids == (1,)
    assert len({enter.alert_id, dwell.alert_id, exit_.alert_id}) == 3
    assert enter.evidence["zone"] == SQUARE and enter.evidence["objects"][0]["track_id"] == 1
    assert dwell.evidence["dwell_s"] == 3 and enter_end.evidence["reason"] == "cleared"


def test_a_person_standing_still_in_a_zone_is_one_start_and_one_end() -> None:
    eng = engine(zone(events=["enter", "dwell"], dwell_s=5), {"id": "anyone", "type": "present"})
    rng = random.Random(7)
    frames = [(t, [person(1, 400 + rng.uniform(-3, 3), 400 + rng.uniform(-3, 3))]) for t in timeline(0, 120)]
    changes = run(eng, frames, finish=True)
    assert [(c.rule_id, c.evidence["trigger"], c.kind.value) for c in changes] == [
        ("door", "enter", "start"),
        ("anyone", "present", "start"),
        ("door", "dwell", "start"),
        ("door", "enter", "end"),
        ("door", "dwell", "end"),
        ("anyone", "present", "end"),
    ]
    assert {c.evidence["reason"] for c in ends(changes)} == {"stream_stopped"}
    assert ends(changes)[0].duration_s == 119.9


def test_jitter_on_the_edge_does_not_flap() -> None:
    # Feet wobble around the bottom edge (y = 600) by a few pixels, frame after frame.
    rng = random.Random(3)
    frames = [(t, [person(1, 400, 600 + rng.uniform(-6, 6))]) for t in timeline(0, 60)]
    steady = run(engine(zone(events=["enter", "exit"], cooldown_s=0, clear_s=0)), frames)
    assert len(starts(steady)) <= 1 and not [c for c in steady if c.evidence["trigger"] == "exit"]
    # Without the hysteresis band (nor settling) the same footage flaps: that is what the band is for.
    flapping = run(engine(zone(events=["enter", "exit"], cooldown_s=0, clear_s=0, hysteresis=0, settle_s=0)), frames)
    assert len(starts(flapping)) > 20


def test_jitter_wider_than_the_band_does_not_flap_once_changes_must_settle() -> None:
    # A real box's bottom edge jumps by more than the band (a leg found or lost, a predicted box
    # between measured ones): here by up to 25 px on a 100 px person, whose band is 10 px.
    rng = random.Random(5)
    frames = [(t, [person(1, 400, 600 + rng.uniform(-25, 25))]) for t in timeline(0, 60)]
    rules = {"events": ["enter", "exit"], "cooldown_s": 0, "clear_s": 0}
    settled = run(engine(zone(**rules)), frames)  # settle_s: 0.5 by default
    assert len(starts(settled)) <= 1, [(c.evidence["trigger"], c.pts) for c in settled]
    unsettled = run(engine(zone(**rules, settle_s=0)), frames)
    assert len(starts(unsettled)) > 20  # the band alone: what the sample's east-side zone did


def test_jitter_across_a_line_is_not_a_crossing_once_it_must_settle() -> None:
    rng = random.Random(6)
    frames = [(t, [person(1, 500, 500 + rng.uniform(-25, 25))]) for t in timeline(0, 60)]
    line = {"id": "gate", "type": "line", "points": [[200, 500], [800, 500]], "cooldown_s": 0}
    assert len(starts(run(engine(line), frames))) <= 1  # a 0.5 s run clear on the far side can happen by chance
    assert len(starts(run(engine({**line, "settle_s": 0}), frames))) > 20


def test_a_walk_in_and_out_across_the_edge_still_counts() -> None:
    # Jitter does not hide a real crossing: walk from 550 to 650 (out through y = 600) and back.
    eng = engine(zone(events=["enter", "exit"], cooldown_s=0))
    path = [550 + 2 * i for i in range(50)] + [650 - 2 * i for i in range(50)]
    changes = run(eng, [(i / FPS, [person(1, 400, y)]) for i, y in enumerate(path)])
    assert [(c.evidence["trigger"], c.kind.value) for c in starts(changes)] == [
        ("enter", "start"),
        ("exit", "start"),
        ("enter", "start"),
    ]


def test_track_end_ends_its_alert_but_a_short_loss_does_not() -> None:
    eng = engine(zone(events=["enter"]))
    frames = [(t, [person(1, 400, 400)]) for t in timeline(0, 3)]
    frames += [(t, []) for t in timeline(3, 4)]  # lost behind someone, not ended
    frames += [(t, [person(1, 400, 400)]) for t in timeline(4, 5)]
    changes = run(eng, frames, end_missing=False)
    assert len(starts(changes)) == 1 and not ends(changes)
    ended = eng.evaluate(Moment(5.0, 5.0), [], ended=[1])
    assert len(ended) == 1 and ended[0].evidence["reason"] == "track_ended"
    assert ended[0].ended_pts == 4.9 and ended[0].alert_id == changes[0].alert_id


def test_normalized_polygon_is_placed_on_the_frame() -> None:
    norm = [[0.2, 0.2], [0.6, 0.2], [0.6, 0.6], [0.2, 0.6]]
    eng = engine(zone(polygon=norm, normalized=True))
    changes = run(eng, [(0.0, [person(1, 400, 400)])])
    assert len(changes) == 1 and changes[0].evidence["zone"] == SQUARE  # frame is 1000 x 1000


def test_class_filter_and_enter_debounce() -> None:
    eng = engine(zone(classes=["Fall"], for_s=1.0))
    frames = [(t, [person(1, 400, 400), person(2, 300, 300, cls="Fall")]) for t in timeline(0, 2)]
    changes = run(eng, frames)
    assert [(c.track_ids, c.started_pts, c.class_name) for c in changes] == [((2,), 1.0, "Fall")]
