"""Does an INT8 copy find the boxes its FP32 original finds, on this CPU?

Static INT8 is not the same arithmetic everywhere. With uint8 activations and int8 weights, x86
CPUs with VNNI multiply-accumulate in 32 bits, while those with AVX2 or AVX-512 but no VNNI go
through an instruction (vpmaddubsw) whose 16-bit intermediate saturates: the same model lost 8 %
of its boxes on such a CPU and none here. So the copy is checked where it will run, when it is
built: both models on the calibration frames, FP32's boxes at the detector's threshold against the
copy's down to half that threshold (a box whose score drifts across the threshold is still found;
the drift is measured apart), matched one to one at IoU 0.5 within a class. The CPU's features
are part of the cache key, so a copy checked on one machine is never taken for another.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

from engines.detector import box_iou
from engines.types import Detections, ModelInfo

MIN_RECALL = 0.95  # of FP32's boxes found by the copy; the people model measures 0.98-0.99 with VNNI
MAX_DRIFT = 0.05  # mean |score difference| of matched boxes; 0.02-0.03 here (VNNI)
MIN_BOXES = 10  # fewer reference boxes than this at the threshold: the check lowers it once
REFERENCE_CONF = 0.25  # the detector's default threshold
LOW_CONF = 0.05  # for a model that finds little in the calibration clip at the default
SLACK = 0.5  # the copy's boxes count down to this fraction of the threshold
IOU = 0.5
# /proc/cpuinfo flags that change how ONNX Runtime's integer kernels compute.
INT8_FLAGS = ("avx2", "avx512f", "avx512bw", "avx512_vnni", "avx_vnni", "amx_int8")


@dataclass(frozen=True, slots=True)
class Agreement:
    recall: float  # FP32 boxes the copy found (1.0 when FP32 found none)
    precision: float  # the copy's boxes that FP32 found too
    drift: float  # mean |score difference| over matched boxes
    fp32_boxes: int
    int8_boxes: int
    conf: float  # the threshold both were read at

    @property
    def holds(self) -> bool:
        return self.recall >= MIN_RECALL and self.drift <= MAX_DRIFT

    def describe(self) -> str:
        return (f"recall {self.recall:.3f} of {self.fp32_boxes} FP32 boxes (bound {MIN_RECALL}), precision "
                f"{self.precision:.3f}, score drift {self.drift:.3f} (bound {MAX_DRIFT}), at conf {self.conf:g}")

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class Reference:
    """FP32's detections on the calibration frames (RGB), run once on a CPU session and measured
    against every variant the build tries."""

    def __init__(self, fp32: Path, frames: Sequence[np.ndarray]) -> None:
        self._fp32 = fp32
        self._frames = frames
        self._expected: list[Detections] | None = None
        self._info: ModelInfo | None = None

    def measure(self, int8: Path) -> Agreement:
        from engines.detector import YoloDetector
        from engines.onnx_backend import OnnxRuntimeBackend

        expected, info = self._detections()
        copy = YoloDetector(OnnxRuntimeBackend(int8, "cpu", sessions=1), info, conf=LOW_CONF * SLACK)
        try:
            found = [copy.detect([frame])[0] for frame in self._frames]
        finally:
            copy.close()
        conf = REFERENCE_CONF
        if sum(int((d.scores >= conf).sum()) for d in expected) < MIN_BOXES:
            conf = LOW_CONF
        return compare(expected, found, conf)

    def _detections(self) -> tuple[list[Detections], ModelInfo]:
        if self._expected is None or self._info is None:
            from engines.detector import YoloDetector
            from engines.registry import create_detector

            reference = create_detector(self._fp32, "onnx-cpu", conf=LOW_CONF * SLACK, workers=1)
            assert isinstance(reference, YoloDetector)
            try:
                self._expected = [reference.detect([frame])[0] for frame in self._frames]
                self._info = reference.info
            finally:
                reference.close()
        return self._expected, self._info


def compare(expected: Sequence[Detections], found: Sequence[Detections], conf: float) -> Agreement:
    """FP32's detections at `conf` against the copy's down to `conf * SLACK` (recall), and the
    other way round (precision)."""
    matched = shown = reference = kept = 0
    drifts: list[float] = []
    for fp32, int8 in zip(expected, found, strict=True):
        want, got = _above(fp32, conf), _above(int8, conf * SLACK)
        reference += len(want)
        for i, j in _pairs(want, got):
            matched += 1
            drifts.append(abs(float(want.scores[i]) - float(got.scores[j])))
        shown_now, loose = _above(int8, conf), _above(fp32, conf * SLACK)
        shown += len(shown_now)
        kept += len(_pairs(shown_now, loose))
    return Agreement(
        recall=matched / reference if reference else 1.0,
        precision=kept / shown if shown else 1.0,
        drift=float(np.mean(drifts)) if drifts else 0.0,
        fp32_boxes=reference,
        int8_boxes=shown,
        conf=conf,
    )


def _above(found: Detections, conf: float) -> Detections:
    keep = found.scores >= conf
    return Detections(found.boxes[keep], found.scores[keep], found.class_ids[keep])


def _pairs(want: Detections, got: Detections) -> list[tuple[int, int]]:
    """One-to-one matches, best IoU first, same class, IoU >= 0.5."""
    iou = box_iou(want.boxes, got.boxes)
    if iou.size == 0:
        return []
    iou[want.class_ids[:, None] != got.class_ids[None, :]] = 0.0
    pairs: list[tuple[int, int]] = []
    used_i: set[int] = set()
    used_j: set[int] = set()
    for flat in np.argsort(-iou, axis=None):
        i, j = divmod(int(flat), iou.shape[1])
        if iou[i, j] < IOU:
            break
        if i in used_i or j in used_j:
            continue
        used_i.add(i)
        used_j.add(j)
        pairs.append((i, j))
    return pairs


@cache
def cpu_int8_features() -> tuple[str, ...]:
    """The CPU flags that change INT8 arithmetic, as /proc/cpuinfo names them (Linux; () elsewhere)."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as info:
            for line in info:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    return tuple(f for f in INT8_FLAGS if f in flags)
    except OSError:
        pass
    return ()


def has_vnni(features: Sequence[str]) -> bool:
    return "avx512_vnni" in features or "avx_vnni" in features or "amx_int8" in features
