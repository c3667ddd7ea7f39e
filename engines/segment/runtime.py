"""Run a many-input, many-output ONNX graph by tensor name: the SAM encoder and prompt decoder
and YOLO-seg need more than the detector's one-image-in, one-tensor-out backends offer.

`read_signature` reads names, shapes and types from the ONNX file itself, so a segmenter can
check a model before any runtime starts; the runners execute it (ONNX Runtime here, TensorRT in
`engines.segment.tensorrt_runner`).
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

import numpy as np

from engines.errors import EngineError, EngineUnavailable
from engines.model_info import _load_onnx
from engines.onnx_backend import CUDA_EP, execution_providers, import_onnxruntime, new_session

_ONNX_DTYPES = {1: np.float32, 10: np.float16, 6: np.int32, 7: np.int64, 9: np.bool_}


@dataclass(frozen=True, slots=True)
class TensorSpec:
    name: str
    shape: tuple[int | None, ...]  # None: a dynamic axis
    dtype: type


@dataclass(frozen=True, slots=True)
class Signature:
    path: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]

    def input(self, name: str) -> TensorSpec | None:
        return next((t for t in self.inputs if t.name == name), None)

    @property
    def input_names(self) -> list[str]:
        return [t.name for t in self.inputs]

    @property
    def output_names(self) -> list[str]:
        return [t.name for t in self.outputs]


def read_signature(path: str | Path) -> Signature:
    """The graph's real inputs (initializers excluded) and outputs; ModelLoadError on a bad file."""
    model = _load_onnx(Path(path))
    initializers = {init.name for init in model.graph.initializer}

    def spec(value: Any) -> TensorSpec:
        tensor = value.type.tensor_type
        dims = tuple(d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else None for d in tensor.shape.dim)
        return TensorSpec(value.name, dims, _ONNX_DTYPES.get(tensor.elem_type, np.float32))

    inputs = tuple(spec(v) for v in model.graph.input if v.name not in initializers)
    return Signature(str(path), inputs, tuple(spec(v) for v in model.graph.output))


ShapeRange = tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]  # TensorRT (min, opt, max)


class TensorRunner(Protocol):
    name: str  # "onnxruntime-cpu" | "onnxruntime-cuda" | "tensorrt"

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Every output by name; inputs are cast to the model's dtypes."""
        ...

    def close(self) -> None: ...


class OnnxRunner:
    """One ONNX Runtime session (CPU or CUDA EP); calls are serialised (the segmenter is shared)."""

    def __init__(self, path: str | Path, device: Literal["cpu", "cuda"] = "cpu", *, threads: int | None = None) -> None:
        ort = import_onnxruntime()
        # Segmentation runs beside the detector: its idle threads sleep too (see new_session).
        self._session = new_session(ort, path, execution_providers(ort, device), threads or os.cpu_count() or 1)
        if device == "cuda" and self._session.get_providers()[0] != CUDA_EP:
            raise EngineUnavailable(f"onnx-cuda: {CUDA_EP} failed to initialise for {path}")
        self.name = f"onnxruntime-{device}"
        self._types = {i.name: _ORT_DTYPES.get(i.type, np.float32) for i in self._session.get_inputs()}
        self._outputs = [o.name for o in self._session.get_outputs()]
        self._lock = threading.Lock()

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        cast = {name: np.ascontiguousarray(value, dtype=self._types.get(name)) for name, value in feeds.items()}
        with self._lock:
            if self._session is None:
                raise EngineError("onnxruntime session is closed")
            values = self._session.run(self._outputs, cast)
        return dict(zip(self._outputs, (np.asarray(v) for v in values), strict=True))

    def close(self) -> None:
        with self._lock:
            self._session = None


_ORT_DTYPES = {
    "tensor(float)": np.float32,
    "tensor(float16)": np.float16,
    "tensor(int64)": np.int64,
    "tensor(int32)": np.int32,
    "tensor(bool)": np.bool_,
}


def open_runner(
    path: str | Path,
    backend: str,
    *,
    threads: int | None = None,
    shapes: dict[str, ShapeRange] | None = None,
    fp16: bool = True,
) -> TensorRunner:
    """A runner for `backend` ("onnx-cpu" | "onnx-cuda" | "tensorrt"); `shapes` gives TensorRT's
    (min, opt, max) for each dynamic input."""
    if backend == "onnx-cpu":
        return OnnxRunner(path, "cpu", threads=threads)
    if backend == "onnx-cuda":
        return OnnxRunner(path, "cuda", threads=threads)
    if backend == "tensorrt":
        from engines.segment.tensorrt_runner import TensorRTRunner

        return TensorRTRunner(path, shapes=shapes or {}, fp16=fp16)
    raise ValueError(f"unknown segmentation backend {backend!r}; choose one of: onnx-cpu, onnx-cuda, tensorrt")
