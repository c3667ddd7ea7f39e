"""YOLO pre/post-processing on synthetic data: letterbox geometry, NMS, decoding, validation."""

from __future__ import annotations

import numpy as np
import pytest

from engines.detector import PAD_VALUE, Letterbox, YoloDetector, nms
from engines.errors import EngineError
from engines.types import ModelInfo

NAMES = {0: "person", 1: "car", 2: "dog"}


class ScriptedBackend:
    """An InferenceBackend that returns a prepared raw output and records the batches it saw."""

    name = "scripted"
    input_name = "images"
    max_batch: int | None = None

    def __init__(self, raw: np.ndarray | None = None) -> None:
        self.raw = raw
        self.batches: list[tuple[int, ...]] = []
        self.closed = 0

    def infer(self, batch: np.ndarray) -> np.ndarray:
        self.batches.append(batch.shape)
        if self.raw is not None:
            return self.raw
        return np.zeros((batch.shape[0], 4 + len(NAMES), 10), np.float32)

    def close(self) -> None:
        self.closed += 1


def make_info(fixed_batch: int | None = 1, imgsz: tuple[int, int] = (640, 640)) -> ModelInfo:
    return ModelInfo(path="scripted.onnx", names=NAMES, imgsz=imgsz, fixed_batch=fixed_batch)


def raw_output(detections: list[tuple[float, float, float, float, int, float]], anchors: int = 50) -> np.ndarray:
    """Build a [1, 4 + nc, anchors] output from (cx, cy, w, h, class, score) rows in model pixels."""
    raw = np.zeros((1, 4 + len(NAMES), anchors), np.float32)
    for column, (cx, cy, w, h, cls, score) in enumerate(detections):
        raw[0, :4, column] = (cx, cy, w, h)
        raw[0, 4 + cls, column] = score
    return raw


# -- letterbox -------------------------------------------------------------------------------


def test_letterbox_geometry_for_vtest_frame() -> None:
    box = Letterbox.fit((576, 768), (640, 640))
    assert box.resized_hw == (480, 640)
    assert box.pad == (0, 80)
    assert box.scale_xy == pytest.approx((640 / 768, 480 / 576))


def test_letterbox_round_trip_is_exact() -> None:
    box = Letterbox.fit((576, 768), (640, 640))
    source = np.array([[100.0, 50.0, 300.0, 400.0], [0.0, 0.0, 768.0, 576.0]], np.float32)
    model = box.to_model(source)
    np.testing.assert_allclose(model[1], [0, 80, 640, 560], atol=1e-4)  # the whole image fills the unpadded band
    np.testing.assert_allclose(box.to_source(model), source, atol=1e-4)


def test_letterbox_portrait_and_upscaling() -> None:
    box = Letterbox.fit((100, 50), (320, 320))  # small portrait image is scaled up 3.2x
    assert box.resized_hw == (320, 160)
    assert box.pad == (80, 0)
    source = np.array([[10.0, 20.0, 40.0, 90.0]], np.float32)
    np.testing.assert_allclose(box.to_source(box.to_model(source)), source, atol=1e-4)


def test_to_source_clips_to_the_image() -> None:
    box = Letterbox.fit((576, 768), (640, 640))
    clipped = box.to_source(np.array([[-20.0, 60.0, 700.0, 600.0]], np.float32))
    np.testing.assert_allclose(clipped, [[0, 0, 768, 576]])


# -- NMS -------------------------------------------------------------------------------------


def test_nms_is_class_aware() -> None:
    boxes = np.array([[0, 0, 100, 100], [5, 5, 105, 105]], np.float32)  # IoU ~0.82
    scores = np.array([0.9, 0.8], np.float32)
    assert nms(boxes, scores, 0.45, np.array([0, 1])).tolist() == [0, 1]
    assert nms(boxes, scores, 0.45, np.array([1, 1])).tolist() == [0]
    assert nms(boxes, scores, 0.45).tolist() == [0]


def test_nms_keeps_separate_boxes_best_first_and_caps() -> None:
    boxes = np.array([[0, 0, 10, 10], [50, 50, 60, 60], [1, 1, 11, 11], [100, 0, 110, 10]], np.float32)
    scores = np.array([0.5, 0.9, 0.6, 0.7], np.float32)
    assert nms(boxes, scores, 0.45).tolist() == [1, 3, 2]  # box 0 overlaps the better box 2
    assert nms(boxes, scores, 0.45, max_keep=2).tolist() == [1, 3]
    assert nms(np.zeros((0, 4), np.float32), np.zeros(0, np.float32), 0.45).size == 0


# -- preprocess ------------------------------------------------------------------------------


def test_preprocess_letterboxes_into_a_contiguous_float_tensor() -> None:
    detector = YoloDetector(ScriptedBackend(), make_info(fixed_batch=None))
    image = np.full((576, 768, 3), 200, np.uint8)
    image[..., 0] = 10  # R channel differs: channel order must stay RGB
    prepared = detector.preprocess([image, image[:100, :50].copy()])
    tensor = prepared.tensor
    assert tensor.shape == (2, 3, 640, 640) and tensor.dtype == np.float32 and tensor.flags.c_contiguous
    assert prepared.count == 2
    assert tensor[0, :, 40, 320] == pytest.approx([PAD_VALUE / 255] * 3)  # top padding band
    assert tensor[0, :, 320, 320] == pytest.approx([10 / 255, 200 / 255, 200 / 255])
    assert tensor[1, 0, 320, 100] == pytest.approx(PAD_VALUE / 255)  # left band of the portrait crop


