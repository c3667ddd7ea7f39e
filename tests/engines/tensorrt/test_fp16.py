"""The FP16 copy strongly typed TensorRT builds from: FP16 weights, FP32 I/O, metadata kept, made
once, and its boxes agree with the FP32 model's (run here on ONNX Runtime CPU)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import onnx
from onnx import TensorProto

from engines.detector import YoloDetector
from engines.model_info import read_model_info
from engines.parity import compare
from engines.registry import create_detector
from engines.tensorrt.fp16 import fp16_onnx, is_strongly_typed


def test_strong_typing_is_told_by_the_missing_flag() -> None:
    assert is_strongly_typed(SimpleNamespace(BuilderFlag=SimpleNamespace(TF32=1)))
    assert not is_strongly_typed(SimpleNamespace(BuilderFlag=SimpleNamespace(FP16=1, INT8=2)))


def test_fp16_copy_agrees_with_the_fp32_model(
    nudenet_model: Path, nudenet_detector: YoloDetector, vtest_frames: dict[int, np.ndarray], tmp_path: Path
) -> None:
    half = fp16_onnx(nudenet_model, tmp_path)
    made = half.stat().st_mtime_ns
    assert fp16_onnx(nudenet_model, tmp_path) == half and half.stat().st_mtime_ns == made  # made once
    model = onnx.load(str(half))
    assert model.graph.input[0].type.tensor_type.elem_type == TensorProto.FLOAT
    assert model.graph.output[0].type.tensor_type.elem_type == TensorProto.FLOAT
    assert sum(i.data_type == TensorProto.FLOAT16 for i in model.graph.initializer) > 100
    assert read_model_info(half).names == nudenet_detector.info.names

    frames = list(vtest_frames.values())
    detector = create_detector(half, "onnx-cpu", conf=nudenet_detector.conf, workers=1)
    try:
        report = compare(nudenet_detector.detect(frames), detector.detect(frames), reference_name="fp32",
                         candidate_name="fp16", reference_ms=0, candidate_ms=0)
    finally:
        detector.close()
    assert report.matched > 0 and report.agree, report.verdict()
    assert report.score_diff_max < 0.01 and report.iou_min > 0.95
