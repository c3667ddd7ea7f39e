"""What flows into the rule engine (tracked objects) and out of it (alert changes)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from pipelines.clock import Moment
from pipelines.rules.geometry import Box
from pipelines.tracker import Track

__all__ = ["AlertChange", "AlertEventKind", "Moment", "TrackedObject", "tracked_objects"]


@dataclass(frozen=True, slots=True)
class TrackedObject:
    """One confirmed track as seen on the current frame."""

    track_id: int
    class_name: str
    box: Box  # xyxy source pixels
    score: float


def tracked_objects(tracks: Iterable[Track], names: Mapping[int, str]) -> list[TrackedObject]:
    """The tracker's live tracks as rule input. The class is the track's smoothed vote, so a
    single flickering detection does not end a `fall` alert or a class-filtered zone alert."""
    return [
        TrackedObject(
            track_id=t.track_id,
            class_name=names.get(t.class_id, str(t.class_id)),
            box=(float(t.box[0]), float(t.box[1]), float(t.box[2]), float(t.box[3])),
            score=float(t.score),
        )
        for t in tracks
    ]


class AlertEventKind(StrEnum):
    START = "start"
    END = "end"


@dataclass(frozen=True, slots=True)
class AlertChange:
    """An alert started or ended. Start and end of one alert share `alert_id`."""

    kind: AlertEventKind
    alert_id: str
    rule_id: str
    rule_type: str
    severity: str
    track_ids: tuple[int, ...]
    class_name: str | None
    evidence: Mapping[str, Any]
    started_pts: float
    pts: float  # media time of the frame this change was decided on
    # When the condition stopped holding (end only), on the timeline of the start's frame: across a
    # reconnect (media pts restarted) it is started_pts plus the stream-clock time since, never earlier.
    ended_pts: float | None = None
    duration_s: float | None = None  # end only
    snapshot: bool = False  # a start whose rule asks for a snapshot of the frame
