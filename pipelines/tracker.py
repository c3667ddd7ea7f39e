"""ByteTrack-style multi-object tracker with track lifecycle events.

Association runs in three rounds per frame: confident detections against all live and
recently lost tracks, then the remaining live tracks against low-score detections (which
keeps a person tracked through partial occlusion), then unconfirmed tracks against what
is left. A track is announced (`new`) once confirmed, re-announced (`update`) only when
something a subscriber cares about changes (its class, or it moved a meaningful distance),
and retired (`end`) after it has been lost for `lost_timeout_s`.

Association is class-agnostic so a person who falls keeps their id; the track's class is
a score-weighted vote over recent detections so one flickering frame does not flip it.

For the frames the detector skips, `predict` carries each track's last measured box forward
by its velocity in pixels per second of stream time (a smoothed average of its measured
motion). Not the Kalman filter's state: that is a smoothed box a step behind the detection, with
a velocity per update, which is wrong as soon as updates come irregularly (a loaded model), so
its predicted box jumped beside the person at each measured frame. A track with no measured
motion yet is held where it was seen, and none is carried further than `max_predict_s`: the
rules still count and place every seen track on a predicted frame, as a track missing from it
would read as one that left (bench/bench_live_boxes.py measures the error). Live, each
measurement of a moving track says how far the prediction for that moment would have been from
it: `prediction_error`, the median over the last measurements, in box widths.
"""

from __future__ import annotations

import itertools
from collections import deque
from dataclasses import dataclass, field
from enum import StrEnum

import numpy as np
from scipy.optimize import linear_sum_assignment

from engines.types import Detections
from pipelines.kalman import KalmanBoxFilter

PREDICTION_ERRORS_KEPT = 256  # the recent measurements `prediction_error` is the median of


@dataclass(frozen=True, slots=True)
class TrackerConfig:
    high_score: float = 0.4  # detections at or above take part in the first round
    low_score: float = 0.1  # ... between low and high only in the second round
    new_track_score: float = 0.45  # an unmatched detection must reach this to start a track
    match_iou: float = 0.2  # first round: minimum (score-weighted) IoU to match
    low_match_iou: float = 0.5  # second round
    unconfirmed_match_iou: float = 0.3  # third round
    lost_timeout_s: float = 1.5  # a lost track ends after this long without a match
    class_memory: float = 0.7  # decay of the class vote per frame (higher = steadier)
    update_move_fraction: float = 0.5  # centre moved by this fraction of the box size → update
    update_size_change: float = 0.35  # box area changed by this fraction → update
    max_tracks: int = 1000  # hard bound on live + lost tracks per stream
    max_predict_s: float = 1.0  # a prediction carries a track's motion no further than this
    velocity_memory: float = 0.7  # weight of the past in a track's smoothed velocity (per measurement)


class TrackState(StrEnum):
    TENTATIVE = "tentative"
    TRACKED = "tracked"
    LOST = "lost"


class LifecycleKind(StrEnum):
    NEW = "new"
    UPDATE = "update"
    END = "end"


@dataclass(slots=True)
class Track:
    track_id: int
    filter: KalmanBoxFilter
    box: np.ndarray
    score: float
    class_votes: dict[int, float]
    first_seen_pts: float
    last_seen_pts: float
    hits: int = 1
    state: TrackState = TrackState.TENTATIVE
    velocity: np.ndarray | None = None  # xyxy pixels per second of stream time; None until it moved twice
    announced_box: np.ndarray | None = None
    announced_class: int | None = None

    @property
    def class_id(self) -> int:
        return max(self.class_votes.items(), key=lambda kv: kv[1])[0]

    def vote(self, class_id: int, score: float, memory: float) -> None:
        for key in self.class_votes:
            self.class_votes[key] *= memory
        self.class_votes[class_id] = self.class_votes.get(class_id, 0.0) + score


@dataclass(frozen=True, slots=True)
class TrackEvent:
    kind: LifecycleKind
    track_id: int
    class_id: int
    score: float
    box: np.ndarray  # xyxy source pixels
    first_seen_pts: float
    last_seen_pts: float
    hits: int
    changed: tuple[str, ...] = ()  # for updates: which of "class", "position", "size"
    reason: str | None = None  # for ends: "lost", "stream_stopped", "evicted"


