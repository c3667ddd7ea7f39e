"""Can TensorRT run here? Answered without importing it (fast, for `auto` and `doctor`)."""

from __future__ import annotations

import importlib.util
from typing import Any

from engines.cuda_probe import cuda_device_count
from engines.errors import EngineUnavailable

INSTALL_HINT = "pip install 'tensorrt>=10' pycuda (needs an NVIDIA GPU and driver)"


def tensorrt_available() -> tuple[bool, str]:
    for package in ("tensorrt", "pycuda"):
        if importlib.util.find_spec(package) is None:
            return False, f"python package {package!r} is not installed: {INSTALL_HINT}"
    count, why = cuda_device_count()
    if count == 0:
        return False, why
    return True, f"tensorrt and pycuda installed; {why}"


def import_gpu_stack() -> tuple[Any, Any]:
    """(tensorrt, pycuda.driver), or EngineUnavailable saying what to install."""
    try:
        import tensorrt as trt
    except ImportError as exc:
        raise EngineUnavailable(f"tensorrt: cannot import the 'tensorrt' package ({exc}): {INSTALL_HINT}") from None
    try:
        import pycuda.driver as cuda
    except ImportError as exc:
        raise EngineUnavailable(f"tensorrt: cannot import 'pycuda' ({exc}): pip install pycuda") from None
    major = int(str(trt.__version__).split(".")[0])
    if major < 10:
        raise EngineUnavailable(f"tensorrt: version {trt.__version__} found, need >= 10: {INSTALL_HINT}")
    return trt, cuda
