"""TensorRT 10 runner for many-input graphs (the SAM encoder and prompt decoder, YOLO-seg).

Like `engines.tensorrt`: the engine is built once from the ONNX file, cached under a key
that hashes the ONNX bytes with everything the engine depends on, and run with
`execute_async_v3` on one CUDA stream through pycuda. Device buffers are sized for each input's
largest profile shape and allocated once; pinned host buffers are reused between calls.
`tensorrt` and `pycuda` are imported only when a runner is built.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
import threading
from pathlib import Path
from typing import Any

import numpy as np

from engines.errors import EngineError, EngineUnavailable
from engines.segment.runtime import ShapeRange
from engines.tensorrt.availability import INSTALL_HINT, tensorrt_available
from engines.tensorrt.cache import DEFAULT_CACHE_DIR

log = logging.getLogger(__name__)


def engine_cache_key(onnx_bytes_digest: str, settings: dict[str, Any]) -> str:
    """The cache key of one build: the ONNX file's sha256 and the build settings, hashed together."""
    digest = hashlib.sha256(onnx_bytes_digest.encode())
    digest.update(json.dumps(settings, sort_keys=True).encode())
    return digest.hexdigest()[:20]


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def profile_shapes(dims: tuple[int, ...], name: str, shapes: dict[str, ShapeRange]) -> ShapeRange | None:
    """The optimisation-profile range of one input: None when all its axes are static; the given
    range when it has dynamic axes; an error naming the input when it has them but no range."""
    if all(d >= 0 for d in dims):
        return None
    if name not in shapes:
        raise EngineError(f"input {name!r} has dynamic shape {list(dims)}; give its (min, opt, max) shapes")
    low, opt, high = shapes[name]
    for shape in (low, opt, high):
        if len(shape) != len(dims) or any(d >= 0 and d != s for d, s in zip(dims, shape, strict=True)):
            raise EngineError(f"profile shape {shape} of {name!r} does not fit its dims {list(dims)}")
    return low, opt, high


