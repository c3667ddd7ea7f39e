"""Plane geometry for zones and lines, in image pixels (x right, y down).

Plain floats rather than numpy: rules look at a few dozen points per frame, where numpy's
per-call overhead costs more than the arithmetic. The one exception is the one-off check that a
polygon is simple, which compares every pair of edges.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

Point = tuple[float, float]
Box = tuple[float, float, float, float]  # x1, y1, x2, y2

_ROWS = 64  # edges tested against all others per numpy step: at most 64 x n values per array


def feet(box: Box) -> Point:
    """Bottom-centre of a box: where a standing person touches the ground, so a zone drawn
    on the floor matches what people mean by "in the zone" regardless of their height."""
    return ((box[0] + box[2]) / 2.0, box[3])


def box_height(box: Box) -> float:
    return max(box[3] - box[1], 0.0)


def signed_area(polygon: Sequence[Point]) -> float:
    """Shoelace formula; the sign depends on the winding order."""
    total = 0.0
    for i, (x1, y1) in enumerate(polygon):
        x2, y2 = polygon[(i + 1) % len(polygon)]
        total += x1 * y2 - x2 * y1
    return total / 2.0


def cross(o: Point, a: Point, b: Point) -> float:
    """z of (a - o) x (b - o): > 0 when b is clockwise of a around o on screen (y down)."""
    return (a[0] - o[0]) * (b[1] - o[1]) - (a[1] - o[1]) * (b[0] - o[0])


def _on_segment(p: Point, a: Point, b: Point) -> bool:
    return min(a[0], b[0]) <= p[0] <= max(a[0], b[0]) and min(a[1], b[1]) <= p[1] <= max(a[1], b[1])


def segments_intersect(p1: Point, p2: Point, q1: Point, q2: Point) -> bool:
    """True when segment p1-p2 and segment q1-q2 share a point (touching counts)."""
    d1, d2 = cross(q1, q2, p1), cross(q1, q2, p2)
    d3, d4 = cross(p1, p2, q1), cross(p1, p2, q2)
    if ((d1 > 0 > d2) or (d1 < 0 < d2)) and ((d3 > 0 > d4) or (d3 < 0 < d4)):
        return True
    return (
        (d1 == 0 and _on_segment(p1, q1, q2))
        or (d2 == 0 and _on_segment(p2, q1, q2))
        or (d3 == 0 and _on_segment(q1, p1, p2))
        or (d4 == 0 and _on_segment(q2, p1, p2))
    )


def is_simple_polygon(polygon: Sequence[Point]) -> bool:
    """No two non-adjacent edges touch (a bow-tie or a repeated vertex is not a zone).

    Every pair of edges is tested, as `segments_intersect` would, but a block of rows at a time
    in numpy: a config or API body is validated once, and a pure-Python pairwise loop took
    36 ms for 256 vertices (seconds for a body full of polygons), this about 3 ms. Memory stays
    bounded for any n."""
    n = len(polygon)
    if n < 4:
        return True  # every pair of edges is adjacent
    pts = np.asarray(polygon, dtype=np.float64)
    a, b = pts, np.roll(pts, -1, axis=0)  # edge k runs a[k] -> b[k]
    ax, ay, bx, by = a[:, 0], a[:, 1], b[:, 0], b[:, 1]
    lo_x, hi_x = np.minimum(ax, bx), np.maximum(ax, bx)
    lo_y, hi_y = np.minimum(ay, by), np.maximum(ay, by)
    index = np.arange(n)
    for start in range(0, n, _ROWS):
        i = index[start : start + _ROWS, None]  # edges p = a[i]-b[i] against every edge q = a[j]-b[j]
        # The same products, in the same order, as `cross` in segments_intersect.
        d1 = (bx - ax) * (ay[i] - ay) - (by - ay) * (ax[i] - ax)  # p1 against q
        d2 = (bx - ax) * (by[i] - ay) - (by - ay) * (bx[i] - ax)  # p2 against q
        d3 = (bx[i] - ax[i]) * (ay - ay[i]) - (by[i] - ay[i]) * (ax - ax[i])  # q1 against p
        d4 = (bx[i] - ax[i]) * (by - ay[i]) - (by[i] - ay[i]) * (bx - ax[i])  # q2 against p
        crossing = (((d1 > 0) & (d2 < 0)) | ((d1 < 0) & (d2 > 0))) & (((d3 > 0) & (d4 < 0)) | ((d3 < 0) & (d4 > 0)))
        in_q = (lo_x, hi_x, lo_y, hi_y)  # an end of p on q's box (with d == 0: on q itself)
        in_p = (lo_x[i], hi_x[i], lo_y[i], hi_y[i])
        touching = (
            ((d1 == 0) & _in_box(ax[i], ay[i], in_q))
            | ((d2 == 0) & _in_box(bx[i], by[i], in_q))
            | ((d3 == 0) & _in_box(ax, ay, in_p))
            | ((d4 == 0) & _in_box(bx, by, in_p))
        )
        # Only pairs j > i that do not share a vertex by construction.
        apart = (index > i + 1) & ~((i == 0) & (index == n - 1))
        if np.any((crossing | touching) & apart):
            return False
    return True


def _in_box(x: np.ndarray, y: np.ndarray, box: tuple[np.ndarray, ...]) -> np.ndarray:
    lo_x, hi_x, lo_y, hi_y = box
    result: np.ndarray = (lo_x <= x) & (x <= hi_x) & (lo_y <= y) & (y <= hi_y)
    return result


def point_in_polygon(p: Point, polygon: Sequence[Point]) -> bool:
    """Even-odd ray casting."""
    x, y = p
    inside = False
    n = len(polygon)
    for i in range(n):
        x1, y1 = polygon[i]
        x2, y2 = polygon[(i + 1) % n]
        if (y1 > y) != (y2 > y):
            x_at_y = x1 + (y - y1) * (x2 - x1) / (y2 - y1)
            if x < x_at_y:
                inside = not inside
    return inside


def distance_to_segment(p: Point, a: Point, b: Point) -> float:
    dx, dy = b[0] - a[0], b[1] - a[1]
    length2 = dx * dx + dy * dy
    t = 0.0 if length2 == 0 else max(0.0, min(1.0, ((p[0] - a[0]) * dx + (p[1] - a[1]) * dy) / length2))
    return math.hypot(p[0] - (a[0] + t * dx), p[1] - (a[1] + t * dy))


def signed_depth(p: Point, polygon: Sequence[Point]) -> float:
    """Distance from p to the polygon's outline: positive inside, negative outside."""
    n = len(polygon)
    nearest = min(distance_to_segment(p, polygon[i], polygon[(i + 1) % n]) for i in range(n))
    return nearest if point_in_polygon(p, polygon) else -nearest


def signed_distance_to_line(p: Point, a: Point, b: Point) -> float:
    """Perpendicular distance from p to the infinite line a→b. Negative on the side to the
    left of someone standing at a facing b, as the image is shown (y down); positive on the right."""
    length = math.hypot(b[0] - a[0], b[1] - a[1])
    return cross(a, b, p) / length if length else 0.0


def scale_points(points: Sequence[Point], width: float, height: float) -> tuple[Point, ...]:
    """Normalised (0-1) coordinates to source pixels."""
    return tuple((x * width, y * height) for x, y in points)
