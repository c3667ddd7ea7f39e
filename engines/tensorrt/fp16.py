"""FP16 for strongly typed TensorRT (11 and later), which takes each tensor's type from the model.

TensorRT 10 builds FP16 from an FP32 ONNX when asked (`BuilderFlag.FP16`); TensorRT 11 dropped
that flag and the INT8 calibrators: the ONNX itself must be FP16 (or carry Q/DQ nodes for INT8).
So for those versions an FP16 copy of the model is written once beside the engines, with its
inputs and outputs kept FP32 so the bindings and the letterbox kernel stay the same.
"""

from __future__ import annotations

import logging
import os
import tempfile
from pathlib import Path
from typing import Any

from engines.errors import EngineError
from engines.tensorrt.cache import file_sha256

log = logging.getLogger(__name__)


def is_strongly_typed(trt: Any) -> bool:
    """True for TensorRT releases without the precision builder flags (11 and later)."""
    return getattr(trt.BuilderFlag, "FP16", None) is None


def fp16_onnx(onnx_path: str | Path, cache_dir: str | Path) -> Path:
    """An FP16 copy of `onnx_path` (FP32 inputs and outputs), made once per model content."""
    source = Path(onnx_path)
    target = Path(cache_dir) / f"{source.stem}-{file_sha256(source)[:16]}.fp16.onnx"
    if target.is_file():
        return target
    import onnx

    try:
        from onnxruntime.transformers.float16 import convert_float_to_float16
    except ImportError as exc:
        raise EngineError(
            f"FP16 conversion needs onnxruntime's transformers tools ({exc}): pip install onnxruntime"
        ) from None
    model = onnx.load(str(source))
    # Its default block list keeps index and range ops (TopK, Range, Upsample, ...) in FP32.
    half = convert_float_to_float16(model, keep_io_types=True)
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=target.parent, suffix=".tmp", delete=False) as tmp:
        tmp.write(half.SerializeToString())
    os.replace(tmp.name, target)
    log.info("FP16 copy of %s written to %s", source, target)
    return target
