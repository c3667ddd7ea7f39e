"""Scripted tracks for rule tests: people as boxes whose feet are where the test says."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from pydantic import TypeAdapter

from pipelines.rules.engine import RuleEngine
from pipelines.rules.specs import AnyRule, RuleList
from pipelines.rules.types import AlertChange, AlertEventKind, Moment, TrackedObject

NAMES = {0: "Normal", 1: "Fall"}
FPS = 10
_RULES: TypeAdapter[list[AnyRule]] = TypeAdapter(RuleList)


def rules(*specs: dict) -> list[AnyRule]:
    return _RULES.validate_python(list(specs))


def person(track_id: int, x: float, y: float, *, height: float = 100.0, cls: str = "Normal") -> TrackedObject:
    """A person whose feet (bottom-centre of the box) are at (x, y)."""
    return TrackedObject(track_id, cls, (x - height / 4, y - height, x + height / 4, y), 0.9)


def engine(*specs: dict) -> RuleEngine:
    return RuleEngine("cam", rules(*specs), NAMES)


def run(
    eng: RuleEngine,
    frames: Iterable[tuple[float, Sequence[TrackedObject]]],
    *,
    finish: bool = False,
    end_missing: bool = True,
) -> list[AlertChange]:
    """Feed frames (on a 1000 x 1000 image). With `end_missing`, a track missing from a frame
    has ended, as the tracker would report; without, it is only lost for the moment."""
    changes: list[AlertChange] = []
    last = 0.0
    previous: set[int] = set()
    for pts, objects in frames:
        current = {o.track_id for o in objects}
        ended = sorted(previous - current) if end_missing else []
        changes += eng.evaluate(Moment(pts, pts), objects, ended=ended, frame_size=(1000, 1000))
        previous = current | (previous if not end_missing else set())
        last = pts
    if finish:
        changes += eng.finish(Moment(last, last))
    return changes


def timeline(start: float, stop: float) -> list[float]:
    """Frame times at FPS from start (inclusive) to stop (exclusive)."""
    return [round(start + i / FPS, 3) for i in range(round((stop - start) * FPS))]


def starts(changes: Iterable[AlertChange]) -> list[AlertChange]:
    return [c for c in changes if c.kind is AlertEventKind.START]


def ends(changes: Iterable[AlertChange]) -> list[AlertChange]:
    return [c for c in changes if c.kind is AlertEventKind.END]
