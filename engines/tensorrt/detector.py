"""Open the YOLO detector on TensorRT with explicit options (precision, INT8 calibration, cache).

The detector is the shared YoloDetector: the backend says `letterbox_on_device`, so detect()
hands it the frames and the letterbox runs on the GPU; preprocess()/infer() (benchmarks, and
hosts without nvcc) keep the CPU letterbox.
"""

from __future__ import annotations

from pathlib import Path

from engines.detector import YoloDetector
from engines.model_info import read_model_info
from engines.tensorrt.backend import TensorRTBackend, TensorRTOptions


def open_tensorrt_detector(
    model_path: str | Path, options: TensorRTOptions | None = None, *, conf: float = 0.25, iou: float = 0.45,
    max_det: int = 300,
) -> YoloDetector:
    info = read_model_info(model_path)
    backend = TensorRTBackend(info.path, info, options or TensorRTOptions())
    try:
        return YoloDetector(backend, info, conf=conf, iou=iou, max_det=max_det)
    except BaseException:
        backend.close()
        raise
