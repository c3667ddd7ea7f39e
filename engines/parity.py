"""Do two detectors agree? Boxes matched greedily by IoU within a class, scores compared.

The check behind `vidsentry doctor --parity`: a GPU engine (FP16 or INT8) against ONNX Runtime on
the CPU, same model, same frames. Boxes near the score threshold may appear on one side only
under reduced precision, so the verdict allows a few unmatched boxes rather than demanding
identity.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from engines.detector import box_iou
from engines.types import Detections

MATCH_IOU = 0.5
AGREE_MATCHED = 0.95  # matched boxes / all boxes either side
AGREE_SCORE_DIFF = 0.02  # mean |score difference| of matched boxes


@dataclass(frozen=True, slots=True)
class FrameMatch:
    pairs: tuple[tuple[int, int], ...]  # (reference index, candidate index)
    ious: np.ndarray  # of each pair
    score_diffs: np.ndarray  # |reference - candidate| of each pair
    only_reference: int
    only_candidate: int


def match_detections(reference: Detections, candidate: Detections, iou_threshold: float = MATCH_IOU) -> FrameMatch:
    """Greedy one-to-one matching: the highest-IoU same-class pair first, down to `iou_threshold`."""
    ious = box_iou(reference.boxes, candidate.boxes)
    if ious.size:
        ious = np.where(reference.class_ids[:, None] == candidate.class_ids[None, :], ious, 0.0)
    rows, cols = np.nonzero(ious >= iou_threshold)
    order = np.argsort(-ious[rows, cols], kind="stable")
    used_r: set[int] = set()
    used_c: set[int] = set()
    pairs: list[tuple[int, int]] = []
    for k in order:
        r, c = int(rows[k]), int(cols[k])
        if r not in used_r and c not in used_c:
            used_r.add(r)
            used_c.add(c)
            pairs.append((r, c))
    idx_r = np.array([p[0] for p in pairs], np.int64)
    idx_c = np.array([p[1] for p in pairs], np.int64)
    return FrameMatch(
        pairs=tuple(pairs),
        ious=ious[idx_r, idx_c] if pairs else np.zeros(0),
        score_diffs=np.abs(reference.scores[idx_r].astype(np.float64) - candidate.scores[idx_c]) if pairs
        else np.zeros(0),
        only_reference=len(reference) - len(pairs),
        only_candidate=len(candidate) - len(pairs),
    )


@dataclass(frozen=True, slots=True)
class ParityReport:
    reference: str  # engine names, e.g. "onnxruntime-cpu", "tensorrt (fp16)"
    candidate: str
    frames: int
    matched: int
    only_reference: int
    only_candidate: int
    iou_mean: float
    iou_min: float
    score_diff_mean: float
    score_diff_max: float
    reference_ms: float  # mean time per frame
    candidate_ms: float

    @property
    def matched_fraction(self) -> float:
        total = self.matched + self.only_reference + self.only_candidate
        return 1.0 if total == 0 else self.matched / total

    @property
    def agree(self) -> bool:
        return self.matched_fraction >= AGREE_MATCHED and self.score_diff_mean <= AGREE_SCORE_DIFF

    def verdict(self) -> str:
        word = "AGREE" if self.agree else "DISAGREE"
        return (
            f"{word}: {self.matched_fraction:.1%} of boxes matched, mean score difference "
            f"{self.score_diff_mean:.4f} (agree: >= {AGREE_MATCHED:.0%} matched, <= {AGREE_SCORE_DIFF})"
        )

    def to_json(self) -> dict[str, object]:
        return {
            "reference": self.reference,
            "candidate": self.candidate,
            "frames": self.frames,
            "matched": self.matched,
            "only_reference": self.only_reference,
            "only_candidate": self.only_candidate,
            "matched_fraction": round(self.matched_fraction, 6),
            "iou_mean": round(self.iou_mean, 6),
            "iou_min": round(self.iou_min, 6),
            "score_diff_mean": round(self.score_diff_mean, 6),
            "score_diff_max": round(self.score_diff_max, 6),
            "reference_ms_per_frame": round(self.reference_ms, 3),
            "candidate_ms_per_frame": round(self.candidate_ms, 3),
            "agree": self.agree,
            "verdict": self.verdict(),
        }


def compare(
    reference: Sequence[Detections],
    candidate: Sequence[Detections],
    *,
    reference_name: str,
    candidate_name: str,
    reference_ms: float,
    candidate_ms: float,
    iou_threshold: float = MATCH_IOU,
) -> ParityReport:
    if len(reference) != len(candidate):
        raise ValueError(f"{len(reference)} reference frames but {len(candidate)} candidate frames")
    matches = [match_detections(r, c, iou_threshold) for r, c in zip(reference, candidate, strict=True)]
    ious = np.concatenate([m.ious for m in matches]) if matches else np.zeros(0)
    diffs = np.concatenate([m.score_diffs for m in matches]) if matches else np.zeros(0)
    return ParityReport(
        reference=reference_name,
        candidate=candidate_name,
        frames=len(matches),
        matched=int(ious.size),
        only_reference=sum(m.only_reference for m in matches),
        only_candidate=sum(m.only_candidate for m in matches),
        iou_mean=float(ious.mean()) if ious.size else 0.0,
        iou_min=float(ious.min()) if ious.size else 0.0,
        score_diff_mean=float(diffs.mean()) if diffs.size else 0.0,
        score_diff_max=float(diffs.max()) if diffs.size else 0.0,
        reference_ms=reference_ms,
        candidate_ms=candidate_ms,
    )
