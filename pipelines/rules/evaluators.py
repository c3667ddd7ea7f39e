"""One evaluator per rule type: turns a frame's live tracks into condition verdicts for the
rule's `AlertLifecycle`, and says what the evidence is when an alert starts."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

from pipelines.rules.geometry import Point, scale_points
from pipelines.rules.lifecycle import AlertLifecycle, AlertStart
from pipelines.rules.membership import SIDE_B, LineSides, ZoneMembership
from pipelines.rules.specs import (
    AbsentRule,
    AnyRule,
    CountRule,
    FallRule,
    LineRule,
    PresentRule,
    Rule,
    ZoneRule,
)
from pipelines.rules.types import AlertChange, Moment, TrackedObject

MAX_EVIDENCE_OBJECTS = 32  # boxes listed in one alert's evidence (a crowd would bloat the event)
STREAM_SUBJECT = "stream"  # the subject of rules about the whole frame


@dataclass(slots=True)
class LiveTrack:
    obj: TrackedObject  # as last seen
    last_seen: Moment
    seen_now: bool  # False while the tracker has lost it for a moment (kept at its last box)


@dataclass(slots=True)
class FrameView:
    now: Moment
    tracks: dict[int, LiveTrack]  # every live track, including momentarily lost ones
    gone: dict[int, LiveTrack]  # tracks that ended since the previous frame


def _rounded(points: Sequence[Point]) -> list[list[float]]:
    return [[round(x, 1), round(y, 1)] for x, y in points]


def _object(track: LiveTrack) -> dict[str, Any]:
    obj = track.obj
    return {
        "track_id": obj.track_id,
        "class": obj.class_name,
        "box": [round(v, 1) for v in obj.box],
        "score": round(obj.score, 4),
    }


class Evaluator:
    """Shared parts: the rule, its lifecycle, its geometry in pixels, its class filter."""

    def __init__(self, rule: AnyRule) -> None:
        self.rule = rule
        self.lifecycle = AlertLifecycle(rule)
        self.normalized = bool(getattr(rule, "normalized", False))
        self._size: tuple[int, int] | None = None
        classes = getattr(rule, "classes", None)
        self.classes: frozenset[str] | None = frozenset(classes) if classes is not None else None
        self.resize(None)

    def resize(self, size: tuple[int, int] | None) -> None:
        """Place the geometry on a frame of `size` (width, height); needed for normalised points."""
        self._size = size

    def pixels(self, points: Sequence[Point]) -> tuple[Point, ...]:
        if not self.normalized:
            return tuple(points)
        if self._size is None:
            return ()  # placed on the first frame
        return scale_points(points, *self._size)

    def wants(self, obj: TrackedObject) -> bool:
        return self.classes is None or obj.class_name in self.classes

    def evaluate(self, view: FrameView) -> list[AlertChange]:
        raise NotImplementedError

    def finish(self, now: Moment) -> list[AlertChange]:
        return self.lifecycle.finish(now)


class CountingEvaluator(Evaluator):
    """present / absent / count: how many matching objects (in the optional zone)."""

    rule: PresentRule | AbsentRule | CountRule

    def __init__(self, rule: PresentRule | AbsentRule | CountRule) -> None:
        self.membership = ZoneMembership(rule.hysteresis, rule.settle_s)
        self.zone: tuple[Point, ...] = ()
        super().__init__(rule)

    def resize(self, size: tuple[int, int] | None) -> None:
        super().resize(size)
        self.zone = self.pixels(self.rule.zone) if self.rule.zone is not None else ()

    def evaluate(self, view: FrameView) -> list[AlertChange]:
        for track_id in view.gone:
            self.membership.forget(track_id)
        # Membership first: it must follow every track, whatever its class is at the moment.
        matching = [t for t in view.tracks.values() if self._in_zone(t, view.now) and self.wants(t.obj)]
        count = len(matching)
        holds = self._holds(count)
        change = self.lifecycle.observe(
            view.now,
            STREAM_SUBJECT,
            holds,
            hold_s=self.rule.for_s,
            describe=partial(self._describe, matching),
            involved=[t.obj.track_id for t in matching] if holds else (),
            count=count if self.rule.type != "absent" else None,
        )
        return [change] if change is not None else []

    def _in_zone(self, track: LiveTrack, now: Moment) -> bool:
        if self.rule.zone is None:
            return True
        if not track.seen_now:
            return self.membership.inside(track.obj.track_id)
        return self.membership.update(self.zone, track.obj.track_id, track.obj.box, now.t)[1]

    def _holds(self, count: int) -> bool:
        rule = self.rule
        if rule.type == "present":
            return count >= 1
        if rule.type == "absent":
            return count == 0
        if rule.above is not None:
            return count > rule.above
        return rule.below is not None and count < rule.below

    def _describe(self, matching: list[LiveTrack]) -> AlertStart:
        rule = self.rule
        evidence: dict[str, Any] = {"trigger": rule.type, "count": len(matching)}
        if rule.type == "count":
            evidence["threshold"] = {"above": rule.above} if rule.above is not None else {"below": rule.below}
        if self.zone:
            evidence["zone"] = _rounded(self.zone)
        evidence["objects"] = [_object(t) for t in matching[:MAX_EVIDENCE_OBJECTS]]
        names = Counter(t.obj.class_name for t in matching)
        if names:
            class_name: str | None = names.most_common(1)[0][0]
        else:
            class_name = rule.classes[0] if rule.classes is not None and len(rule.classes) == 1 else None
        return AlertStart(tuple(t.obj.track_id for t in matching), class_name, evidence)


class ZoneEvaluator(Evaluator):
    """zone: per track, an `enter` alert for its stay, a `dwell` alert once it stayed longer
    than dwell_s, an instantaneous `exit` alert when it leaves."""

    rule: ZoneRule

    def __init__(self, rule: ZoneRule) -> None:
        self.membership = ZoneMembership(rule.hysteresis, rule.settle_s)
        self.polygon: tuple[Point, ...] = ()
        super().__init__(rule)

    def resize(self, size: tuple[int, int] | None) -> None:
        super().resize(size)
        self.polygon = self.pixels(self.rule.polygon)

    def evaluate(self, view: FrameView) -> list[AlertChange]:
        rule, lifecycle, now = self.rule, self.lifecycle, view.now
        changes: list[AlertChange] = []
        for track_id, track in view.gone.items():
            self.membership.forget(track_id)
            for trigger in rule.events:
                ended = lifecycle.forget(now, (track_id, trigger), track.last_seen)
                if ended is not None:
                    changes.append(ended)
        for track_id, track in view.tracks.items():
            if track.seen_now:
                before, inside = self.membership.update(self.polygon, track_id, track.obj.box, now.t)
            else:
                before = inside = self.membership.inside(track_id)
            wanted = self.wants(track.obj)
            for trigger in rule.events:
                subject = (track_id, trigger)
                if trigger == "exit":
                    if wanted and before is True and not inside:
                        changes += lifecycle.pulse(now, subject, partial(self._describe, track, "exit"))
                    continue
                change = lifecycle.observe(
                    now,
                    subject,
                    wanted and inside,
                    hold_s=(rule.dwell_s or 0.0) if trigger == "dwell" else rule.for_s,
                    describe=partial(self._describe, track, trigger),
                    involved=(track_id,),
                )
                if change is not None:
                    changes.append(change)
        return changes

    def _describe(self, track: LiveTrack, trigger: str) -> AlertStart:
        evidence: dict[str, Any] = {"trigger": trigger, "zone": _rounded(self.polygon), "objects": [_object(track)]}
        if trigger == "dwell":
            evidence["dwell_s"] = self.rule.dwell_s
        return AlertStart((track.obj.track_id,), track.obj.class_name, evidence)


class LineEvaluator(Evaluator):
    """line: an instantaneous alert each time a track crosses the segment in `direction`."""

    rule: LineRule

    def __init__(self, rule: LineRule) -> None:
        self.sides = LineSides(rule.hysteresis, rule.settle_s)
        self.line: tuple[Point, ...] = ()
        self.counts = {"a_to_b": 0, "b_to_a": 0}
        super().__init__(rule)

    def resize(self, size: tuple[int, int] | None) -> None:
        super().resize(size)
        self.line = self.pixels(self.rule.points)

    def evaluate(self, view: FrameView) -> list[AlertChange]:
        changes: list[AlertChange] = []
        for track_id, track in view.gone.items():
            self.sides.forget(track_id)
            self.lifecycle.forget(view.now, track_id, track.last_seen)  # pulses leave no active alert
        if len(self.line) != 2:
            return changes
        a, b = self.line
        for track_id, track in view.tracks.items():
            if not track.seen_now:
                continue  # a lost track's last box does not move
            crossed = self.sides.update(a, b, track_id, track.obj.box, view.now.t)
            if crossed is None or not self.wants(track.obj):
                continue
            direction = "a_to_b" if crossed == SIDE_B else "b_to_a"
            self.counts[direction] += 1
            if self.rule.direction in ("any", direction):
                changes += self.lifecycle.pulse(view.now, track_id, partial(self._describe, track, direction))
        return changes

    def _describe(self, track: LiveTrack, direction: str) -> AlertStart:
        evidence: dict[str, Any] = {
            "trigger": direction,
            "line": _rounded(self.line),
            "objects": [_object(track)],
            "counts": dict(self.counts),
        }
        return AlertStart((track.obj.track_id,), track.obj.class_name, evidence)


class FallEvaluator(Evaluator):
    """fall: a track whose smoothed class is the fall class for for_s seconds."""

    rule: FallRule

    def evaluate(self, view: FrameView) -> list[AlertChange]:
        changes: list[AlertChange] = []
        for track_id, track in view.gone.items():
            ended = self.lifecycle.forget(view.now, track_id, track.last_seen)
            if ended is not None:
                changes.append(ended)
        for track_id, track in view.tracks.items():
            change = self.lifecycle.observe(
                view.now,
                track_id,
                track.obj.class_name == self.rule.fall_class,
                hold_s=self.rule.for_s,
                describe=partial(self._describe, track),
                involved=(track_id,),
            )
            if change is not None:
                changes.append(change)
        return changes

    def _describe(self, track: LiveTrack) -> AlertStart:
        evidence = {"trigger": "fall", "fall_class": self.rule.fall_class, "objects": [_object(track)]}
        return AlertStart((track.obj.track_id,), track.obj.class_name, evidence)


def evaluator_for(rule: Rule) -> Evaluator:
    if isinstance(rule, PresentRule | AbsentRule | CountRule):
        return CountingEvaluator(rule)
    if isinstance(rule, ZoneRule):
        return ZoneEvaluator(rule)
    if isinstance(rule, LineRule):
        return LineEvaluator(rule)
    if isinstance(rule, FallRule):
        return FallEvaluator(rule)
    raise TypeError(f"{type(rule).__name__} is not evaluated on frames (its on_frames is false)")
