"""The segmenter every stream shares, and how often it is asked (the `segmentation:` settings)."""

from __future__ import annotations

import asyncio
import contextlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from engines.segment import rle
from engines.segment.types import Segmenter
from pipelines.compute import ComputeBudget, ModelClaim, Priority
from pipelines.frames import DeferredImage, as_rgb
from pipelines.graph.engines import EngineKey


@dataclass(frozen=True, slots=True)
class SegmentSettings:
    # A track gets a new mask when the IoU of its box with the box of its last mask falls below this.
    reseg_iou: float = 0.8
    max_per_frame: int = 4  # masks computed for one frame at most; the rest wait (counted)
    every_frame_classes: frozenset[str] = field(default_factory=frozenset)  # segmented on every frame

    def __post_init__(self) -> None:
        if not 0.0 < self.reseg_iou <= 1.0:
            raise ValueError(f"reseg_iou must be in (0, 1], got {self.reseg_iou}")
        if self.max_per_frame < 1:
            raise ValueError(f"max_per_frame must be >= 1, got {self.max_per_frame}")


SEGMENTER = "segmenter"  # its name in the compute budget


def segmenter_claim(threads: int) -> ModelClaim:
    """The segmenter's place in a compute budget: bulk work beside the detector, all its threads."""
    return ModelClaim(Priority.BULK, threads=threads)


class SegmentEngine:
    """Runs the shared segmenter on one thread of its own: calls from every stream queue there,
    never on the event loop and never beside each other (one model, one set of buffers)."""

    def __init__(
        self, segmenter: Segmenter, settings: SegmentSettings | None = None, *, compute: ComputeBudget | None = None
    ) -> None:
        self.segmenter = segmenter
        self.settings = settings or SegmentSettings()
        self.compute = compute  # each call waits for its threads in the machine's compute budget
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="segment")

    @property
    def name(self) -> str:
        return f"{self.segmenter.kind}/{self.segmenter.backend}"

    async def masks(self, image: np.ndarray | DeferredImage, boxes: np.ndarray) -> list[rle.Rle | None]:
        """One COCO RLE (compact counts) per box, or None where the model found nothing."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self._masks, image, boxes)

    def _masks(self, image: np.ndarray | DeferredImage, boxes: np.ndarray) -> list[rle.Rle | None]:
        turn = self.compute.turn(SEGMENTER) if self.compute is not None else contextlib.nullcontext()
        with turn:
            # A predicted frame's picture is converted here, off the event loop.
            masks = self.segmenter.segment(as_rgb(image), boxes)
        # Encoding here too keeps the event loop free of per-pixel work.
        return [None if m is None else rle.encode(m) for m in masks]

    def close(self) -> None:
        self._executor.shutdown(wait=True, cancel_futures=True)
        self.segmenter.close()


SEGMENTATION: EngineKey[SegmentEngine] = EngineKey("segmentation")  # the engine in SharedEngines
