"""Line crossings on scripted trajectories: directions, once per crossing, jitter, the line's ends."""

from __future__ import annotations

import random

import pytest

from tests.pipelines.rules.script import FPS, ends, engine, person, run, starts

# Drawn left to right, so side a is above it (smaller y) and side b below.
LINE = [[200, 500], [800, 500]]


def line(**extra: object) -> dict:
    return {"id": "gate", "type": "line", "points": LINE, **extra}


def walk(track_id: int, x: float, ys: list[float]) -> list[tuple[float, list]]:
    return [(i / FPS, [person(track_id, x, y)]) for i, y in enumerate(ys)]


DOWN = [305 + 10 * i for i in range(40)]  # 305 → 695: a to b
UP = list(reversed(DOWN))  # b to a


@pytest.mark.parametrize(
    ("direction", "path", "fires"),
    [
        ("a_to_b", DOWN, True),
        ("a_to_b", UP, False),
        ("b_to_a", UP, True),
        ("b_to_a", DOWN, False),
        ("any", DOWN, True),
        ("any", UP, True),
    ],
)
def test_direction(direction: str, path: list[float], fires: bool) -> None:
    changes = run(engine(line(direction=direction)), walk(1, 500, path))
    if not fires:
        assert changes == []
        return
    start, end = changes
    assert start.alert_id == end.alert_id and start.track_ids == (1,)
    # The first frame clear of the 10 px band is at 2.1; the crossing counts once it lasted settle_s (0.5).
    assert start.pts == end.pts == end.ended_pts == pytest.approx(2.6)
    expected = "a_to_b" if path is DOWN else "b_to_a"
    assert start.evidence["trigger"] == expected and start.evidence["counts"][expected] == 1
    assert start.evidence["line"] == LINE


def test_each_crossing_counts_once_and_cooldown_limits_a_track() -> None:
    there_and_back = DOWN + UP
    changes = run(engine(line(cooldown_s=0)), walk(1, 500, there_and_back))
    assert [c.evidence["trigger"] for c in starts(changes)] == ["a_to_b", "b_to_a"]
    assert len(ends(changes)) == 2
    cooled = engine(line(cooldown_s=30))
    assert len(starts(run(cooled, walk(1, 500, there_and_back)))) == 1
    assert cooled.suppressed == 1


def test_jitter_on_the_line_is_not_a_crossing() -> None:
    rng = random.Random(5)
    loiter = [500 + rng.uniform(-8, 8) for _ in range(300)]  # band: 10 % of a 100 px person
    assert run(engine(line(cooldown_s=0)), walk(1, 500, [420, *loiter])) == []


def test_walking_past_the_end_of_the_line_is_not_a_crossing() -> None:
    assert run(engine(line()), walk(1, 900, DOWN)) == []  # the line stops at x = 800


def test_several_tracks_are_counted_separately() -> None:
    eng = engine(line())
    frames = [(i / FPS, [person(1, 300, y), person(2, 600, y + 50)]) for i, y in enumerate(DOWN)]
    changes = starts(run(eng, frames))
    assert sorted(c.track_ids[0] for c in changes) == [1, 2]
    assert changes[-1].evidence["counts"]["a_to_b"] == 2
