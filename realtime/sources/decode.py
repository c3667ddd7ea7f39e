"""Where PyAV decodes video: NVDEC (FFmpeg's CUDA hwaccel) when the host has it, else the CPU.

`VIDSENTRY_DECODE=auto|cpu|cuda` chooses (default auto): auto takes NVDEC when PyAV has the
hardware-acceleration API, its FFmpeg was built with the CUDA hwdevice and the driver reports a
GPU, and says why not otherwise; cuda insists (a host without NVDEC is an error naming what is
missing); cpu never tries.

Frames still reach the pipeline as numpy arrays in host memory. PyAV >= 18 can keep decoded
frames on the GPU (`HWAccel(is_hw_owned=True)`, planes exported over DLPack as NV12), but every
stage after the source (detector batching, tracking, snapshots, WebRTC) takes RGB arrays, so
PyAV copies each NVDEC frame back (NV12, half the bytes of RGB) and the RGB conversion runs on the
CPU, only for the frames something looks at (`deferred_rgb`). What NVDEC saves is the decode
itself, the largest CPU cost of a 1080p H.264/HEVC stream.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import av
import av.error

from engines.cuda_probe import cuda_device_count
from pipelines.frames import DeferredImage
from realtime.errors import ServiceError

log = logging.getLogger(__name__)

DECODE_ENV = "VIDSENTRY_DECODE"
DECODE_MODES = ("auto", "cpu", "cuda")
# Errors that say the source itself is unreachable or bad: opening again on the CPU cannot help
# and would double the wait.
_SOURCE_ERRORS: tuple[type[BaseException], ...] = (
    av.error.ConnectionRefusedError,
    av.error.ExitError,
    av.error.TimeoutError,
    av.error.HTTPError,
    av.error.FileNotFoundError,
    av.error.PermissionError,
    av.error.InvalidDataError,
)


class DecodeUnavailable(ServiceError, RuntimeError):
    """`cuda` decode was asked for on a host that cannot do it."""


@dataclass(frozen=True, slots=True)
class DecoderChoice:
    device: Literal["cpu", "cuda"]
    reason: str

    def hwaccel(self) -> Any:
        """The `hwaccel=` argument for av.open (None for CPU decode)."""
        if self.device == "cpu":
            return None
        from av.codec.hwaccel import HWAccel

        # Software fallback: streams NVDEC cannot take (e.g. MJPEG, 4:4:4 H.264) still decode.
        return HWAccel(device_type="cuda", allow_software_fallback=True)


def decode_mode() -> str:
    mode = os.environ.get(DECODE_ENV, "auto").strip().lower() or "auto"
    if mode not in DECODE_MODES:
        raise ValueError(f"{DECODE_ENV}={mode!r} is not one of {', '.join(DECODE_MODES)}")
    return mode


def nvdec_status(
    hwdevices: Callable[[], list[str]] | None = None,
    gpus: Callable[[], tuple[int, str]] = cuda_device_count,
) -> tuple[bool, str]:
    """Whether PyAV can decode on an NVIDIA GPU here, and why not."""
    if hwdevices is None:
        try:
            from av.codec.hwaccel import hwdevices_available
        except ImportError:
            return False, f"PyAV {av.__version__} has no hardware decoding API (needs PyAV >= 14)"
        hwdevices = hwdevices_available
    if "cuda" not in hwdevices():
        return False, f"PyAV {av.__version__}'s FFmpeg was built without the CUDA hwdevice (NVDEC)"
    count, why = gpus()
    if count == 0:
        return False, f"FFmpeg has NVDEC support but {why}"
    return True, f"NVDEC through PyAV {av.__version__}'s FFmpeg; {why}"


def select_decoder(
    mode: str = "auto",
    *,
    status: Callable[[], tuple[bool, str]] = nvdec_status,
) -> DecoderChoice:
    if mode not in DECODE_MODES:
        raise ValueError(f"decode mode {mode!r} is not one of {', '.join(DECODE_MODES)}")
    if mode == "cpu":
        return DecoderChoice("cpu", f"{DECODE_ENV}=cpu")
    ok, why = status()
    if ok:
        return DecoderChoice("cuda", why)
    if mode == "cuda":
        raise DecodeUnavailable(f"{DECODE_ENV}=cuda but NVDEC cannot run here: {why}")
    return DecoderChoice("cpu", f"CPU decode: {why}")


def open_input(url: str, choice: DecoderChoice, **kwargs: Any) -> Any:
    """av.open for reading, on the chosen decoder; a CUDA device that fails to start falls back
    to the CPU (logged once per open) rather than failing the stream."""
    hwaccel = choice.hwaccel()
    if hwaccel is None:
        return av.open(url, mode="r", **kwargs)
    try:
        return av.open(url, mode="r", hwaccel=hwaccel, **kwargs)
    except _SOURCE_ERRORS:
        raise
    except av.error.FFmpegError as exc:
        log.warning("NVDEC could not start (%s); decoding on the CPU", exc.strerror or type(exc).__name__)
        return av.open(url, mode="r", **kwargs)


def deferred_rgb(frame: Any, width: int | None = None, height: int | None = None) -> DeferredImage:
    """A decoded PyAV video frame as a picture converted to RGB (scaled to width x height when
    given) on first use: the frames whose boxes the tracker predicts are never converted."""
    w, h = width or int(frame.width), height or int(frame.height)

    def convert() -> Any:
        return frame.to_ndarray(format="rgb24", width=w, height=h)

    return DeferredImage(w, h, convert)
