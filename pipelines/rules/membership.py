"""Per-track position state with hysteresis: inside/outside a zone, which side of a line.

Each decision uses the bottom-centre of the box and a band of `hysteresis` x box height
around the outline: a track changes state only once it is clearly across, so a person
standing on the edge, whose box jitters by a few pixels, does not flap in and out. The band
scales with the box because jitter does (a distant person's box is small and jitters little).
"""

from __future__ import annotations

from collections.abc import Sequence

from pipelines.rules.geometry import (
    Box,
    Point,
    box_height,
    feet,
    segments_intersect,
    signed_depth,
    signed_distance_to_line,
)

SIDE_A, SIDE_B = -1, 1


class ZoneMembership:
    def __init__(self, hysteresis: float) -> None:
        self.hysteresis = hysteresis
        self._inside: dict[int, bool] = {}

    def inside(self, track_id: int) -> bool:
        return self._inside.get(track_id, False)

    def update(self, polygon: Sequence[Point], track_id: int, box: Box) -> tuple[bool | None, bool]:
        """(inside before, inside now); before is None for a track seen for the first time."""
        depth = signed_depth(feet(box), polygon)
        before = self._inside.get(track_id)
        if before is None:
            now = depth >= 0  # first sighting: no history to be sticky about
        else:
            margin = self.hysteresis * box_height(box)
            now = depth > -margin if before else depth > margin
        self._inside[track_id] = now
        return before, now

    def forget(self, track_id: int) -> None:
        self._inside.pop(track_id, None)


class LineSides:
    """Which side of a line each track is on, and when it crosses.

    A crossing is counted when a track, clear of the band on one side, is next seen clear of
    the band on the other side, and the path between those two positions passes through the
    segment itself (walking around the end of a line is not crossing it). One change of side
    is one crossing, so a track is counted once per crossing.
    """

    def __init__(self, hysteresis: float) -> None:
        self.hysteresis = hysteresis
        self._state: dict[int, tuple[int, Point]] = {}  # side, last position clear of the band

    def update(self, a: Point, b: Point, track_id: int, box: Box) -> int | None:
        """The side the track crossed to (SIDE_A or SIDE_B), or None."""
        p = feet(box)
        distance = signed_distance_to_line(p, a, b)
        side_now = SIDE_B if distance > 0 else SIDE_A
        known = self._state.get(track_id)
        if known is None:
            if distance != 0:
                self._state[track_id] = (side_now, p)
            return None
        side, anchor = known
        if abs(distance) <= self.hysteresis * box_height(box):
            return None  # inside the band: neither here nor there yet
        self._state[track_id] = (side_now, p)
        if side_now == side or not segments_intersect(anchor, p, a, b):
            return None
        return side_now

    def forget(self, track_id: int) -> None:
        self._state.pop(track_id, None)
