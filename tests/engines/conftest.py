"""Engine fixtures: real vtest.avi frames and real bundled models on ONNX Runtime CPU."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import av
import numpy as np
import pytest

from engines.detector import YoloDetector
from engines.registry import create_detector

FRAME_INDICES = (0, 50, 100)


@pytest.fixture(scope="session")
def vtest_frames(vtest_avi: Path) -> dict[int, np.ndarray]:
    """RGB frames of vtest.avi (768x576) by index."""
    wanted = set(FRAME_INDICES)
    frames: dict[int, np.ndarray] = {}
    with av.open(str(vtest_avi)) as container:
        for index, frame in enumerate(container.decode(video=0)):
            if index in wanted:
                frames[index] = frame.to_ndarray(format="rgb24")
            if index >= max(wanted):
                break
    return frames


@pytest.fixture(scope="session")
def people_crops(vtest_frames: dict[int, np.ndarray]) -> list[np.ndarray]:
    """Three differently sized RGB images in which the nudenet model finds people's parts."""
    frame = vtest_frames[100]
    return [
        np.ascontiguousarray(frame[130:300, 320:640]),  # 170x320, the group in the middle
        frame,  # 576x768
        np.ascontiguousarray(frame[100:420, 280:680]),  # 320x400
    ]


@pytest.fixture(scope="module")
def fall_detector(fall_model: Path) -> Iterator[YoloDetector]:
    detector = create_detector(fall_model, "onnx-cpu")
    assert isinstance(detector, YoloDetector)
    yield detector
    detector.close()


@pytest.fixture(scope="module")
def nudenet_detector(nudenet_model: Path) -> Iterator[YoloDetector]:
    # Low threshold: vtest has few nudenet classes (faces, feet), and batch parity needs boxes to compare.
    detector = create_detector(nudenet_model, "onnx-cpu", conf=0.05)
    assert isinstance(detector, YoloDetector)
    yield detector
    detector.close()
