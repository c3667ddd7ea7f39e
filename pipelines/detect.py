"""One detector shared by every stream, fed through a cross-stream batcher.

Each stream has at most one frame in flight, so the queue is bounded by the number of
streams. When the model is free the batcher takes the frames that are ready, up to the
model's batch limit, and runs them in one call on its own inference thread. Streams that
just got their results back need a moment to track, publish and submit their next frame,
so while fewer frames are queued than streams are registered the batcher waits for them,
but never longer than `gather_window_s`: a paused camera costs the others at most that.
Without the window, four streams settle into alternating batches of two.

The batcher is supervised: if its runner task ends for any reason other than `aclose()`, if
the engine breaks its contract (not one result per frame), or if `max_consecutive_failures`
model calls in a row raise, the batcher is dead. It logs why once, `alive` turns False,
`failure` holds a one-line reason, and every frame waiting and every later `detect()` fails at
once with `DetectorFailed` instead of hanging. A model call that raises below that threshold
fails only its frames, with the engine's error. Frames waiting are capped at `max_pending`;
past it `detect()` raises `BatcherFull` at once rather than queue without bound.
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
    failures: int = 0  # model calls that raised
    busy_s: float = 0.0
    rejected: int = 0  # detect() calls refused with BatcherFull


class DetectorFailed(RuntimeError):
    """The shared detector is unusable (crashed, broken engine, or closed); `reason` says why.

    Not transient: every later `detect()` raises it too.
    """

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class BatcherFull(RuntimeError):
    """`max_pending` frames are already waiting; this one was refused, not queued."""


DEFAULT_GATHER_WINDOW_S = 0.005
# Each stream has at most one frame waiting, so the queue holds at most one frame per stream
# and 256 is far above the streams one node runs. Reaching it means a caller broke that
# contract (submitting without awaiting); refusing then keeps memory (256 1080p RGB frames are
# ~1.6 GB) and latency bounded instead of growing until the process is killed.
DEFAULT_MAX_PENDING = 256
# Model calls in a row that may raise before the engine is declared broken: enough that a few
# bad frames do not take every stream down, few enough that a dead engine is noticed in seconds.
DEFAULT_MAX_CONSECUTIVE_FAILURES = 5

_Pending = tuple[np.ndarray, asyncio.Future[DetectionOutcome]]


class DetectionBatcher:
    def __init__(
        self,
        detector: BatchDetector,
        *,
        max_batch: int | None = None,
        gather_window_s: float = DEFAULT_GATHER_WINDOW_S,
        max_pending: int = DEFAULT_MAX_PENDING,
        max_consecutive_failures: int = DEFAULT_MAX_CONSECUTIVE_FAILURES,
    ) -> None:
        if max_pending < 1:
            raise ValueError(f"max_pending must be at least 1, got {max_pending}")
        if max_consecutive_failures < 1:
            raise ValueError(f"max_consecutive_failures must be at least 1, got {max_consecutive_failures}")
        self.detector = detector
        self.max_batch = max(1, min(max_batch or detector.max_batch, detector.max_batch))
        self.gather_window_s = gather_window_s
        self.max_pending = max_pending
        self.max_consecutive_failures = max_consecutive_failures
        self._clients = 0
        self._arrived = asyncio.Event()
        self._pending: asyncio.Queue[_Pending] = asyncio.Queue(maxsize=max_pending)
        # Every future a detect() call awaits until it resolves, wherever it is (queued, gathered
        # into a batch, in the model call), so dying or closing can resolve them all.
        self._waiting: set[asyncio.Future[DetectionOutcome]] = set()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="vidsentry-infer")
        self._runner: asyncio.Task[None] | None = None
        self._closed = False
        self._failure: str | None = None
        self._consecutive_failures = 0
        self.stats = BatcherStats()

    async def __aenter__(self) -> DetectionBatcher:
        self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    @property
    def alive(self) -> bool:
        """Started, and neither dead nor closed: `detect()` calls are being served."""
        return self._runner is not None and self._failure is None and not self._closed

    @property
    def failure(self) -> str | None:
        """Why the batcher died (one line, for users), or None while it has not."""
        return self._failure

    @property
    def pending(self) -> int:
        """Frames queued and not yet gathered into a batch."""
        return self._pending.qsize()

    def start(self) -> None:
        if self._closed:
            raise RuntimeError("DetectionBatcher was closed; it cannot be started again")
        if self._runner is None:
            self._runner = asyncio.create_task(self._run(), name="detection-batcher")
            self._runner.add_done_callback(self._runner_done)

    @contextlib.contextmanager
    def client(self) -> Iterator[None]:
        """Register a stream for the lifetime of its frame loop (sizes the gather window's wait)."""
        self._clients += 1
        try:
            yield
        finally:
            self._clients -= 1

    async def detect(self, image: np.ndarray) -> DetectionOutcome:
        """Detect on one RGB frame.

        Raises the engine's error if the model call failed, `DetectorFailed` if the batcher is
        dead or closed (at once, or while waiting if it dies then), and `BatcherFull` if
        `max_pending` frames are already waiting.
        """
        if self._failure is not None:
            raise DetectorFailed(self._failure)
        if self._closed:
            raise DetectorFailed("detector is closed")
        if self._runner is None:
            raise RuntimeError("DetectionBatcher.start() was not called")
        future: asyncio.Future[DetectionOutcome] = asyncio.get_running_loop().create_future()
        try:
            self._pending.put_nowait((image, future))
        except asyncio.QueueFull:
            self.stats.rejected += 1
            raise BatcherFull(f"{self.max_pending} frames are already waiting for the detector") from None
        self._waiting.add(future)
        future.add_done_callback(self._waiting.discard)
        self._arrived.set()
        return await future

    async def _gather(self) -> list[_Pending]:
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
        """Serve batches until cancelled by aclose() or the engine is found broken (then return dead).

        Futures still unresolved when it ends are resolved by aclose() or _die(), not here.
        """
        loop = asyncio.get_running_loop()
        while True:
            batch = await self._gather()
            live = [(img, fut) for img, fut in batch if not fut.done()]
            if not live:
                continue
            images = [img for img, _ in live]
            started_wall = time.time()
            started = time.perf_counter()
            try:
                results = await loop.run_in_executor(self._executor, self.detector.detect, images)
            except Exception as exc:  # the engine failed: fail these frames, keep serving
                self.stats.failures += 1
                self._consecutive_failures += 1
                log.warning("detector call failed", extra={"error": repr(exc), "batch": len(images)})
                for _, fut in live:
                    if not fut.done():
                        fut.set_exception(exc)
                if self._consecutive_failures >= self.max_consecutive_failures:
                    self._die(
                        f"detector failed {self._consecutive_failures} model calls in a row; "
                        f"last error: {_describe(exc)}",
                        exc,
                    )
                    return
                continue
            if not isinstance(results, list) or len(results) != len(images):
                got = f"{len(results)} results" if isinstance(results, list) else f"a {type(results).__name__}"
                self._die(f"detector engine is broken: backend returned {got} for {len(images)} frames")
                return
            self._consecutive_failures = 0
            elapsed_ms = (time.perf_counter() - started) * 1000
            self.stats.calls += 1
            self.stats.frames += len(images)
            self.stats.busy_s += elapsed_ms / 1000
            for (_, fut), dets in zip(live, results, strict=True):
                if not fut.done():
                    fut.set_result(DetectionOutcome(dets, elapsed_ms, len(images), started_wall))

    def _runner_done(self, task: asyncio.Task[None]) -> None:
        if task.cancelled():
            if not self._closed:
                self._die("detector batcher was cancelled")
            return
        exc = task.exception()  # retrieving it also keeps asyncio from logging it again
        if exc is not None:
            self._die(f"detector batcher crashed: {_describe(exc)}", exc)
        elif not self._closed:
            self._die("detector batcher stopped")  # no-op after _run returned through _die

    def _die(self, reason: str, exc: BaseException | None = None) -> None:
        """Mark the batcher dead (once) and fail everything waiting with DetectorFailed(reason)."""
        if self._failure is not None:
            return
        self._failure = reason
        log.error("detector batcher is dead: %s", reason, exc_info=exc, extra={"reason": reason})
        self._drain_queue()
        for fut in list(self._waiting):
            if not fut.done():
                fut.set_exception(DetectorFailed(reason))

    def _drain_queue(self) -> None:
        while not self._pending.empty():
            self._pending.get_nowait()

    async def aclose(self) -> None:
        self._closed = True
        runner, self._runner = self._runner, None
        if runner is not None and not runner.done():
            runner.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await runner
        # Frames still waiting (queued, gathered, or in the interrupted model call) are cancelled.
        self._drain_queue()
        for fut in list(self._waiting):
            fut.cancel()
        # Wait for an in-flight model call so the engine is not closed under it.
        await asyncio.get_running_loop().run_in_executor(None, self._executor.shutdown, True)


def _describe(exc: BaseException) -> str:
    text = str(exc).splitlines()[0].strip() if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
