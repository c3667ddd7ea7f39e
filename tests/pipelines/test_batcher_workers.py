"""A batcher with several workers: calls side by side, batches gathered while they run, and the
same supervision as with one. The model is a plain function; every wait is bounded."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from pipelines.batching import ModelBatcher, ModelFailed
from pipelines.compute import ComputeBudget, ModelClaim
from tests.support.clock import FakeClock

PROMPT_S = 5.0


def batcher(
    call: Callable[[list[int]], list[int]], *, workers: int = 2, max_batch: int = 8, **kw: Any
) -> ModelBatcher[int, int]:
    return ModelBatcher(call, name="model", unit="items", max_batch=max_batch, workers=workers, **kw)


async def test_two_workers_run_two_calls_at_once() -> None:
    both_inside = threading.Barrier(2, timeout=PROMPT_S)  # one worker alone would time out here

    def call(items: list[int]) -> list[int]:
        both_inside.wait()
        return [i * 10 for i in items]

    async with batcher(call, max_batch=1) as b:
        async with asyncio.timeout(PROMPT_S):
            first, second = await asyncio.gather(b.submit(1), b.submit(2))
    assert (first.result, second.result) == (10, 20)
    assert b.stats.calls == 2 and b.stats.items == 2


async def test_items_arriving_while_every_worker_is_busy_ride_in_one_batch() -> None:
    release = threading.Event()
    called = threading.Semaphore(0)
    sizes: list[int] = []

    def call(items: list[int]) -> list[int]:
        sizes.append(len(items))
        called.release()
        if len(sizes) <= 2:
            release.wait(PROMPT_S)
        return list(items)

    async with batcher(call) as b:
        async with asyncio.timeout(PROMPT_S):
            held = []
            for i in range(2):  # one at a time, so each worker gets a call of one
                held.append(asyncio.create_task(b.submit(i)))
                assert await asyncio.to_thread(called.acquire, True, PROMPT_S)
            later = [asyncio.create_task(b.submit(i)) for i in range(10, 15)]
            await asyncio.sleep(0.05)
            release.set()
            await asyncio.gather(*held, *later)
    assert sizes[:2] == [1, 1] and sizes[2:] == [5], sizes


async def test_a_failing_call_fails_only_its_items_and_enough_of_them_kill_the_batcher() -> None:
    def call(items: list[int]) -> list[int]:
        if any(i < 0 for i in items):
            raise ValueError("negative")
        time.sleep(0.01)
        return list(items)

    async with batcher(call, max_batch=1, max_consecutive_failures=3) as b:
        async with asyncio.timeout(PROMPT_S):
            ok, bad = await asyncio.gather(b.submit(5), b.submit(-1), return_exceptions=True)
            assert not isinstance(ok, BaseException) and ok.result == 5
            assert isinstance(bad, ValueError)
            outcomes = await asyncio.gather(*(b.submit(-i - 1) for i in range(4)), return_exceptions=True)
        assert b.failure is not None and "3 model calls in a row" in b.failure
        assert not b.alive
        assert all(isinstance(o, ValueError | ModelFailed) for o in outcomes), outcomes
        with pytest.raises(ModelFailed):
            await b.submit(1)


async def test_close_waits_for_every_call_in_flight() -> None:
    inside = threading.Semaphore(0)
    finished: list[int] = []

    def call(items: list[int]) -> list[int]:
        inside.release()
        time.sleep(0.2)
        finished.extend(items)
        return list(items)

    b = batcher(call, max_batch=1)
    b.start()
    tasks = [asyncio.create_task(b.submit(i)) for i in range(2)]
    async with asyncio.timeout(PROMPT_S):
        for _ in range(2):
            assert await asyncio.to_thread(inside.acquire, True, PROMPT_S)
        await b.aclose()
    assert sorted(finished) == [0, 1]  # the model was not closed under a running call
    assert all(t.cancelled() for t in tasks)


def test_turns_at_the_cpu_keep_the_workers() -> None:
    # A model's turn admits its own calls side by side (tests/pipelines/test_compute.py).
    shares = ComputeBudget(2, {"model": ModelClaim(), "other": ModelClaim()})
    assert batcher(list, compute=shares).workers == 2
    with pytest.raises(ValueError, match="workers"):
        batcher(list, workers=0)


async def test_load_is_the_share_of_worker_time_in_calls() -> None:
    # On a fake clock: each call takes 0.05 s of it, so the figures are exact however slow the
    # machine running the test is.
    clock = FakeClock()

    def call(items: list[int]) -> list[int]:
        clock.advance(0.05)
        return list(items)

    async with batcher(call, max_batch=1, clock=clock) as b:
        assert b.load() == 0.0
        async with asyncio.timeout(PROMPT_S):
            for _ in range(6):  # one call at a time, then as long idle: one of the two workers busy half the time
                await b.submit(1)
                clock.advance(0.05)
        clock.advance(0.1)  # load() is worked out at most every 0.1 s
        assert b.load() == pytest.approx(0.3 / (3 * 2))  # 0.3 s of calls over 3 s and two workers
    async with batcher(call, max_batch=1, workers=1, clock=clock) as one:
        async with asyncio.timeout(PROMPT_S):
            await asyncio.gather(*(one.submit(i) for i in range(20)))  # 1 s of back-to-back calls
        clock.advance(0.1)
        assert one.load() == pytest.approx(1 / 3)  # 1 s busy out of the 3 s window
        clock.advance(2.425)  # the window now starts halfway through the 11th call: 9.5 calls are in it
        assert one.load() == pytest.approx(0.475 / 3)
        clock.advance(3.0)  # and then past them all
        assert one.load() == 0.0


async def test_free_workers_share_the_streams_waiting() -> None:
    sizes: list[int] = []
    both_inside = threading.Barrier(2, timeout=PROMPT_S)  # the two calls run side by side

    def call(items: list[int]) -> list[int]:
        sizes.append(len(items))
        both_inside.wait()
        return list(items)

    async with batcher(call, max_batch=8) as b:
        with contextlib.ExitStack() as streams:
            for _ in range(6):
                streams.enter_context(b.client())
            async with asyncio.timeout(PROMPT_S):
                await asyncio.gather(*(b.submit(i) for i in range(6)))
    assert sizes == [3, 3], sizes  # not six beside an idle worker
