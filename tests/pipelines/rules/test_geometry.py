"""Point-in-polygon, distances and segment crossings in image coordinates (y down)."""

from __future__ import annotations

import pytest

from pipelines.rules.geometry import (
    feet,
    is_simple_polygon,
    point_in_polygon,
    segments_intersect,
    signed_depth,
    signed_distance_to_line,
)

SQUARE = ((0.0, 0.0), (10.0, 0.0), (10.0, 10.0), (0.0, 10.0))
# A "U": the notch between x 4-6 reaches down to y 5 and is outside.
U_SHAPE = ((0.0, 0.0), (4.0, 0.0), (4.0, 5.0), (6.0, 5.0), (6.0, 0.0), (10.0, 0.0), (10.0, 10.0), (0.0, 10.0))


def test_point_in_convex_and_concave_polygons() -> None:
    assert point_in_polygon((5, 5), SQUARE) and not point_in_polygon((11, 5), SQUARE)
    assert not point_in_polygon((5, 2), U_SHAPE)  # in the notch
    assert point_in_polygon((5, 7), U_SHAPE) and point_in_polygon((2, 2), U_SHAPE)


def test_signed_depth_is_positive_inside_negative_outside() -> None:
    assert signed_depth((5, 5), SQUARE) == pytest.approx(5)
    assert signed_depth((5, 9), SQUARE) == pytest.approx(1)
    assert signed_depth((5, 12), SQUARE) == pytest.approx(-2)
    assert signed_depth((13, 14), SQUARE) == pytest.approx(-5)  # nearest the corner


def test_segments_intersect() -> None:
    assert segments_intersect((0, 0), (10, 10), (0, 10), (10, 0))
    assert not segments_intersect((0, 0), (4, 4), (0, 10), (4, 6))
    assert segments_intersect((0, 0), (5, 5), (5, 5), (9, 0))  # touching at an end
    assert not segments_intersect((0, 0), (10, 0), (0, 1), (10, 1))  # parallel
    assert not segments_intersect((0, 0), (2, 0), (3, 0), (5, 0))  # collinear, apart


def test_simple_polygon_check_rejects_a_bow_tie() -> None:
    assert is_simple_polygon(SQUARE) and is_simple_polygon(U_SHAPE)
    assert not is_simple_polygon(((0, 0), (10, 10), (10, 0), (0, 10)))


def test_side_a_is_above_a_line_drawn_left_to_right() -> None:
    a, b = (0.0, 100.0), (200.0, 100.0)
    assert signed_distance_to_line((50, 40), a, b) == pytest.approx(-60)  # above: side a
    assert signed_distance_to_line((50, 130), a, b) == pytest.approx(30)  # below: side b


def test_feet_is_the_bottom_centre() -> None:
    assert feet((10, 20, 30, 80)) == (20, 80)
