"""Per-track position state with hysteresis: inside/outside a zone, which side of a line.

Each decision uses the bottom-centre of the box and a band of `hysteresis` x box height
around the outline: a track changes state only once it is clearly across, so a person
standing on the edge, whose box jitters by a few pixels, does not flap in and out. The band
scales with the box because jitter does (a distant person's box is small and jitters little).

The band alone is not enough on real footage: a box's bottom edge jumps by more than a tenth of
its height when a leg or a neighbour is found or lost, and the frame loop's predicted boxes move
between measured ones. So a change of state must also last: a track counts as across only once
it has stayed clearly across for `settle_s` of stream time; coming back sooner cancels it. An
alert about the change is that much later, which is the price of not crying wolf.
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
    def __init__(self, hysteresis: float, settle_s: float = 0.0) -> None:
        self.hysteresis = hysteresis
        self.settle_s = settle_s
        self._inside: dict[int, bool] = {}
        self._across_since: dict[int, float] = {}  # stream time a track was first seen across, unsettled

    def inside(self, track_id: int) -> bool:
        return self._inside.get(track_id, False)

    def update(self, polygon: Sequence[Point], track_id: int, box: Box, t: float = 0.0) -> tuple[bool | None, bool]:
        """(inside before, inside now) at stream time `t`; before is None for a track seen for
        the first time."""
        depth = signed_depth(feet(box), polygon)
        before = self._inside.get(track_id)
        if before is None:
            now = depth >= 0  # first sighting: no history to be sticky about
        else:
            margin = self.hysteresis * box_height(box)
            across = depth <= -margin if before else depth > margin
            now = before
            if not across:
                self._across_since.pop(track_id, None)
            elif t - self._across_since.setdefault(track_id, t) >= self.settle_s:
                del self._across_since[track_id]
                now = not before
        self._inside[track_id] = now
        return before, now

    def forget(self, track_id: int) -> None:
        self._inside.pop(track_id, None)
        self._across_since.pop(track_id, None)


class LineSides:
    """Which side of a line each track is on, and when it crosses.

    A crossing is counted when a track, clear of the band on one side, is next seen clear of
    the band on the other side, and the path between those two positions passes through the
    segment itself (walking around the end of a line is not crossing it). One change of side
    is one crossing, so a track is counted once per crossing, once it has stayed clear on the
    other side for `settle_s`.
    """

    def __init__(self, hysteresis: float, settle_s: float = 0.0) -> None:
        self.hysteresis = hysteresis
        self.settle_s = settle_s
        self._state: dict[int, tuple[int, Point]] = {}  # side, last position clear of the band
        self._across: dict[int, tuple[Point, float]] = {}  # first position clear on the other side, when

    def update(self, a: Point, b: Point, track_id: int, box: Box, t: float = 0.0) -> int | None:
        """The side the track crossed to (SIDE_A or SIDE_B) at stream time `t`, or None."""
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
            self._across.pop(track_id, None)  # not clearly across any more: settling starts again
            return None  # inside the band: neither here nor there yet
        if side_now == side:
            self._state[track_id] = (side_now, p)
            self._across.pop(track_id, None)  # back before it settled: no crossing
            return None
        first, since = self._across.setdefault(track_id, (p, t))
        if t - since < self.settle_s:
            return None
        del self._across[track_id]
        self._state[track_id] = (side_now, p)
        return side_now if segments_intersect(anchor, first, a, b) else None

    def forget(self, track_id: int) -> None:
        self._state.pop(track_id, None)
        self._across.pop(track_id, None)
