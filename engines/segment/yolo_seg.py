"""Ultralytics YOLO-seg exports: instance masks from prototype masks.

`output0` is `(1, 4 + nc + nm, anchors)`: a box, class scores and `nm` (32) mask coefficients per
anchor; `output1` is `(1, nm, H/4, W/4)` prototype masks over the letterboxed input. An
instance's mask is `sigmoid(coefficients @ prototypes)`, cut out of the letterbox, resized to the
source image, thresholded at 0.5 and cleared outside its box (as Ultralytics does).

As a box-prompted `Segmenter` it runs the model on the image and gives each requested box the
mask of the instance that overlaps it best (IoU >= `match_iou`), so it serves tracked objects
found by any detector.
"""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np

from engines.detector import PAD_VALUE, Letterbox, box_iou, check_settings, letterbox_image, nms
from engines.errors import EngineError, ModelLoadError
from engines.model_info import read_model_info
from engines.segment.runtime import ShapeRange, TensorRunner, open_runner
from engines.segment.types import clip_to_box
from engines.types import Detections, ModelInfo

MASK_THRESHOLD = 0.5


def proto_mask(coeffs: np.ndarray, protos: np.ndarray, box: Letterbox) -> np.ndarray:
    """One instance's mask probabilities in source pixels, (H, W) float32."""
    channels, ph, pw = protos.shape
    logits = coeffs.astype(np.float32) @ protos.reshape(channels, -1).astype(np.float32)
    probs = (1.0 / (1.0 + np.exp(-logits))).reshape(ph, pw)
    mh, mw = box.dst_hw
    sx, sy = pw / mw, ph / mh  # prototype pixels per model pixel (1/4)
    left, top = box.pad
    rh, rw = box.resized_hw
    # The part of the prototype grid that covers the image, not the letterbox padding.
    x1, y1 = left * sx, top * sy
    x2, y2 = (left + rw) * sx, (top + rh) * sy
    h, w = box.src_hw
    # An affine warp resamples that sub-rectangle straight to the source size in one pass.
    matrix = np.array(
        [[(x2 - x1) / w, 0, x1 + 0.5 * (x2 - x1) / w - 0.5], [0, (y2 - y1) / h, y1 + 0.5 * (y2 - y1) / h - 0.5]],
        np.float32,
    )
    return cv2.warpAffine(
        probs, matrix, (w, h), flags=cv2.INTER_LINEAR | cv2.WARP_INVERSE_MAP, borderMode=cv2.BORDER_REPLICATE
    )


class YoloSegSegmenter:
    kind = "yolo-seg"

    def __init__(
        self, runner: TensorRunner, info: ModelInfo, *, conf: float = 0.25, iou: float = 0.45, match_iou: float = 0.5
    ) -> None:
        if info.task != "segment" or not info.mask_channels or info.protos_name is None:
            raise ModelLoadError(
                f"{info.path}: is a YOLO {info.task!r} export, not 'segment' (yolo export a -seg model)"
            )
        check_settings(conf=conf, iou=iou, max_det=1)
        self.info = info
        self._protos = info.protos_name
        self.conf, self.iou, self.match_iou = conf, iou, match_iou
        self._runner = runner
        self.backend = runner.name

    def instances(self, image: np.ndarray, max_det: int = 100) -> tuple[Detections, list[np.ndarray]]:
        """Every instance the model finds: detections in source pixels and one bool mask each."""
        height, width = self.info.imgsz
        box = Letterbox.fit(image.shape[:2], (height, width))
        canvas = np.full((height, width, 3), PAD_VALUE, np.uint8)
        letterbox_image(image, box, canvas)
        tensor = (canvas.transpose(2, 0, 1)[None].astype(np.float32)) * np.float32(1 / 255)
        out = self._runner.run({self.info.input_name: tensor})
        pred, protos = out[self.info.output_name][0].astype(np.float32), out[self._protos][0]
        nc, nm = self.info.num_classes, self.info.mask_channels
        if pred.shape[0] != 4 + nc + nm or protos.shape[0] != nm:
            raise EngineError(
                f"{self.info.path}: outputs {pred.shape} / {protos.shape} do not fit {nc} classes + {nm} masks"
            )
        scores_all = pred[4 : 4 + nc]
        best = scores_all.max(axis=0)
        keep_idx = np.flatnonzero(best > self.conf)
        if keep_idx.size == 0:
            return Detections.empty(), []
        scores = best[keep_idx]
        class_ids = scores_all[:, keep_idx].argmax(axis=0).astype(np.int32)
        cx, cy, w, h = pred[:4, keep_idx]
        xyxy = np.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], axis=1)
        keep = nms(xyxy, scores, self.iou, class_ids, max_keep=max_det)
        boxes = box.to_source(xyxy[keep])
        coeffs = pred[4 + nc :, keep_idx[keep]].T
        masks = [
            clip_to_box(proto_mask(c, protos, box) > MASK_THRESHOLD, b) for c, b in zip(coeffs, boxes, strict=True)
        ]
        dets = Detections(boxes=boxes, scores=scores[keep].astype(np.float32), class_ids=class_ids[keep])
        return dets, masks

    def segment(self, image: np.ndarray, boxes: np.ndarray) -> list[np.ndarray | None]:
        boxes = np.asarray(boxes, np.float32).reshape(-1, 4)
        if len(boxes) == 0:
            return []
        dets, masks = self.instances(image)
        if not masks:
            return [None] * len(boxes)
        overlap = box_iou(boxes, dets.boxes)
        result: list[np.ndarray | None] = [None] * len(boxes)
        taken: set[int] = set()
        # Greedy, best pairs first: each instance serves one requested box at most.
        for flat in np.argsort(-overlap, axis=None):
            i, j = divmod(int(flat), overlap.shape[1])
            if overlap[i, j] < self.match_iou:
                break
            if result[i] is None and j not in taken:
                taken.add(j)
                mask = clip_to_box(masks[j], boxes[i])
                result[i] = mask if mask.any() else None
        return result

    def close(self) -> None:
        self._runner.close()


def open_yolo_seg(
    path: str | Path, backend: str = "onnx-cpu", *, conf: float = 0.25, iou: float = 0.45, threads: int | None = None
) -> YoloSegSegmenter:
    info = read_model_info(path)
    height, width = info.imgsz
    shape: tuple[int, ...] = (1, 3, height, width)
    shapes: dict[str, ShapeRange] = {info.input_name: (shape, shape, shape)}
    runner = open_runner(path, backend, threads=threads, shapes=shapes)
    try:
        return YoloSegSegmenter(runner, info, conf=conf, iou=iou)
    except BaseException:
        runner.close()
        raise
