"""The detector protocol and the YOLO pre/post-processing every backend shares.

A backend only turns an NCHW float32 tensor into the raw `[B, 4 + nc, anchors]` output; letterboxing,
decoding, class-aware NMS and the mapping back to source pixels live here, once, so ONNX Runtime
and TensorRT give the same boxes for the same raw output.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import cv2
import numpy as np

from engines.errors import EngineError
from engines.types import Detections, ModelInfo

PAD_VALUE = 114  # Ultralytics' letterbox gray; the models were trained with it
DEFAULT_MAX_BATCH = 16  # chunk size for dynamic-batch models when the backend sets no limit
MAX_NMS_CANDIDATES = 30_000  # bounds NMS cost on pathological outputs (e.g. conf=0.001)
_NO_TENSOR = np.zeros((0, 3, 1, 1), np.float32)  # postprocess() reads only a batch's letterboxes


@runtime_checkable
class Detector(Protocol):
    info: ModelInfo
    backend: str  # "onnxruntime-cpu" | "onnxruntime-cuda" | "tensorrt"
    max_batch: int  # largest batch one call may take (1 for fixed-batch-1 models)
    workers: int  # calls that may run side by side (each runs in parallel with the others)

    def detect(self, images: Sequence[np.ndarray]) -> list[Detections]:
        """RGB HxWx3 uint8 images of any sizes; blocks until done; one Detections per image."""
        ...

    def close(self) -> None: ...


class InferenceBackend(Protocol):
    """Runs the bare model: NCHW float32 in, raw output out."""

    name: str
    input_name: str
    max_batch: int | None  # the backend's own limit (TensorRT profile), None when unbounded

    def infer(self, batch: np.ndarray) -> np.ndarray: ...

    def close(self) -> None: ...


@dataclass(frozen=True, slots=True)
class Letterbox:
    """How one source image was fitted into the model input (aspect kept, centered, gray padding)."""

    src_hw: tuple[int, int]
    dst_hw: tuple[int, int]
    resized_hw: tuple[int, int]
    pad: tuple[int, int]  # (left, top) in model pixels

    @staticmethod
    def fit(src_hw: tuple[int, int], dst_hw: tuple[int, int]) -> Letterbox:
        (h, w), (dh, dw) = src_hw, dst_hw
        if h <= 0 or w <= 0:
            raise ValueError(f"image size must be positive, got {h}x{w}")
        scale = min(dh / h, dw / w)
        rh = min(dh, max(1, round(h * scale)))
        rw = min(dw, max(1, round(w * scale)))
        return Letterbox((h, w), (dh, dw), (rh, rw), ((dw - rw) // 2, (dh - rh) // 2))

    @property
    def scale_xy(self) -> tuple[float, float]:
        # Per-axis scale of the rounded resize, so the inverse mapping is exact.
        return self.resized_hw[1] / self.src_hw[1], self.resized_hw[0] / self.src_hw[0]

    def to_model(self, boxes: np.ndarray) -> np.ndarray:
        sx, sy = self.scale_xy
        left, top = self.pad
        return boxes * np.array([sx, sy, sx, sy], np.float32) + np.array([left, top, left, top], np.float32)

    def to_source(self, boxes: np.ndarray) -> np.ndarray:
        """Model-input xyxy -> source-image xyxy, clipped to the image."""
        sx, sy = self.scale_xy
        left, top = self.pad
        out = (boxes - np.array([left, top, left, top], np.float32)) / np.array([sx, sy, sx, sy], np.float32)
        h, w = self.src_hw
        np.clip(out[:, 0::2], 0, w, out=out[:, 0::2])
        np.clip(out[:, 1::2], 0, h, out=out[:, 1::2])
        return out.astype(np.float32, copy=False)


@dataclass(frozen=True, slots=True)
class PreparedBatch:
    tensor: np.ndarray  # (B, 3, H, W) float32 contiguous; B may exceed `count` for fixed-batch models
    letterboxes: tuple[Letterbox, ...]  # one per real image

    @property
    def count(self) -> int:
        return len(self.letterboxes)


def letterbox_image(image: np.ndarray, box: Letterbox, out: np.ndarray) -> None:
    """Resize `image` into `out` (an HxWx3 uint8 canvas already filled with PAD_VALUE)."""
    rh, rw = box.resized_hw
    left, top = box.pad
    if (rh, rw) != image.shape[:2]:
        image = cv2.resize(image, (rw, rh), interpolation=cv2.INTER_LINEAR)
    out[top : top + rh, left : left + rw] = image


def box_iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Pairwise IoU of xyxy boxes: (len(a), len(b)), float64; empty when either side is."""
    if len(a) == 0 or len(b) == 0:
        return np.zeros((len(a), len(b)), np.float64)
    a, b = a.astype(np.float64), b.astype(np.float64)
    lt = np.maximum(a[:, None, :2], b[None, :, :2])
    rb = np.minimum(a[:, None, 2:], b[None, :, 2:])
    inter = np.clip(rb - lt, 0, None).prod(axis=2)
    area_a = np.clip(a[:, 2:] - a[:, :2], 0, None).prod(axis=1)
    area_b = np.clip(b[:, 2:] - b[:, :2], 0, None).prod(axis=1)
    return inter / np.maximum(area_a[:, None] + area_b[None, :] - inter, 1e-12)


