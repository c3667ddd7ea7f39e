"""Frames to JPEG at one fixed size, so every image costs the model the same number of tokens."""

from __future__ import annotations

import cv2
import numpy as np

from engines.vlm.types import VlmImage


def encode_image(rgb_or_bgr: np.ndarray, size: tuple[int, int], *, bgr: bool = True, quality: int = 85) -> VlmImage:
    """Letterbox a frame (H x W x 3, uint8) to exactly `size` = (width, height) and JPEG-encode it.

    The aspect ratio is kept and the bars are black. Pick a size in multiples of 28 px: Qwen2.5-VL
    spends one token per 28x28 tile, and with the server's min_pixels = max_pixels set to the same
    area it never resizes again. Encode each frame once and reuse the VlmImage: a re-encode changes
    the bytes and with them the prefix-cache identity.
    """
    width, height = size
    if width <= 0 or height <= 0:
        raise ValueError(f"encode_image: size must be positive, got {size}")
    if not 1 <= quality <= 100:
        raise ValueError(f"encode_image: quality must be 1..100, got {quality}")
    if rgb_or_bgr.ndim != 3 or rgb_or_bgr.shape[2] != 3 or rgb_or_bgr.dtype != np.uint8:
        raise ValueError(f"encode_image: need an H x W x 3 uint8 frame, got {rgb_or_bgr.shape} {rgb_or_bgr.dtype}")
    src_h, src_w = rgb_or_bgr.shape[:2]
    scale = min(width / src_w, height / src_h)
    new_w, new_h = max(1, round(src_w * scale)), max(1, round(src_h * scale))
    frame = rgb_or_bgr if bgr else cv2.cvtColor(rgb_or_bgr, cv2.COLOR_RGB2BGR)
    if (new_w, new_h) != (src_w, src_h):
        shrinking = scale < 1.0
        frame = cv2.resize(frame, (new_w, new_h), interpolation=cv2.INTER_AREA if shrinking else cv2.INTER_LINEAR)
    if (new_w, new_h) != (width, height):
        canvas = np.zeros((height, width, 3), dtype=np.uint8)
        top, left = (height - new_h) // 2, (width - new_w) // 2
        canvas[top : top + new_h, left : left + new_w] = frame
        frame = canvas
    ok, buffer = cv2.imencode(".jpg", frame, [cv2.IMWRITE_JPEG_QUALITY, quality])
    if not ok:
        raise ValueError("encode_image: JPEG encoding failed")
    return VlmImage(buffer.tobytes(), width, height)
