"""Optimization profile shapes for fixed and dynamic batch."""

from __future__ import annotations

import pytest

from engines.tensorrt.profile import profile_shapes


def test_dynamic_batch_gets_a_range_with_opt_at_max() -> None:
    shapes = profile_shapes("images", [None, 3, 640, 640], (640, 640), max_batch=8)
    assert shapes.dynamic
    assert (shapes.min, shapes.opt, shapes.max) == ((1, 3, 640, 640), (8, 3, 640, 640), (8, 3, 640, 640))
    assert shapes.max_batch == 8
    assert shapes.as_key() == [[1, 3, 640, 640], [8, 3, 640, 640], [8, 3, 640, 640]]


def test_symbolic_height_and_width_are_pinned_to_imgsz() -> None:
    shapes = profile_shapes("images", [-1, 3, -1, -1], (384, 640), max_batch=4)
    assert shapes.min == (1, 3, 384, 640) and shapes.max == (4, 3, 384, 640)


@pytest.mark.parametrize("batch", [1, 4])
def test_fixed_batch_is_one_shape_whatever_max_batch_says(batch: int) -> None:
    shapes = profile_shapes("images", [batch, 3, 320, 320], (320, 320), max_batch=16)
    assert not shapes.dynamic
    assert shapes.min == shapes.opt == shapes.max == (batch, 3, 320, 320)
    assert shapes.max_batch == batch


def test_bad_inputs() -> None:
    with pytest.raises(ValueError, match="rank 3"):
        profile_shapes("images", [1, 3, 640], (640, 640), max_batch=1)
    with pytest.raises(ValueError, match="max_batch"):
        profile_shapes("images", [None, 3, 640, 640], (640, 640), max_batch=0)
