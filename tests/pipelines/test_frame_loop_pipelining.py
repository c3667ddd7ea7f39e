"""Frames in flight: the detection loop keeps the model busy with the next frames while it
handles one, and still handles results strictly in frame order, failures included.

The detector here is a plain object with a sleep for a model; the batcher, mailbox, tracker and
loop are the real ones. Overlap is proven by the calls the detector sees running at once, not by
how long the run took (a loaded machine says nothing about that).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Sequence

import numpy as np

from engines.types import Detections, ModelInfo
from pipelines.detect import DetectionBatcher
from pipelines.events import Event, EventKind
from pipelines.frame_loop import FrameLoop
from pipelines.frames import VideoFrame
from pipelines.mailbox import FrameMailbox

FRAMES = 24
MODEL_S = 0.02


class SlowDetector:
    """Takes MODEL_S per call; the frame whose first pixel is 255 makes it raise."""

    backend = "test"
    max_batch = 1

    def __init__(self, workers: int) -> None:
        self.info = ModelInfo(path="/models/slow.onnx", names={0: "person"}, imgsz=(32, 32))
        self.workers = workers
        self.running = 0
        self.most_at_once = 0
        self._lock = threading.Lock()
        # Set once `workers` calls run together: until then a call waits for its partner, so the
        # overlap is seen however slowly this machine hands frames to the model.
        self.overlapped = threading.Event()

    def detect(self, images: Sequence[np.ndarray]) -> list[Detections]:
        with self._lock:
            self.running += 1
            self.most_at_once = max(self.most_at_once, self.running)
            if self.running >= self.workers:
                self.overlapped.set()
        try:
            if self.workers > 1:
                self.overlapped.wait(10)  # bounded: a loop that never overlaps fails most_at_once
            time.sleep(MODEL_S)
            if images[0][0, 0, 0] == 255:
                raise ValueError("bad frame")
            box = np.array([[1, 1, 9, 9]], np.float32)
            return [Detections(box, np.array([0.9], np.float32), np.array([0], np.int32)) for _ in images]
        finally:
            with self._lock:
                self.running -= 1


class Collect:
    def __init__(self) -> None:
        self.events: list[Event] = []

    async def publish(self, event: Event) -> None:
        await asyncio.sleep(0.005)  # publishing takes a while too: the model must not wait for it
        self.events.append(event)


async def run_loop(workers: int, *, bad: int | None = None) -> tuple[SlowDetector, Collect, FrameLoop]:
    detector = SlowDetector(workers)
    sink = Collect()
    mailbox = FrameMailbox(blocking=True)  # a file: every frame reaches the loop

    def feed() -> None:
        for seq in range(FRAMES):
            image = np.zeros((16, 16, 3), np.uint8)
            if seq == bad:
                image[0, 0, 0] = 255
            mailbox.put(VideoFrame("s1", seq, seq * 0.1, time.time(), image), timeout=10)
        mailbox.close()

    async with DetectionBatcher(detector) as batcher:
        loop = FrameLoop("s1", mailbox, batcher, sink)
        feeder = threading.Thread(target=feed)
        feeder.start()
        await asyncio.wait_for(loop.run(), 30)
        feeder.join(5)
    return detector, sink, loop


def seqs(sink: Collect) -> list[int]:
    return [e.data["frame_seq"] for e in sink.events if e.kind is EventKind.DETECTIONS]


async def test_two_workers_run_frames_side_by_side_and_results_stay_in_order() -> None:
    one, _, _ = await run_loop(1)
    two, sink, loop = await run_loop(2)
    assert one.most_at_once == 1
    assert two.most_at_once == 2
    assert seqs(sink) == list(range(FRAMES))
    assert loop.stats.frames_processed == FRAMES
    # Two calls ran at once (most_at_once) and results still came out in frame order: that is the
    # pipelining. What it gains in wall-clock time is a bench figure, not a test's.
    # One track, seen on every frame, in order: a single `new` and no early end.
    kinds = [e.data["event"] for e in sink.events if e.kind is EventKind.TRACKS]
    assert kinds.count("new") == 1


async def test_a_failed_frame_is_counted_and_the_frames_around_it_keep_their_order() -> None:
    _, sink, loop = await run_loop(2, bad=5)
    assert seqs(sink) == [s for s in range(FRAMES) if s != 5]
    assert loop.stats.frames_failed == 1
    assert loop.stats.frames_processed == FRAMES - 1
