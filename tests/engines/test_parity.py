"""Matching two detectors' boxes for `doctor --parity`."""

from __future__ import annotations

import numpy as np
import pytest

from engines.parity import box_iou, compare, match_detections
from engines.types import Detections


def dets(boxes: list[list[float]], scores: list[float], classes: list[int]) -> Detections:
    return Detections(np.array(boxes, np.float32).reshape(-1, 4), np.array(scores, np.float32),
                      np.array(classes, np.int32))


def test_iou() -> None:
    a = np.array([[0, 0, 10, 10]], np.float32)
    b = np.array([[0, 0, 10, 10], [5, 0, 15, 10], [20, 20, 30, 30]], np.float32)
    np.testing.assert_allclose(box_iou(a, b), [[1.0, 50 / 150, 0.0]])
    assert box_iou(a, b[:0]).shape == (1, 0)


def test_greedy_matching_is_one_to_one_within_a_class() -> None:
    reference = dets([[0, 0, 10, 10], [0, 0, 10, 11], [50, 50, 60, 60]], [0.9, 0.8, 0.7], [0, 0, 1])
    candidate = dets([[0, 0, 10, 11], [50, 50, 60, 60], [100, 100, 110, 110]], [0.85, 0.6, 0.5], [0, 0, 0])
    match = match_detections(reference, candidate)
    # The exact twin pairs first; the other class-0 box has no partner left; class 1 never matches class 0.
    assert match.pairs == ((1, 0),)
    assert match.only_reference == 2 and match.only_candidate == 2
    np.testing.assert_allclose(match.score_diffs, [0.05], atol=1e-6)


def test_below_the_iou_threshold_nothing_matches() -> None:
    match = match_detections(dets([[0, 0, 10, 10]], [0.9], [0]), dets([[6, 0, 16, 10]], [0.9], [0]))
    assert match.pairs == () and match.only_reference == match.only_candidate == 1


def test_report_and_verdict() -> None:
    a = dets([[0, 0, 10, 10], [20, 20, 30, 30]], [0.9, 0.5], [0, 2])
    b = dets([[0, 0, 10, 10.2], [20, 20, 30, 30]], [0.88, 0.53], [0, 2])
    report = compare([a, a], [b, b], reference_name="cpu", candidate_name="gpu", reference_ms=20, candidate_ms=2)
    assert report.frames == 2 and report.matched == 4 and report.matched_fraction == 1
    assert report.score_diff_max == pytest.approx(0.03, abs=1e-6)
    assert report.score_diff_mean == pytest.approx(0.025, abs=1e-6)
    assert not report.agree and report.verdict().startswith("DISAGREE")  # mean diff over 0.02
    close = dets([[0, 0, 10, 10.2], [20, 20, 30, 30]], [0.89, 0.5], [0, 2])
    report = compare([a], [close], reference_name="cpu", candidate_name="gpu", reference_ms=20, candidate_ms=2)
    assert report.agree and report.to_json()["agree"] is True
    empty = compare([Detections.empty()], [Detections.empty()], reference_name="a", candidate_name="b",
                    reference_ms=1, candidate_ms=1)
    assert empty.matched_fraction == 1 and empty.agree
    with pytest.raises(ValueError, match="2 reference frames but 1"):
        compare([a, a], [b], reference_name="a", candidate_name="b", reference_ms=1, candidate_ms=1)
