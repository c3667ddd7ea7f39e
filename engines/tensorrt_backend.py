"""TensorRT 10 backend: builds an engine from the ONNX export once, caches it, runs it with pycuda.

Engines are specific to the GPU, the TensorRT version and the build settings, so the cache key
hashes all of them together with the ONNX bytes. `tensorrt` and `pycuda` are optional extras
(`pip install 'vidsentry[gpu]'`) and are imported only when this backend is constructed.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import tempfile
import threading
from pathlib import Path
from typing import Any

import numpy as np

from engines.cuda_probe import cuda_device_count
from engines.errors import EngineError, EngineUnavailable
from engines.types import ModelInfo

log = logging.getLogger(__name__)

DEFAULT_CACHE_DIR = Path.home() / ".cache" / "vidsentry" / "trt"
DEFAULT_MAX_BATCH = 8
INSTALL_HINT = "pip install 'tensorrt>=10' pycuda (needs an NVIDIA GPU and driver)"


def tensorrt_available() -> tuple[bool, str]:
    """Whether TensorRT can run here, without importing it (fast, for `auto` and `doctor`)."""
    for package in ("tensorrt", "pycuda"):
        if importlib.util.find_spec(package) is None:
            return False, f"python package {package!r} is not installed: {INSTALL_HINT}"
    count, why = cuda_device_count()
    if count == 0:
        return False, why
    return True, f"tensorrt and pycuda installed; {why}"


def _import_gpu_stack() -> tuple[Any, Any]:
    try:
        import tensorrt as trt
    except ImportError as exc:
        raise EngineUnavailable(f"tensorrt: cannot import the 'tensorrt' package ({exc}): {INSTALL_HINT}") from None
    try:
        import pycuda.driver as cuda
    except ImportError as exc:
        raise EngineUnavailable(f"tensorrt: cannot import 'pycuda' ({exc}): pip install pycuda") from None
    major = int(trt.__version__.split(".")[0])
    if major < 10:
        raise EngineUnavailable(f"tensorrt: version {trt.__version__} found, need >= 10: {INSTALL_HINT}")
    return trt, cuda


class TensorRTBackend:
    """One engine + execution context on one GPU; `infer` calls are serialised by a lock."""

    name = "tensorrt"

    def __init__(
        self,
        model_path: str | Path,
        info: ModelInfo,
        *,
        fp16: bool = True,
        max_batch: int = DEFAULT_MAX_BATCH,
        device_id: int = 0,
        cache_dir: str | Path | None = None,
        workspace_bytes: int = 2 << 30,
    ) -> None:
        ok, why = tensorrt_available()
        if not ok:
            raise EngineUnavailable(f"tensorrt: {why}")
        trt, cuda = _import_gpu_stack()
        self._trt, self._cuda = trt, cuda
        self._info = info
        self._lock = threading.Lock()
        self._closed = False
        cuda.init()
        if not 0 <= device_id < cuda.Device.count():
            raise EngineUnavailable(f"tensorrt: CUDA device {device_id} does not exist")
        device = cuda.Device(device_id)
        # The primary context is shared with other CUDA users in the process (e.g. onnxruntime),
        # and push/pop around every call lets any thread run inference.
        self._context_cuda = device.retain_primary_context()
        self._context_cuda.push()
        try:
            self._logger = trt.Logger(trt.Logger.WARNING)
            settings = {
                "trt": trt.__version__,
                "gpu": device.name(),
                "compute_capability": list(device.compute_capability()),
                "fp16": fp16,
                "max_batch": info.fixed_batch or max_batch,
                "imgsz": list(info.imgsz),
            }
            engine_path = _engine_path(Path(model_path), settings, Path(cache_dir or DEFAULT_CACHE_DIR))
            self._engine = self._load_engine(engine_path) or self._build_engine(
                Path(model_path), engine_path, settings, workspace_bytes
            )
            self._context = self._engine.create_execution_context()
            self._allocate_io()
        except BaseException:
            self._context_cuda.pop()
            self._context_cuda.detach()
            raise
        self._context_cuda.pop()
        self.engine_path = engine_path

    # -- engine build / cache --------------------------------------------------------------

    def _load_engine(self, engine_path: Path) -> Any:
        if not engine_path.is_file():
            return None
        runtime = self._trt.Runtime(self._logger)
        engine = runtime.deserialize_cuda_engine(engine_path.read_bytes())
        if engine is None:
            log.warning("cached TensorRT engine %s is unreadable; rebuilding it", engine_path)
        return engine

    def _build_engine(self, onnx_path: Path, engine_path: Path, settings: dict[str, Any], workspace: int) -> Any:
        trt = self._trt
        log.warning("building TensorRT engine for %s (one-off, can take minutes) ...", onnx_path)
        builder = trt.Builder(self._logger)
        network = builder.create_network(0)  # explicit batch is the only mode in TensorRT 10
        parser = trt.OnnxParser(network, self._logger)
        if not parser.parse_from_file(str(onnx_path)):
            errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
            raise EngineError(f"{onnx_path}: TensorRT cannot parse it: {errors}")
        config = builder.create_builder_config()
        config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, workspace)
        if settings["fp16"]:
            fp16_flag = getattr(trt.BuilderFlag, "FP16", None)
            if fp16_flag is None:
                log.warning("this TensorRT has no BuilderFlag.FP16; building FP32")
            else:
                config.set_flag(fp16_flag)
        model_input = network.get_input(0)
        if any(dim < 0 for dim in model_input.shape):
            # Images are always letterboxed to imgsz, so only the batch axis varies; opt = max because
            # callers batch for throughput.
            height, width = settings["imgsz"]
            max_batch = settings["max_batch"]
            min_shape, max_shape = (1, 3, height, width), (max_batch, 3, height, width)
            profile = builder.create_optimization_profile()
            profile.set_shape(model_input.name, min_shape, max_shape, max_shape)
            config.add_optimization_profile(profile)
        serialized = builder.build_serialized_network(network, config)
        if serialized is None:
            raise EngineError(f"{onnx_path}: TensorRT engine build failed (see the TensorRT log above)")
        engine_path.parent.mkdir(parents=True, exist_ok=True)
        # Write-then-rename so a crash or a parallel worker never leaves a half-written engine.
        with tempfile.NamedTemporaryFile(dir=engine_path.parent, suffix=".tmp", delete=False) as tmp:
            tmp.write(serialized)
        os.replace(tmp.name, engine_path)
        engine_path.with_suffix(".json").write_text(json.dumps({"onnx": str(onnx_path), **settings}, indent=1))
        log.info("TensorRT engine cached at %s", engine_path)
        engine = trt.Runtime(self._logger).deserialize_cuda_engine(engine_path.read_bytes())
        if engine is None:
            raise EngineError(f"{engine_path}: TensorRT cannot load the engine it just built")
        return engine

    # -- buffers and inference -------------------------------------------------------------

    def _allocate_io(self) -> None:
        trt, cuda, engine = self._trt, self._cuda, self._engine
        names = [engine.get_tensor_name(i) for i in range(engine.num_io_tensors)]
        inputs = [n for n in names if engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT]
        outputs = [n for n in names if n not in inputs]
        if len(inputs) != 1 or not outputs:
            raise EngineError(f"engine has inputs {inputs} and outputs {outputs}; expected one image input")
        self.input_name: str = inputs[0]
        self._output_name = self._info.output_name if self._info.output_name in outputs else outputs[0]
        batch_dim = engine.get_tensor_shape(self.input_name)[0]
        if batch_dim < 0:
            batch_dim = engine.get_tensor_profile_shape(self.input_name, 0)[2][0]
        self.max_batch: int | None = int(batch_dim)
        height, width = self._info.imgsz
        if not self._context.set_input_shape(self.input_name, (self.max_batch, 3, height, width)):
            raise EngineError(f"engine rejects input shape {(self.max_batch, 3, height, width)}")
        self._host: dict[str, np.ndarray] = {}
        self._device: dict[str, Any] = {}
        for name in names:
            shape = tuple(self._context.get_tensor_shape(name))
            dtype = np.dtype(trt.nptype(engine.get_tensor_dtype(name)))
            # Sized for the largest batch; smaller batches use a prefix of the same buffers.
            self._host[name] = cuda.pagelocked_empty(int(np.prod(shape)), dtype)
            self._device[name] = cuda.mem_alloc(self._host[name].nbytes)
            self._context.set_tensor_address(name, int(self._device[name]))
        self._stream = cuda.Stream()

    def infer(self, batch: np.ndarray) -> np.ndarray:
        cuda = self._cuda
        with self._lock:
            if self._closed:
                raise EngineError("TensorRT backend is closed")
            self._context_cuda.push()
            try:
                if not self._context.set_input_shape(self.input_name, batch.shape):
                    raise EngineError(f"engine rejects input shape {batch.shape} (max batch {self.max_batch})")
                host_in = self._host[self.input_name][: batch.size].reshape(batch.shape)
                host_in[...] = batch  # casts to FP16 when the engine's input is half precision
                cuda.memcpy_htod_async(self._device[self.input_name], host_in, self._stream)
                if not self._context.execute_async_v3(self._stream.handle):
                    raise EngineError("TensorRT execute_async_v3 failed")
                out_shape = tuple(self._context.get_tensor_shape(self._output_name))
                host_out = self._host[self._output_name][: int(np.prod(out_shape))].reshape(out_shape)
                cuda.memcpy_dtoh_async(host_out, self._device[self._output_name], self._stream)
                self._stream.synchronize()
                return host_out.astype(np.float32)  # a copy: the pinned buffer is reused next call
            finally:
                self._context_cuda.pop()

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._context_cuda.push()
            try:
                for allocation in self._device.values():
                    allocation.free()
                self._device.clear()
                self._host.clear()
                del self._context, self._engine, self._stream
            finally:
                self._context_cuda.pop()
                self._context_cuda.detach()


def _engine_path(onnx_path: Path, settings: dict[str, Any], cache_dir: Path) -> Path:
    digest = hashlib.sha256()
    with onnx_path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    digest.update(json.dumps(settings, sort_keys=True).encode())
    return cache_dir / f"{onnx_path.stem}-{digest.hexdigest()[:20]}.engine"
