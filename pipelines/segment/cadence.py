"""Which tracked objects of a frame get a new mask, and the last mask of every track.

A track is segmented when it is new (no mask yet), when its box has moved or changed shape
since its last mask (IoU below `reseg_iou`), or on every frame when its class is listed in
`every_frame_classes`. At most `max_per_frame` are chosen per frame: new tracks first, then the
most changed; the others are counted as skipped and come up again on a later frame.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from engines.segment.rle import Rle
from pipelines.segment.engine import SegmentSettings

MAX_TRACK_MASKS = 1024  # bound on remembered tracks; the least recently seen go first


@dataclass(frozen=True, slots=True)
class TrackedBox:
    track_id: int
    class_name: str
    box: tuple[float, float, float, float]


@dataclass(slots=True)
class TrackMask:
    box: tuple[float, float, float, float]  # the box the mask was made for
    rle: Rle | None  # None: the model found nothing in that box
    frame_seq: int


def iou(a: Sequence[float], b: Sequence[float]) -> float:
    w = min(a[2], b[2]) - max(a[0], b[0])
    h = min(a[3], b[3]) - max(a[1], b[1])
    if w <= 0 or h <= 0:
        return 0.0
    inter = w * h
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return float(inter / union) if union > 0 else 0.0


class MaskCadence:
    def __init__(self, settings: SegmentSettings) -> None:
        self.settings = settings
        self._masks: OrderedDict[int, TrackMask] = OrderedDict()
        self._asked: dict[int, tuple[float, float, float, float]] = {}  # in flight: track -> box asked for
        self.skipped = 0

    def choose(self, objects: Sequence[TrackedBox]) -> list[TrackedBox]:
        """The objects to segment now (in flight ones excluded), at most max_per_frame."""
        wanted: list[tuple[float, TrackedBox]] = []
        for obj in objects:
            if obj.track_id in self._asked:
                continue
            last = self._masks.get(obj.track_id)
            if last is None:
                wanted.append((-1.0, obj))  # new: before any changed one
            elif obj.class_name in self.settings.every_frame_classes:
                wanted.append((1.0, obj))
            else:
                overlap = iou(obj.box, last.box)
                if overlap < self.settings.reseg_iou:
                    wanted.append((overlap, obj))
        wanted.sort(key=lambda item: item[0])
        chosen = [obj for _, obj in wanted[: self.settings.max_per_frame]]
        self.skipped += len(wanted) - len(chosen)
        for obj in chosen:
            self._asked[obj.track_id] = obj.box
        return chosen

    def release(self, objects: Sequence[TrackedBox]) -> None:
        """Chosen objects that were not segmented after all (the frame was gone, the model failed)."""
        for obj in objects:
            self._asked.pop(obj.track_id, None)

    def store(self, obj: TrackedBox, mask: Rle | None, frame_seq: int) -> None:
        self._asked.pop(obj.track_id, None)
        self._masks[obj.track_id] = TrackMask(obj.box, mask, frame_seq)
        self._masks.move_to_end(obj.track_id)
        while len(self._masks) > MAX_TRACK_MASKS:
            self._masks.popitem(last=False)

    def mask_of(self, track_id: int) -> TrackMask | None:
        found = self._masks.get(track_id)
        if found is not None:
            self._masks.move_to_end(track_id)
        return found

    def forget(self, track_id: int) -> None:
        self._masks.pop(track_id, None)
        self._asked.pop(track_id, None)

    def __len__(self) -> int:
        return len(self._masks)


def boxes_array(objects: Sequence[TrackedBox]) -> np.ndarray:
    return np.array([obj.box for obj in objects], np.float32).reshape(-1, 4)
