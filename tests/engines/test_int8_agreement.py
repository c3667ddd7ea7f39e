"""The INT8 build's check: FP32's boxes against the copy's, read the way the build reads them."""

from __future__ import annotations

import numpy as np

from engines import int8_agreement
from engines.int8_agreement import MAX_DRIFT, MIN_RECALL, compare, has_vnni
from engines.types import Detections


def boxes(*found: tuple[float, float, int]) -> Detections:
    """(x, score, class) each: a 10x10 box at x."""
    return Detections(
        np.array([[x, 0, x + 10, 10] for x, _, _ in found], np.float32).reshape(-1, 4),
        np.array([s for _, s, _ in found], np.float32),
        np.array([c for _, _, c in found], np.int32),
    )


def test_a_box_whose_score_drifts_under_the_threshold_is_still_found_and_the_drift_counted() -> None:
    fp32 = [boxes((0, 0.30, 0), (50, 0.90, 0))]
    int8 = [boxes((1, 0.20, 0), (50, 0.88, 0))]  # under 0.25, over half of it; moved by a pixel
    agreement = compare(fp32, int8, 0.25)
    assert agreement.recall == 1.0 and agreement.fp32_boxes == 2
    assert abs(agreement.drift - (0.10 + 0.02) / 2) < 1e-6
    assert agreement.int8_boxes == 1 and agreement.precision == 1.0  # what a user sees at 0.25
    assert not agreement.holds  # a drift of 0.06 is past the bound
    assert MAX_DRIFT == 0.05


def test_lost_moved_or_relabelled_boxes_lower_the_recall() -> None:
    fp32 = [boxes((0, 0.9, 0), (50, 0.9, 0), (100, 0.9, 1)), boxes((0, 0.8, 2))]
    int8 = [boxes((5, 0.9, 0), (100, 0.9, 0)), boxes((0, 0.8, 2), (0, 0.8, 2))]
    # (5, ...) overlaps the first at IoU 5/15 < 0.5; the third changed class; two copies of the
    # last match it once.
    agreement = compare(fp32, int8, 0.25)
    assert agreement.fp32_boxes == 4 and agreement.recall == 0.25
    assert agreement.int8_boxes == 4 and agreement.precision == 0.25
    assert not agreement.holds and MIN_RECALL == 0.95


def test_nothing_to_find_holds() -> None:
    agreement = compare([Detections.empty()], [Detections.empty()], 0.25)
    assert agreement.holds and agreement.recall == 1.0 and agreement.fp32_boxes == 0


def test_the_cpu_features_are_read_from_the_kernel() -> None:
    features = int8_agreement.cpu_int8_features()
    with open("/proc/cpuinfo") as info:
        flags = set(next(line for line in info if line.startswith("flags")).split(":", 1)[1].split())
    assert set(features) == flags & set(int8_agreement.INT8_FLAGS)
    assert has_vnni(("avx2", "avx_vnni")) and has_vnni(("avx512_vnni",)) and not has_vnni(("avx2", "avx512f"))
