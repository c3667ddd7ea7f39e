"""INT8 on CPU: ONNX Runtime static quantization (QDQ) of a YOLO detect export, cached on disk.

Weights are quantized to int8 per output channel, activations to uint8 with ranges calibrated
(99.999th percentile) on frames of a video letterboxed exactly as the detector feeds the model, a
frame at a time with the histograms merged as they come (all at once, the calibration held every
activation of every frame: 15 GB for the 640 px people model);
ONNX Runtime's CPU EP fuses the Q/DQ pairs into integer kernels (QLinearConv, QLinearSigmoid...).
The box-decode tail of the detect head (DFL softmax, anchor arithmetic, the final concats) stays
in float: one scale cannot hold pixel coordinates and class scores at once (quantized, every
score rounds to zero: mAP50 0 against FP32), and it costs next to nothing. The result is cached under
~/.cache/vidsentry/int8, keyed by the source model, the calibration clip, the settings and the
onnxruntime version, so it is built once (a progress line says so) and reused after.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import logging
import os
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Literal

import numpy as np
from onnxruntime.quantization import CalibrationDataReader

from engines.detector import PAD_VALUE, Letterbox, letterbox_image
from engines.errors import EngineUnavailable, ModelLoadError
from engines.int8_agreement import Reference, cpu_int8_features
from engines.model_info import read_model_info
from engines.models import ModelNotFound

log = logging.getLogger(__name__)

DEFAULT_CACHE_DIR = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "vidsentry" / "int8"
# The sample clip deploy/setup.sh builds (samples/make_sample.py); users may calibrate on their own.
SAMPLE_VIDEO = Path(__file__).resolve().parents[1] / ".cache" / "samples" / "vtest.avi"
FORMAT_VERSION = 1  # bump when the way a model is quantized changes, so old cache entries go stale
MAX_CACHED = 8  # quantized models kept; the least recently used go first (a few 3-45 MB files)
Calibration = Literal["minmax", "entropy", "percentile"]
HeadPolicy = Literal["quantize", "keep-decode", "keep-outputs"]
Activations = Literal["uint8", "int8"]
Weights = Literal["int8", "uint8"]
Ops = Literal["all", "conv"]


@dataclass(frozen=True, slots=True)
class QuantizeSettings:
    """How a model is quantized; every field is part of the cache key."""

    calibration: Calibration = "percentile"
    frames: int = 32  # calibration frames, spread evenly over the clip
    per_channel: bool = True
    # "keep-decode": the head's box decode stays float; "keep-outputs": the last convs too.
    head: HeadPolicy = "keep-decode"
    percentile: float = 99.999  # only for calibration="percentile"
    # uint8 activations with int8 weights (U8S8): ONNX Runtime's CPU EP fuses those Q/DQ pairs into
    # QLinearConv and friends; with int8 activations it left them unfused here (DQ -> float Conv
    # -> Q), slower than FP32 (320n, 1 thread: 46 ms vs 26 ms FP32 vs 15 ms U8S8).
    activations: Activations = "uint8"
    ops: Ops = "all"  # "conv": only convolutions, SiLU and concat stay float
    # Frames whose activations are held at once while calibrating: the histogram calibrators keep
    # every activation of every frame they are given (hundreds of MB a frame for a 640 model), so
    # they get this many at a time and merge histograms as they go.
    batch: int = 1
    # Where the CPU has no VNNI, ONNX Runtime's u8 x s8 kernels can saturate a 16-bit intermediate:
    # 7-bit weights (reduce_range) or uint8 weights avoid it. The build tries these when the
    # copy disagrees with FP32 on this CPU (engines.int8_agreement).
    reduce_range: bool = False
    weights: Weights = "int8"

    def __post_init__(self) -> None:
        if self.calibration not in ("minmax", "entropy", "percentile"):
            raise ValueError(f"calibration must be minmax, entropy or percentile, got {self.calibration!r}")
        if self.head not in ("quantize", "keep-decode", "keep-outputs"):
            raise ValueError(f"head must be quantize, keep-decode or keep-outputs, got {self.head!r}")
        if not 1 <= self.frames <= 10_000:
            raise ValueError(f"calibration frames must be in [1, 10000], got {self.frames}")
        if self.weights not in ("int8", "uint8"):
            raise ValueError(f"weights must be int8 or uint8, got {self.weights!r}")
        if self.activations not in ("uint8", "int8"):
            raise ValueError(f"activations must be uint8 or int8, got {self.activations!r}")
        if self.ops not in ("all", "conv"):
            raise ValueError(f"ops must be all or conv, got {self.ops!r}")
        if not 1 <= self.batch <= 64:
            raise ValueError(f"calibration batch must be in [1, 64], got {self.batch}")
        if not 90.0 <= self.percentile <= 100.0:
            raise ValueError(f"percentile must be in [90, 100], got {self.percentile}")


DEFAULT_SETTINGS = QuantizeSettings()


def calibration_video_path(calibration_video: str | Path | None) -> Path:
    """The clip to calibrate on: the one given, else the sample clip."""
    return Path(calibration_video) if calibration_video is not None else default_calibration_video()


def default_calibration_video() -> Path:
    if not SAMPLE_VIDEO.is_file():
        raise ModelNotFound(
            f"{SAMPLE_VIDEO} is missing: run samples/make_sample.py, or give a video of your own scenes "
            "to calibrate INT8 on (detector.calibration)"
        )
    return SAMPLE_VIDEO


class Int8Disagrees(EngineUnavailable):
    """No INT8 copy found FP32's boxes on this CPU; `agreements` says how each variant did."""

    def __init__(self, message: str, agreements: list[dict[str, Any]]) -> None:
        super().__init__(message)
        self.agreements = agreements


