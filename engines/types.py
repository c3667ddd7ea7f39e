"""Result types shared by every detector backend."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True, slots=True)
class Detections:
    """Detections for one image, in source-image pixels.

    boxes: (N, 4) float32 xyxy; scores: (N,) float32; class_ids: (N,) int32.
    """

    boxes: np.ndarray
    scores: np.ndarray
    class_ids: np.ndarray

    def __len__(self) -> int:
        return int(self.scores.shape[0])

    @staticmethod
    def empty() -> Detections:
        return Detections(
            boxes=np.zeros((0, 4), np.float32),
            scores=np.zeros((0,), np.float32),
            class_ids=np.zeros((0,), np.int32),
        )


@dataclass(frozen=True, slots=True)
class ModelInfo:
    """What a YOLO export says about itself (read from the ONNX metadata)."""

    path: str
    names: dict[int, str]
    imgsz: tuple[int, int]  # (height, width) the model expects / was exported at
    stride: int = 32
    fixed_batch: int | None = None  # None: dynamic batch axis
    dynamic_hw: bool = False
    task: str = "detect"
    extra: dict[str, str] = field(default_factory=dict)
    input_name: str = "images"
    output_name: str = "output0"
    mask_channels: int = 0  # YOLO-seg: mask coefficients after the class scores (protos in a 2nd output)
    protos_name: str | None = None  # YOLO-seg: the prototype-mask output, (batch, mask_channels, H/4, W/4)

    @property
    def max_batch(self) -> int | None:
        return self.fixed_batch

    @property
    def num_classes(self) -> int:
        return len(self.names)
