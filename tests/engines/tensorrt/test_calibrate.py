"""INT8 calibration inputs: frames letterboxed as the detector does, the cache file, Q/DQ detection."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

from engines.detector import YoloDetector
from engines.tensorrt.calibrate import CalibrationCache, calibration_batches, has_qdq_nodes, video_frames


def test_batches_are_the_detectors_input(
    vtest_frames: dict[int, np.ndarray], nudenet_detector: YoloDetector
) -> None:
    frames = list(vtest_frames.values())  # 3 frames: one batch of 2, the partial rest dropped
    batches = list(calibration_batches(iter(frames), nudenet_detector.info.imgsz, batch=2))
    assert len(batches) == 1 and batches[0].shape == (2, 3, *nudenet_detector.info.imgsz)
    expected = nudenet_detector.preprocess(frames[:2]).tensor
    np.testing.assert_array_equal(batches[0], expected)


def test_video_frames_are_spread_and_bounded(vtest_avi: Path) -> None:
    frames = list(video_frames(vtest_avi, 3, stride=10))
    assert len(frames) == 3 and frames[0].shape == (576, 768, 3)
    assert not np.array_equal(frames[0], frames[1])


def test_cache_round_trip(tmp_path: Path) -> None:
    cache = CalibrationCache(tmp_path / "deep" / "yolo.calib")
    assert cache.read() is None
    cache.write(memoryview(b"TRT-1003-EntropyCalibration2\nimages: 3c010a14\n"))
    assert cache.read() == b"TRT-1003-EntropyCalibration2\nimages: 3c010a14\n"
    assert [p.name for p in cache.path.parent.iterdir()] == ["yolo.calib"]  # no temp file left
    cache.path.write_bytes(b"")
    assert cache.read() is None  # an empty file is no cache


def test_qdq_models_are_recognised(tmp_path: Path, nudenet_model: Path) -> None:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])
    scale = helper.make_tensor("scale", TensorProto.FLOAT, [], [0.1])
    zero = helper.make_tensor("zero", TensorProto.INT8, [], [0])
    graph = helper.make_graph(
        [helper.make_node("QuantizeLinear", ["x", "scale", "zero"], ["q"]),
         helper.make_node("DequantizeLinear", ["q", "scale", "zero"], ["y"])],
        "qdq", [x], [y], [scale, zero],
    )
    path = tmp_path / "qdq.onnx"
    onnx.save(helper.make_model(graph), str(path))
    assert has_qdq_nodes(path)
    assert not has_qdq_nodes(nudenet_model)
