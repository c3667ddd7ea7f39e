"""SAM / MobileSAM, EfficientSAM and YOLO-seg on ONNX Runtime with tiny models of the real export
signatures: masks land inside their boxes, where the model put them in source pixels."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from engines.errors import EngineUnavailable, ModelLoadError
from engines.registry import create_detector
from engines.segment import open_segmenter
from engines.segment.sam import sam_preprocess, sam_resize_shape
from engines.segment.yolo_seg import YoloSegSegmenter
from tests.engines.segment.models import ellipse_in

IMAGE = np.random.default_rng(0).integers(0, 255, (480, 640, 3), dtype=np.uint8)
BOXES = np.array([[100, 50, 300, 250], [400, 300, 600, 470]], np.float32)


def test_sam_preprocess_resizes_longest_side_normalises_and_pads() -> None:
    assert sam_resize_shape(480, 640, 1024) == (768, 1024)
    image = np.full((480, 640, 3), 128, np.uint8)
    tensor, resized = sam_preprocess(image, 1024)
    assert tensor.shape == (1, 3, 1024, 1024) and resized == (768, 1024)
    assert np.allclose(tensor[0, 0, :768], (128 - 123.675) / 58.395)
    assert not tensor[0, :, 768:].any()  # zero padding below the image


@pytest.mark.parametrize("variant", ["sam", "esam"])
def test_box_prompt_masks(seg_models: dict[str, Path], variant: str) -> None:
    segmenter = open_segmenter(
        sam_encoder=seg_models[f"{variant}_encoder"], sam_decoder=seg_models[f"{variant}_decoder"], backend="onnx-cpu"
    )
    try:
        masks = segmenter.segment(IMAGE, BOXES)
    finally:
        segmenter.close()
    assert segmenter.kind == ("sam" if variant == "sam" else "efficientsam")
    for box, mask in zip(BOXES, masks, strict=True):
        assert mask is not None and mask.shape == (480, 640)
        # The decoder's best-IoU mask (the ellipse in the box), not its whole-image one.
        assert np.array_equal(mask, ellipse_in(box, (480, 640)))
        ys, xs = np.nonzero(mask)
        assert xs.min() >= box[0] and xs.max() < box[2] and ys.min() >= box[1] and ys.max() < box[3]


def test_low_resolution_decoder_masks_are_upscaled_like_sam_does(seg_models: dict[str, Path]) -> None:
    # NanoSAM-style decoder: no orig_im_size, 256x256 logits over the padded 1024 square.
    segmenter = open_segmenter(
        sam_encoder=seg_models["lowres_encoder"], sam_decoder=seg_models["lowres_decoder"], backend="onnx-cpu"
    )
    try:
        masks = segmenter.segment(IMAGE, BOXES)
    finally:
        segmenter.close()
    for box, mask in zip(BOXES, masks, strict=True):
        assert mask is not None
        expected = ellipse_in(box, (480, 640))
        assert (mask & expected).sum() / (mask | expected).sum() > 0.97  # same ellipse, resampled
        ys, xs = np.nonzero(mask)
        assert xs.min() >= box[0] and xs.max() < box[2] and ys.min() >= box[1] and ys.max() < box[3]


def test_tensorrt_refuses_a_decoder_sized_by_its_input(seg_models: dict[str, Path]) -> None:
    with pytest.raises(EngineUnavailable, match="orig_im_size"):
        open_segmenter(sam_encoder=seg_models["sam_encoder"], sam_decoder=seg_models["sam_decoder"], backend="tensorrt")


def test_decoder_of_another_kind_is_refused(seg_models: dict[str, Path]) -> None:
    with pytest.raises(ModelLoadError, match="neither a SAM/MobileSAM decoder"):
        open_segmenter(sam_encoder=seg_models["sam_encoder"], sam_decoder=seg_models["yolo_seg"], backend="onnx-cpu")


def test_yolo_seg_instances_are_unletterboxed_and_cropped(seg_models: dict[str, Path]) -> None:
    segmenter = open_segmenter(yolo_seg=seg_models["yolo_seg"], backend="onnx-cpu")
    assert isinstance(segmenter, YoloSegSegmenter)
    image = np.zeros((64, 128, 3), np.uint8)  # letterboxed into 64x64 at half scale, 16 px pad top
    dets, masks = segmenter.instances(image)
    assert dets.boxes.tolist() == [[32, 16, 96, 48], [80, 16, 112, 48]]
    # Instance 0's prototype covers the left half of the input: x < 64 in source pixels, cut to its box.
    expected = np.zeros((64, 128), bool)
    expected[16:48, 32:64] = True
    assert np.array_equal(masks[0], expected)
    assert masks[1][16:48, 80:112].all() and masks[1].sum() == 32 * 32
    # As a box-prompted segmenter: boxes are matched to instances; a box with none gets None.
    prompted = segmenter.segment(image, np.array([[81, 17, 111, 47], [0, 0, 10, 10]], np.float32))
    assert prompted[1] is None
    assert prompted[0] is not None and prompted[0].sum() == 30 * 30
    segmenter.close()


def test_detector_takes_a_seg_export(seg_models: dict[str, Path]) -> None:
    detector = create_detector(seg_models["yolo_seg"], "onnx-cpu")
    try:
        assert detector.info.task == "segment" and detector.info.mask_channels == 32
        (dets,) = detector.detect([np.zeros((64, 128, 3), np.uint8)])
        assert dets.boxes.tolist() == [[32, 16, 96, 48], [80, 16, 112, 48]]
        assert dets.class_ids.tolist() == [0, 1]
    finally:
        detector.close()