@dataclass(slots=True)
class TrackerOutput:
    """Per detection index, the id of the confirmed track it belongs to (or None)."""

    track_ids: list[int | None]
    events: list[TrackEvent] = field(default_factory=list)


def iou_matrix(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if len(a) == 0 or len(b) == 0:
        return np.zeros((len(a), len(b)), np.float32)
    x1 = np.maximum(a[:, None, 0], b[None, :, 0])
    y1 = np.maximum(a[:, None, 1], b[None, :, 1])
    x2 = np.minimum(a[:, None, 2], b[None, :, 2])
    y2 = np.minimum(a[:, None, 3], b[None, :, 3])
    inter = np.clip(x2 - x1, 0, None) * np.clip(y2 - y1, 0, None)
    area_a = (a[:, 2] - a[:, 0]) * (a[:, 3] - a[:, 1])
    area_b = (b[:, 2] - b[:, 0]) * (b[:, 3] - b[:, 1])
    union = area_a[:, None] + area_b[None, :] - inter
    return np.where(union > 0, inter / np.maximum(union, 1e-9), 0.0).astype(np.float32)


def _match(similarity: np.ndarray, minimum: float) -> list[tuple[int, int]]:
    """Optimal one-to-one assignment keeping only pairs with similarity ≥ minimum."""
    if similarity.size == 0:
        return []
    rows, cols = linear_sum_assignment(-similarity)
    return [(int(r), int(c)) for r, c in zip(rows, cols, strict=True) if similarity[r, c] >= minimum]


class ByteTracker:
    """Tracks for one stream. Not thread-safe: one stream's frame loop owns it."""

    def __init__(self, config: TrackerConfig | None = None) -> None:
        self.config = config or TrackerConfig()
        self._tracks: list[Track] = []
        self._ids = itertools.count(1)
        self._frames = 0
        self._last_update: float | None = None  # stream time of the last measured frame
        self.evicted = 0
        self._prediction_errors: deque[float] = deque(maxlen=PREDICTION_ERRORS_KEPT)

    @property
    def prediction_error(self) -> float:
        """How far a predicted box was from the next measured box of its track: the median over the
        last measurements, in widths of the measured box (0 before any)."""
        errors = sorted(self._prediction_errors)
        return round(errors[len(errors) // 2], 3) if errors else 0.0

    @property
    def has_tracks(self) -> bool:
        return bool(self._tracks)

    @property
    def active_tracks(self) -> list[Track]:
        return [t for t in self._tracks if t.state is TrackState.TRACKED]

    def predict(self, pts: float) -> list[tuple[Track, np.ndarray]]:
        """Where each confirmed, currently seen track is at stream time `pts`, for a frame the
        detector skipped: its last measured box moved on by its velocity, for at most
        `max_predict_s`. Nothing changes: the next `update` goes on from the last measurement as if
        this was never asked."""
        last = self._last_update
        if last is None:
            return []
        # Every seen track stays on the frame (the rules count and place it: dropping it would read
        # as an exit); past max_predict_s, or before it has moved, its box is held where it was seen.
        ahead = min(max(0.0, pts - last), self.config.max_predict_s)
        seen = [t for t in self._tracks if t.state is TrackState.TRACKED and t.last_seen_pts == last]
        return [(t, t.box.copy() if t.velocity is None else self._carried(t, ahead)) for t in seen]

    @staticmethod
    def _carried(track: Track, ahead: float) -> np.ndarray:
        assert track.velocity is not None
        return (track.box + track.velocity * ahead).astype(np.float32)

    def update(self, detections: Detections, pts: float) -> TrackerOutput:
        cfg = self.config
        self._frames += 1
        self._last_update = pts
        n = len(detections)
        assigned: list[Track | None] = [None] * n
        events: list[TrackEvent] = []
        for track in self._tracks:
            track.filter.predict()

        scores = detections.scores
        high = [i for i in range(n) if scores[i] >= cfg.high_score]
        low = [i for i in range(n) if cfg.low_score <= scores[i] < cfg.high_score]
        confirmed = [t for t in self._tracks if t.state is not TrackState.TENTATIVE]
        tentative = [t for t in self._tracks if t.state is TrackState.TENTATIVE]

        # Round 1: confident detections vs tracked + lost; IoU weighted by detection score.
        sim = self._similarity(confirmed, detections, high, pts) * scores[high][None, :]
        matched_tracks: set[int] = set()
        remaining_high = set(high)
        for ti, dj in _match(sim, cfg.match_iou):
            det = high[dj]
            self._apply(confirmed[ti], detections, det, pts)
            assigned[det] = confirmed[ti]
            matched_tracks.add(id(confirmed[ti]))
            remaining_high.discard(det)

        # Round 2: still-unmatched live tracks vs low-score detections.
        live_left = [t for t in confirmed if id(t) not in matched_tracks and t.state is TrackState.TRACKED]
        for ti, dj in _match(self._similarity(live_left, detections, low, pts), cfg.low_match_iou):
            det = low[dj]
            self._apply(live_left[ti], detections, det, pts)
            assigned[det] = live_left[ti]
            matched_tracks.add(id(live_left[ti]))

        # Round 3: tentative tracks vs the confident detections nobody took.
        left = sorted(remaining_high)
        for ti, dj in _match(self._similarity(tentative, detections, left, pts), cfg.unconfirmed_match_iou):
            det = left[dj]
            track = tentative[ti]
            self._apply(track, detections, det, pts)
            track.state = TrackState.TRACKED
            assigned[det] = track
            matched_tracks.add(id(track))
            remaining_high.discard(det)

        survivors: list[Track] = []
        for track in self._tracks:
            if id(track) in matched_tracks:
                survivors.append(track)
            elif track.state is TrackState.TENTATIVE:
                continue  # a one-frame wonder: never announced, dropped silently
            elif pts - track.last_seen_pts > cfg.lost_timeout_s:
                events.append(self._event(track, LifecycleKind.END, reason="lost"))
            else:
                track.state = TrackState.LOST
                survivors.append(track)
        self._tracks = survivors

        # New tracks; on the very first frame they are confirmed at once, like ByteTrack.
        for det in sorted(remaining_high):
            if scores[det] < cfg.new_track_score:
                continue
            track = Track(
                track_id=next(self._ids),
                filter=KalmanBoxFilter(detections.boxes[det]),
                box=detections.boxes[det].astype(np.float32),
                score=float(scores[det]),
                class_votes={int(detections.class_ids[det]): float(scores[det])},
                first_seen_pts=pts,
                last_seen_pts=pts,
                state=TrackState.TRACKED if self._frames == 1 else TrackState.TENTATIVE,
            )
            self._tracks.append(track)
            assigned[det] = track
        events.extend(self._evict_overflow())

        for track in self._tracks:
            if track.state is TrackState.TRACKED and track.last_seen_pts == pts:
                event = self._lifecycle_for(track)
                if event is not None:
                    events.append(event)
        ids = [t.track_id if t is not None and t.state is TrackState.TRACKED else None for t in assigned]
        return TrackerOutput(track_ids=ids, events=events)

    def expire(self, now: float) -> list[TrackEvent]:
        """End the tracks unseen for longer than lost_timeout_s at stream time `now`, with no frame
        to match against (the source is silent): tracks end on time through an outage."""
        timeout = self.config.lost_timeout_s
        stale = [t for t in self._tracks if now - t.last_seen_pts > timeout]
        if not stale:
            return []
        self._tracks = [t for t in self._tracks if now - t.last_seen_pts <= timeout]
        return [self._event(t, LifecycleKind.END, reason="lost") for t in stale if t.announced_box is not None]

    def finish(self, reason: str = "stream_stopped") -> list[TrackEvent]:
        """End every announced track (the stream is going away)."""
        events = [
            self._event(t, LifecycleKind.END, reason=reason)
            for t in self._tracks
            if t.announced_box is not None
        ]
        self._tracks = []
        return events

    def _similarity(self, tracks: list[Track], detections: Detections, indices: list[int], pts: float) -> np.ndarray:
        if not tracks or not indices:
            return np.zeros((len(tracks), len(indices)), np.float32)
        predicted = np.stack([self._expected(t, pts) for t in tracks])
        return iou_matrix(predicted, detections.boxes[indices])

    def _expected(self, track: Track, pts: float) -> np.ndarray:
        # Where to look for a track on a measured frame: moved by its velocity over the stream time
        # since it was last measured, as the filter's per-update step misses when updates come
        # irregularly or sparsely; a track lost for longer than max_predict_s is looked for where
        # the filter has it.
        ahead = pts - track.last_seen_pts
        if track.velocity is None or ahead > self.config.max_predict_s:
            return track.filter.box()
        return (track.box + track.velocity * ahead).astype(np.float32)

    def _apply(self, track: Track, detections: Detections, det: int, pts: float) -> None:
        box = detections.boxes[det]
        gap = pts - track.last_seen_pts
        if track.velocity is not None and 0 < gap <= self.config.max_predict_s:
            expected = track.box + track.velocity * gap  # what predict() said of this moment
            width = max(float(box[2] - box[0]), 1.0)
            shift = np.hypot(*((expected[:2] + expected[2:] - box[:2] - box[2:]) / 2))
            self._prediction_errors.append(float(shift) / width)
        if gap > 0:
            moved = (box.astype(np.float64) - track.box) / gap
            memory = self.config.velocity_memory
            track.velocity = moved if track.velocity is None else memory * track.velocity + (1 - memory) * moved
        track.filter.update(box)
        track.box = box.astype(np.float32)
        track.score = float(detections.scores[det])
        track.vote(int(detections.class_ids[det]), track.score, self.config.class_memory)
        track.last_seen_pts = pts
        track.hits += 1
        if track.state is TrackState.LOST:
            track.state = TrackState.TRACKED

    def _lifecycle_for(self, track: Track) -> TrackEvent | None:
        if track.announced_box is None:
            return self._announce(track, LifecycleKind.NEW, ())
        changed: list[str] = []
        if track.class_id != track.announced_class:
            changed.append("class")
        old, new = track.announced_box, track.box
        old_w, old_h = max(old[2] - old[0], 1.0), max(old[3] - old[1], 1.0)
        size = float(np.sqrt(old_w * old_h))
        dx = (new[0] + new[2] - old[0] - old[2]) / 2
        dy = (new[1] + new[3] - old[1] - old[3]) / 2
        shift = float(np.hypot(dx, dy))
        if shift > self.config.update_move_fraction * size:
            changed.append("position")
        new_area = max(new[2] - new[0], 1.0) * max(new[3] - new[1], 1.0)
        if abs(new_area / (old_w * old_h) - 1.0) > self.config.update_size_change:
            changed.append("size")
        if not changed:
            return None
        return self._announce(track, LifecycleKind.UPDATE, tuple(changed))

    def _announce(self, track: Track, kind: LifecycleKind, changed: tuple[str, ...]) -> TrackEvent:
        track.announced_box = track.box.copy()
        track.announced_class = track.class_id
        return self._event(track, kind, changed=changed)

    def _evict_overflow(self) -> list[TrackEvent]:
        overflow = len(self._tracks) - self.config.max_tracks
        if overflow <= 0:
            return []
        # Drop the longest-unseen tracks first; they are the least likely to come back.
        self._tracks.sort(key=lambda t: t.last_seen_pts, reverse=True)
        evicted, self._tracks = self._tracks[-overflow:], self._tracks[:-overflow]
        self.evicted += overflow
        announced = [t for t in evicted if t.announced_box is not None]
        return [self._event(t, LifecycleKind.END, reason="evicted") for t in announced]

    @staticmethod
    def _event(
        track: Track, kind: LifecycleKind, *, changed: tuple[str, ...] = (), reason: str | None = None
    ) -> TrackEvent:
        return TrackEvent(
            kind=kind,
            track_id=track.track_id,
            class_id=track.class_id,
            score=track.score,
            box=track.box.copy(),
            first_seen_pts=track.first_seen_pts,
            last_seen_pts=track.last_seen_pts,
            hits=track.hits,
            changed=changed,
            reason=reason,
        )
