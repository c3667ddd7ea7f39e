"""The life of one rule's alerts, per subject: pending → active → cleared → cooling down.

A subject is what an alert is about: one track (zone, line, fall rules) or the whole stream
(present, absent, count). Whatever the rule type, the same four guards keep alerts few:
- a condition must hold `hold_s` before an alert starts (debounce);
- while it lasts, an alert is one start event, never one event per frame;
- it ends only after the condition has been false for `clear_s` (detector flicker rides over);
- after it ends, the same subject cannot start another for `cooldown_s`.

Times: holds, clears, cooldowns and durations run on the stream clock (`Moment.t`, which never
runs backwards). An alert reports its times on one timeline, that of the frame it started on:
`started_pts` is that frame's media pts, and `ended_pts` is `started_pts` plus the stream time
that passed until the end. Within one connection that is the end's own media pts; across a
camera reconnect (pts restart near 0) it still comes after the start, and `ended_pts -
started_pts` is `duration_s` (to the rounding). The events' `pts` stay each decision frame's
media pts.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass, field
from typing import Any

from pipelines.rules.specs import Rule
from pipelines.rules.types import AlertChange, AlertEventKind, Moment

MAX_TRACK_IDS = 100  # an alert about a crowd names at most this many tracks
# Evidence of the start that the end event repeats, so an end can be read on its own.
CARRIED_EVIDENCE = ("trigger", "zone", "line", "threshold", "fall_class", "question")


@dataclass(slots=True)
class AlertStart:
    """What an evaluator says about an alert that is starting."""

    track_ids: tuple[int, ...]
    class_name: str | None
    evidence: dict[str, Any]


@dataclass(slots=True)
class _Active:
    alert_id: str
    started: Moment
    class_name: str | None
    carried: dict[str, Any]
    track_ids: set[int] = field(default_factory=set)
    peak_count: int | None = None


@dataclass(slots=True)
class _Subject:
    holds_since: Moment | None = None
    false_since: Moment | None = None  # while active: when the condition last stopped holding
    cooldown_until: float = -math.inf  # engine clock
    blocked: bool = False  # a start is being held back by the cooldown (counted once)
    alert: _Active | None = None


def new_alert_id() -> str:
    # Random rather than derived from stream/rule/track/pts: track ids and pts restart with the
    # stream, so derived ids would repeat across restarts.
    return uuid.uuid4().hex


def on_timeline_of(started: Moment, ended: Moment) -> float:
    """`ended` in the media pts of the connection `started` was on: its own pts while the stream
    clock's offset from pts is unchanged, else `started.pts` plus the stream time between them (a
    reconnect restarted pts, or the clock held over jitter). Never before `started.pts`."""
    shift = (ended.t - ended.pts) - (started.t - started.pts)
    if abs(shift) < 1e-9:  # one connection: pts moved as the stream clock did
        return max(ended.pts, started.pts)
    return started.pts + max(ended.t - started.t, 0.0)


class AlertLifecycle:
    """Alerts of one rule. Pure and synchronous: time only moves with the `now` passed in."""

    def __init__(self, rule: Rule) -> None:
        self.rule = rule
        self._subjects: dict[Hashable, _Subject] = {}
        self.suppressed = 0  # starts held back by a cooldown

    @property
    def active(self) -> int:
        return sum(1 for s in self._subjects.values() if s.alert is not None)

    def is_active(self, subject: Hashable) -> bool:
        state = self._subjects.get(subject)
        return state is not None and state.alert is not None

    def observe(
        self,
        now: Moment,
        subject: Hashable,
        holds: bool,
        *,
        hold_s: float,
        describe: Callable[[], AlertStart],
        involved: Iterable[int] = (),
        count: int | None = None,
    ) -> AlertChange | None:
        """Feed one frame's verdict for a subject; returns a start or an end, or None.

        `describe` is called only when an alert starts; `involved` and `count` are folded into
        the active alert (its end names every track that took part, and the peak count).
        """
        state = self._subjects.setdefault(subject, _Subject())
        alert = state.alert
        if holds:
            if state.holds_since is None:
                state.holds_since = now
            if alert is not None:
                state.false_since = None
                self._fold(alert, involved, count)
                return None
            if now.t - state.holds_since.t < hold_s:
                return None
            if now.t < state.cooldown_until:
                if not state.blocked:
                    state.blocked = True
                    self.suppressed += 1
                return None
            return self._start(now, state, describe(), count, since=state.holds_since)
        state.holds_since = None
        state.blocked = False
        if alert is None:
            if now.t >= state.cooldown_until:
                del self._subjects[subject]  # nothing left to remember; keeps memory bounded
            return None
        if state.false_since is None:
            state.false_since = now
        if now.t - state.false_since.t < self.rule.clear_s:
            return None
        return self._end(now, state, state.false_since, "cleared")

    def pulse(self, now: Moment, subject: Hashable, describe: Callable[[], AlertStart]) -> list[AlertChange]:
        """An instantaneous event (a line crossing, a zone exit): start and end at once,
        unless the subject is cooling down."""
        state = self._subjects.setdefault(subject, _Subject())
        if now.t < state.cooldown_until:
            self.suppressed += 1
            return []
        start = self._start(now, state, describe(), None)
        return [start, self._end(now, state, now, "instant")]

    def forget(self, now: Moment, subject: Hashable, last_seen: Moment) -> AlertChange | None:
        """The subject is gone (its track ended): end its alert as of when it was last seen."""
        state = self._subjects.pop(subject, None)
        if state is None or state.alert is None:
            return None
        return self._end(now, state, last_seen, "track_ended")

    def finish(self, now: Moment) -> list[AlertChange]:
        """The stream stopped: end every active alert and forget everything."""
        ends = [
            self._end(now, state, state.false_since or now, "stream_stopped")
            for state in self._subjects.values()
            if state.alert is not None
        ]
        self._subjects.clear()
        return ends

    def _start(
        self, now: Moment, state: _Subject, start: AlertStart, count: int | None, since: Moment | None = None
    ) -> AlertChange:
        rule = self.rule
        evidence = start.evidence
        if since is not None:  # how long the condition held before the alert fired
            evidence = {**evidence, "since_pts": round(since.pts, 3), "held_s": round(now.t - since.t, 3)}
        alert = _Active(
            alert_id=new_alert_id(),
            started=now,
            class_name=start.class_name,
            carried={k: start.evidence[k] for k in CARRIED_EVIDENCE if k in start.evidence},
        )
        self._fold(alert, start.track_ids, count)
        state.alert, state.false_since, state.blocked = alert, None, False
        return AlertChange(
            kind=AlertEventKind.START,
            alert_id=alert.alert_id,
            rule_id=rule.id,
            rule_type=rule.type_name(),
            severity=rule.severity,
            track_ids=tuple(start.track_ids),
            class_name=start.class_name,
            evidence=evidence,
            started_pts=now.pts,
            pts=now.pts,
            snapshot=rule.snapshot,
        )

    def _end(self, now: Moment, state: _Subject, ended: Moment, reason: str) -> AlertChange:
        alert = state.alert
        assert alert is not None
        state.alert, state.false_since, state.holds_since = None, None, None
        state.cooldown_until = now.t + self.rule.cooldown_s
        evidence: dict[str, Any] = {**alert.carried, "reason": reason}
        if alert.peak_count is not None:
            evidence["peak_count"] = alert.peak_count
        return AlertChange(
            kind=AlertEventKind.END,
            alert_id=alert.alert_id,
            rule_id=self.rule.id,
            rule_type=self.rule.type_name(),
            severity=self.rule.severity,
            track_ids=tuple(sorted(alert.track_ids)),
            class_name=alert.class_name,
            evidence=evidence,
            started_pts=alert.started.pts,
            pts=now.pts,
            ended_pts=on_timeline_of(alert.started, ended),
            duration_s=round(max(ended.t - alert.started.t, 0.0), 3),
        )

    @staticmethod
    def _fold(alert: _Active, involved: Iterable[int], count: int | None) -> None:
        for track_id in involved:
            if len(alert.track_ids) >= MAX_TRACK_IDS:
                break
            alert.track_ids.add(track_id)
        if count is not None:
            alert.peak_count = count if alert.peak_count is None else max(alert.peak_count, count)