def variants(settings: QuantizeSettings) -> list[QuantizeSettings]:
    """What a build tries, in order: the settings asked for, then the two remedies for CPUs whose
    integer kernels saturate (7-bit weights, then uint8 weights)."""
    tried = [settings, replace(settings, reduce_range=True), replace(settings, weights="uint8", reduce_range=False)]
    return list(dict.fromkeys(tried))


def int8_model(
    model_path: str | Path,
    *,
    calibration_video: str | Path | None = None,
    settings: QuantizeSettings | None = None,
    cache_dir: str | Path | None = None,
    check: bool = True,
) -> Path:
    """The statically quantized (QDQ) copy of `model_path`, built on first use and cached.

    `check`: the build measures each variant against FP32 on the calibration frames, on this CPU
    (engines.int8_agreement), keeps the first that holds and writes what it measured beside the
    model (`report`). When none holds it raises Int8Disagrees, and remembers that (a later call
    raises at once) until the cache entry is removed."""
    settings = settings or DEFAULT_SETTINGS
    source = Path(model_path)
    video = calibration_video_path(calibration_video)
    if not video.is_file():
        raise ModelNotFound(f"{video}: no such calibration video")
    entry = cache_path(source, video, settings, cache_dir)
    if entry.is_file():
        log.debug("int8 model from the cache: %s", entry)
        with contextlib.suppress(OSError):  # a read-only cache still serves
            entry.touch()  # recently used: pruning takes the others first
        return entry
    if check and (refused := _read_json(rejected_path(entry))) is not None:
        raise Int8Disagrees(str(refused.get("reason", "INT8 disagreed with FP32 on this CPU")),
                            list(refused.get("agreements", [])))
    read_model_info(source)  # a bad model fails before any frame is decoded
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        workspace = tempfile.TemporaryDirectory(dir=entry.parent, prefix=".build-")
    except OSError as exc:
        raise EngineUnavailable(
            f"cannot write the INT8 model cache at {entry.parent} ({exc.strerror}): set XDG_CACHE_HOME"
        ) from None
    started = time.monotonic()
    log.warning(
        "building the INT8 model of %s (%d calibration frames of %s, %s); once, cached at %s",
        source.name, settings.frames, video.name, settings.calibration, entry,
    )
    measured: list[dict[str, Any]] = []
    with workspace as tmp:
        frames = spread_frames(video, settings.frames)
        if not frames:
            raise ModelNotFound(f"{video}: no video frames to calibrate on")
        reference = Reference(source, frames) if check else None
        for variant in variants(settings) if check else [settings]:
            built = Path(tmp) / "model.onnx"
            try:
                quantize(source, built, frames, variant)
            except Exception as exc:  # the quantizer's passes raise whatever they raise
                raise ModelLoadError(f"{source}: cannot quantize it: {exc}".splitlines()[0]) from exc
            agreement = reference.measure(built) if reference is not None else None
            if agreement is not None:
                measured.append({"variant": _variant_name(variant), **agreement.as_dict()})
                log.warning("INT8 %s against FP32 on this CPU: %s", _variant_name(variant), agreement.describe())
                if not agreement.holds:
                    continue
            _write_json(report_path(entry), {"variant": _variant_name(variant), "settings": asdict(variant),
                                             "cpu": list(cpu_int8_features()), "agreements": measured})
            os.replace(built, entry)  # atomic: a reader never sees half a file
            break
        else:
            reason = (f"no INT8 copy of {source.name} finds FP32's boxes on this CPU (features: "
                      f"{', '.join(cpu_int8_features()) or 'unknown'}): " + "; ".join(
                          f"{m['variant']} recall {m['recall']:.3f}" for m in measured))
            _write_json(rejected_path(entry), {"reason": reason, "agreements": measured})
            prune(entry.parent, keep=MAX_CACHED)
            raise Int8Disagrees(reason, measured)
    prune(entry.parent, keep=MAX_CACHED)
    log.warning("INT8 model of %s built in %.0f s: %s", source.name, time.monotonic() - started, entry)
    return entry


