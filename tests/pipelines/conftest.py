"""Fixtures the pipeline tests share."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from engines.registry import create_detector
from pipelines.detect import DetectionBatcher


@pytest.fixture
async def fall_batcher(fall_model: Path) -> AsyncIterator[DetectionBatcher]:
    """The bundled people model (classes Normal, Fall) on the CPU, behind a batcher."""
    detector = create_detector(fall_model, "onnx-cpu")
    async with DetectionBatcher(detector) as batcher:
        yield batcher
    detector.close()