class TensorRTRunner:
    """One engine + execution context on one GPU; calls are serialised by a lock."""

    name = "tensorrt"

    def __init__(
        self,
        onnx_path: str | Path,
        *,
        shapes: dict[str, ShapeRange],
        fp16: bool = True,
        device_id: int = 0,
        cache_dir: str | Path | None = None,
        workspace_bytes: int = 2 << 30,
    ) -> None:
        ok, why = tensorrt_available()
        if not ok:
            raise EngineUnavailable(f"tensorrt: {why}")
        try:
            import pycuda.driver as cuda
            import tensorrt as trt
        except ImportError as exc:
            raise EngineUnavailable(f"tensorrt: {exc}: {INSTALL_HINT}") from None
        if int(trt.__version__.split(".")[0]) < 10:
            raise EngineUnavailable(f"tensorrt: version {trt.__version__} found, need >= 10")
        self._trt, self._cuda = trt, cuda
        self._lock = threading.Lock()
        self._closed = False
        self._shapes = dict(shapes)
        path = Path(onnx_path)
        cuda.init()
        if not 0 <= device_id < cuda.Device.count():
            raise EngineUnavailable(f"tensorrt: CUDA device {device_id} does not exist")
        device = cuda.Device(device_id)
        self._ctx = device.retain_primary_context()
        self._ctx.push()
        try:
            self._logger = trt.Logger(trt.Logger.WARNING)
            settings = {
                "trt": trt.__version__,
                "gpu": device.name(),
                "compute_capability": list(device.compute_capability()),
                "fp16": fp16,
                "shapes": {k: [list(s) for s in v] for k, v in sorted(shapes.items())},
            }
            key = engine_cache_key(file_sha256(path), settings)
            engine_path = Path(cache_dir or DEFAULT_CACHE_DIR) / f"{path.stem}-{key}.engine"
            self._engine = self._load(engine_path) or self._build(path, engine_path, settings, workspace_bytes)
            self._context = self._engine.create_execution_context()
            self._allocate()
        except BaseException:
            self._ctx.pop()
            self._ctx.detach()
            raise
        self._ctx.pop()
        self.engine_path = engine_path

    def _load(self, engine_path: Path) -> Any:
        if not engine_path.is_file():
            return None
        engine = self._trt.Runtime(self._logger).deserialize_cuda_engine(engine_path.read_bytes())
        if engine is None:
            log.warning("cached TensorRT engine %s is unreadable; rebuilding it", engine_path)
        return engine

    def _build(self, onnx_path: Path, engine_path: Path, settings: dict[str, Any], workspace: int) -> Any:
        trt = self._trt
        log.warning("building TensorRT engine for %s (one-off, can take minutes) ...", onnx_path)
        builder = trt.Builder(self._logger)
        network = builder.create_network(0)
        parser = trt.OnnxParser(network, self._logger)
        if not parser.parse_from_file(str(onnx_path)):
            errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
            raise EngineError(f"{onnx_path}: TensorRT cannot parse it: {errors}")
        config = builder.create_builder_config()
        config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, workspace)
        if settings["fp16"] and hasattr(trt.BuilderFlag, "FP16"):
            config.set_flag(trt.BuilderFlag.FP16)
        profile = builder.create_optimization_profile()
        dynamic = False
        for i in range(network.num_inputs):
            tensor = network.get_input(i)
            shape_range = profile_shapes(tuple(tensor.shape), tensor.name, self._shapes)
            if shape_range is not None:
                profile.set_shape(tensor.name, *shape_range)
                dynamic = True
        if dynamic:
            config.add_optimization_profile(profile)
        serialized = builder.build_serialized_network(network, config)
        if serialized is None:
            raise EngineError(f"{onnx_path}: TensorRT engine build failed (see the TensorRT log above)")
        engine_path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=engine_path.parent, suffix=".tmp", delete=False) as tmp:
            tmp.write(serialized)
        os.replace(tmp.name, engine_path)  # never a half-written engine in the cache
        engine_path.with_suffix(".json").write_text(json.dumps({"onnx": str(onnx_path), **settings}, indent=1))
        engine = trt.Runtime(self._logger).deserialize_cuda_engine(engine_path.read_bytes())
        if engine is None:
            raise EngineError(f"{engine_path}: TensorRT cannot load the engine it just built")
        return engine

    def _allocate(self) -> None:
        trt, cuda, engine = self._trt, self._cuda, self._engine
        names = [engine.get_tensor_name(i) for i in range(engine.num_io_tensors)]
        self._inputs = [n for n in names if engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT]
        self._outputs = [n for n in names if n not in self._inputs]
        # Largest shapes first, so the output buffers sized from them fit every later call.
        for name in self._inputs:
            shape = tuple(engine.get_tensor_shape(name))
            if any(d < 0 for d in shape):
                shape = tuple(engine.get_tensor_profile_shape(name, 0)[2])
            if not self._context.set_input_shape(name, shape):
                raise EngineError(f"engine rejects input shape {shape} for {name!r}")
        self._dtypes = {n: np.dtype(trt.nptype(engine.get_tensor_dtype(n))) for n in names}
        self._host: dict[str, np.ndarray] = {}
        self._device: dict[str, Any] = {}
        for name in names:
            count = max(1, int(np.prod(tuple(self._context.get_tensor_shape(name)))))
            self._host[name] = cuda.pagelocked_empty(count, self._dtypes[name])
            self._device[name] = cuda.mem_alloc(self._host[name].nbytes)
            self._context.set_tensor_address(name, int(self._device[name]))
        self._stream = cuda.Stream()

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        cuda = self._cuda
        with self._lock:
            if self._closed:
                raise EngineError("TensorRT runner is closed")
            self._ctx.push()
            try:
                for name in self._inputs:
                    value = np.asarray(feeds[name])
                    if value.size > self._host[name].size or not self._context.set_input_shape(name, value.shape):
                        raise EngineError(f"engine rejects input shape {value.shape} for {name!r}")
                    host = self._host[name][: value.size].reshape(value.shape)
                    host[...] = value  # casts to the engine's dtype (FP16 inputs, int32 sizes)
                    cuda.memcpy_htod_async(self._device[name], host, self._stream)
                if not self._context.execute_async_v3(self._stream.handle):
                    raise EngineError("TensorRT execute_async_v3 failed")
                results = {}
                for name in self._outputs:
                    shape = tuple(self._context.get_tensor_shape(name))
                    host = self._host[name][: int(np.prod(shape))].reshape(shape)
                    cuda.memcpy_dtoh_async(host, self._device[name], self._stream)
                    results[name] = host
                self._stream.synchronize()
                # Copies: the pinned buffers are reused by the next call.
                return {
                    name: np.array(value, dtype=np.float32 if value.dtype == np.float16 else value.dtype)
                    for name, value in results.items()
                }
            finally:
                self._ctx.pop()

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._ctx.push()
            try:
                for allocation in self._device.values():
                    allocation.free()
                self._device.clear()
                self._host.clear()
                del self._context, self._engine, self._stream
            finally:
                self._ctx.pop()
                self._ctx.detach()
