"""TensorRT segmentation runner: pure logic here; the engine itself only where TensorRT runs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from engines.errors import EngineError
from engines.segment.tensorrt_runner import engine_cache_key, profile_shapes


def test_cache_key_changes_with_any_setting() -> None:
    base = {"trt": "10.3", "gpu": "H100", "compute_capability": [9, 0], "fp16": True, "shapes": {}}
    key = engine_cache_key("abc", base)
    assert key == engine_cache_key("abc", dict(base))
    assert key != engine_cache_key("abd", base)
    for change in ({"fp16": False}, {"trt": "10.4"}, {"compute_capability": [8, 9]}):
        assert engine_cache_key("abc", {**base, **change}) != key


def test_profile_shapes() -> None:
    assert profile_shapes((1, 3, 1024, 1024), "image", {}) is None
    ranges = ((1, 1, 2), (1, 2, 2), (1, 16, 2))
    assert profile_shapes((1, -1, 2), "point_coords", {"point_coords": ranges}) == ranges
    with pytest.raises(EngineError, match="point_coords"):
        profile_shapes((1, -1, 2), "point_coords", {})
    with pytest.raises(EngineError, match="does not fit"):
        profile_shapes((1, -1, 2), "point_coords", {"point_coords": ((1, 1, 3), (1, 2, 3), (1, 4, 3))})


@pytest.mark.gpu
def test_sam_on_tensorrt_matches_onnxruntime(seg_models: dict[str, Path]) -> None:
    pytest.importorskip("tensorrt")
    from engines.segment import open_segmenter

    image = np.random.default_rng(1).integers(0, 255, (480, 640, 3), dtype=np.uint8)
    boxes = np.array([[100, 50, 300, 250]], np.float32)
    results = []
    for backend in ("onnx-cpu", "tensorrt"):
        segmenter = open_segmenter(
            sam_encoder=seg_models["lowres_encoder"], sam_decoder=seg_models["lowres_decoder"], backend=backend
        )
        results.append(segmenter.segment(image, boxes)[0])
        segmenter.close()
    cpu, gpu = results
    assert cpu is not None and gpu is not None
    assert (cpu ^ gpu).sum() <= 0.01 * cpu.sum()
