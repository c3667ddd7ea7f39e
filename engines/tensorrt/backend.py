"""The TensorRT engine at run time: one execution context on one GPU, fed through pycuda.

Everything a frame needs is allocated once when the engine opens: pinned host buffers and device
buffers for every binding (sized for the profile's largest batch), the CUDA stream, and the GPU
letterbox's staging slots. A call letterboxes on the GPU straight into the input binding,
enqueues the engine with `execute_async_v3` on the stream, copies the raw output back into its
pinned buffer and synchronises once.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from engines.detector import Letterbox
from engines.errors import EngineError, EngineUnavailable
from engines.tensorrt.availability import import_gpu_stack, tensorrt_available
from engines.tensorrt.bindings import BindingLayout, binding_layout
from engines.tensorrt.cache import (
    DEFAULT_CACHE_DIR,
    PRECISIONS,
    BuildProgress,
    CacheEntry,
    EngineKey,
    cache_entry,
    cache_state,
    file_sha256,
    store_engine,
)
from engines.tensorrt.calibrate import (
    CALIBRATION_BATCH,
    DEFAULT_CALIBRATION_FRAMES,
    CalibrationCache,
    calibration_batches,
    has_qdq_nodes,
    make_entropy_calibrator,
    video_frames,
)
from engines.tensorrt.fp16 import fp16_onnx, is_strongly_typed
from engines.tensorrt.preprocess import GpuLetterbox
from engines.tensorrt.profile import ProfileShapes, profile_shapes
from engines.types import ModelInfo

log = logging.getLogger(__name__)

DEFAULT_MAX_BATCH = 8


@dataclass(frozen=True, slots=True)
class TensorRTOptions:
    precision: str = "fp16"  # fp16 (default) | fp32 | int8
    max_batch: int = DEFAULT_MAX_BATCH  # profile max for dynamic-batch models
    device_id: int = 0
    cache_dir: Path | None = None  # default ~/.cache/vidsentry/trt
    workspace_bytes: int = 2 << 30
    # INT8 from a float ONNX: the scales come from this cache file (default: beside the engines),
    # computed on frames of `calibration_video` when the file does not exist yet.
    calibration_cache: Path | None = None
    calibration_video: Path | None = None
    calibration_frames: int = DEFAULT_CALIBRATION_FRAMES

    def __post_init__(self) -> None:
        if self.precision not in PRECISIONS:
            raise ValueError(f"TensorRT precision must be one of {', '.join(PRECISIONS)}, got {self.precision!r}")
        if self.max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {self.max_batch}")
        if self.calibration_frames < CALIBRATION_BATCH:
            raise ValueError(f"calibration_frames must be >= {CALIBRATION_BATCH}, got {self.calibration_frames}")


class TensorRTBackend:
    """InferenceBackend over a cached TensorRT engine; calls are serialised by a lock."""

    name = "tensorrt"

    def __init__(
        self,
        model_path: str | Path,
        info: ModelInfo,
        options: TensorRTOptions | None = None,
        *,
        fp16: bool = True,
        max_batch: int = DEFAULT_MAX_BATCH,
        device_id: int = 0,
        cache_dir: str | Path | None = None,
    ) -> None:
        if options is None:
            options = TensorRTOptions(
                precision="fp16" if fp16 else "fp32", max_batch=max_batch, device_id=device_id,
                cache_dir=Path(cache_dir) if cache_dir is not None else None,
            )
        ok, why = tensorrt_available()
        if not ok:
            raise EngineUnavailable(f"tensorrt: {why}")
        trt, cuda = import_gpu_stack()
        self._trt, self._cuda = trt, cuda
        self.info = self._info = info
        self._options = options
        self._onnx = Path(model_path)
        self._lock = threading.Lock()
        self._closed = False
        cuda.init()
        if not 0 <= options.device_id < cuda.Device.count():
            raise EngineUnavailable(f"tensorrt: CUDA device {options.device_id} does not exist")
        device = cuda.Device(options.device_id)
        # The primary context is shared with other CUDA users in the process (onnxruntime, PyAV's
        # NVDEC); push/pop around every call lets any thread run inference.
        self._context_cuda = device.retain_primary_context()
        self._context_cuda.push()
        try:
            self._logger = trt.Logger(trt.Logger.WARNING)
            self._runtime = trt.Runtime(self._logger)  # kept: it must outlive the engines it loads
            onnx_shape = [info.fixed_batch, 3, *info.imgsz]
            self.profile = profile_shapes(info.input_name, onnx_shape, info.imgsz, options.max_batch)
            self._qdq = options.precision == "int8" and has_qdq_nodes(self._onnx)
            self._calibration = self._calibration_cache()
            self.entry = self._entry(device)
            self._engine = self._load_or_build()
            self._context = self._engine.create_execution_context()
            self.layout: BindingLayout = binding_layout(
                self._engine, trt, self._context, output_name=info.output_name
            )
            self._allocate()
        except BaseException:
            self._context_cuda.pop()
            self._context_cuda.detach()
            raise
        self._context_cuda.pop()
        self.input_name: str = self.layout.input.name
        self.max_batch: int | None = self.layout.max_batch
        self.engine_path = self.entry.engine_path

    # -- cache -----------------------------------------------------------------------------

    def _calibration_cache(self) -> CalibrationCache | None:
        if self._options.precision != "int8" or self._qdq or is_strongly_typed(self._trt):
            return None
        path = self._options.calibration_cache or (
            (self._options.cache_dir or DEFAULT_CACHE_DIR) / f"{self._onnx.stem}-{file_sha256(self._onnx)[:12]}.calib"
        )
        return CalibrationCache(path)

    def _entry(self, device: Any) -> CacheEntry:
        calibration = ""
        if self._qdq:
            calibration = "qdq"
        elif self._calibration is not None and self._calibration.read() is not None:
            calibration = file_sha256(self._calibration.path)
        key = EngineKey(
            onnx_sha256=file_sha256(self._onnx),
            trt_version=str(self._trt.__version__),
            gpu_name=str(device.name()),
            compute_capability=tuple(device.compute_capability()),
            precision=self._options.precision,
            profile=(self.profile.min, self.profile.opt, self.profile.max),
            calibration_sha256=calibration,
        )
        return cache_entry(self._options.cache_dir or DEFAULT_CACHE_DIR, self._onnx, key)

    def _load_or_build(self) -> Any:
        state, why = cache_state(self.entry)
        if state == "fresh":
            engine = self._runtime.deserialize_cuda_engine(self.entry.engine_path.read_bytes())
            if engine is not None:
                log.info("TensorRT engine loaded from %s", self.entry.engine_path)
                return engine
            why = "the cached engine cannot be deserialized by this TensorRT"
        with BuildProgress(self._onnx.name, why):
            serialized = self._build()
        if self._calibration is not None and not self.entry.key.calibration_sha256:
            # Calibrated during this build: key the engine by the cache it just wrote, as the next
            # start will compute it.
            key = self.entry.key
            self.entry = cache_entry(
                self.entry.engine_path.parent, self._onnx,
                EngineKey(key.onnx_sha256, key.trt_version, key.gpu_name, key.compute_capability,
                          key.precision, key.profile, file_sha256(self._calibration.path)),
            )
        store_engine(self.entry, serialized)
        log.info("TensorRT engine cached at %s", self.entry.engine_path)
        engine = self._runtime.deserialize_cuda_engine(self.entry.engine_path.read_bytes())
        if engine is None:
            raise EngineError(f"{self.entry.engine_path}: TensorRT cannot load the engine it just built")
        return engine

    def _build(self) -> Any:
        trt, options = self._trt, self._options
        strongly_typed = is_strongly_typed(trt)
        source = self._onnx
        if strongly_typed and options.precision == "fp16":
            source = fp16_onnx(self._onnx, self.entry.engine_path.parent)
        if strongly_typed and options.precision == "int8" and not self._qdq:
            raise EngineError(
                f"TensorRT {trt.__version__} builds INT8 only from a model with Q/DQ nodes (it has no calibrator): "
                f"quantize {self._onnx.name} first, or build fp16"
            )
        builder = trt.Builder(self._logger)
        network = builder.create_network(0)  # explicit batch is the only mode since TensorRT 10
        parser = trt.OnnxParser(network, self._logger)
        if not parser.parse_from_file(str(source)):
            errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
            raise EngineError(f"{source}: TensorRT cannot parse it: {errors}")
        config = builder.create_builder_config()
        config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, options.workspace_bytes)
        if options.precision in ("fp16", "int8") and not strongly_typed:
            # INT8 engines keep FP16 for the layers INT8 cannot take.
            _set_flag(trt, config, "FP16")
        if self.profile.dynamic:
            config.add_optimization_profile(_trt_profile(builder, self.profile))
        calibrator = None  # held here: TensorRT calls back into it until the build returns
        if options.precision == "int8" and not strongly_typed:
            _set_flag(trt, config, "INT8")
            if self._calibration is not None:
                calibrator = self._calibrator()
                config.int8_calibrator = calibrator
                if self.profile.dynamic:
                    batch = min(CALIBRATION_BATCH, self.profile.max_batch)
                    shape = (batch, *self.profile.max[1:])
                    calib = ProfileShapes(self.profile.input_name, shape, shape, shape)
                    config.set_calibration_profile(_trt_profile(builder, calib))
        serialized = builder.build_serialized_network(network, config)
        del calibrator
        if serialized is None:
            raise EngineError(f"{self._onnx}: TensorRT engine build failed (see the TensorRT log above)")
        return serialized

    def _calibrator(self) -> Any:
        assert self._calibration is not None
        batch = self.profile.max_batch if not self.profile.dynamic else min(CALIBRATION_BATCH, self.profile.max_batch)
        batches = None
        if self._calibration.read() is None:
            video = self._options.calibration_video
            if video is None or not Path(video).is_file():
                raise EngineUnavailable(
                    f"tensorrt int8: no calibration cache at {self._calibration.path} and no calibration video "
                    f"({video}); pass one (e.g. the sample clip) or build with fp16"
                )
            frames = video_frames(video, self._options.calibration_frames)
            batches = calibration_batches(frames, self._info.imgsz, batch)
            log.warning("calibrating INT8 on up to %d frames of %s", self._options.calibration_frames, video)
        return make_entropy_calibrator(self._trt, self._cuda, batches, self._calibration, batch)

    # -- buffers ---------------------------------------------------------------------------

    def _allocate(self) -> None:
        cuda = self._cuda
        self._host: dict[str, np.ndarray] = {}
        self._device: dict[str, Any] = {}
        for binding in self.layout.bindings:
            # Sized for the largest batch; smaller batches use a prefix of the same buffers.
            self._host[binding.name] = cuda.pagelocked_empty(binding.shape, binding.dtype)
            self._device[binding.name] = cuda.mem_alloc(binding.nbytes)
            self._context.set_tensor_address(binding.name, int(self._device[binding.name]))
        self._stream = cuda.Stream()
        self.gpu_letterbox: GpuLetterbox | None = None
        self.letterbox_on_device = False  # YoloDetector.detect() hands frames to infer_images() when True
        try:
            from pycuda.compiler import SourceModule

            self.gpu_letterbox = GpuLetterbox(
                cuda, SourceModule, dst_hw=self._info.imgsz, dtype=self.layout.input.dtype,
                slots=self.layout.max_batch, stream=self._stream,
            )
            self.letterbox_on_device = True
        except Exception as exc:  # nvcc missing, or an input dtype the kernel does not write
            log.warning("TensorRT: letterbox stays on the CPU (%s): pycuda compiles its kernel with nvcc, "
                        "install the CUDA toolkit to move it to the GPU", str(exc).splitlines()[0] if str(exc) else exc)

    # -- inference -------------------------------------------------------------------------

    def infer(self, batch: np.ndarray) -> np.ndarray:
        """A CPU-letterboxed NCHW float32 batch in, raw output out (the InferenceBackend path)."""
        with self._lock, self._current():
            self._set_batch(batch.shape[0])
            host_in = self._host[self.input_name].reshape(-1)[: batch.size].reshape(batch.shape)
            host_in[...] = batch  # casts to FP16 when the engine's input is half precision
            self._cuda.memcpy_htod_async(self._device[self.input_name], host_in, self._stream)
            return self._run_and_fetch()

    def infer_images(self, images: Sequence[np.ndarray]) -> tuple[np.ndarray, tuple[Letterbox, ...]]:
        """RGB uint8 frames in; letterboxed on the GPU into the input binding; raw output out."""
        if self.gpu_letterbox is None:
            raise EngineError("the GPU letterbox is not available (see the warning logged at start)")
        rows = self._info.fixed_batch or len(images)
        with self._lock, self._current():
            self._set_batch(rows)
            boxes = self.gpu_letterbox.run(images, int(self._device[self.input_name]), rows)
            return self._run_and_fetch(), boxes

    def _set_batch(self, rows: int) -> None:
        if self._closed:
            raise EngineError("TensorRT backend is closed")
        shape = (rows, *self.layout.input.shape[1:])
        if not 1 <= rows <= self.layout.max_batch or not self._context.set_input_shape(self.input_name, shape):
            raise EngineError(f"engine rejects input shape {shape} (max batch {self.layout.max_batch})")

    def _run_and_fetch(self) -> np.ndarray:
        if not self._context.execute_async_v3(self._stream.handle):
            raise EngineError("TensorRT execute_async_v3 failed")
        name = self.layout.output.name
        out_shape = tuple(self._context.get_tensor_shape(name))
        host_out = self._host[name].reshape(-1)[: int(np.prod(out_shape))].reshape(out_shape)
        self._cuda.memcpy_dtoh_async(host_out, self._device[name], self._stream)
        self._stream.synchronize()
        return host_out.astype(np.float32)  # a copy: the pinned buffer is reused next call

    def _current(self) -> _PushedContext:
        return _PushedContext(self._context_cuda)

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._context_cuda.push()
            try:
                if self.gpu_letterbox is not None:
                    self.gpu_letterbox.close()
                for allocation in self._device.values():
                    allocation.free()
                self._device.clear()
                self._host.clear()
                del self._context, self._engine, self._runtime, self._stream
            finally:
                self._context_cuda.pop()
                self._context_cuda.detach()


class _PushedContext:
    """Makes the engine's CUDA context current on the calling thread for a `with` block."""

    def __init__(self, context: Any) -> None:
        self._context = context

    def __enter__(self) -> None:
        self._context.push()

    def __exit__(self, *exc: object) -> None:
        self._context.pop()


def _set_flag(trt: Any, config: Any, name: str) -> None:
    flag = getattr(trt.BuilderFlag, name, None)
    if flag is None:
        raise EngineError(f"this TensorRT ({trt.__version__}) has no BuilderFlag.{name}; build with another precision")
    config.set_flag(flag)


def _trt_profile(builder: Any, shapes: ProfileShapes) -> Any:
    profile = builder.create_optimization_profile()
    profile.set_shape(shapes.input_name, shapes.min, shapes.opt, shapes.max)
    return profile
