"""One detector shared by every stream, fed through a cross-stream batcher.

Each stream has at most one frame in flight, so the queue is bounded by the number of
streams. When the model is free the batcher takes the frames that are ready, up to the
model's batch limit, and runs them in one call on its own inference thread. Streams that
just got their results back need a moment to track, publish and submit their next frame,
so while fewer frames are queued than streams are registered the batcher waits for them,
but never longer than `gather_window_s`: a paused camera costs the others at most that.
Without the window, four streams settle into alternating batches of two.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterator, Sequence
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


DEFAULT_GATHER_WINDOW_S = 0.005


class DetectionBatcher:
    def __init__(
        self,
        detector: BatchDetector,
        *,
        max_batch: int | None = None,
        gather_window_s: float = DEFAULT_GATHER_WINDOW_S,
    ) -> None:
        self.detector = detector
        self.max_batch = max(1, min(max_batch or detector.max_batch, detector.max_batch))
        self.gather_window_s = gather_window_s
        self._clients = 0
        self._arrived = asyncio.Event()
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

    @contextlib.contextmanager
    def client(self) -> Iterator[None]:
        """Register a stream for the lifetime of its frame loop (sizes the gather window's wait)."""
        self._clients += 1
        try:
            yield
        finally:
            self._clients -= 1

    async def detect(self, image: np.ndarray) -> DetectionOutcome:
        """Detect on one RGB frame. Raises the engine's error if the model call failed."""
        if self._runner is None:
            raise RuntimeError("DetectionBatcher.start() was not called")
        future: asyncio.Future[DetectionOutcome] = asyncio.get_running_loop().create_future()
        self._pending.put_nowait((image, future))
        self._arrived.set()
        return await future

    async def _gather(self) -> list[tuple[np.ndarray, asyncio.Future[DetectionOutcome]]]:
        batch = [await self._pending.get()]
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.gather_window_s
        while len(batch) < self.max_batch:
            if not self._pending.empty():
                batch.append(self._pending.get_nowait())
                continue
            remaining = deadline - loop.time()
            if len(batch) >= self._clients or remaining <= 0:
                break
            self._arrived.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._arrived.wait(), remaining)
        return batch

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            batch = await self._gather()
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
