"""Read and validate what an Ultralytics YOLO detect (or segment) ONNX export says about itself.

Every backend starts here, so a bad file fails the same way (ModelLoadError naming the file and
the problem) whether it would later run on ONNX Runtime or TensorRT.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from engines.errors import ModelLoadError
from engines.types import ModelInfo

DEFAULT_IMGSZ = 640
_KNOWN_KEYS = {"names", "imgsz", "stride", "task", "batch"}
_EXPORT_HINT = "export a detect model with `yolo export format=onnx nms=False`"
TASKS = ("detect", "segment")  # a segment export detects too: its mask coefficients are extra channels


def read_model_info(model_path: str | Path) -> ModelInfo:
    """Parse `model_path` and return its ModelInfo, or raise ModelLoadError."""
    path = Path(model_path)
    model = _load_onnx(path)

    def fail(problem: str) -> ModelLoadError:
        return ModelLoadError(f"{path}: {problem}")

    meta = {p.key: p.value for p in model.metadata_props}
    task = meta.get("task", "detect")
    if task not in TASKS:
        raise fail(f"is a YOLO {task!r} export; only 'detect' and 'segment' models are supported ({_EXPORT_HINT})")
    if "names" not in meta:
        raise fail(f"has no 'names' metadata, so it is not an Ultralytics YOLO export ({_EXPORT_HINT})")
    names = _parse_names(meta["names"], fail)
    args = _literal(meta.get("args", "{}"), {})
    if isinstance(args, Mapping) and args.get("nms") is True:
        raise fail(f"was exported with nms=True (end-to-end output), which is not supported ({_EXPORT_HINT})")

    initializers = {init.name for init in model.graph.initializer}
    inputs = [i for i in model.graph.input if i.name not in initializers]
    if len(inputs) != 1:
        raise fail(f"has {len(inputs)} inputs; a YOLO export has exactly one image input")
    in_shape = _dims(inputs[0])
    if len(in_shape) != 4 or in_shape[1] not in (3, None):
        raise fail(f"input {inputs[0].name!r} has shape {_fmt(in_shape)}, expected [batch, 3, height, width]")
    if not model.graph.output:
        raise fail("has no outputs")
    output = model.graph.output[0]
    out_shape = _dims(output)
    mask_channels, protos_name = _protos(model.graph.output, task, fail)
    channels = 4 + len(names) + mask_channels
    if len(out_shape) != 3 or out_shape[1] not in (channels, None):
        masks = f" + {mask_channels} mask coefficients" if mask_channels else ""
        raise fail(
            f"output {output.name!r} has shape {_fmt(out_shape)}, expected [batch, {channels}, anchors] "
            f"(4 box values + {len(names)} class scores{masks}; YOLOv5-style or end-to-end exports are not supported)"
        )

    height, width = in_shape[2], in_shape[3]
    dynamic_hw = height is None or width is None
    if dynamic_hw:
        height, width = _parse_imgsz(meta.get("imgsz"), fail)
    assert height is not None and width is not None
    try:
        stride = int(meta.get("stride", "32"))
    except ValueError:
        raise fail(f"metadata 'stride' is not an integer: {meta['stride']!r}") from None

    return ModelInfo(
        path=str(path),
        names=names,
        imgsz=(height, width),
        stride=stride,
        fixed_batch=in_shape[0],
        dynamic_hw=dynamic_hw,
        task=task,
        extra={k: v for k, v in meta.items() if k not in _KNOWN_KEYS},
        input_name=inputs[0].name,
        output_name=output.name,
        mask_channels=mask_channels,
        protos_name=protos_name,
    )


def _protos(outputs: Any, task: str, fail: Any) -> tuple[int, str | None]:
    """(mask coefficients per box, name of the prototype output) of a segment export; (0, None) else."""
    if task != "segment":
        return 0, None
    if len(outputs) < 2:
        raise fail("is a 'segment' export but has no second output (the prototype masks, [batch, 32, H/4, W/4])")
    protos = outputs[1]
    shape = _dims(protos)
    if len(shape) != 4 or shape[1] is None:
        raise fail(f"prototype output {protos.name!r} has shape {_fmt(shape)}, expected [batch, masks, height, width]")
    return int(shape[1]), protos.name


def _load_onnx(path: Path) -> Any:
    if not path.exists():
        raise ModelLoadError(f"{path}: no such model file")
    if not path.is_file():
        raise ModelLoadError(f"{path}: is not a file (expected an .onnx model)")
    import onnx
    from google.protobuf.message import DecodeError

    try:
        # External weights are not needed to read the graph signature and metadata.
        model = onnx.load(str(path), load_external_data=False)
    except (DecodeError, OSError, ValueError) as exc:
        raise ModelLoadError(f"{path}: is not an ONNX model ({exc})") from None
    # Protobuf happily parses some non-ONNX bytes (or an empty file) into an empty message.
    if model.ir_version == 0 or not model.graph.node:
        raise ModelLoadError(f"{path}: is not an ONNX model (no graph)")
    return model


def _parse_names(raw: str, fail: Any) -> dict[int, str]:
    value = _literal(raw, None)
    if isinstance(value, list | tuple):
        value = dict(enumerate(value))
    if not isinstance(value, Mapping) or not value:
        raise fail(f"metadata 'names' is not a non-empty dict of class names: {raw[:80]!r}")
    try:
        names = {int(k): str(v) for k, v in value.items()}
    except (TypeError, ValueError):
        raise fail(f"metadata 'names' keys are not class indices: {raw[:80]!r}") from None
    if sorted(names) != list(range(len(names))):
        raise fail(f"metadata 'names' keys are not 0..{len(names) - 1}: {sorted(names)[:10]}")
    return names


def _parse_imgsz(raw: str | None, fail: Any) -> tuple[int, int]:
    if raw is None:
        return DEFAULT_IMGSZ, DEFAULT_IMGSZ
    value = _literal(raw, None)
    if isinstance(value, int):
        value = [value, value]
    if not isinstance(value, list | tuple) or len(value) != 2 or not all(isinstance(v, int) and v > 0 for v in value):
        raise fail(f"metadata 'imgsz' is not [height, width]: {raw!r}")
    return int(value[0]), int(value[1])


def _literal(raw: str, default: Any) -> Any:
    # Metadata is untrusted text: literal_eval only, never eval.
    try:
        return ast.literal_eval(raw)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return default


def _dims(value_info: Any) -> list[int | None]:
    """Static dims as ints, symbolic or unknown dims as None."""
    dims = value_info.type.tensor_type.shape.dim
    return [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else None for d in dims]


def _fmt(shape: list[int | None]) -> str:
    return "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]"
