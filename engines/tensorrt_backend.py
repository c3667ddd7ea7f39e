"""Kept for imports written before engines/tensorrt/ existed; the TensorRT code lives there."""

from engines.tensorrt.availability import INSTALL_HINT, tensorrt_available
from engines.tensorrt.backend import DEFAULT_MAX_BATCH, TensorRTBackend, TensorRTOptions
from engines.tensorrt.cache import DEFAULT_CACHE_DIR

__all__ = [
    "DEFAULT_CACHE_DIR",
    "DEFAULT_MAX_BATCH",
    "INSTALL_HINT",
    "TensorRTBackend",
    "TensorRTOptions",
    "tensorrt_available",
]
