"""The bundled YOLO exports on ONNX Runtime CPU, on real vtest.avi frames."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from engines.detector import Detector, YoloDetector
from engines.registry import create_detector
from engines.types import Detections


def assert_same_detections(a: Detections, b: Detections, atol: float = 0.5) -> None:
    assert len(a) == len(b)
    assert a.class_ids.tolist() == b.class_ids.tolist()
    np.testing.assert_allclose(a.scores, b.scores, atol=1e-3)
    np.testing.assert_allclose(a.boxes, b.boxes, atol=atol)


def test_fall_model_finds_people_on_vtest(fall_detector: YoloDetector, vtest_frames: dict[int, np.ndarray]) -> None:
    frame = vtest_frames[100]
    (result,) = fall_detector.detect([frame])
    names = [fall_detector.info.names[int(c)] for c in result.class_ids]
    assert names.count("Normal") >= 3, names
    height, width = frame.shape[:2]
    x1, y1, x2, y2 = result.boxes.T
    assert np.all((x1 >= 0) & (y1 >= 0) & (x2 <= width) & (y2 <= height))
    assert np.all((x2 > x1) & (y2 > y1))
    assert np.all((result.scores >= fall_detector.conf) & (result.scores <= 1))
    # People in vtest are upright and well under half the frame tall.
    assert np.all(y2 - y1 < height / 2)


def test_fall_model_metadata_and_fixed_batch(fall_detector: YoloDetector) -> None:
    info = fall_detector.info
    assert info.names == {0: "Normal", 1: "Fall"}
    assert info.imgsz == (640, 640) and info.fixed_batch == 1 and not info.dynamic_hw
    assert fall_detector.max_batch == 1
    assert fall_detector.backend == "onnxruntime-cpu"
    assert isinstance(fall_detector, Detector)


def test_fixed_batch_model_chunks_many_images(fall_detector: YoloDetector, vtest_frames: dict[int, np.ndarray]) -> None:
    frames = [vtest_frames[100], vtest_frames[0]]
    together = fall_detector.detect(frames)
    assert len(together) == 2
    for frame, result in zip(frames, together, strict=True):
        assert_same_detections(fall_detector.detect([frame])[0], result, atol=1e-3)


def test_three_steps_equal_detect(fall_detector: YoloDetector, vtest_frames: dict[int, np.ndarray]) -> None:
    frame = vtest_frames[100]
    prepared = fall_detector.preprocess([frame])
    raw = fall_detector.infer(prepared.tensor)
    assert raw.shape == (1, 6, 8400)
    (stepwise,) = fall_detector.postprocess(raw, prepared)
    assert_same_detections(stepwise, fall_detector.detect([frame])[0], atol=1e-3)


def test_nudenet_dynamic_model_uses_metadata_imgsz(
    nudenet_detector: YoloDetector, people_crops: list[np.ndarray]
) -> None:
    info = nudenet_detector.info
    assert info.fixed_batch is None and info.dynamic_hw
    assert info.imgsz == (320, 320) and len(info.names) == 18
    assert "FACE_FEMALE" in info.names.values()
    assert nudenet_detector.max_batch > 1
    prepared = nudenet_detector.preprocess(people_crops)
    assert prepared.tensor.shape == (3, 3, 320, 320)
    raw = nudenet_detector.infer(prepared.tensor)
    assert raw.shape == (3, 22, 2100)


def test_nudenet_batch_equals_single_calls(nudenet_detector: YoloDetector, people_crops: list[np.ndarray]) -> None:
    batched = nudenet_detector.detect(people_crops)
    singles = [nudenet_detector.detect([image])[0] for image in people_crops]
    assert sum(len(d) for d in singles) > 0, "the comparison needs some detections"
    for image, one, many in zip(people_crops, singles, batched, strict=True):
        assert_same_detections(one, many)
        if len(one):
            assert one.boxes[:, 2].max() <= image.shape[1] and one.boxes[:, 3].max() <= image.shape[0]


def test_more_images_than_max_batch(nudenet_model: Path, people_crops: list[np.ndarray]) -> None:
    detector = create_detector(nudenet_model, "onnx-cpu", conf=0.05, max_batch=2, threads=1)
    try:
        assert detector.max_batch == 2
        images = people_crops + people_crops[:2]
        results = detector.detect(images)
        assert len(results) == 5
        assert_same_detections(results[0], results[3])
        assert_same_detections(results[1], results[4])
    finally:
        detector.close()


def test_thresholds_are_applied(nudenet_model: Path, people_crops: list[np.ndarray]) -> None:
    strict = create_detector(nudenet_model, "onnx-cpu", conf=0.15, max_det=1)
    try:
        for result in strict.detect(people_crops):
            assert len(result) <= 1
            assert np.all(result.scores > 0.15)
    finally:
        strict.close()


@pytest.mark.parametrize("size", [(32, 32), (1, 500), (2000, 300)])
def test_odd_image_sizes(nudenet_detector: YoloDetector, size: tuple[int, int]) -> None:
    image = np.random.default_rng(0).integers(0, 255, (*size, 3), dtype=np.uint8)
    (result,) = nudenet_detector.detect([image])
    if len(result):
        assert result.boxes[:, 2].max() <= size[1] and result.boxes[:, 3].max() <= size[0]
