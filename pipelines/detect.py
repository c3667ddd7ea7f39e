"""One detector shared by every stream, fed through a cross-stream batcher.

Each stream has at most one frame in flight, so the queue is bounded by the number of
streams. The batcher never waits for a batch to fill: it takes whatever frames are ready
when the model is free (a paused camera can never hold the others back), up to the
model's batch limit, and runs them in one call on its own inference thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from engines.types import Detections, ModelInfo

log = logging.getLogger(__name__)


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
    started_at: float  # wall clock when that model call began


@dataclass(slots=True)
class BatcherStats:
    calls: int = 0
    frames: int = 0
    failures: int = 0
    busy_s: float = 0.0


class DetectionBatcher:
    def __init__(self, detector: BatchDetector, *, max_batch: int | None = None) -> None:
        self.detector = detector
        self.max_batch = max(1, min(max_batch or detector.max_batch, detector.max_batch))
        self._pending: asyncio.Queue[tuple[np.ndarray, asyncio.Future[DetectionOutcome]]] = asyncio.Queue()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="vidsentry-infer")
        self._runner: asyncio.Task[None] | None = None
        self.stats = BatcherStats()

    async def __aenter__(self) -> DetectionBatcher:
        self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def start(self) -> None:
        if self._runner is None:
            self._runner = asyncio.create_task(self._run(), name="detection-batcher")

    async def detect(self, image: np.ndarray) -> DetectionOutcome:
        """Detect on one RGB frame. Raises the engine's error if the model call failed."""
        if self._runner is None:
            raise RuntimeError("DetectionBatcher.start() was not called")
        future: asyncio.Future[DetectionOutcome] = asyncio.get_running_loop().create_future()
        self._pending.put_nowait((image, future))
        return await future

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            batch = [await self._pending.get()]
            while len(batch) < self.max_batch and not self._pending.empty():
                batch.append(self._pending.get_nowait())
            live = [(img, fut) for img, fut in batch if not fut.cancelled()]
            if not live:
                continue
            images = [img for img, _ in live]
            started_wall = time.time()
            started = time.perf_counter()
            try:
                results = await loop.run_in_executor(self._executor, self.detector.detect, images)
            except asyncio.CancelledError:
                for _, fut in live:
                    fut.cancel()
                raise
            except Exception as exc:  # the engine failed: fail these frames, keep serving
                self.stats.failures += 1
                log.warning("detector call failed", extra={"error": repr(exc), "batch": len(images)})
                for _, fut in live:
                    if not fut.done():
                        fut.set_exception(exc)
                continue
            elapsed_ms = (time.perf_counter() - started) * 1000
            self.stats.calls += 1
            self.stats.frames += len(images)
            self.stats.busy_s += elapsed_ms / 1000
            for (_, fut), dets in zip(live, results, strict=True):
                if not fut.done():
                    fut.set_result(DetectionOutcome(dets, elapsed_ms, len(images), started_wall))

    async def aclose(self) -> None:
        if self._runner is not None:
            self._runner.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._runner
            self._runner = None
        while not self._pending.empty():
            _, fut = self._pending.get_nowait()
            fut.cancel()
        # Wait for an in-flight model call so the engine is not closed under it.
        await asyncio.get_running_loop().run_in_executor(None, self._executor.shutdown, True)
