"""The segmenter protocol: an image and boxes in, one binary mask per box out."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import numpy as np


@runtime_checkable
class Segmenter(Protocol):
    kind: str  # "sam" | "efficientsam" | "yolo-seg"
    backend: str  # the runtime: "onnxruntime-cpu" | "onnxruntime-cuda" | "tensorrt"

    def segment(self, image: np.ndarray, boxes: np.ndarray) -> list[np.ndarray | None]:
        """RGB HxWx3 uint8 image, (N, 4) xyxy boxes in its pixels -> per box an HxW bool mask
        that lies inside the box, or None when the model finds nothing there. Blocks."""
        ...

    def close(self) -> None: ...


def clip_to_box(mask: np.ndarray, box: np.ndarray) -> np.ndarray:
    """`mask` with everything outside the (pixel-rounded) box cleared, in place."""
    height, width = mask.shape
    x1, y1 = max(0, int(np.floor(box[0]))), max(0, int(np.floor(box[1])))
    x2, y2 = min(width, int(np.ceil(box[2]))), min(height, int(np.ceil(box[3])))
    inside = np.zeros_like(mask)
    if x2 > x1 and y2 > y1:
        inside[y1:y2, x1:x2] = mask[y1:y2, x1:x2]
    return inside
