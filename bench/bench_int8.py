"""INT8 versus FP32 on the CPU: speed and agreement, for both bundled models.

    .venv/bin/python bench/bench_int8.py [--threads 1] [--rounds 6] [--quick]
    .venv/bin/python bench/bench_int8.py --sweep [--models nudenet-320n] [--only 3 6]

Writes bench/results/int8.json (the sweep: bench/results/int8_sweep_<models>.json).

Agreement: FP32 detections at the usual threshold (conf 0.25; 0.05 for nudenet, which finds
nothing above 0.25 in vtest) are the pseudo-labels; the INT8 model's detections (conf 0.001, as
COCO evaluation keeps) are scored against them with mAP50 (COCO's 101-point interpolated AP per
class, matched at IoU 0.5, averaged over the classes that have labels). Evaluation frames (every
8th of vtest.avi, from 4) never coincide with calibration frames (an even stride of 24 from 0).

Speed: bare inference on the same letterboxed frames, one session with the same thread count
for both, FP32 and INT8 rounds interleaved in one run so load from others hits both alike.
`--sweep` quantizes each model several ways (calibration, activation type, what of the head
stays float) and prints agreement and speed-up of each: how engines/quantize.py's defaults were
chosen.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
from _common import ROOT, table, write_results

from engines.detector import YoloDetector, box_iou
from engines.int8_agreement import cpu_int8_features
from engines.models import fall_model_path, nudenet_model_path
from engines.onnx_backend import OnnxRuntimeBackend
from engines.quantize import QuantizeSettings, int8_model
from engines.registry import create_detector
from engines.types import Detections

VTEST = ROOT / ".cache" / "samples" / "vtest.avi"
# (name, model, label threshold): the detector's default 0.25 for the people model; nudenet sees
# vtest's small, clothed people at low scores only (nothing reaches 0.25), so 0.05 as in its tests.
MODELS = (("fall-yolov8s-640", fall_model_path, 0.25), ("nudenet-320n", nudenet_model_path, 0.05))
EVAL_CONF = 0.001  # COCO evaluation keeps low-score detections so the whole PR curve is drawn


# -- mAP50 -----------------------------------------------------------------------------------


def average_precision(scores: np.ndarray, hits: np.ndarray, labels: int) -> float:
    """COCO's 101-point interpolated AP from the detections' scores and whether each hit a label."""
    order = np.argsort(-scores, kind="stable")
    tp = np.cumsum(hits[order])
    fp = np.cumsum(~hits[order])
    recall = tp / labels
    precision = tp / np.maximum(tp + fp, 1e-9)
    # Precision envelope: the best precision at this recall or any higher one.
    precision = np.maximum.accumulate(precision[::-1])[::-1]
    points = np.linspace(0, 1, 101)
    at = np.searchsorted(recall, points, side="left")
    return float(np.mean([precision[i] if i < len(precision) else 0.0 for i in at]))


def map50(predictions: list[Detections], labels: list[Detections], iou: float = 0.5) -> dict[str, Any]:
    """mAP at IoU 0.5 of `predictions` against `labels`, per image alike; classes without labels are left out."""
    classes = sorted({int(c) for d in labels for c in d.class_ids})
    per_class: dict[int, float] = {}
    counts: dict[int, int] = {}
    for cls in classes:
        scores: list[float] = []
        hits: list[bool] = []
        total = 0
        for pred, truth in zip(predictions, labels, strict=True):
            gt = truth.boxes[truth.class_ids == cls]
            total += len(gt)
            mine = pred.class_ids == cls
            boxes, conf = pred.boxes[mine], pred.scores[mine]
            taken = np.zeros(len(gt), bool)
            ious = box_iou(boxes, gt)
            for i in np.argsort(-conf, kind="stable"):
                # Greedy, best score first: the best-overlapping label not yet taken.
                candidates = np.where(taken, -1.0, ious[i]) if len(gt) else np.zeros(0)
                j = int(np.argmax(candidates)) if len(gt) else -1
                hit = j >= 0 and candidates[j] >= iou
                if hit:
                    taken[j] = True
                scores.append(float(conf[i]))
                hits.append(bool(hit))
        per_class[cls] = average_precision(np.asarray(scores), np.asarray(hits, bool), total)
        counts[cls] = total
    value = float(np.mean(list(per_class.values()))) if per_class else float("nan")
    return {"map50": value, "per_class": per_class, "per_class_labels": counts, "labels": sum(len(d) for d in labels)}


# -- frames ----------------------------------------------------------------------------------


def eval_frames(limit: int) -> list[np.ndarray]:
    import av

    if not VTEST.exists():
        sys.path.insert(0, str(ROOT / "samples"))
        import make_sample

        make_sample.fetch_vtest(VTEST.parent)
    frames = []
    with av.open(str(VTEST)) as container:
        for index, frame in enumerate(container.decode(video=0)):
            if index % 8 == 4:
                frames.append(frame.to_ndarray(format="rgb24"))
                if len(frames) >= limit:
                    break
    return frames


# -- measurements ----------------------------------------------------------------------------


def detector(path: Path, info_from: Path, conf: float, threads: int) -> YoloDetector:
    """A one-session CPU detector running `path` (FP32 or INT8) with `info_from`'s metadata."""
    base = create_detector(info_from, "onnx-cpu", conf=conf, threads=threads, workers=1)
    assert isinstance(base, YoloDetector)
    if path == info_from:
        return base
    base.close()
    runtime = OnnxRuntimeBackend(path, "cpu", threads=threads, sessions=1)
    return YoloDetector(runtime, base.info, conf=conf)


