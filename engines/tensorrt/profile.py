"""Optimization profile shapes for the image input.

Images are always letterboxed to the model's imgsz, so height and width are pinned even when the
export left them symbolic; only a dynamic batch axis gets a range. opt = max because GPU callers
batch for throughput: TensorRT tunes its kernels for the batch it will mostly see.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

Shape = tuple[int, ...]


@dataclass(frozen=True, slots=True)
class ProfileShapes:
    input_name: str
    min: Shape
    opt: Shape
    max: Shape

    @property
    def dynamic(self) -> bool:
        """Whether the engine needs an optimization profile (some axis varies at run time)."""
        return self.min != self.max

    @property
    def max_batch(self) -> int:
        return self.max[0]

    def as_key(self) -> list[list[int]]:
        return [list(self.min), list(self.opt), list(self.max)]


def profile_shapes(
    input_name: str, onnx_shape: Sequence[int | None], imgsz: tuple[int, int], max_batch: int
) -> ProfileShapes:
    """Shapes for an ONNX input of `onnx_shape` ([batch, 3, h, w]; None or <= 0 = dynamic).

    A fixed batch wins over `max_batch` (the model cannot run any other)."""
    if len(onnx_shape) != 4:
        raise ValueError(f"image input {input_name!r} has rank {len(onnx_shape)}, expected 4 (NCHW)")
    if max_batch < 1:
        raise ValueError(f"max_batch must be >= 1, got {max_batch}")
    batch, channels = onnx_shape[0], onnx_shape[1]
    height, width = imgsz
    chans = channels if channels is not None and channels > 0 else 3
    if batch is not None and batch > 0:
        fixed: Shape = (batch, chans, height, width)
        return ProfileShapes(input_name, fixed, fixed, fixed)
    return ProfileShapes(input_name, (1, chans, height, width), (max_batch, chans, height, width),
                         (max_batch, chans, height, width))