def test_fixed_batch_models_get_padded_batches(vtest_frames: dict[int, np.ndarray]) -> None:
    backend = ScriptedBackend()
    detector = YoloDetector(backend, make_info(fixed_batch=2))
    assert detector.max_batch == 2
    results = detector.detect([vtest_frames[0]] * 3)
    assert len(results) == 3
    assert backend.batches == [(2, 3, 640, 640), (2, 3, 640, 640)]


def test_dynamic_batch_is_chunked_at_max_batch() -> None:
    backend = ScriptedBackend()
    detector = YoloDetector(backend, make_info(fixed_batch=None, imgsz=(320, 320)), max_batch=2)
    results = detector.detect([np.zeros((40, 60, 3), np.uint8)] * 5)
    assert len(results) == 5
    assert [shape[0] for shape in backend.batches] == [2, 2, 1]
    assert detector.detect([]) == []


# -- postprocess -----------------------------------------------------------------------------


def test_postprocess_decodes_thresholds_and_maps_back() -> None:
    # vtest-sized frame: model pixels = source * 5/6, shifted down by 80.
    raw = raw_output(
        [
            (320, 320, 100, 50, 1, 0.9),  # -> source (324, 258, 444, 318)
            (322, 321, 100, 50, 1, 0.8),  # same class, overlapping: suppressed
            (322, 321, 100, 50, 2, 0.7),  # other class, same place: kept
            (100, 100, 20, 20, 0, 0.2),  # below conf 0.25: dropped
            (630, 555, 40, 40, 0, 0.5),  # sticks out of the image: clipped
        ]
    )
    detector = YoloDetector(ScriptedBackend(raw), make_info())
    (result,) = detector.detect([np.zeros((576, 768, 3), np.uint8)])
    assert result.class_ids.tolist() == [1, 2, 0]
    np.testing.assert_allclose(result.scores, [0.9, 0.7, 0.5], atol=1e-6)
    np.testing.assert_allclose(result.boxes[0], [324, 258, 444, 318], atol=1e-3)
    assert result.boxes[2, 2] == pytest.approx(768) and result.boxes[2, 3] == pytest.approx(576)
    assert result.boxes.dtype == np.float32 and result.scores.dtype == np.float32
    assert result.class_ids.dtype == np.int32


def test_postprocess_caps_at_max_det_and_handles_empty_output() -> None:
    rows = [(20.0 + 30 * i, 300, 20, 20, 0, 0.3 + 0.01 * i) for i in range(20)]
    detector = YoloDetector(ScriptedBackend(raw_output(rows)), make_info(), max_det=5)
    (result,) = detector.detect([np.zeros((640, 640, 3), np.uint8)])
    assert len(result) == 5
    assert result.scores.tolist() == sorted(result.scores.tolist(), reverse=True)
    empty = YoloDetector(ScriptedBackend(raw_output([])), make_info())
    assert len(empty.detect([np.zeros((64, 64, 3), np.uint8)])[0]) == 0


def test_postprocess_rejects_a_wrong_output_shape() -> None:
    detector = YoloDetector(ScriptedBackend(np.zeros((1, 9, 10), np.float32)), make_info())
    with pytest.raises(EngineError, match=r"output shape \(1, 9, 10\)"):
        detector.detect([np.zeros((64, 64, 3), np.uint8)])


# -- validation ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("image", "error", "match"),
    [
        (np.zeros((64, 64), np.uint8), ValueError, "expected HxWx3"),
        (np.zeros((64, 64, 4), np.uint8), ValueError, "expected HxWx3"),
        (np.zeros((0, 64, 3), np.uint8), ValueError, "expected HxWx3"),
        (np.zeros((64, 64, 3), np.float32), ValueError, "expected uint8"),
        ("frame.png", TypeError, "expected a numpy array"),
    ],
)
def test_bad_images_are_rejected(image: object, error: type[Exception], match: str) -> None:
    detector = YoloDetector(ScriptedBackend(), make_info())
    with pytest.raises(error, match=match):
        detector.detect([image])  # type: ignore[list-item]


def test_single_array_instead_of_a_list_is_rejected() -> None:
    detector = YoloDetector(ScriptedBackend(), make_info())
    with pytest.raises(TypeError, match="sequence of images"):
        detector.detect(np.zeros((64, 64, 3), np.uint8))


def test_infer_validates_the_tensor() -> None:
    detector = YoloDetector(ScriptedBackend(), make_info())
    with pytest.raises(ValueError, match="not \\(batch, 3, 640, 640\\)"):
        detector.infer(np.zeros((1, 3, 320, 320), np.float32))
    with pytest.raises(ValueError, match="expected float32"):
        detector.infer(np.zeros((1, 3, 640, 640), np.float64))
    with pytest.raises(ValueError, match="does not fit"):
        detector.infer(np.zeros((2, 3, 640, 640), np.float32))


@pytest.mark.parametrize("kwargs", [{"conf": 1.5}, {"conf": -0.1}, {"iou": 0.0}, {"max_det": 0}, {"max_batch": 0}])
def test_bad_settings_are_rejected(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        YoloDetector(ScriptedBackend(), make_info(), **kwargs)  # type: ignore[arg-type]


def test_close_is_idempotent_and_final() -> None:
    backend = ScriptedBackend()
    with YoloDetector(backend, make_info()) as detector:
        pass
    detector.close()
    assert backend.closed == 1
    with pytest.raises(EngineError, match="closed"):
        detector.detect([np.zeros((64, 64, 3), np.uint8)])
