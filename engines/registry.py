"""Pick a runtime for a detector (`auto` = the fastest that can run here) and report what can run."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import logging
import os
from dataclasses import dataclass
from pathlib import Path

from engines.cuda_probe import cuda_device_count
from engines.detector import Detector, InferenceBackend, YoloDetector, check_settings
from engines.errors import EngineError, EngineUnavailable, ModelLoadError
from engines.model_info import read_model_info
from engines.models import ModelNotFound, default_detector_model, whisper_tiny_en_dir
from engines.types import ModelInfo

log = logging.getLogger(__name__)

BACKENDS = ("auto", "tensorrt", "onnx-cuda", "onnx-cpu")
# int8: ONNX Runtime static quantization, CPU only (engines.quantize). auto: int8 for the bundled
# people model when the detector runs on the CPU (measured: 2.8-3.2x faster, mAP50 0.996 against
# fp32; bench/bench_int8.py, bench/bench_realtime.py), fp32 for any other model or engine, and fp32
# when the int8 copy cannot be built.
PRECISIONS = ("auto", "fp32", "int8")


def create_detector(
    model_path: str | Path,
    backend: str = "auto",
    *,
    conf: float = 0.25,
    iou: float = 0.45,
    max_det: int = 300,
    threads: int | None = None,
    max_batch: int | None = None,
    fp16: bool = True,
    workers: int | None = None,
    precision: str = "fp32",
    calibration: str | Path | None = None,
) -> Detector:
    """Load an Ultralytics detect ONNX export on the requested runtime.

    `auto` tries TensorRT, then ONNX Runtime's CUDA EP, then CPU, skipping any that cannot run
    here. Naming a backend that cannot run raises EngineUnavailable saying what to install.
    `threads` sizes ONNX Runtime's CPU pool (default: all cores); `fp16` applies to TensorRT.
    `workers` is how many calls the CPU engine runs side by side, sharing `threads` (default:
    `default_cpu_workers`); GPU engines take one call at a time and batch instead.
    `precision="int8"` runs a statically quantized copy on the CPU (built once, calibrated on
    frames of `calibration`, default the sample clip; see engines.quantize).
    """
    if backend not in BACKENDS:
        raise ValueError(f"unknown detector backend {backend!r}; choose one of: {', '.join(BACKENDS)}")
    check_settings(conf=conf, iou=iou, max_det=max_det, max_batch=max_batch)
    if workers is not None and workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    if precision not in PRECISIONS:
        raise ValueError(f"unknown detector precision {precision!r}; choose one of: {', '.join(PRECISIONS)}")
    if precision == "int8" and backend not in ("auto", "onnx-cpu"):
        raise ValueError(f"precision int8 runs on onnx-cpu only for now, not on {backend}")
    info = read_model_info(model_path)  # a bad file fails here, before any runtime starts
    if precision == "auto":
        precision = "fp32"
        if auto_precision(model_path, backend) == "int8" and _int8_buildable(info.path, calibration):
            try:
                return _int8_detector(info, calibration, conf=conf, iou=iou, max_det=max_det, max_batch=max_batch,
                                      threads=threads, workers=workers)
            except (EngineUnavailable, ModelLoadError, ModelNotFound, OSError) as exc:
                log.warning("the INT8 copy of the people model cannot be had (%s): running it in FP32", exc)
    if precision == "int8":
        return _int8_detector(info, calibration, conf=conf, iou=iou, max_det=max_det, max_batch=max_batch,
                              threads=threads, workers=workers)
    candidates = _auto_order() if backend == "auto" else [backend]
    reasons: list[str] = []
    for name in candidates:
        try:
            runtime = _open_backend(name, info, threads=threads, max_batch=max_batch, fp16=fp16, workers=workers)
        except EngineUnavailable as exc:
            if backend != "auto":
                raise
            log.info("detector backend %s unavailable, trying the next: %s", name, exc)
            reasons.append(str(exc))
            continue
        return YoloDetector(runtime, info, conf=conf, iou=iou, max_det=max_det, max_batch=max_batch)
    raise EngineUnavailable("no detector backend can run here: " + "; ".join(reasons))


def _int8_detector(
    info: ModelInfo,
    calibration: str | Path | None,
    *,
    conf: float,
    iou: float,
    max_det: int,
    max_batch: int | None,
    threads: int | None,
    workers: int | None,
) -> Detector:
    from engines.onnx_backend import OnnxRuntimeBackend
    from engines.quantize import int8_model

    quantized = int8_model(info.path, calibration_video=calibration)
    runtime = OnnxRuntimeBackend(quantized, "cpu", threads=threads, sessions=workers or default_cpu_workers(threads))
    return YoloDetector(runtime, info, conf=conf, iou=iou, max_det=max_det, max_batch=max_batch)


# The quantizer's calibration holds one frame's activations at a time; a build of the people model
# peaks under 1 GB (docs/performance.md). Below this much free memory the service stays on FP32.
INT8_BUILD_BYTES = 2 * 1024**3


def _int8_buildable(model_path: str | Path, calibration: str | Path | None) -> bool:
    """Whether `precision: auto` may use the INT8 copy: it is cached, or there is memory to build it
    (a build that runs the machine out of memory would take the service down with it)."""
    from engines.quantize import DEFAULT_SETTINGS, cache_path, calibration_video_path

    try:
        if cache_path(Path(model_path), calibration_video_path(calibration), DEFAULT_SETTINGS).is_file():
            return True
    except (ModelNotFound, OSError):
        return True  # int8_model says what is wrong, and auto falls back to FP32
    available = available_memory()
    if available is not None and available < INT8_BUILD_BYTES:
        log.warning(
            "the INT8 copy of the people model is not built and building it needs about %d GB of memory "
            "(%d GB available): running it in FP32; build it on a larger machine or run deploy/setup.sh "
            "there and copy ~/.cache/vidsentry/int8",
            INT8_BUILD_BYTES // 1024**3, available // 1024**3,
        )
        return False
    return True


def available_memory() -> int | None:
    """Bytes of memory the kernel says can be had without swapping (Linux), else None."""
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        return None
    return None


def auto_precision(model_path: str | Path, backend: str = "auto") -> str:
    """What `precision: auto` means: int8 for the bundled people model on the CPU engine (where its
    agreement with fp32 was measured), fp32 for any other model (until its owner measures it with
    bench/bench_int8.py) and on a GPU."""
    if backend not in ("auto", "onnx-cpu"):
        return "fp32"
    try:
        bundled = Path(model_path).resolve() == default_detector_model().resolve()
    except ModelNotFound:
        return "fp32"
    on_cpu = backend == "onnx-cpu" or _auto_order() == ["onnx-cpu"]
    return "int8" if bundled and on_cpu else "fp32"


def _auto_order() -> list[str]:
    from engines.tensorrt.availability import tensorrt_available

    order = []
    if tensorrt_available()[0]:
        order.append("tensorrt")
    if _onnx_cuda_status()[0]:
        order.append("onnx-cuda")
    return [*order, "onnx-cpu"]


def default_cpu_workers(threads: int | None = None) -> int:
    """Two calls side by side on a CPU with two or more threads to give, else one.

    Measured on 2 cores (320n, one frame per call): one call on two threads 48 fps, two calls
    on one thread each 78 fps. Past two, frames in flight per stream (and latency) grow for
    little: bigger CPUs give each call more threads instead."""
    return 2 if (threads or os.cpu_count() or 1) >= 2 else 1


def _open_backend(
    name: str, info: ModelInfo, *, threads: int | None, max_batch: int | None, fp16: bool, workers: int | None = None
) -> InferenceBackend:
    if name == "tensorrt":
        from engines.tensorrt.backend import DEFAULT_MAX_BATCH, TensorRTBackend

        return TensorRTBackend(info.path, info, fp16=fp16, max_batch=max_batch or DEFAULT_MAX_BATCH)
    from engines.onnx_backend import OnnxRuntimeBackend

    if name == "onnx-cuda":
        return OnnxRuntimeBackend(info.path, "cuda", threads=threads)
    return OnnxRuntimeBackend(info.path, "cpu", threads=threads, sessions=workers or default_cpu_workers(threads))


# -- doctor ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class EngineCheck:
    name: str
    available: bool
    detail: str  # what was found, or why it cannot run and what to install


def doctor() -> list[EngineCheck]:
    """Which engines can run on this machine, and why not. Fast; never downloads anything."""
    from engines.tensorrt.availability import tensorrt_available

    checks = [EngineCheck("tensorrt", *tensorrt_available())]
    checks.append(EngineCheck("onnxruntime-cuda", *_onnx_cuda_status()))
    checks.append(EngineCheck("onnxruntime-cpu", *_onnx_cpu_status()))
    checks.append(EngineCheck("faster-whisper", *_whisper_status()))
    checks.append(EngineCheck("default-detector-model", *_default_model_status()))
    checks.append(EngineCheck("int8", *_int8_status()))
    return checks


def _int8_status() -> tuple[bool, str]:
    """The CPU's INT8 features and what the people model's INT8 build measured on it. INT8 is a
    speed-up, not a requirement: a copy that did not hold means FP32, not a failure."""
    from engines.int8_agreement import cpu_int8_features, has_vnni
    from engines.quantize import report

    features = cpu_int8_features()
    cpu = (f"CPU {', '.join(features) or 'without AVX2'}" +
           ("" if has_vnni(features) else " (no VNNI: u8 x s8 kernels may saturate; the build checks)"))
    try:
        built = report(default_detector_model())
    except ModelNotFound:
        built = None
    if built is None:
        return True, (f"{cpu}; the people model's INT8 copy is not built here yet (deploy/setup.sh or the first "
                      "start builds it and checks it against FP32)")
    if built.get("rejected"):
        return True, f"{cpu}; precision auto runs the people model in FP32: {built.get('reason', '')}"
    kept = (built.get("agreements") or [{}])[-1]
    measured = (f", recall {kept['recall']:.3f}, score drift {kept['drift']:.3f} against FP32"
                if "recall" in kept else "")
    return True, f"{cpu}; precision auto runs the people model in INT8 ({built.get('variant')}{measured})"


def _onnx_cpu_status() -> tuple[bool, str]:
    try:
        from engines.onnx_backend import CPU_EP, import_onnxruntime

        ort = import_onnxruntime()
    except EngineError as exc:
        return False, str(exc)
    if CPU_EP not in ort.get_available_providers():
        return False, f"onnxruntime {ort.__version__} has no {CPU_EP}"
    return True, f"onnxruntime {ort.__version__}, {os.cpu_count()} CPU cores"


def _onnx_cuda_status() -> tuple[bool, str]:
    try:
        from engines.onnx_backend import cuda_ep_available

        ok, why = cuda_ep_available()
    except EngineError as exc:
        return False, str(exc)
    if not ok:
        return False, why
    count, device_why = cuda_device_count()
    return count > 0, f"{why}; {device_why}"


def _whisper_status() -> tuple[bool, str]:
    for package in ("faster_whisper", "ctranslate2"):
        if importlib.util.find_spec(package) is None:
            return False, f"python package {package!r} is not installed: pip install faster-whisper"
    try:
        model_dir = whisper_tiny_en_dir()
    except ModelNotFound as exc:
        return False, str(exc)
    version = importlib.metadata.version("faster-whisper")
    return True, f"faster-whisper {version}; model tiny.en at {model_dir}"


def _default_model_status() -> tuple[bool, str]:
    try:
        path = default_detector_model()
    except ModelNotFound as exc:
        return False, str(exc)
    return True, str(path)