def _variant_name(settings: QuantizeSettings) -> str:
    kind = "u8u8" if settings.weights == "uint8" else "u8s8" if settings.activations == "uint8" else "s8s8"
    return kind + (", 7-bit weights" if settings.reduce_range else "")


def report_path(entry: Path) -> Path:
    """What the build measured, beside the model it kept."""
    return entry.with_suffix(".json")


def rejected_path(entry: Path) -> Path:
    return entry.with_suffix(".rejected.json")


def report(model_path: str | Path, calibration_video: str | Path | None = None,
           settings: QuantizeSettings | None = None, cache_dir: str | Path | None = None) -> dict[str, Any] | None:
    """What the build of this model's INT8 copy measured on this CPU ({"rejected": True, ...} when
    no variant held); None when it has not been built here."""
    try:
        entry = cache_path(Path(model_path), calibration_video_path(calibration_video), settings or DEFAULT_SETTINGS,
                           cache_dir)
    except (ModelNotFound, OSError):
        return None
    if (refused := _read_json(rejected_path(entry))) is not None:
        return {"rejected": True, **refused}
    return _read_json(report_path(entry)) if entry.is_file() else None


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def _write_json(path: Path, value: dict[str, Any]) -> None:
    with contextlib.suppress(OSError):  # the model still serves without its report
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(value, indent=1))
        os.replace(tmp, path)


def prune(cache_dir: Path, keep: int) -> list[Path]:
    """Delete all but the `keep` most recently used entries in `cache_dir` (models with their
    reports, and refusals: a build that held on no variant); returns those deleted."""
    entries = sorted([*cache_dir.glob("*-int8-*.onnx"), *cache_dir.glob("*-int8-*.rejected.json")],
                     key=lambda p: p.stat().st_mtime_ns, reverse=True)
    removed = []
    for old in entries[keep:]:
        old.unlink(missing_ok=True)
        if old.suffix == ".onnx":
            report_path(old).unlink(missing_ok=True)
        removed.append(old)
    return removed


