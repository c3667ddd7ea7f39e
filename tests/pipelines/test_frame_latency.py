"""Latency is a duration: it is measured on the monotonic clock, so a step of the wall clock (NTP, an
operator) between a frame's capture and its event moves no latency figure, while the event still
carries the wall-clock `captured_at` the wire has always had."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

import numpy as np
import pytest

from engines.types import Detections, ModelInfo
from pipelines.detect import DetectionBatcher
from pipelines.frame_loop import FrameLoop
from pipelines.frames import FrameResult, VideoFrame
from pipelines.mailbox import FrameMailbox
from tests.support.sinks import ListSink


class SteppedClock:
    """The system's clocks, with a wall clock a test can step."""

    def __init__(self) -> None:
        self.wall_step_s = 0.0

    def wall(self) -> float:
        return time.time() + self.wall_step_s

    def monotonic(self) -> float:
        return time.monotonic()


class OneBox:
    backend = "test"
    max_batch = 1

    def __init__(self) -> None:
        self.info = ModelInfo(path="/models/one.onnx", names={0: "person"}, imgsz=(32, 32))

    def detect(self, images: Sequence[np.ndarray]) -> list[Detections]:
        box = np.array([[1, 1, 9, 9]], np.float32)
        return [Detections(box, np.array([0.9], np.float32), np.array([0], np.int32)) for _ in images]


@pytest.mark.parametrize("step_s", [3600.0, -3600.0])
async def test_a_wall_clock_step_after_capture_is_not_latency(step_s: float) -> None:
    clock = SteppedClock()
    mailbox = FrameMailbox(blocking=True)
    frames = [
        VideoFrame("cam", seq, seq / 10, clock.wall(), np.zeros((16, 16, 3), np.uint8), captured_mono=clock.monotonic())
        for seq in range(3)
    ]
    clock.wall_step_s = step_s  # the wall clock jumps after capture, before the events go out
    seen: list[float] = []
    sink = ListSink()

    def feed() -> None:
        for frame in frames:
            mailbox.put(frame, timeout=10)
        mailbox.close()

    def on_frame(_result: FrameResult, latency_ms: float) -> None:
        seen.append(latency_ms)

    async with DetectionBatcher(OneBox()) as batcher:
        loop = FrameLoop("cam", mailbox, batcher, sink, on_frame=on_frame, system_clock=clock)
        feeder = threading.Thread(target=feed)
        feeder.start()
        try:
            await loop.run()
        finally:
            feeder.join(10)
    assert len(seen) == len(frames) and list(loop.stats.latency_ms) == seen
    assert all(0 <= ms < 5_000 for ms in seen), seen  # an hour's step would read as ±3,600,000 ms
    assert all(0 <= ms < 5_000 for ms in loop.stats.wait_ms)
    captured = sorted(event.captured_at for event in sink.events)
    assert captured[0] == frames[0].captured_at  # the wire keeps the wall-clock stamp, unstepped
