"""The compute budget: thread slots, captions first, detection never starved, background last."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from engines.cpu_grant import granted_threads
from pipelines.compute import ComputeBudget, Grant, ModelClaim, Priority
from tests.support.clock import FakeClock
from tests.support.waiting import poll

DETECTOR = ModelClaim(Priority.BULK, threads=1, max_threads=2)
RECOGNIZER = ModelClaim(Priority.CRITICAL, threads=1)


def budget(**kwargs: Any) -> ComputeBudget:
    return ComputeBudget(2, {"detector": DETECTOR, "recognizer": RECOGNIZER}, **kwargs)


class Held:
    """One model call on its own thread that keeps its threads until `release` is set."""

    def __init__(self, shares: ComputeBudget, name: str) -> None:
        self.threads: int | None = None
        self.entered, self.release = threading.Event(), threading.Event()
        self._thread = threading.Thread(target=self._call, args=(shares, name), daemon=True)
        self._thread.start()

    def _call(self, shares: ComputeBudget, name: str) -> None:
        with shares.turn(name) as threads:
            self.threads = threads
            self.entered.set()
            self.release.wait(10.0)

    def end(self) -> None:
        self.release.set()
        self._thread.join(5.0)


def turn_soon(shares: ComputeBudget, name: str) -> int | None:
    """The threads one call of `name` is granted, or None if it was not granted within 5 s: on a
    fake clock nothing changes while it waits, so a call that must wait would wait for ever."""
    call = Held(shares, name)
    call.entered.wait(5.0)
    call.end()
    return call.threads


def waiters(shares: ComputeBudget) -> int:
    with shares._cond:
        return len(shares._waiting)


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
    shares = budget(clock=FakeClock())
    seen: list[int | None] = []

    def turns() -> None:
        for _ in range(20):
            with shares.turn("detector") as threads:
                seen.append(granted_threads())
                assert threads == 2

    # On a fake clock a call that had to wait would wait for ever: all 20 turns ending is the proof.
    run_all(turns)
    assert shares.stats["detector"].turns == 20 and shares.stats["detector"].waited == 0
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
    clock = FakeClock()
    shares = budget(reserve_hold_s=0.3, clock=clock)
    assert _one_turn(shares, "recognizer") == 1
    # Within the hold the detector runs narrow, one call at a time: a core waits for the recognizer.
    first = Held(shares, "detector")
    assert first.entered.wait(5.0) and first.threads == 1
    other = Held(shares, "detector")
    poll(lambda: waiters(shares) == 1, 5.0, "the second detector call to ask", every_s=0.005)
    time.sleep(0.05)  # it looks again every 50 ms: once more at least, on the same fake instant
    assert not other.entered.is_set()  # the second detector call may not take the reserved core
    clock.advance(0.2)  # still within the hold
    assert turn_soon(shares, "recognizer") == 1  # ... which the recognizer gets beside the first call
    assert first.threads == 1 and not first.release.is_set()
    first.end()
    assert other.entered.wait(5.0) and other.threads == 1  # the recognizer was active a moment ago: narrow still
    other.end()
    clock.advance(0.35)  # the recognizer has been quiet for longer than the hold
    assert turn_soon(shares, "detector") == 2


def _one_turn(shares: ComputeBudget, name: str) -> int:
    with shares.turn(name) as threads:
        return threads


def test_a_recognizer_flood_leaves_the_detector_its_bound() -> None:
    # Two streams of decodes always waiting against a detector that always has a frame, on a fake
    # clock: the decision that bounds the recognizer's share flips exactly when its use passes the bound.
    clock = FakeClock()
    shares = budget(critical_max_share=0.6, half_life_s=0.5, clock=clock)
    decodes = [Held(shares, "recognizer"), Held(shares, "recognizer")]
    assert all(d.entered.wait(5.0) for d in decodes) and shares.threads_in_use() == 2
    detector = Held(shares, "detector")
    decodes.append(Held(shares, "recognizer"))
    poll(lambda: waiters(shares) == 2, 5.0, "the detector and a third decode to ask", every_s=0.005)
    try:
        clock.advance(0.2)  # 0.4 thread-s of decoding: under its bound, the recognizer goes first
        decodes[0].end()
        assert decodes[2].entered.wait(5.0) and not detector.entered.is_set()
        # Some 1.2 thread-s of decoding in the last half-lives: past 0.6 of the 1.44 the cores
        # offered (not past all of it: a share of 1.0 would still let the decodes go first).
        clock.advance(0.35)
        decodes.append(Held(shares, "recognizer"))
        poll(lambda: waiters(shares) == 2, 5.0, "a fourth decode to ask", every_s=0.005)
        decodes[1].end()
        # Unbounded, the decodes would hold both cores for ever; past the bound the detector goes first.
        assert detector.entered.wait(5.0) and detector.threads == 1
        assert not decodes[3].entered.is_set()
    finally:
        detector.end()
        for decode in decodes:
            decode.end()
    assert shares.stats["detector"].turns == 1 and shares.stats["recognizer"].turns == 4


def test_a_kept_core_means_the_recognizer_is_never_held_back() -> None:
    clock = FakeClock()
    shares = budget(reserve_hold_s=0.6, clock=clock)
    assert _one_turn(shares, "recognizer") == 1  # one stream decoding: a 40 ms call every 100 ms
    # Two detector calls always want a core: one runs, the other waits, neither takes the kept one.
    running = Held(shares, "detector")
    assert running.entered.wait(5.0) and running.threads == 1
    waiting = Held(shares, "detector")
    poll(lambda: waiters(shares) == 1, 5.0, "the second detector call to ask", every_s=0.005)
    try:
        for _ in range(5):
            clock.advance(0.06)
            # Granted while a detector call runs and another waits: it never waits for one to end.
            call = Held(shares, "recognizer")
            assert call.entered.wait(5.0) and call.threads == 1
            assert shares.threads_in_use() == 2 and not waiting.entered.is_set()
            clock.advance(0.04)
            call.end()
            assert not waiting.entered.is_set() and waiters(shares) == 1  # the core stays kept between decodes
    finally:
        running.end()
        waiting.end()
    assert shares.stats["recognizer"].turns == 6
    assert shares.busy_shares()["recognizer"] > 0


def test_background_work_runs_when_nobody_waits_or_once_its_patience_is_out() -> None:
    clock = FakeClock()
    shares = budget(background_patience_s=0.2, clock=clock)
    shares.add("encoder", ModelClaim(Priority.BACKGROUND))
    assert turn_soon(shares, "encoder") == 1  # nobody waits: at once
    first = Held(shares, "detector")
    assert first.entered.wait(5.0) and first.threads == 2  # both cores
    clock.advance(0.1)  # the detector has used the cores a while: it ranks behind a newcomer of its priority
    second = Held(shares, "detector")
    poll(lambda: waiters(shares) == 1, 5.0, "the second detector call to ask", every_s=0.005)
    encoder = Held(shares, "encoder")
    poll(lambda: waiters(shares) == 2, 5.0, "the encoder to ask", every_s=0.005)
    clock.advance(0.1)  # within its patience: held back behind the waiting detector call
    first.end()
    assert second.entered.wait(5.0) and second.threads == 2  # the detector went first, and wide
    assert not encoder.entered.is_set()
    third = Held(shares, "detector")
    poll(lambda: waiters(shares) == 2, 5.0, "the third detector call to ask", every_s=0.005)
    clock.advance(0.15)  # the encoder has now waited 0.25 s, past its patience: it goes first
    second.end()
    assert encoder.entered.wait(5.0) and encoder.threads == 1
    assert third.entered.wait(5.0) and third.threads == 1  # the core the encoder left
    for call in (encoder, third):
        call.end()
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
