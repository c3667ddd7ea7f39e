"""The YOLO detector over the TensorRT backend, letterboxing on the GPU when it can."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from engines.detector import PreparedBatch, YoloDetector, _check_images
from engines.model_info import read_model_info
from engines.tensorrt.backend import TensorRTBackend, TensorRTOptions
from engines.types import Detections

_NO_TENSOR = np.zeros((0, 3, 1, 1), np.float32)  # postprocess reads only the letterboxes


class TensorRTDetector(YoloDetector):
    """detect() hands frames to the backend's GPU letterbox; preprocess()/infer() (benchmarks,
    the CPU-letterbox fallback when no nvcc is present) keep the shared CPU path."""

    def __init__(self, backend: TensorRTBackend, **settings: float | int | None) -> None:
        super().__init__(backend, backend.info, **settings)  # type: ignore[arg-type]
        self._trt = backend

    def detect(self, images: Sequence[np.ndarray]) -> list[Detections]:
        images = _check_images(images)
        if self._trt.gpu_letterbox is None:
            return super().detect(images)
        self._check_open()
        results: list[Detections] = []
        for start in range(0, len(images), self.max_batch):
            raw, boxes = self._trt.infer_images(images[start : start + self.max_batch])
            results.extend(self.postprocess(raw, PreparedBatch(_NO_TENSOR, boxes)))
        return results


def open_tensorrt_detector(
    model_path: str | Path, options: TensorRTOptions | None = None, *, conf: float = 0.25, iou: float = 0.45,
    max_det: int = 300,
) -> TensorRTDetector:
    info = read_model_info(model_path)
    backend = TensorRTBackend(info.path, info, options or TensorRTOptions())
    try:
        return TensorRTDetector(backend, conf=conf, iou=iou, max_det=max_det)
    except BaseException:
        backend.close()
        raise
