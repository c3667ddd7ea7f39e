"""One detector shared by every stream, fed through the cross-stream batcher (see batching.py).

`detect()` is `submit()` with the detector's names: its failures are `DetectorFailed` (dead or
closed) and `BatcherFull` (past `max_pending`), its results `DetectionOutcome`s.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from engines.types import Detections, ModelInfo
from pipelines.batching import (
    DEFAULT_GATHER_WINDOW_S,
    DEFAULT_MAX_CONSECUTIVE_FAILURES,
    DEFAULT_MAX_PENDING,
    BatcherStats,
    ModelBatcher,
    ModelFailed,
    QueueFull,
)
from pipelines.compute import ComputeBudget, Grant, ModelClaim, Priority
from pipelines.frames import DeferredImage, as_rgb

__all__ = ["BatchDetector", "BatcherFull", "BatcherStats", "DetectionBatcher", "DetectionOutcome", "DetectorFailed"]


DETECTOR = "detector"  # the batcher's name: in reasons, logs and compute shares


class BatchDetector(Protocol):
    """What the batcher needs from an engine (engines.detector.Detector satisfies it)."""

    info: ModelInfo
    backend: str
    max_batch: int

    def detect(self, images: Sequence[np.ndarray]) -> list[Detections]: ...


@dataclass(frozen=True, slots=True)
class DetectionOutcome:
    detections: Detections
    inference_ms: float  # wall time of the model call this frame rode in (pre/post-processing included)
    batch_size: int
    started_mono: float  # time.monotonic() when that model call began


def detector_claim(detector: BatchDetector, cores: int) -> ModelClaim:
    """The detector's place in a compute budget: bulk work that a frame skipped costs little (the
    tracker predicts it). A call alone may use the wide session (every thread); calls side by side
    use one narrow session each."""
    wide = int(getattr(detector, "threads", 0) or cores)
    workers = max(1, int(getattr(detector, "workers", 1)))
    narrow = max(1, wide // workers) if workers > 1 else wide
    return ModelClaim(Priority.BULK, threads=narrow, max_threads=wide)


class DetectorFailed(ModelFailed):
    """The shared detector is unusable (crashed, broken engine, or closed); `reason` says why."""


class BatcherFull(QueueFull):
    """`max_pending` frames are already waiting; this one was refused, not queued."""


class DetectionBatcher(ModelBatcher["np.ndarray | DeferredImage", Detections]):
    def __init__(
        self,
        detector: BatchDetector,
        *,
        max_batch: int | None = None,
        gather_window_s: float = DEFAULT_GATHER_WINDOW_S,
        max_pending: int = DEFAULT_MAX_PENDING,
        max_consecutive_failures: int = DEFAULT_MAX_CONSECUTIVE_FAILURES,
        compute: ComputeBudget | None = None,
        workers: int | None = None,
        in_flight: int | None = None,
    ) -> None:
        self.detector = detector
        workers = workers or int(getattr(detector, "workers", 1))
        # Frames each stream keeps submitted at once: one per worker plus one queued behind them,
        # so a worker that finishes finds the next frame ready while the stream tracks and
        # publishes the last one (see pipelines.frame_loop).
        self.in_flight = in_flight or workers + 1
        if self.in_flight < 1:
            raise ValueError(f"in_flight must be at least 1, got {self.in_flight}")
        super().__init__(
            self._detect_pictures,
            name=DETECTOR,
            unit="frames",
            max_batch=min(max_batch or detector.max_batch, detector.max_batch),
            gather_window_s=gather_window_s,
            max_pending=max_pending,
            max_consecutive_failures=max_consecutive_failures,
            failed_error=DetectorFailed,
            full_error=BatcherFull,
            thread_name="vidsentry-infer",
            compute=compute,
            workers=workers,
        )

    def _detect_pictures(self, pictures: Sequence[np.ndarray | DeferredImage]) -> list[Detections]:
        # On the worker's thread: a deferred frame is converted here, inside its model call.
        return self.detector.detect([as_rgb(p) for p in pictures])

    async def detect(self, image: np.ndarray | DeferredImage, grant: Grant | None = None) -> DetectionOutcome:
        """Detect on one RGB frame (see `submit` for what it raises); with a compute `grant`, at
        once on the threads it holds (see `submit_granted`)."""
        outcome = await (self.submit(image) if grant is None else self.submit_granted(image, grant))
        return DetectionOutcome(outcome.result, outcome.elapsed_ms, outcome.batch_size, outcome.started_mono)
