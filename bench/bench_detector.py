"""Detector benchmark: bare inference, pre- and post-processing per frame, on real vtest.avi frames.

    .venv/bin/python bench/bench_detector.py [--backend auto] [--threads N] [--quick] [--seconds S]

Writes bench/results/detector.json.

Measures the bundled fall model (YOLOv8s, 640, batch 1) and nudenet 320n (batch 1 and 4). Each
configuration runs for a time budget after a warm-up; figures are medians. On a shared machine only
ratios within one run mean much (see docs/performance.md).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
from _common import ROOT, decode_frames, table, write_results

from engines.detector import YoloDetector
from engines.models import fall_model_path, nudenet_model_path
from engines.registry import BACKENDS, create_detector

VTEST = ROOT / ".cache" / "samples" / "vtest.avi"
CONFIGS = (
    ("fall", fall_model_path, 1),
    ("nudenet-320n", nudenet_model_path, 1),
    ("nudenet-320n", nudenet_model_path, 4),
)


@dataclass
class Result:
    model: str
    batch: int
    imgsz: str
    backend: str
    iterations: int
    preprocess_ms_per_frame: float
    infer_ms_per_frame: float
    postprocess_ms_per_frame: float
    total_ms_per_frame: float
    infer_fps: float
    end_to_end_fps: float
    detections_per_frame: float


def vtest_frames(count: int) -> list[np.ndarray]:
    if not VTEST.exists():
        sys.path.insert(0, str(ROOT / "samples"))
        import make_sample

        make_sample.fetch_vtest(VTEST.parent)
    return decode_frames(VTEST, count)


def measure(
    detector: YoloDetector, frames: list[np.ndarray], batch: int, budget_s: float, min_iters: int
) -> dict[str, Any]:
    pre, infer, post, found = [], [], [], []
    for _ in range(2):  # warm-up: first runs allocate arenas and pick kernels
        detector.detect(frames[:batch])
    started = time.perf_counter()
    i = 0
    while i < min_iters or (time.perf_counter() - started < budget_s and i < 500):
        chunk = [frames[(i * batch + k) % len(frames)] for k in range(batch)]
        t0 = time.perf_counter()
        prepared = detector.preprocess(chunk)
        t1 = time.perf_counter()
        raw = detector.infer(prepared.tensor)
        t2 = time.perf_counter()
        results = detector.postprocess(raw, prepared)
        t3 = time.perf_counter()
        pre.append(t1 - t0)
        infer.append(t2 - t1)
        post.append(t3 - t2)
        found.append(sum(len(r) for r in results))
        i += 1
    per_frame = [1e3 * statistics.median(x) / batch for x in (pre, infer, post)]
    return {
        "iterations": i,
        "preprocess_ms_per_frame": per_frame[0],
        "infer_ms_per_frame": per_frame[1],
        "postprocess_ms_per_frame": per_frame[2],
        "detections_per_frame": sum(found) / (i * batch),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--backend", default="auto", choices=BACKENDS)
    parser.add_argument("--threads", type=int, default=None, help="ONNX Runtime intra-op threads (default: all)")
    parser.add_argument("--quick", action="store_true", help="short run (about 10 s) for a smoke check")
    parser.add_argument("--seconds", type=float, default=None, help="time budget per configuration")
    args = parser.parse_args(argv)
    budget = args.seconds if args.seconds is not None else (2.0 if args.quick else 12.0)
    min_iters = 3 if args.quick else 10

    frames = vtest_frames(16)
    print(f"{len(frames)} vtest frames {frames[0].shape[1]}x{frames[0].shape[0]}, {budget:.0f} s per configuration")
    results: list[Result] = []
    for name, model_path, batch in CONFIGS:
        detector = create_detector(model_path(), args.backend, threads=args.threads)
        assert isinstance(detector, YoloDetector)
        try:
            m = measure(detector, frames, batch, budget, min_iters)
        finally:
            detector.close()
        total = m["preprocess_ms_per_frame"] + m["infer_ms_per_frame"] + m["postprocess_ms_per_frame"]
        results.append(
            Result(
                model=name,
                batch=batch,
                imgsz="x".join(map(str, detector.info.imgsz)),
                backend=detector.backend,
                total_ms_per_frame=total,
                infer_fps=1e3 / m["infer_ms_per_frame"],
                end_to_end_fps=1e3 / total,
                **m,
            )
        )

    rows = [asdict(r) for r in results]
    columns = ["model", "batch", "imgsz", "backend", "preprocess_ms_per_frame", "infer_ms_per_frame"]
    columns += ["postprocess_ms_per_frame", "infer_fps", "end_to_end_fps", "iterations"]
    print("\nper frame, medians\n" + table(rows, columns))
    speedup = results[1].infer_ms_per_frame / results[2].infer_ms_per_frame
    print(f"\nnudenet batch 4 vs batch 1, inference per frame: {speedup:.2f}x faster")

    import onnxruntime

    path = write_results(
        "detector",
        {
            "settings": {"backend": args.backend, "threads": args.threads, "seconds_per_config": budget},
            "onnxruntime": onnxruntime.__version__,
            "results": rows,
            "ratios": {"nudenet_batch4_speedup_per_frame": speedup},
        },
    )
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
