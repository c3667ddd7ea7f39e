"""The sample clip's detections on every frame, computed once and cached (bench/results/ is
ignored): the benches that replay the tracker and the rules need the detector's boxes, not its
speed, so they read them from here instead of running the model again each time."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import av
import numpy as np

from engines.models import fall_model_path
from engines.registry import create_detector
from engines.types import Detections

RESULTS = Path(__file__).resolve().parent / "results"


Sample = tuple[list[float], list[Detections], tuple[int, int], dict[int, str]]


def sample_detections(clip: Path, *, batch: int = 4) -> Sample:
    """(pts of each frame, its detections, (width, height), class names) for every frame of `clip`."""
    cache = RESULTS / f"detections-{clip.stem}.npz"
    if cache.exists():
        data = np.load(cache)
        splits = np.cumsum(data["counts"])[:-1]
        boxes, scores, classes = (np.split(data[k], splits) for k in ("boxes", "scores", "class_ids"))
        dets = [Detections(b.reshape(-1, 4), s, c) for b, s, c in zip(boxes, scores, classes, strict=True)]
        names = {int(k): v for k, v in json.loads(str(data["names"])).items()}
        return list(data["pts"]), dets, (int(data["size"][0]), int(data["size"][1])), names
    # INT8, as `serve` runs the bundled model on a CPU (detector.precision: auto).
    detector = create_detector(fall_model_path(), "onnx-cpu", threads=2, precision="int8")
    pts: list[float] = []
    dets: list[Detections] = []
    pending: list[np.ndarray] = []
    size = (0, 0)
    try:
        with av.open(str(clip)) as container:
            for frame in container.decode(video=0):
                pts.append(float(frame.time or 0.0))
                pending.append(frame.to_ndarray(format="rgb24"))
                size = (frame.width, frame.height)
                if len(pending) == batch:
                    dets += detector.detect(pending)
                    pending = []
                    print(f"\rdetected {len(dets)} frames", end="", file=sys.stderr)
        if pending:
            dets += detector.detect(pending)
        names = dict(detector.info.names)
    finally:
        detector.close()
    print(file=sys.stderr)
    RESULTS.mkdir(parents=True, exist_ok=True)
    np.savez(
        cache,
        pts=np.array(pts),
        counts=np.array([len(d) for d in dets]),
        boxes=np.concatenate([d.boxes.reshape(-1, 4) for d in dets]),
        scores=np.concatenate([d.scores for d in dets]),
        class_ids=np.concatenate([d.class_ids for d in dets]),
        size=np.array(size),
        names=np.array(json.dumps(names)),
    )
    return pts, dets, size, names
