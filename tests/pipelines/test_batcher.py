"""Cross-stream batching on the real dynamic-batch model."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest

from engines.registry import create_detector
from pipelines.detect import DetectionBatcher


@pytest.fixture
async def batcher(nudenet_model: Path) -> AsyncIterator[DetectionBatcher]:
    detector = create_detector(nudenet_model, "onnx-cpu", workers=1)  # one call at a time
    async with DetectionBatcher(detector, max_batch=4) as batcher:
        yield batcher
    detector.close()


async def stream_loop(
    batcher: DetectionBatcher, image: np.ndarray, frames: int, sizes: Counter[int], work_steps: int = 1
) -> None:
    with batcher.client():
        for _ in range(frames):
            outcome = await batcher.detect(image)
            sizes[outcome.batch_size] += 1
            # Between frames a stream tracks, publishes and takes its next frame; streams
            # differ in how long that takes.
            for _ in range(work_steps):
                await asyncio.sleep(0)


async def test_four_busy_streams_share_full_batches(nudenet_model: Path) -> None:
    detector = create_detector(nudenet_model, "onnx-cpu", workers=1)
    image = np.random.default_rng(0).integers(0, 255, (240, 320, 3), dtype=np.uint8)
    sizes: Counter[int] = Counter()
    # A window far longer than the streams' steps between frames: the batch closes because all four
    # have sent (max_batch), so a stalled event loop on a loaded machine cannot split it.
    try:
        async with DetectionBatcher(detector, max_batch=4, gather_window_s=1.0) as batcher:
            await asyncio.gather(*(stream_loop(batcher, image, 12, sizes, work_steps=1 + i) for i in range(4)))
    finally:
        detector.close()
    # Without the gather window this settles into alternating batches of two.
    assert sizes[4] >= 0.75 * sum(sizes.values()), sizes
    assert batcher.stats.frames == 48


async def test_a_paused_stream_does_not_hold_the_others(batcher: DetectionBatcher) -> None:
    image = np.zeros((240, 320, 3), np.uint8)
    sizes: Counter[int] = Counter()
    with batcher.client():  # a registered camera that sends nothing (paused at a keyframe, say)
        await asyncio.wait_for(
            asyncio.gather(*(stream_loop(batcher, image, 10, sizes) for _ in range(3))), timeout=60
        )
    assert batcher.stats.frames == 30
    assert max(sizes) <= 3 and sizes[3] >= 5, sizes


async def test_engine_failure_fails_only_those_frames(batcher: DetectionBatcher) -> None:
    with pytest.raises(ValueError, match="3 channels|shape|image"):
        await batcher.detect(np.zeros((10, 10), np.uint8))  # not an RGB image
    outcome = await batcher.detect(np.zeros((64, 64, 3), np.uint8))
    assert outcome.batch_size == 1 and batcher.stats.failures == 1


async def test_two_workers_split_four_busy_streams_into_two_calls_at_once(nudenet_model: Path) -> None:
    detector = create_detector(nudenet_model, "onnx-cpu", threads=2, workers=2)
    image = np.random.default_rng(0).integers(0, 255, (240, 320, 3), dtype=np.uint8)
    sizes: Counter[int] = Counter()
    try:
        async with DetectionBatcher(detector, max_batch=4) as batcher:
            assert batcher.workers == 2 and batcher.in_flight == 3
            await asyncio.gather(*(stream_loop(batcher, image, 12, sizes, work_steps=1 + i) for i in range(4)))
            assert batcher.stats.frames == 48
    finally:
        detector.close()
    # Two calls of two beside each other, not one of four beside an idle worker.
    assert sizes[4] <= 0.25 * sum(sizes.values()), sizes
