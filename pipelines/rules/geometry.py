"""Plane geometry for zones and lines, in image pixels (x right, y down).

Plain floats rather than numpy: rules look at a few dozen points per frame, where numpy's
per-call overhead costs more than the arithmetic.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

Point = tuple[float, float]
Box = tuple[float, float, float, float]  # x1, y1, x2, y2


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
    """No two non-adjacent edges touch (a bow-tie or a repeated vertex is not a zone)."""
    n = len(polygon)
    edges = [(polygon[i], polygon[(i + 1) % n]) for i in range(n)]
    for i in range(n):
        for j in range(i + 1, n):
            if j == i + 1 or (i == 0 and j == n - 1):
                continue  # adjacent edges share a vertex by construction
            if segments_intersect(*edges[i], *edges[j]):
                return False
    return True


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
