"""COCO RLE: column-major runs starting with 0s, and the compact string form."""

from __future__ import annotations

import numpy as np
import pytest

from engines.segment import rle


def test_runs_are_column_major_and_start_with_zeros() -> None:
    mask = np.array([[1, 0, 0], [1, 1, 0]], bool)  # columns: [1,1], [0,1], [0,0]
    assert rle.mask_runs(mask) == [0, 2, 1, 1, 2]
    assert rle.encode(mask, compressed=False) == {"size": [2, 3], "counts": [0, 2, 1, 1, 2]}


def test_known_compact_string() -> None:
    # What pycocotools writes for this mask (checked against pycocotools 2.0.11).
    mask = np.zeros((4, 5), bool)
    mask[1:3, 1:4] = True
    assert rle.encode(mask)["counts"] == "5220003"
    assert rle.area(rle.encode(mask)) == 6


@pytest.mark.parametrize("compressed", [True, False])
def test_round_trip_random_masks(compressed: bool) -> None:
    rng = np.random.default_rng(7)
    for _ in range(50):
        h, w = rng.integers(1, 60, 2)
        mask = rng.random((h, w)) < rng.random()
        encoded = rle.encode(mask, compressed=compressed)
        assert np.array_equal(rle.decode(encoded), mask)
        assert rle.area(encoded) == int(mask.sum())


def test_long_runs_round_trip() -> None:
    mask = np.zeros((1080, 1920), bool)
    mask[100:900, 300:1700] = True  # runs far larger than one 5-bit group
    assert np.array_equal(rle.decode(rle.encode(mask)), mask)


def test_bad_counts_are_refused() -> None:
    with pytest.raises(ValueError, match="cover"):
        rle.decode({"size": [2, 2], "counts": [1, 1]})
