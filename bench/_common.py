"""Helpers shared by the benchmarks: sample frames, percentiles, result files."""

from __future__ import annotations

import json
import platform
import resource
import sys
import time
from pathlib import Path
from typing import Any

import av
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
SAMPLE_CLIP = ROOT / ".cache" / "samples" / "vtest_speech.mp4"


def ensure_sample() -> Path:
    if not SAMPLE_CLIP.exists():
        sys.path.insert(0, str(ROOT / "samples"))
        import make_sample

        make_sample.main([])
    return SAMPLE_CLIP


def decode_frames(path: Path, count: int, start: int = 0) -> list[np.ndarray]:
    frames: list[np.ndarray] = []
    with av.open(str(path)) as container:
        for index, frame in enumerate(container.decode(video=0)):
            if index >= start:
                frames.append(frame.to_ndarray(format="rgb24"))
            if len(frames) >= count:
                break
    return frames


def pct(values: list[float] | np.ndarray, q: float) -> float | None:
    arr = np.asarray(values, dtype=np.float64)
    return None if arr.size == 0 else round(float(np.percentile(arr, q)), 2)


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def current_rss_mb() -> float:
    with open("/proc/self/statm") as fh:
        pages = int(fh.read().split()[1])
    return pages * resource.getpagesize() / 2**20


def write_results(name: str, payload: dict[str, Any]) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    payload = {
        "benchmark": name,
        "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {"python": platform.python_version(), "cpus": _cpus(), "node": platform.node()},
        **payload,
    }
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(payload, indent=2))
    return path


def _cpus() -> int:
    import os

    return len(os.sched_getaffinity(0))


def table(rows: list[dict[str, Any]], columns: list[str]) -> str:
    widths = {c: max(len(c), *(len(_fmt(r.get(c))) for r in rows)) for c in columns}
    lines = ["  ".join(c.ljust(widths[c]) for c in columns)]
    lines += ["  ".join(_fmt(r.get(c)).ljust(widths[c]) for c in columns) for r in rows]
    return "\n".join(lines)


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3f}" if abs(value) < 10 else f"{value:.1f}"
    return str(value)
