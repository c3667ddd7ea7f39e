"""The compute budget: thread slots, captions first, detection never starved, background last."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest

from engines.cpu_grant import granted_threads
from pipelines.compute import ComputeBudget, Grant, ModelClaim, Priority

DETECTOR = ModelClaim(Priority.BULK, threads=1, max_threads=2)
RECOGNIZER = ModelClaim(Priority.CRITICAL, threads=1)


def budget(**kwargs: float) -> ComputeBudget:
    return ComputeBudget(2, {"detector": DETECTOR, "recognizer": RECOGNIZER}, **kwargs)


def busy(budget: ComputeBudget, name: str, seconds: float, until: float, peak: list[int] | None = None) -> None:
    while time.perf_counter() < until:
        with budget.turn(name):
            if peak is not None:
                peak.append(budget.threads_in_use())
            time.sleep(seconds)


def run_all(*targets: Callable[[], None]) -> None:
    threads = [threading.Thread(target=target) for target in targets]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10.0)


def test_a_model_alone_never_waits_and_gets_every_core() -> None:
    shares = budget()
    seen: list[int | None] = []
    until = time.perf_counter() + 0.1
    while time.perf_counter() < until:
        with shares.turn("detector") as threads:
            seen.append(granted_threads())
            assert threads == 2
            time.sleep(0.002)
    assert shares.stats["detector"].turns > 10 and shares.stats["detector"].waited == 0
    assert set(seen) == {2} and granted_threads() is None  # the engine is told, and only inside the call


def test_calls_never_hold_more_threads_than_the_budget_has() -> None:
    shares = budget(reserve_hold_s=0.0)
    peak: list[int] = []
    until = time.perf_counter() + 0.6
    run_all(
        lambda: busy(shares, "detector", 0.004, until, peak),
        lambda: busy(shares, "detector", 0.004, until, peak),
        lambda: busy(shares, "recognizer", 0.01, until, peak),
        lambda: busy(shares, "recognizer", 0.01, until, peak),
    )
    assert peak and max(peak) <= 2
    assert shares.stats["detector"].wide > 0  # granted both threads when they were free


def test_the_recognizer_goes_before_a_waiting_detector_call() -> None:
    shares = budget()
    order: list[str] = []
    inside, release = threading.Event(), threading.Event()

    def wide_detector_call() -> None:
        with shares.turn("detector") as threads:
            order.append(f"detector {threads}")
            inside.set()
            release.wait(5.0)

    def call(name: str) -> None:
        with shares.turn(name):
            order.append(name)

    first = threading.Thread(target=wide_detector_call)
    first.start()
    assert inside.wait(5.0)
    detector = threading.Thread(target=call, args=("detector",))
    detector.start()
    time.sleep(0.05)
    recognizer = threading.Thread(target=call, args=("recognizer",))
    recognizer.start()
    time.sleep(0.05)
    assert order == ["detector 2"]  # both cores are held by the wide call
    release.set()
    run_all()
    for thread in (first, detector, recognizer):
        thread.join(5.0)
    assert order == ["detector 2", "recognizer", "detector"]


def test_an_active_recognizer_keeps_a_core_free_and_the_detector_gets_it_back() -> None:
    shares = budget(reserve_hold_s=0.3)
    with shares.turn("recognizer"):
        pass
    # Within the hold the detector runs narrow, one call at a time: a core waits for the recognizer.
    with shares.turn("detector") as threads:
        assert threads == 1
        got: list[int] = []
        started = time.perf_counter()
        other = threading.Thread(target=lambda: got.append(_one_turn(shares, "detector")))
        other.start()
        time.sleep(0.05)
        assert not got  # the second detector call may not take the reserved core
        with shares.turn("recognizer") as recognizer_threads:  # ... which the recognizer gets at once
            assert recognizer_threads == 1
            assert time.perf_counter() - started < 0.2
    other.join(5.0)
    assert got == [1]  # the recognizer was active a moment ago: narrow still
    time.sleep(0.35)  # the recognizer has been quiet for longer than the hold
    with shares.turn("detector") as threads:
        assert threads == 2


def _one_turn(shares: ComputeBudget, name: str) -> int:
    with shares.turn(name) as threads:
        return threads


def test_a_recognizer_flood_leaves_the_detector_its_bound() -> None:
    shares = budget(critical_max_share=0.6, half_life_s=0.5)
    until = time.perf_counter() + 1.5
    # Two streams of decodes always waiting against a detector that always has a frame.
    run_all(
        lambda: busy(shares, "recognizer", 0.02, until),
        lambda: busy(shares, "recognizer", 0.02, until),
        lambda: busy(shares, "detector", 0.01, until),
    )
    detector, recognizer = shares.stats["detector"].thread_s, shares.stats["recognizer"].thread_s
    share = recognizer / (detector + recognizer)
    assert 0.45 < share < 0.85, share  # unbounded, the two decode streams would hold both cores (share 1.0)
    assert shares.stats["detector"].turns > 10


def test_a_kept_core_means_the_recognizer_is_never_held_back() -> None:
    shares = budget(reserve_hold_s=0.6)
    until = time.perf_counter() + 1.0
    recognizer_waits: list[float] = []

    def paced_recognizer() -> None:  # one stream: a 40 ms decode every 100 ms
        while time.perf_counter() < until:
            asked = time.perf_counter()
            with shares.turn("recognizer"):
                recognizer_waits.append(time.perf_counter() - asked)
                time.sleep(0.04)
            time.sleep(0.06)

    run_all(
        paced_recognizer,
        lambda: busy(shares, "detector", 0.1, until),
        lambda: busy(shares, "detector", 0.1, until),
    )
    assert max(recognizer_waits) < 0.05  # a core was kept for it: it never waited for a detector call
    assert shares.busy_shares()["recognizer"] > 0


def test_background_work_runs_when_nobody_waits_or_once_its_patience_is_out() -> None:
    shares = budget(background_patience_s=0.2)
    shares.add("encoder", ModelClaim(Priority.BACKGROUND))
    assert _one_turn(shares, "encoder") == 1
    until = time.perf_counter() + 0.8
    waited: list[float] = []

    def encoder() -> None:
        time.sleep(0.1)
        asked = time.perf_counter()
        _one_turn(shares, "encoder")
        waited.append(time.perf_counter() - asked)

    run_all(
        encoder,
        lambda: busy(shares, "detector", 0.02, until),
        lambda: busy(shares, "detector", 0.02, until),
        lambda: busy(shares, "detector", 0.02, until),
    )
    assert waited and 0.15 < waited[0] < 0.5  # held back behind the waiting detector calls, not forever
    assert shares.short() is False


def test_claims_are_checked_and_capped_to_the_cores() -> None:
    with pytest.raises(KeyError, match="no compute claim"), budget().turn("other"):
        pass
    with pytest.raises(ValueError, match="at least one thread"):
        ModelClaim(threads=0)
    with pytest.raises(ValueError, match="below threads"):
        ModelClaim(threads=2, max_threads=1)
    with pytest.raises(ValueError, match="critical_max_share"):
        ComputeBudget(2, critical_max_share=0)
    wide = ComputeBudget(2, {"segmenter": ModelClaim(threads=8)})
    assert wide.models["segmenter"].threads == 2
    assert _one_turn(wide, "segmenter") == 2


async def test_an_event_loop_waits_for_threads_without_blocking_and_in_the_order_it_asked() -> None:
    import asyncio

    shares = ComputeBudget(1, {"detector": ModelClaim(), "recognizer": RECOGNIZER})
    held = shares.acquire("recognizer")
    order: list[str] = []

    async def stream(name: str) -> None:
        grant = await shares.acquire_async("detector")
        order.append(name)
        await asyncio.sleep(0.01)
        shares.release(grant)

    first = asyncio.create_task(stream("a"))
    await asyncio.sleep(0.02)
    second = asyncio.create_task(stream("b"))
    await asyncio.sleep(0.05)
    ticks = 0
    while ticks < 5:  # the loop runs on while they wait
        await asyncio.sleep(0.001)
        ticks += 1
    assert order == [] and shares.short()
    await asyncio.to_thread(shares.release, held)
    await asyncio.wait_for(asyncio.gather(first, second), 5)
    assert order == ["a", "b"]  # streams waiting for the detector are served in the order they asked
    # A wait that is cancelled holds nothing and blocks nobody.
    held = shares.acquire("recognizer")
    waiting = asyncio.create_task(shares.acquire_async("detector"))
    await asyncio.sleep(0.02)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    shares.release(held)
    assert not shares.short() and shares.threads_in_use() == 0
    assert _one_turn(shares, "recognizer") == 1


async def test_a_stream_served_longest_ago_goes_first_whenever_it_asked() -> None:
    # The detector's streams ask once a frame has arrived: a 15 fps stream is back in line sooner
    # than a 10 fps one after every turn. Ranked by when each was last served, they alternate.
    import asyncio

    shares = ComputeBudget(1, {"detector": ModelClaim(), "recognizer": RECOGNIZER})
    fast = await shares.acquire_async("detector")
    shares.release(fast)
    slow = await shares.acquire_async("detector", last_served=fast.started - 1.0)
    shares.release(slow)
    held = shares.acquire("recognizer")
    order: list[str] = []

    async def stream(name: str, last: Grant) -> None:
        grant = await shares.acquire_async("detector", last_served=last.started)
        order.append(name)
        shares.release(grant)

    fast_again = asyncio.create_task(stream("fast", slow))  # served last, asks first
    await asyncio.sleep(0.02)
    slow_again = asyncio.create_task(stream("slow", fast))  # served before it, asks later
    await asyncio.sleep(0.02)
    await asyncio.to_thread(shares.release, held)
    await asyncio.wait_for(asyncio.gather(fast_again, slow_again), 5)
    assert order == ["slow", "fast"]
