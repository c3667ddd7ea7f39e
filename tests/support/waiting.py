"""Waiting in tests for state another task, thread or process changes: a bound against hangs,
never a timing assertion."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


async def wait_until(
    condition: Callable[[], bool], within_s: float = 10.0, what: str | Callable[[], str] = "condition"
) -> None:
    """Poll `condition` every 20 ms until it holds; fail naming `what` after `within_s`."""
    try:
        async with asyncio.timeout(within_s):
            while True:
                if condition():
                    return
                await asyncio.sleep(0.02)
    except TimeoutError:
        raise AssertionError(f"timed out after {within_s} s waiting for {what() if callable(what) else what}") from None


async def eventually(
    probe: Callable[[], Awaitable[T]],
    within_s: float = 10.0,
    what: str | Callable[[], str] = "condition",
    *,
    every_s: float = 0.05,
) -> T:
    """Await `probe` every `every_s` until it returns something true (a reply over HTTP, say) and
    return that; fail naming `what` after `within_s`."""
    try:
        async with asyncio.timeout(within_s):
            while True:
                if found := await probe():
                    return found
                await asyncio.sleep(every_s)
    except TimeoutError:
        raise AssertionError(f"timed out after {within_s} s waiting for {what() if callable(what) else what}") from None


def poll(condition: Callable[[], object], within_s: float, what: str, every_s: float = 0.1,
         error: type[Exception] = AssertionError) -> float:
    """Seconds it took for `condition()` to hold; `error` past `within_s` (a harness that measures
    recovery passes TimeoutError, an outcome it records, not a test failure)."""
    began = time.monotonic()
    while not condition():
        if time.monotonic() - began > within_s:
            raise error(f"timed out after {within_s:g} s waiting for {what}")
        time.sleep(every_s)
    return time.monotonic() - began
