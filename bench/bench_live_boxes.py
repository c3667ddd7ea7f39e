"""What a person watching the sample camera sees of the tracker and the rules: alert starts per
minute (do zone / line alerts flap?) and how far the predicted (dashed) boxes are from where the
model then finds the person.

The sample clip (`.cache/samples/vtest_speech.mp4`, the README's `plaza` camera) goes through the
real people model once (INT8, as `serve` runs it on a CPU; cached in bench/results/), then the
live frame loop's logic is replayed on those detections: one frame in `--every` is measured (the
model's boxes update the tracker), the others get the tracker's predicted boxes, and the rules of
`samples/vidsentry.yaml` judge both, as `pipelines/frame_loop.py` does. A loaded machine measures
fewer frames, so `--every` is the knob the machine's load turns; the replay itself is exact and
costs no model time.

- alerts: starts per minute for each rule, with `settle_s: 0` (the rules before changes had to
  settle) and with the default; "flaps" counts a rule's starts that follow another of the same
  rule within 3 s.
- predicted: for each predicted box, its distance from the same person's box as the model found
  it on that very frame (matched by IoU), in units of the box's width: centre error p50/p95, and
  the share off by more than half a width. The tracker's predictor (`ByteTracker.predict`: the
  last measured box moved on by its velocity per second) against the one it replaced (the Kalman
  filter's smoothed box moved on by its per-update velocity, rebuilt here from the filter's
  state) and against holding the last measured box still.

Usage: python bench/bench_live_boxes.py [--every 1,2,3]
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
import yaml
from _common import ensure_sample, pct, table, write_results
from _sample_detections import sample_detections
from pydantic import TypeAdapter

from engines.types import Detections
from pipelines.kalman import xyah_to_xyxy
from pipelines.rules.engine import RuleEngine
from pipelines.rules.specs import CORE_RULES, rule_list
from pipelines.rules.types import AlertEventKind, Moment, tracked_objects
from pipelines.tracker import ByteTracker, LifecycleKind, iou_matrix

ROOT = Path(__file__).resolve().parents[1]
FLAP_WINDOW_S = 3.0


def sample_rules(settle_s: float | None) -> list[Any]:
    config = yaml.safe_load((ROOT / "samples" / "vidsentry.yaml").read_text())
    raw = [r for r in config["streams"][0]["rules"] if r["type"] in {t.type_name() for t in CORE_RULES}]
    if settle_s is not None:
        raw = [{**r, "settle_s": settle_s} if r["type"] in ("zone", "line") else r for r in raw]
    return TypeAdapter(rule_list(CORE_RULES)).validate_python(raw)


def replay(
    sample: tuple[list[float], list[Detections], tuple[int, int], dict[int, str]], every: int, settle_s: float | None
) -> dict[str, Any]:
    pts, dets, size, names = sample
    tracker = ByteTracker()
    engine = RuleEngine("plaza", sample_rules(settle_s), names)
    starts: dict[str, list[float]] = defaultdict(list)
    errors: dict[str, list[float]] = {"tracker": [], "kalman (before)": [], "hold still": []}
    last, step_s = None, 0.0
    for index, (t, measured) in enumerate(zip(pts, dets, strict=True)):
        now = Moment(t, t)
        if index % every == 0:
            if last is not None:
                step_s = t - last if step_s <= 0 else 0.7 * step_s + 0.3 * (t - last)
            last = t
            out = tracker.update(measured, t)
            ended = [e.track_id for e in out.events if e.kind is LifecycleKind.END]
            changes = engine.evaluate(now, tracked_objects(tracker.active_tracks, names), ended=ended,
                                      frame_size=size)
        else:
            predicted = tracker.predict(t)
            tracks = [replace(track, box=box) for track, box in predicted]
            errors["tracker"] += box_errors(np.array([b for _, b in predicted]).reshape(-1, 4), measured)
            seen = [k for k in tracker.active_tracks if k.last_seen_pts == last and k.hits > 1]
            steps = (t - (last or t)) / step_s if step_s > 0 else 0.0
            kalman = [xyah_to_xyxy(k.filter.mean[:4] + steps * k.filter.mean[4:]) for k in seen]
            errors["kalman (before)"] += box_errors(np.array(kalman).reshape(-1, 4), measured)
            errors["hold still"] += box_errors(np.array([k.box for k in seen]).reshape(-1, 4), measured)
            changes = engine.evaluate(now, tracked_objects(tracks, names), ended=[], frame_size=size)
        for change in changes:
            if change.kind is AlertEventKind.START:
                starts[change.rule_id].append(t)
    minutes = (pts[-1] - pts[0]) / 60
    rules = {}
    for rule in engine.rules:
        times = starts.get(rule.id, [])
        flaps = sum(1 for a, b in zip(times, times[1:], strict=False) if b - a < FLAP_WINDOW_S)
        rules[rule.id] = {"starts": len(times), "per_minute": round(len(times) / minutes, 2), "flaps": flaps}
    return {"rules": rules, "errors": errors}


def box_errors(predicted: np.ndarray, measured: Detections) -> list[float]:
    """Each predicted box's centre distance from its best-overlapping measured box, in box widths."""
    if not len(predicted) or not len(measured):
        return []
    iou = iou_matrix(predicted, measured.boxes)
    out = []
    for i, j in enumerate(iou.argmax(axis=1)):
        if iou[i, j] < 0.1:
            continue  # the model lost this person on this frame: nothing to compare with
        p, m = predicted[i], measured.boxes[j]
        dx = (p[0] + p[2] - m[0] - m[2]) / 2
        dy = (p[1] + p[3] - m[1] - m[3]) / 2
        out.append(float(np.hypot(dx, dy) / max(m[2] - m[0], 1.0)))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--every", default="1,2,3,5", help="measure one frame in N (the others predicted)")
    args = parser.parse_args(argv)
    clip = ensure_sample()
    sample = sample_detections(clip)
    pts, size = sample[0], sample[2]
    rows, results, err_rows = [], [], []
    for every in (int(n) for n in args.every.split(",")):
        for label, settle in (("settle 0 (before)", 0.0), ("default (after)", None)):
            run = replay(sample, every, settle)
            result = {"every": every, "rules": label, "alerts": run["rules"]}
            results.append(result)
            for rule_id, r in run["rules"].items():
                rows.append({"every": every, "rules": label, "rule": rule_id, **r})
            if every > 1 and settle is None:  # the predictions do not depend on the rules
                result["predicted"] = {}
                for name, errors in run["errors"].items():
                    arr = np.array(errors)
                    figures = {"boxes": len(errors), "p50_widths": pct(errors, 50), "p95_widths": pct(errors, 95),
                               "over_half_width": round(float(np.mean(arr > 0.5)), 3) if len(arr) else None}
                    result["predicted"][name] = figures
                    err_rows.append({"every": every, "predictor": name, **figures})
    print(f"sample: {clip.name}, {len(pts)} frames, {size[0]}x{size[1]}, replayed")
    print(table(rows, ["every", "rules", "rule", "starts", "per_minute", "flaps"]))
    print("\npredicted boxes: centre error against the model's box on the same frame, in box widths")
    print(table(err_rows, ["every", "predictor", "boxes", "p50_widths", "p95_widths", "over_half_width"]))
    path = write_results("live_boxes", {"clip": clip.name, "frames": len(pts), "runs": results})
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
