"""GPU backends give the CPU backend's detections (within FP16 tolerance). Needs an NVIDIA GPU."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from engines.detector import box_iou
from engines.errors import EngineUnavailable
from engines.registry import create_detector
from engines.types import Detections


def assert_matches(reference: Detections, candidate: Detections, conf: float) -> None:
    """Every confident CPU box has a same-class GPU box at IoU >= 0.9 and a close score."""
    confident = reference.scores > conf + 0.1  # boxes near the threshold may flip under FP16
    if not confident.any():
        return
    assert len(candidate) > 0
    ious = box_iou(reference.boxes[confident], candidate.boxes)
    same_class = reference.class_ids[confident][:, None] == candidate.class_ids[None, :]
    best = np.where(same_class, ious, 0).argmax(axis=1)
    assert np.all(np.where(same_class, ious, 0).max(axis=1) >= 0.9)
    np.testing.assert_allclose(candidate.scores[best], reference.scores[confident], atol=0.05)


@pytest.fixture(scope="module")
def parity_images(vtest_frames: dict[int, np.ndarray], people_crops: list[np.ndarray]) -> list[np.ndarray]:
    return [*vtest_frames.values(), *people_crops]


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["tensorrt", "onnx-cuda"])
@pytest.mark.parametrize(("model", "conf"), [("fall_model", 0.25), ("nudenet_model", 0.05)])
def test_gpu_backend_matches_cpu(
    backend: str, model: str, conf: float, parity_images: list[np.ndarray], request: pytest.FixtureRequest
) -> None:
    path: Path = request.getfixturevalue(model)
    try:
        gpu = create_detector(path, backend, conf=conf)
    except EngineUnavailable as exc:
        pytest.skip(f"{backend} cannot run here: {exc}")
    cpu = create_detector(path, "onnx-cpu", conf=conf)
    try:
        for reference, candidate in zip(cpu.detect(parity_images), gpu.detect(parity_images), strict=True):
            assert_matches(reference, candidate, conf)
    finally:
        gpu.close()
        cpu.close()
