"""The real people model over a stretch of vtest.avi, run once per test session.

Tracking and rule tests both need the same 40 frames through the same model; decoding and
detecting them once keeps the model's ~6 s off every module that uses them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import av
import pytest

from engines.registry import create_detector
from engines.types import Detections

START = 100  # people are spread over the plaza from here on
FRAMES = 40
FPS = 10.0


@dataclass(frozen=True, slots=True)
class VtestFrame:
    pts: float
    shape: tuple[int, ...]  # (height, width, 3) of the decoded frame
    detections: Detections


@dataclass(frozen=True, slots=True)
class VtestDetections:
    frames: list[VtestFrame]
    names: dict[int, str]


@pytest.fixture(scope="session")
def vtest_detections(vtest_avi: Path, fall_model: Path) -> VtestDetections:
    detector = create_detector(fall_model, "onnx-cpu")
    frames: list[VtestFrame] = []
    try:
        with av.open(str(vtest_avi)) as container:
            for index, frame in enumerate(container.decode(video=0)):
                if index >= START + FRAMES:
                    break
                if index >= START:
                    image = frame.to_ndarray(format="rgb24")
                    frames.append(VtestFrame(index / FPS, image.shape, detector.detect([image])[0]))
    finally:
        detector.close()
    return VtestDetections(frames, dict(detector.info.names))