def agreement(fp32: Path, int8: Path, frames: list[np.ndarray], threads: int, label_conf: float) -> dict[str, Any]:
    with detector(fp32, fp32, label_conf, threads) as ref, detector(int8, fp32, EVAL_CONF, threads) as low:
        labels = [ref.detect([f])[0] for f in frames]
        predictions = [low.detect([f])[0] for f in frames]
    result = map50(predictions, labels)
    # Also what a user sees: INT8 at the same threshold, boxes matched one to one at IoU 0.5.
    seen = [_above(p, label_conf) for p in predictions]
    matched = sum(_matched(p, t) for p, t in zip(seen, labels, strict=True))
    shown = sum(len(p) for p in seen)
    result["matched_of_fp32"] = matched / max(1, result["labels"])
    result["matched_of_int8"] = matched / max(1, shown)
    return result


def _above(found: Detections, conf: float) -> Detections:
    keep = found.scores >= conf
    return Detections(found.boxes[keep], found.scores[keep], found.class_ids[keep])


def _matched(pred: Detections, truth: Detections) -> int:
    ious = box_iou(pred.boxes, truth.boxes)
    ious[pred.class_ids[:, None] != truth.class_ids[None, :]] = 0
    count = 0
    while ious.size and ious.max() >= 0.5:
        i, j = np.unravel_index(int(np.argmax(ious)), ious.shape)
        ious[i, :] = 0
        ious[:, j] = 0
        count += 1
    return count


def speed(fp32: Path, int8: Path, frames: list[np.ndarray], threads: int, rounds: int) -> dict[str, Any]:
    with detector(fp32, fp32, 0.25, threads) as a, detector(int8, fp32, 0.25, threads) as b:
        tensors = [a.preprocess([f]).tensor for f in frames]
        times: dict[str, list[float]] = {"fp32": [], "int8": []}
        for det in (a, b):
            for tensor in tensors[:3]:  # warm-up: arenas, kernel choice
                det.infer(tensor)
        for _ in range(rounds):
            for name, det in (("fp32", a), ("int8", b)):
                for tensor in tensors:
                    t0 = time.perf_counter()
                    det.infer(tensor)
                    times[name].append(time.perf_counter() - t0)
    fp32_ms = 1e3 * statistics.median(times["fp32"])
    int8_ms = 1e3 * statistics.median(times["int8"])
    return {"fp32_ms": fp32_ms, "int8_ms": int8_ms, "speedup": fp32_ms / int8_ms, "samples": len(times["fp32"])}


# -- main ------------------------------------------------------------------------------------

SWEEP = (
    QuantizeSettings(calibration="minmax", head="quantize"),
    QuantizeSettings(calibration="minmax", activations="int8"),
    QuantizeSettings(calibration="percentile", activations="int8"),
    QuantizeSettings(calibration="minmax"),
    QuantizeSettings(calibration="minmax", head="keep-outputs"),
    QuantizeSettings(calibration="entropy"),
    QuantizeSettings(calibration="percentile"),
    QuantizeSettings(calibration="percentile", ops="conv"),
    QuantizeSettings(calibration="minmax", ops="conv"),
    # How many frames' activations the calibration holds at once (6 above: the default, 1); 32,
    # every frame at once, is what shipped before (13.5-15.2 GB for the people model).
    QuantizeSettings(calibration="percentile", batch=2),
    QuantizeSettings(calibration="percentile", batch=4),
    QuantizeSettings(calibration="percentile", batch=32),
    # The remedies for CPUs without VNNI, whose u8 x s8 kernels can saturate (the build tries them
    # in this order when the default disagrees with FP32 on the CPU it runs on).
    QuantizeSettings(calibration="percentile", reduce_range=True),
    QuantizeSettings(calibration="percentile", weights="uint8"),
)