def cache_path(source: Path, video: Path, settings: QuantizeSettings, cache_dir: str | Path | None = None) -> Path:
    import onnxruntime

    key = {
        "model": file_sha256(source),
        "calibration_video": file_sha256(video),
        "settings": asdict(settings),
        "onnxruntime": onnxruntime.__version__,
        "format": FORMAT_VERSION,
        "cpu": list(cpu_int8_features()),  # a copy checked on one CPU is not taken for another
    }
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:20]
    return Path(cache_dir or DEFAULT_CACHE_DIR) / f"{source.stem}-int8-{digest}.onnx"


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def spread_frames(video: Path, count: int) -> list[np.ndarray]:
    """`count` RGB frames taken at an even stride over the whole clip (every frame if shorter)."""
    import av

    with av.open(str(video)) as container:
        total = container.streams.video[0].frames or 0
        stride = max(1, total // count) if total else 1
        frames: list[np.ndarray] = []
        for index, frame in enumerate(container.decode(video=0)):
            if index % stride == 0:
                frames.append(frame.to_ndarray(format="rgb24"))
                if len(frames) >= count:
                    break
    return frames


def letterbox_tensor(image: np.ndarray, imgsz: tuple[int, int]) -> np.ndarray:
    """(1, 3, H, W) float32, the same bytes YoloDetector.preprocess feeds the model."""
    canvas = np.full((*imgsz, 3), PAD_VALUE, np.uint8)
    letterbox_image(image, Letterbox.fit(image.shape[:2], imgsz), canvas)
    return canvas.transpose(2, 0, 1)[None].astype(np.float32) * np.float32(1 / 255)


class CalibrationFrames(CalibrationDataReader):
    """The CalibrationDataReader protocol over video frames, letterboxed as they are read, in
    ranges (`set_range`) so the quantizer can calibrate a few frames at a time."""

    def __init__(self, input_name: str, frames: Sequence[np.ndarray], imgsz: tuple[int, int]) -> None:
        self._input_name = input_name
        self._frames = frames
        self._imgsz = imgsz
        self._range = range(len(frames))
        self._it: Iterator[int] = iter(self._range)

    def __len__(self) -> int:
        return len(self._frames)

    def get_next(self) -> dict[str, np.ndarray] | None:
        index = next(self._it, None)
        return None if index is None else {self._input_name: letterbox_tensor(self._frames[index], self._imgsz)}

    def rewind(self) -> None:
        self._it = iter(self._range)

    def set_range(self, start_index: int, end_index: int) -> None:
        self._range = range(start_index, min(end_index, len(self._frames)))
        self._it = iter(self._range)


def quantize(source: Path, target: Path, frames: Sequence[np.ndarray], settings: QuantizeSettings) -> None:
    """Quantize `source` into `target` (QDQ, int8 weights per channel, activations as `settings` say)."""
    import onnx
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    work = target.parent
    model = onnx.load(str(source))
    info = read_model_info(source)
    float_copy, prepared = work / "float32.onnx", work / "prepared.onnx"
    if not prepared.is_file():  # the variants of one build share its workspace: prepared once
        if has_float16(model):
            model = to_float32(model)
        onnx.save(model, str(float_copy))  # the pre-processor mishandles in-memory models (external data)
        # Fold and fuse first (conv+bias, constant shapes) so quantization sees the graph ORT runs.
        # Symbolic shape inference needs sympy; ONNX's own inference covers these exports.
        quant_pre_process(str(float_copy), str(prepared), skip_symbolic_shape=True)
    method = {
        "minmax": CalibrationMethod.MinMax,
        "entropy": CalibrationMethod.Entropy,
        "percentile": CalibrationMethod.Percentile,
    }[settings.calibration]
    # Frames in batches (ORT's "strided" calibration): the histogram calibrators merge each batch's
    # histograms into the last, so memory holds one batch's activations, not every frame's. The
    # quantizer wants the frame count to divide evenly; the last few frames go if it does not.
    stride = min(settings.batch, len(frames))
    frames = list(frames[: len(frames) - len(frames) % stride])
    # The first batch sets each histogram's bin width, and later batches add bins of that width up
    # to their maximum: a first frame with little in it (a black start, a camera warming up) would
    # make the bins tiny and their number huge. The frame with the most contrast goes first.
    richest = max(range(len(frames)), key=lambda i: float(frames[i][::4, ::4].std()))
    frames.insert(0, frames.pop(richest))
    reader = CalibrationFrames(info.input_name, frames, info.imgsz)
    extra: dict[str, Any] = {"CalibMovingAverage": False, "CalibStridedMinMax": stride}
    if settings.calibration == "percentile":
        extra["CalibPercentile"] = settings.percentile
    chatter = io.StringIO()  # the calibrators print their progress; stdout belongs to the CLI
    with contextlib.redirect_stdout(chatter):
        quantize_static(
            str(prepared),
            str(target),
            reader,
            quant_format=QuantFormat.QDQ,
            per_channel=settings.per_channel,
            activation_type=QuantType.QUInt8 if settings.activations == "uint8" else QuantType.QInt8,
            weight_type=QuantType.QUInt8 if settings.weights == "uint8" else QuantType.QInt8,
            reduce_range=settings.reduce_range,
            op_types_to_quantize=["Conv"] if settings.ops == "conv" else None,
            nodes_to_exclude=head_nodes(onnx.load(str(prepared)), settings.head),
            calibrate_method=method,
            extra_options=extra,
        )
    log.debug("quantizer output: %s", chatter.getvalue().strip())
    _copy_metadata(model, target)


def head_nodes(model: Any, policy: HeadPolicy) -> list[str]:
    """Names of the detect head's nodes to keep in float under `policy`.

    The head is the module that produces the first output (`/model.22/...` in an Ultralytics
    export); its `cv2`/`cv3` branches are the box and class convs, the rest is the decode.
    """
    if policy == "quantize":
        return []
    producer = next((n for n in model.graph.node if model.graph.output[0].name in n.output), None)
    if producer is None or producer.name.count("/") < 2:
        return []
    prefix = "/" + producer.name.split("/")[1] + "/"
    keep: list[str] = []
    for node in model.graph.node:
        if not node.name.startswith(prefix):
            continue
        branch = node.name[len(prefix) :]
        in_branch = branch.startswith("cv")
        if not in_branch:
            keep.append(node.name)
        elif policy == "keep-outputs" and node.op_type == "Conv" and branch.count("/") == 2:
            keep.append(node.name)  # `/model.22/cv2.0/cv2.0.2/Conv`: the branch's last, bare conv
    return keep


def has_float16(model: Any) -> bool:
    from onnx import TensorProto

    return any(init.data_type == TensorProto.FLOAT16 for init in model.graph.initializer)


def to_float32(model: Any) -> Any:
    """A half-precision export as float32: weights, constants, casts and typed values."""
    from onnx import TensorProto, numpy_helper

    graph = model.graph
    for index, init in enumerate(graph.initializer):
        if init.data_type == TensorProto.FLOAT16:
            as_float = numpy_helper.to_array(init).astype(np.float32)
            graph.initializer[index].CopyFrom(numpy_helper.from_array(as_float, init.name))
    for node in graph.node:
        for attr in node.attribute:
            if node.op_type == "Cast" and attr.name == "to" and attr.i == TensorProto.FLOAT16:
                attr.i = TensorProto.FLOAT
            elif attr.t and attr.t.data_type == TensorProto.FLOAT16:
                attr.t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(attr.t).astype(np.float32), attr.t.name))
    for value in (*graph.input, *graph.output, *graph.value_info):
        if value.type.tensor_type.elem_type == TensorProto.FLOAT16:
            value.type.tensor_type.elem_type = TensorProto.FLOAT
    return model


def _copy_metadata(source: Any, target: Path) -> None:
    """Keep the Ultralytics metadata (names, imgsz, stride) so the quantized file reads the same."""
    import onnx

    model = onnx.load(str(target))
    have = {p.key for p in model.metadata_props}
    for prop in source.metadata_props:
        if prop.key not in have:
            model.metadata_props.add(key=prop.key, value=prop.value)
    model.metadata_props.add(key="vidsentry_quantized", value="int8-qdq")
    onnx.save(model, str(target))
