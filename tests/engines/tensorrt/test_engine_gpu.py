"""The TensorRT detector on a real GPU: built once into the cache, loaded from it on the next
start, and agreeing with ONNX Runtime on the CPU. Skips without TensorRT, pycuda and a GPU."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from engines.errors import EngineError, EngineUnavailable
from engines.parity import compare
from engines.registry import create_detector


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["fp16", "int8"])
def test_engine_is_cached_and_agrees_with_cpu(
    precision: str, nudenet_model: Path, vtest_avi: Path, vtest_frames: dict[int, np.ndarray], tmp_path: Path
) -> None:
    from engines.tensorrt.backend import TensorRTBackend, TensorRTOptions
    from engines.tensorrt.detector import open_tensorrt_detector

    options = TensorRTOptions(precision=precision, cache_dir=tmp_path, calibration_video=vtest_avi,
                              calibration_frames=64)
    try:
        first = open_tensorrt_detector(nudenet_model, options, conf=0.05)
    except EngineUnavailable as exc:
        pytest.skip(f"tensorrt cannot run here: {exc}")
    except EngineError as exc:
        # TensorRT 11+ has no calibrator: INT8 needs a Q/DQ model, and says so.
        assert precision == "int8" and "Q/DQ" in str(exc), exc
        return
    frames = list(vtest_frames.values())
    try:
        backend = first._runtime
        assert isinstance(backend, TensorRTBackend)
        engine_path = backend.engine_path
        assert engine_path.is_file() and engine_path.with_suffix(".json").is_file()
        assert backend.letterbox_on_device, "nvcc missing: the letterbox fell back to the CPU"
        gpu = first.detect(frames)
    finally:
        first.close()
    built_at = engine_path.stat().st_mtime_ns
    second = open_tensorrt_detector(nudenet_model, options, conf=0.05)
    try:
        assert getattr(second._runtime, "engine_path", None) == engine_path
        assert engine_path.stat().st_mtime_ns == built_at  # loaded, not rebuilt
        again = second.detect(frames)
    finally:
        second.close()
    cpu = create_detector(nudenet_model, "onnx-cpu", conf=0.05)
    try:
        reference = cpu.detect(frames)
    finally:
        cpu.close()
    report = compare(reference, gpu, reference_name="cpu", candidate_name=precision, reference_ms=0, candidate_ms=0)
    assert report.matched > 0 and (report.agree or precision == "int8"), report.verdict()
    same = compare(gpu, again, reference_name="first", candidate_name="cached", reference_ms=0, candidate_ms=0)
    assert same.matched_fraction == 1