def sweep(frames: list[np.ndarray], threads: int, models: list[str], only: list[int] | None) -> int:
    rows = []
    with tempfile.TemporaryDirectory() as cache:
        for name, model_path, label_conf in MODELS:
            if name not in models:
                continue
            for index, settings in enumerate(SWEEP):
                if only and index not in only:
                    continue
                started = time.monotonic()
                # Exactly these settings: the build's own check would swap in another variant.
                path = int8_model(model_path(), settings=settings, cache_dir=cache, check=False)
                built = time.monotonic() - started
                result = agreement(model_path(), path, frames, threads, label_conf)
                timing = speed(model_path(), path, frames[:8], threads, rounds=3)
                rows.append({"model": name, **asdict(settings), "build_s": built, **_summary(result),
                             "speedup": timing["speedup"]})
                print(table(rows[-1:], list(rows[-1])), flush=True)
    print("\n" + table(rows, list(rows[0])))
    write_results(f"int8_sweep_{'_'.join(models)}", {"settings": {"threads": threads, "frames": len(frames),
                                                                  "cpu": list(cpu_int8_features())},
                                                     "results": rows})
    return 0


def _summary(result: dict[str, Any]) -> dict[str, Any]:
    keys = ("map50", "labels", "matched_of_fp32", "matched_of_int8")
    return {k: result[k] for k in keys}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--threads", type=int, default=1, help="ONNX Runtime threads, both models alike")
    parser.add_argument("--rounds", type=int, default=6, help="interleaved FP32/INT8 timing rounds")
    parser.add_argument("--frames", type=int, default=99, help="evaluation frames (vtest.avi has 99 of them)")
    parser.add_argument("--sweep", action="store_true", help="compare quantizer settings instead")
    parser.add_argument("--models", nargs="+", default=[m[0] for m in MODELS], choices=[m[0] for m in MODELS])
    parser.add_argument("--only", type=int, nargs="+", help="--sweep: these SWEEP entries (0-based) only")
    parser.add_argument("--quick", action="store_true", help="20 frames, 2 rounds: a smoke check")
    args = parser.parse_args(argv)
    if args.quick:
        args.frames, args.rounds = 20, 2
    frames = eval_frames(args.frames)
    print(f"{len(frames)} evaluation frames of vtest.avi, {args.threads} thread(s); CPU INT8 features: "
          f"{', '.join(cpu_int8_features()) or 'none'}", flush=True)
    if args.sweep:
        return sweep(frames, args.threads, args.models, args.only)

    settings = QuantizeSettings()
    rows = []
    for name, model_path, label_conf in MODELS:
        if name not in args.models:
            continue
        fp32 = model_path()
        started = time.monotonic()
        int8 = int8_model(fp32, settings=settings)
        ready = time.monotonic() - started
        result = agreement(fp32, int8, frames, args.threads, label_conf)
        timing = speed(fp32, int8, frames[:16], args.threads, args.rounds)
        rows.append({"model": name, "label_conf": label_conf, **timing, **_summary(result), "int8_ready_s": ready,
                     "per_class_ap50": {str(k): round(v, 4) for k, v in result["per_class"].items()},
                     "per_class_labels": {str(k): v for k, v in result["per_class_labels"].items()}})
    columns = ["model", "fp32_ms", "int8_ms", "speedup", "map50", "labels", "matched_of_fp32", "matched_of_int8"]
    print("\nINT8 vs FP32, bare inference per frame (medians)\n" + table(rows, columns))

    import onnxruntime

    path = write_results(
        "int8",
        {
            "settings": {"threads": args.threads, "rounds": args.rounds, "frames": len(frames),
                         "eval_conf": EVAL_CONF, "quantizer": asdict(settings)},
            "onnxruntime": onnxruntime.__version__,
            "target_map50": 0.95,
            "results": rows,
        },
    )
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
