"""`vidsentry doctor --parity`: the chosen engine against ONNX Runtime on the CPU, same frames.

Decodes the first `--frames` frames of a file (the sample clip by default), runs each engine on
them one frame at a time (after one warm-up call, so engine start and kernel tuning are not
timed), matches the boxes (engines/parity.py) and prints what matched, the score differences,
the time per frame of each engine and a verdict. Exit 0 when they agree, 1 when they do not or
no GPU engine can run here, 2 for bad usage.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from engines.detector import Detector
from engines.errors import EngineUnavailable, ModelLoadError
from engines.models import ModelNotFound, default_detector_model
from engines.parity import ParityReport, compare
from engines.registry import create_detector, doctor
from engines.types import Detections
from realtime.cli.errors import EXIT_OK, EXIT_RUNTIME, EXIT_USAGE, CommandError
from realtime.sources.decode import DecodeUnavailable, decode_mode, open_input, select_decoder

SAMPLE_CLIP = Path(__file__).resolve().parents[2] / ".cache" / "samples" / "vtest_speech.mp4"
DEFAULT_FRAMES = 50
MAX_FRAMES = 2000  # decoded frames are held in memory for both engines
GPU_BACKENDS = ("tensorrt", "onnx-cuda")
_CHECK_NAMES = {"tensorrt": "tensorrt", "onnx-cuda": "onnxruntime-cuda"}
GPU_INSTALL = (
    "install TensorRT (pip install 'tensorrt>=10' pycuda) or ONNX Runtime for CUDA "
    "(pip uninstall onnxruntime && pip install onnxruntime-gpu) on a host with an NVIDIA GPU and driver"
)


def parity_command(args: argparse.Namespace) -> int:
    file, model, reference_model, frames_wanted = _inputs(args)
    backend = args.backend or _best_gpu_backend()
    if backend is None:
        return _no_gpu(args.json)
    frames = _decode(file, frames_wanted)
    reference = _open(reference_model, "onnx-cpu", args, file)
    try:
        candidate = _open(model, backend, args, file)
        try:
            ref_dets, ref_ms = _run(reference, frames)
            cand_dets, cand_ms = _run(candidate, frames)
        finally:
            candidate.close()
    finally:
        reference.close()
    report = compare(
        ref_dets, cand_dets,
        reference_name=_name(reference, reference_model, None),
        candidate_name=_name(candidate, model, args.precision if backend == "tensorrt" else None),
        reference_ms=ref_ms, candidate_ms=cand_ms,
    )
    _print(report, file, args.json)
    return EXIT_OK if report.agree else EXIT_RUNTIME


def _inputs(args: argparse.Namespace) -> tuple[Path, Path, Path, int]:
    file = Path(args.file) if args.file else SAMPLE_CLIP
    if not file.is_file():
        hint = " (build the sample clip with `python samples/make_sample.py`, or pass --file)" if not args.file else ""
        raise CommandError(f"{file}: no such video file{hint}", EXIT_USAGE)
    if not 1 <= args.frames <= MAX_FRAMES:
        raise CommandError(f"--frames must be between 1 and {MAX_FRAMES}, got {args.frames}", EXIT_USAGE)
    if not 0.0 <= args.conf <= 1.0:
        raise CommandError(f"--conf must be in [0, 1], got {args.conf}", EXIT_USAGE)
    try:
        model = Path(args.model) if args.model else default_detector_model()
    except ModelNotFound as exc:
        raise CommandError(str(exc), EXIT_RUNTIME) from None
    reference = Path(args.reference_model) if args.reference_model else model
    return file, model, reference, args.frames


def _best_gpu_backend() -> str | None:
    available = {check.name for check in doctor() if check.available}
    return next((name for name in GPU_BACKENDS if _CHECK_NAMES[name] in available), None)


def _no_gpu(as_json: bool) -> int:
    checks = {check.name: check.detail for check in doctor() if check.name in _CHECK_NAMES.values()}
    if as_json:
        print(json.dumps({"agree": None, "error": "no GPU engine can run on this machine", "engines": checks,
                          "install": GPU_INSTALL}))
        return EXIT_RUNTIME
    print("parity: no GPU engine can run on this machine, so there is nothing to compare with the CPU engine")
    for name, detail in checks.items():
        print(f"  {name}: {detail}")
    print(f"to check a GPU: {GPU_INSTALL}")
    print("to check the comparison itself here: vidsentry doctor --parity --backend onnx-cpu")
    return EXIT_RUNTIME


def _decode(file: Path, count: int) -> list[np.ndarray]:
    try:
        choice = select_decoder(decode_mode())
    except (ValueError, DecodeUnavailable) as exc:
        raise CommandError(str(exc), EXIT_USAGE) from None
    frames: list[np.ndarray] = []
    import av.error

    try:
        with open_input(str(file), choice) as container:
            if not container.streams.video:
                raise CommandError(f"{file}: has no video stream", EXIT_USAGE)
            for frame in container.decode(video=0):
                frames.append(frame.to_ndarray(format="rgb24"))
                if len(frames) >= count:
                    break
    except av.error.FFmpegError as exc:
        raise CommandError(f"{file}: cannot decode it ({exc.strerror or type(exc).__name__})", EXIT_USAGE) from None
    if not frames:
        raise CommandError(f"{file}: no decodable video frames", EXIT_USAGE)
    return frames


def _open(model: Path, backend: str, args: argparse.Namespace, file: Path) -> Detector:
    try:
        if backend == "tensorrt":
            from engines.tensorrt.backend import TensorRTOptions
            from engines.tensorrt.detector import open_tensorrt_detector

            options = TensorRTOptions(
                precision=args.precision,
                calibration_cache=Path(args.calibration_cache) if args.calibration_cache else None,
                calibration_video=file,
            )
            return open_tensorrt_detector(model, options, conf=args.conf)
        return create_detector(model, backend, conf=args.conf)
    except ModelLoadError as exc:
        raise CommandError(str(exc), EXIT_USAGE) from None
    except EngineUnavailable as exc:
        raise CommandError(f"{exc} (doctor --parity --backend {backend} cannot run here)", EXIT_USAGE) from None


def _run(detector: Detector, frames: Sequence[np.ndarray]) -> tuple[list[Detections], float]:
    """Detections per frame and the mean wall time per frame (ms), one frame per call."""
    detector.detect([frames[0]])  # warm-up: first-call allocations and kernel selection
    results: list[Detections] = []
    started = time.perf_counter()
    for frame in frames:
        results.extend(detector.detect([frame]))
    return results, (time.perf_counter() - started) * 1000 / len(frames)


def _name(detector: Detector, model: Path, precision: str | None) -> str:
    engine = f"{detector.backend} ({precision})" if precision else detector.backend
    return f"{engine}, {model.name}"


def _print(report: ParityReport, file: Path, as_json: bool) -> None:
    if as_json:
        print(json.dumps({**report.to_json(), "file": str(file)}))
        return
    speed = report.reference_ms / report.candidate_ms if report.candidate_ms > 0 else float("inf")
    print(f"parity: {report.candidate} against {report.reference} on {report.frames} frames of {file.name}")
    print(f"boxes: {report.matched} matched (same class, IoU >= 0.5), {report.only_reference} only in the "
          f"reference, {report.only_candidate} only in the candidate")
    if report.matched:
        print(f"IoU of matched boxes: mean {report.iou_mean:.3f}, min {report.iou_min:.3f}")
        print(f"score difference: mean {report.score_diff_mean:.4f}, max {report.score_diff_max:.4f}")
    print(f"time per frame: candidate {report.candidate_ms:.1f} ms, reference {report.reference_ms:.1f} ms "
          f"({speed:.1f}x)")
    print(f"verdict: {report.verdict()}")