def nms(
    boxes: np.ndarray,
    scores: np.ndarray,
    iou_threshold: float,
    class_ids: np.ndarray | None = None,
    max_keep: int | None = None,
) -> np.ndarray:
    """Greedy NMS over xyxy boxes; indices of kept boxes, best score first.

    With `class_ids`, boxes only suppress boxes of their own class: each class is shifted to its
    own disjoint region of the plane, so one pass handles every class.
    """
    if len(boxes) == 0:
        return np.zeros((0,), np.int64)
    boxes = boxes.astype(np.float64, copy=False)
    if class_ids is not None:
        span = float(boxes.max() - boxes.min()) + 1.0
        boxes = boxes + (class_ids.astype(np.float64) * span)[:, None]
    x1, y1, x2, y2 = boxes.T
    areas = np.clip(x2 - x1, 0, None) * np.clip(y2 - y1, 0, None)
    order = np.argsort(-scores, kind="stable")
    keep: list[int] = []
    limit = len(order) if max_keep is None else max_keep
    while order.size and len(keep) < limit:
        best, rest = order[0], order[1:]
        keep.append(int(best))
        inter = np.clip(np.minimum(x2[best], x2[rest]) - np.maximum(x1[best], x1[rest]), 0, None) * np.clip(
            np.minimum(y2[best], y2[rest]) - np.maximum(y1[best], y1[rest]), 0, None
        )
        iou = inter / np.maximum(areas[best] + areas[rest] - inter, 1e-9)
        order = rest[iou <= iou_threshold]
    return np.asarray(keep, np.int64)


