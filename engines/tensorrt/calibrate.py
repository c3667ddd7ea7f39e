"""INT8: entropy calibration over sample frames, with a calibration cache file.

TensorRT 10 still builds INT8 engines from a calibrator (implicit quantization; NVIDIA deprecated it
and TensorRT 11 removed it, in favour of Q/DQ models). Both work on 10: an ONNX that already holds
QuantizeLinear/DequantizeLinear nodes (e.g. a statically quantized export) is built with the INT8
flag alone; a float ONNX is calibrated on letterboxed frames of a video, and the scales are kept
in a calibration cache so later builds (another GPU, a new TensorRT) skip the frames.
"""

from __future__ import annotations

import logging
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from engines.detector import PAD_VALUE, Letterbox, letterbox_image
from engines.errors import EngineError

log = logging.getLogger(__name__)

DEFAULT_CALIBRATION_FRAMES = 256
CALIBRATION_BATCH = 8


def has_qdq_nodes(onnx_path: str | Path) -> bool:
    """Whether the model carries its own quantization (Q/DQ nodes), so needs no calibrator."""
    import onnx

    model = onnx.load(str(onnx_path), load_external_data=False)
    return any(node.op_type in ("QuantizeLinear", "DequantizeLinear") for node in model.graph.node)


def video_frames(video: str | Path, count: int, *, stride: int = 5) -> Iterator[np.ndarray]:
    """Up to `count` RGB frames of `video`, every `stride`-th one (spread over the clip)."""
    import av

    with av.open(str(video)) as container:
        taken = 0
        for index, frame in enumerate(container.decode(video=0)):
            if index % stride:
                continue
            yield frame.to_ndarray(format="rgb24")
            taken += 1
            if taken >= count:
                return


def calibration_batches(
    frames: Iterator[np.ndarray], imgsz: tuple[int, int], batch: int
) -> Iterator[np.ndarray]:
    """(batch, 3, H, W) float32 tensors letterboxed exactly as the detector feeds the engine;
    a last partial batch is dropped (the calibration profile has one fixed batch size)."""
    height, width = imgsz
    canvas = np.full((batch, height, width, 3), PAD_VALUE, np.uint8)
    filled = 0
    for frame in frames:
        canvas[filled].fill(PAD_VALUE)
        letterbox_image(frame, Letterbox.fit(frame.shape[:2], imgsz), canvas[filled])
        filled += 1
        if filled == batch:
            tensor = np.empty((batch, 3, height, width), np.float32)
            np.multiply(canvas.transpose(0, 3, 1, 2), np.float32(1 / 255), out=tensor, casting="unsafe")
            yield tensor
            filled = 0


class CalibrationCache:
    """The calibrator's cache file: read if present, written (atomically) after calibrating."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def read(self) -> bytes | None:
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return None
        return data or None

    def write(self, data: bytes | memoryview) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=self.path.parent, suffix=".tmp", delete=False) as tmp:
            tmp.write(bytes(data))
        os.replace(tmp.name, self.path)
        log.info("INT8 calibration cache written to %s", self.path)


def make_entropy_calibrator(
    trt: Any, cuda: Any, batches: Iterator[np.ndarray] | None, cache: CalibrationCache, batch: int
) -> Any:
    """A trt.IInt8EntropyCalibrator2 feeding `batches` (None: the cache must hold the scales).

    Defined inside a function because its base class lives in the `tensorrt` module."""

    class EntropyCalibrator(trt.IInt8EntropyCalibrator2):
        def __init__(self) -> None:
            trt.IInt8EntropyCalibrator2.__init__(self)
            self._batches = batches
            self._device: Any = None
            self.seen = 0

        def get_batch_size(self) -> int:
            return batch

        def get_batch(self, names: list[str]) -> list[int] | None:
            if self._batches is None:
                raise EngineError("INT8 calibration needs frames: the calibration cache is missing or empty")
            tensor = next(self._batches, None)
            if tensor is None:
                return None
            if self._device is None:
                self._device = cuda.mem_alloc(tensor.nbytes)
            cuda.memcpy_htod(self._device, np.ascontiguousarray(tensor))
            self.seen += tensor.shape[0]
            return [int(self._device)] * len(names)

        def read_calibration_cache(self) -> bytes | None:
            return cache.read()

        def write_calibration_cache(self, data: Any) -> None:
            cache.write(memoryview(data))

    return EntropyCalibrator()
