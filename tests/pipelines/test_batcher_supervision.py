"""The batcher's supervision, engine contract checks and queue bound, on tiny fake engines.

Every wait is under `asyncio.timeout`, so a batcher that strands its callers fails the test
instead of hanging it.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Sequence

import numpy as np
import pytest

from engines.types import Detections, ModelInfo
from pipelines.detect import BatcherFull, DetectionBatcher, DetectorFailed
from pipelines.graph.engines import SharedEngines
from tests.support.waiting import wait_until

IMAGE = np.zeros((8, 8, 3), np.uint8)
PROMPT_S = 2.0  # everything here should take milliseconds; this only turns a hang into a failure


class FakeDetector:
    """Satisfies BatchDetector; `respond` decides what each model call returns or raises."""

    info = ModelInfo(path="models/fake.onnx", names={0: "person"}, imgsz=(64, 64))
    backend = "fake"

    def __init__(self, respond: Callable[[Sequence[np.ndarray]], object], max_batch: int = 4) -> None:
        self.respond = respond
        self.max_batch = max_batch
        self.calls = 0

    def detect(self, images: Sequence[np.ndarray]) -> list[Detections]:
        self.calls += 1
        return self.respond(images)  # type: ignore[return-value]  # wrong types are the point


def one_each(images: Sequence[np.ndarray]) -> list[Detections]:
    return [Detections.empty() for _ in images]


class Gate:
    """Holds the first model call in the inference thread until released (so frames queue behind it)."""

    def __init__(self, then: Callable[[Sequence[np.ndarray]], object] = one_each) -> None:
        self.then = then
        self.entered = threading.Event()
        self.release = threading.Event()
        self.finished = threading.Event()

    def __call__(self, images: Sequence[np.ndarray]) -> object:
        if not self.entered.is_set():
            self.entered.set()
            self.release.wait(PROMPT_S * 5)
            self.finished.set()
        return self.then(images)

    async def wait_entered(self) -> None:
        assert await asyncio.to_thread(self.entered.wait, PROMPT_S), "the model was never called"


def script(*steps: Exception | None) -> Callable[[Sequence[np.ndarray]], list[Detections]]:
    """A model whose n-th call raises steps[n], or succeeds where it is None."""
    it = iter(steps)

    def respond(images: Sequence[np.ndarray]) -> list[Detections]:
        step = next(it)
        if step is not None:
            raise step
        return one_each(images)

    return respond


async def test_wrong_result_count_kills_the_batcher_and_fails_every_waiter(caplog: pytest.LogCaptureFixture) -> None:
    gate = Gate(then=lambda images: [Detections.empty()] * (len(images) + 1))
    detector = FakeDetector(gate)
    async with DetectionBatcher(detector, max_batch=1) as batcher:
        assert batcher.alive and batcher.failure is None
        in_flight = asyncio.create_task(batcher.detect(IMAGE))
        await gate.wait_entered()
        queued = [asyncio.create_task(batcher.detect(IMAGE)) for _ in range(3)]
        await asyncio.sleep(0)
        assert batcher.pending == 3
        gate.release.set()
        async with asyncio.timeout(PROMPT_S):
            outcomes = await asyncio.gather(in_flight, *queued, return_exceptions=True)
        assert all(isinstance(o, DetectorFailed) for o in outcomes), outcomes
        assert not batcher.alive
        assert batcher.failure == "detector engine is broken: backend returned 2 results for 1 frames"
        assert all(o.reason == batcher.failure for o in outcomes if isinstance(o, DetectorFailed))
        assert batcher.pending == 0
        async with asyncio.timeout(PROMPT_S):  # later calls fail at once, without queuing
            with pytest.raises(DetectorFailed, match="2 results for 1 frames"):
                await batcher.detect(IMAGE)
        assert detector.calls == 1
    dead_logs = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(dead_logs) == 1 and str(batcher.failure) in dead_logs[0].getMessage()


async def test_a_non_list_result_is_a_broken_engine() -> None:
    async with DetectionBatcher(FakeDetector(lambda images: tuple(one_each(images)))) as batcher:
        async with asyncio.timeout(PROMPT_S):
            with pytest.raises(DetectorFailed, match="backend returned a tuple for 1 frames"):
                await batcher.detect(IMAGE)
        assert not batcher.alive


async def test_a_crashed_runner_fails_waiters_with_the_reason_and_logs_the_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    batcher = DetectionBatcher(FakeDetector(one_each))

    async def broken_gather() -> list[tuple[np.ndarray, asyncio.Future[object]]]:
        await batcher._pending.get()
        raise KeyError("bug in the batcher")

    batcher._gather = broken_gather  # type: ignore[assignment,method-assign]
    async with batcher:
        waiters = [asyncio.create_task(batcher.detect(IMAGE)) for _ in range(2)]
        async with asyncio.timeout(PROMPT_S):
            outcomes = await asyncio.gather(*waiters, return_exceptions=True)
        assert all(isinstance(o, DetectorFailed) for o in outcomes), outcomes
        assert batcher.failure == "detector batcher crashed: KeyError: 'bug in the batcher'"
        assert not batcher.alive
        with pytest.raises(DetectorFailed, match="crashed"):
            await batcher.detect(IMAGE)
    [record] = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert record.exc_info is not None and record.exc_info[0] is KeyError


async def test_a_runner_cancelled_by_someone_else_is_dead_too() -> None:
    async with DetectionBatcher(FakeDetector(one_each)) as batcher:
        assert batcher._runner is not None
        batcher._runner.cancel()
        async with asyncio.timeout(PROMPT_S):
            with pytest.raises(DetectorFailed, match="cancelled"):
                while True:  # the death is noticed by the runner's done-callback, one loop turn later
                    await batcher.detect(IMAGE)
        assert not batcher.alive


async def test_a_backend_that_keeps_raising_goes_dead_after_the_threshold() -> None:
    detector = FakeDetector(script(*[OSError("CUDA device lost")] * 3))
    async with DetectionBatcher(detector, max_consecutive_failures=3) as batcher:
        async with asyncio.timeout(PROMPT_S):
            for _ in range(2):  # below the threshold: the engine's error, and still serving
                with pytest.raises(OSError, match="device lost"):
                    await batcher.detect(IMAGE)
                assert batcher.alive
            with pytest.raises(OSError, match="device lost"):  # the call that crosses it fails as itself
                await batcher.detect(IMAGE)
            assert not batcher.alive
            assert batcher.failure == "detector failed 3 model calls in a row; last error: OSError: CUDA device lost"
            with pytest.raises(DetectorFailed, match="3 model calls in a row"):
                await batcher.detect(IMAGE)
        assert batcher.stats.failures == 3 and detector.calls == 3


async def test_frames_waiting_behind_the_last_failure_get_detector_failed() -> None:
    gate = Gate(then=script(RuntimeError("engine gone")))
    async with DetectionBatcher(FakeDetector(gate), max_batch=1, max_consecutive_failures=1) as batcher:
        in_flight = asyncio.create_task(batcher.detect(IMAGE))
        await gate.wait_entered()
        queued = asyncio.create_task(batcher.detect(IMAGE))
        await asyncio.sleep(0)
        gate.release.set()
        async with asyncio.timeout(PROMPT_S):
            with pytest.raises(RuntimeError, match="engine gone"):
                await in_flight
            with pytest.raises(DetectorFailed, match="engine gone"):
                await queued


async def test_a_success_resets_the_failure_count() -> None:
    err = ValueError("bad frame")
    detector = FakeDetector(script(err, err, None, err, err, None, err, err))
    async with DetectionBatcher(detector, max_consecutive_failures=3) as batcher:
        async with asyncio.timeout(PROMPT_S):
            for step in range(8):
                if step in (2, 5):
                    await batcher.detect(IMAGE)
                else:
                    with pytest.raises(ValueError, match="bad frame"):
                        await batcher.detect(IMAGE)
                assert batcher.alive, step
        assert batcher.stats.failures == 6 and batcher.stats.calls == 2


async def test_detect_past_max_pending_is_refused_at_once_and_counted() -> None:
    gate = Gate()
    async with DetectionBatcher(FakeDetector(gate), max_pending=2) as batcher:
        in_flight = asyncio.create_task(batcher.detect(IMAGE))
        await gate.wait_entered()  # taken out of the queue: only queued frames count
        queued = [asyncio.create_task(batcher.detect(IMAGE)) for _ in range(2)]
        await asyncio.sleep(0)
        assert batcher.pending == 2
        for n in (1, 2):
            with pytest.raises(BatcherFull, match="2 frames are already waiting"):
                await batcher.detect(IMAGE)
            assert batcher.stats.rejected == n
        assert batcher.alive  # a full queue is back-pressure, not a failure
        gate.release.set()
        async with asyncio.timeout(PROMPT_S):
            outcomes = await asyncio.gather(in_flight, *queued)
            assert [o.batch_size for o in outcomes] == [1, 2, 2]
            await batcher.detect(IMAGE)  # room again
        assert batcher.stats.frames == 4 and batcher.stats.rejected == 2


async def test_detect_after_aclose_raises_instead_of_hanging() -> None:
    batcher = DetectionBatcher(FakeDetector(one_each))
    assert not batcher.alive
    with pytest.raises(RuntimeError, match=r"start\(\) was not called"):
        await batcher.detect(IMAGE)
    async with batcher:
        await batcher.detect(IMAGE)
    assert not batcher.alive and batcher.failure is None
    async with asyncio.timeout(PROMPT_S):
        with pytest.raises(DetectorFailed, match="detector is closed"):
            await batcher.detect(IMAGE)
    with pytest.raises(RuntimeError, match="closed"):
        batcher.start()


async def test_aclose_cancels_waiting_frames_and_waits_for_the_model_call() -> None:
    gate = Gate()
    batcher = DetectionBatcher(FakeDetector(gate), max_batch=1)
    batcher.start()
    in_flight = asyncio.create_task(batcher.detect(IMAGE))
    await gate.wait_entered()
    queued = asyncio.create_task(batcher.detect(IMAGE))
    await asyncio.sleep(0)
    asyncio.get_running_loop().call_later(0.05, gate.release.set)
    async with asyncio.timeout(PROMPT_S):
        await batcher.aclose()
    assert gate.finished.is_set()  # the engine was not left mid-call
    assert in_flight.cancelled() and queued.cancelled()


async def test_aclose_does_not_strand_a_frame_held_in_the_gather_window() -> None:
    # Two streams registered, one frame sent: the runner holds it waiting for the other stream.
    batcher = DetectionBatcher(FakeDetector(one_each), gather_window_s=30)
    batcher.start()
    with batcher.client(), batcher.client():
        held = asyncio.create_task(batcher.detect(IMAGE))
        await asyncio.sleep(0.01)
        assert batcher.pending == 0  # gathered, not yet run
        async with asyncio.timeout(PROMPT_S):
            await batcher.aclose()
        # Not `await held` under the timeout: its own cancellation would pass for the one expected.
        await asyncio.wait([held], timeout=PROMPT_S)
        assert held.cancelled()


def test_bounds_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_pending"):
        DetectionBatcher(FakeDetector(one_each), max_pending=0)
    with pytest.raises(ValueError, match="max_consecutive_failures"):
        DetectionBatcher(FakeDetector(one_each), max_consecutive_failures=0)


async def test_a_call_past_the_stuck_deadline_is_counted_once_and_fails_readiness_until_it_returns(
    caplog: pytest.LogCaptureFixture,
) -> None:
    gate = Gate()
    async with DetectionBatcher(FakeDetector(gate), max_batch=1) as batcher:
        engines = SharedEngines(detector=batcher)
        in_flight = asyncio.create_task(batcher.detect(IMAGE))
        await gate.wait_entered()
        # Running, but within the default deadline (20 s): however late this line runs, not stuck.
        assert not batcher.stuck and engines.health() == {"detector": True, "detector_responsive": True}
        batcher.stuck_after_s = 0.2  # the deadline is read at each look: the held call passes it soon
        await wait_until(lambda: batcher.stuck, PROMPT_S, "the held call to count as stuck")
        assert batcher.oldest_call_s() > 0.2
        assert engines.health() == {"detector": True, "detector_responsive": False}
        assert batcher.stats.stuck_calls == 1 and batcher.alive  # stuck is not dead: it may return
        gate.release.set()
        async with asyncio.timeout(PROMPT_S):
            await in_flight
        assert not batcher.stuck and batcher.oldest_call_s() == 0.0
        assert engines.health()["detector_responsive"] and batcher.stats.stuck_calls == 1
    said = [r.getMessage() for r in caplog.records]
    assert any("call stuck" in m for m in said) and any("was stuck has returned" in m for m in said)