class YoloDetector:
    """A Detector over any InferenceBackend running an Ultralytics detect export."""

    def __init__(
        self,
        backend: InferenceBackend,
        info: ModelInfo,
        *,
        conf: float = 0.25,
        iou: float = 0.45,
        max_det: int = 300,
        max_batch: int | None = None,
    ) -> None:
        check_settings(conf=conf, iou=iou, max_det=max_det, max_batch=max_batch)
        self.info = info
        self.backend = backend.name
        self.conf, self.iou, self.max_det = conf, iou, max_det
        self._runtime = backend
        self.workers = max(1, int(getattr(backend, "parallel", 1)))
        self.threads = int(getattr(backend, "threads", 0))  # CPU threads of a call alone (0: not a CPU pool)
        if info.fixed_batch is not None:
            # A fixed batch-N model always runs N images; fewer are padded in preprocess().
            self.max_batch = info.fixed_batch
        else:
            limits = [max_batch or DEFAULT_MAX_BATCH, backend.max_batch or DEFAULT_MAX_BATCH]
            self.max_batch = min(limits)
        self._closed = False

    # -- the three timed steps -------------------------------------------------------------

    def preprocess(self, images: Sequence[np.ndarray]) -> PreparedBatch:
        """Letterbox up to `max_batch` RGB images into one NCHW float32 tensor."""
        images = _check_images(images)
        if not images:
            raise ValueError("preprocess() needs at least one image")
        if len(images) > self.max_batch:
            raise ValueError(f"{len(images)} images exceed max_batch={self.max_batch}; use detect() to chunk")
        height, width = self.info.imgsz
        rows = self.info.fixed_batch or len(images)
        canvas = np.full((rows, height, width, 3), PAD_VALUE, np.uint8)
        boxes = []
        for i, image in enumerate(images):
            box = Letterbox.fit(image.shape[:2], (height, width))
            letterbox_image(image, box, canvas[i])
            boxes.append(box)
        tensor = np.empty((rows, 3, height, width), np.float32)
        np.multiply(canvas.transpose(0, 3, 1, 2), np.float32(1 / 255), out=tensor, casting="unsafe")
        return PreparedBatch(tensor, tuple(boxes))

    def infer(self, tensor: np.ndarray) -> np.ndarray:
        """Run the bare model on a preprocessed tensor; returns the raw output."""
        self._check_open()
        height, width = self.info.imgsz
        if tensor.ndim != 4 or tensor.shape[1:] != (3, height, width):
            raise ValueError(f"input tensor shape {tensor.shape} is not (batch, 3, {height}, {width})")
        if tensor.dtype != np.float32:
            raise ValueError(f"input tensor dtype is {tensor.dtype}, expected float32")
        fixed = self.info.fixed_batch
        if (fixed is not None and tensor.shape[0] != fixed) or not 1 <= tensor.shape[0] <= self.max_batch:
            raise ValueError(f"batch of {tensor.shape[0]} does not fit this model (max_batch={self.max_batch})")
        return self._runtime.infer(np.ascontiguousarray(tensor))

    def postprocess(self, raw: np.ndarray, prepared: PreparedBatch) -> list[Detections]:
        """Decode the raw output into per-image Detections in source pixels."""
        channels = 4 + self.info.num_classes + self.info.mask_channels  # a seg export's coefficients ride along
        if raw.ndim != 3 or raw.shape[0] < prepared.count or raw.shape[1] != channels:
            raise EngineError(
                f"model output shape {raw.shape} is not (>= {prepared.count}, {channels}, anchors) for {self.info.path}"
            )
        return [self._decode(raw[i], box) for i, box in enumerate(prepared.letterboxes)]

    # -- the Detector protocol -------------------------------------------------------------

    def detect(self, images: Sequence[np.ndarray]) -> list[Detections]:
        images = _check_images(images)
        # A backend that letterboxes on its device (TensorRT) takes the frames themselves.
        on_device = getattr(self._runtime, "letterbox_on_device", False)
        results: list[Detections] = []
        for start in range(0, len(images), self.max_batch):
            chunk = images[start : start + self.max_batch]
            if on_device:
                self._check_open()
                raw, boxes = self._runtime.infer_images(chunk)  # type: ignore[attr-defined]
                results.extend(self.postprocess(raw, PreparedBatch(_NO_TENSOR, boxes)))
                continue
            prepared = self.preprocess(chunk)
            results.extend(self.postprocess(self.infer(prepared.tensor), prepared))
        return results

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._runtime.close()

    def __enter__(self) -> YoloDetector:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"YoloDetector({self.info.path!r}, backend={self.backend!r}, imgsz={self.info.imgsz}, "
            f"classes={self.info.num_classes}, max_batch={self.max_batch})"
        )

    # -- internals -------------------------------------------------------------------------

    def _decode(self, pred: np.ndarray, box: Letterbox) -> Detections:
        pred = pred.astype(np.float32, copy=False)  # FP16 engines return half precision
        class_scores = pred[4 : 4 + self.info.num_classes]
        best = class_scores.max(axis=0)
        candidates = np.flatnonzero(best > self.conf)
        if candidates.size == 0:
            return Detections.empty()
        if candidates.size > MAX_NMS_CANDIDATES:
            top = np.argpartition(-best[candidates], MAX_NMS_CANDIDATES)[:MAX_NMS_CANDIDATES]
            candidates = candidates[top]
        scores = best[candidates]
        class_ids = class_scores[:, candidates].argmax(axis=0).astype(np.int32)
        cx, cy, w, h = pred[:4, candidates]
        xyxy = np.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], axis=1)
        keep = nms(xyxy, scores, self.iou, class_ids, max_keep=self.max_det)
        return Detections(
            boxes=box.to_source(xyxy[keep]),
            scores=scores[keep].astype(np.float32, copy=False),
            class_ids=class_ids[keep],
        )

    def _check_open(self) -> None:
        if self._closed:
            raise EngineError(f"detector for {self.info.path} is closed")


def check_settings(*, conf: float, iou: float, max_det: int, max_batch: int | None = None) -> None:
    """Raise ValueError for thresholds no detector accepts (checked before any slow engine build)."""
    if not 0.0 <= conf <= 1.0:
        raise ValueError(f"conf must be in [0, 1], got {conf}")
    if not 0.0 < iou <= 1.0:
        raise ValueError(f"iou must be in (0, 1], got {iou}")
    if max_det < 1:
        raise ValueError(f"max_det must be >= 1, got {max_det}")
    if max_batch is not None and max_batch < 1:
        raise ValueError(f"max_batch must be >= 1, got {max_batch}")


def _check_images(images: Sequence[np.ndarray]) -> list[np.ndarray]:
    if isinstance(images, np.ndarray) and images.ndim == 3:
        raise TypeError("pass a sequence of images (e.g. [image]), not a single HxWx3 array")
    checked = list(images)
    for i, image in enumerate(checked):
        if not isinstance(image, np.ndarray):
            raise TypeError(f"image {i} is {type(image).__name__}, expected a numpy array")
        if image.ndim != 3 or image.shape[2] != 3 or image.shape[0] == 0 or image.shape[1] == 0:
            raise ValueError(f"image {i} has shape {image.shape}, expected HxWx3 (RGB)")
        if image.dtype != np.uint8:
            raise ValueError(f"image {i} has dtype {image.dtype}, expected uint8")
    return checked
