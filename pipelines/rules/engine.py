"""RuleEngine: one stream's rules, fed each processed frame's tracks, emitting alert changes.

Pure and synchronous. It has no clock of its own: each frame's `Moment` (the stream clock
the tracker also runs on, plus the media pts) is passed in, so hold, dwell and cooldown times
run on the same timeline as track timeouts, tests script time, and a replayed clip gives the
same alerts as the live run did.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence

from pipelines.errors import PipelineError
from pipelines.rules.evaluators import Evaluator, FrameView, LiveTrack, evaluator_for
from pipelines.rules.specs import Rule, check_unique_ids
from pipelines.rules.types import AlertChange, AlertEventKind, Moment, TrackedObject

log = logging.getLogger(__name__)

# A track the caller stopped reporting without ending it is dropped after this long unseen.
# The frame loop reports ends itself (the tracker's `end` events); this only bounds memory.
DEFAULT_LOST_TIMEOUT_S = 3.0


class RuleError(PipelineError, ValueError):
    """The rules cannot run against this stream's model (unknown class, duplicate id, ...)."""


def unknown_classes(rules: Sequence[Rule], names: Mapping[int, str]) -> list[str]:
    """Problems, one line each, with class names the model does not have."""
    known = set(names.values())
    problems = []
    for rule in rules:
        missing = [c for c in rule.wanted_classes() if c not in known]
        if missing:
            problems.append(
                f"rule {rule.id!r}: class {', '.join(repr(c) for c in missing)} not among the model's classes "
                f"({', '.join(sorted(known))})"
            )
    return problems


class RuleEngine:
    def __init__(
        self,
        stream_id: str,
        specs: Sequence[Rule],
        names: Mapping[int, str],
        *,
        lost_timeout_s: float = DEFAULT_LOST_TIMEOUT_S,
    ) -> None:
        try:
            check_unique_ids(list(specs))
        except ValueError as exc:
            raise RuleError(f"stream {stream_id!r}: {exc}") from None
        problems = unknown_classes(specs, names) if names else []
        if problems:
            raise RuleError(f"stream {stream_id!r}: {'; '.join(problems)}")
        self.stream_id = stream_id
        self.lost_timeout_s = lost_timeout_s
        # A capability's rule types (`on_frames` false) are answered by its own stage.
        self._evaluators: list[Evaluator] = [evaluator_for(rule) for rule in specs if rule.on_frames]
        self._needs_size = any(e.normalized for e in self._evaluators)
        self._size: tuple[int, int] | None = None
        self._tracks: dict[int, LiveTrack] = {}
        self._last: Moment | None = None
        self.started = 0
        self.ended = 0

    @property
    def rules(self) -> list[Rule]:
        return [e.rule for e in self._evaluators]

    @property
    def suppressed(self) -> int:
        """Alert starts held back by cooldowns so far."""
        return sum(e.lifecycle.suppressed for e in self._evaluators)

    @property
    def active(self) -> int:
        return sum(e.lifecycle.active for e in self._evaluators)

    def evaluate(
        self,
        now: Moment,
        objects: Sequence[TrackedObject],
        *,
        ended: Iterable[int] = (),
        frame_size: tuple[int, int] | None = None,
    ) -> list[AlertChange]:
        """One processed frame.

        `objects`: the confirmed tracks matched on this frame. A track missing from it is held
        at its last box (the tracker may have lost it behind someone for a moment) until it is
        listed in `ended` (the tracker's end events) or unseen for `lost_timeout_s`.
        `frame_size` (width, height) places rules given in normalised coordinates.
        """
        self._last = now
        self._place(frame_size)
        view = FrameView(now, self._tracks, self._retire(now, objects, ended))
        return self._count(change for e in self._evaluators for change in e.evaluate(view))

    def finish(self, now: Moment | None = None) -> list[AlertChange]:
        """The stream stopped: end every open alert (`reason: stream_stopped`), at `now` or at
        the last frame's moment."""
        now = now or self._last or Moment(0.0, 0.0)
        self._tracks = {}
        return self._count(change for e in self._evaluators for change in e.finish(now))

    def _place(self, frame_size: tuple[int, int] | None) -> None:
        if frame_size is None:
            if self._needs_size and self._size is None:
                raise ValueError("rules with normalized coordinates need frame_size")
            return
        if frame_size != self._size:
            self._size = frame_size
            for evaluator in self._evaluators:
                evaluator.resize(frame_size)

    def _retire(self, now: Moment, objects: Sequence[TrackedObject], ended: Iterable[int]) -> dict[int, LiveTrack]:
        """Update the live tracks; return those that are gone."""
        for track in self._tracks.values():
            track.seen_now = False
        for obj in objects:
            self._tracks[obj.track_id] = LiveTrack(obj, now, True)
        gone: dict[int, LiveTrack] = {}
        for track_id in ended:
            if track_id in self._tracks:
                gone[track_id] = self._tracks.pop(track_id)
        stale = [i for i, t in self._tracks.items() if now.t - t.last_seen.t > self.lost_timeout_s]
        for track_id in stale:
            gone[track_id] = self._tracks.pop(track_id)
        return gone

    def _count(self, changes: Iterable[AlertChange]) -> list[AlertChange]:
        out = list(changes)
        for change in out:
            if change.kind is AlertEventKind.START:
                self.started += 1
            else:
                self.ended += 1
        return out
