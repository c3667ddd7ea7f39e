"""A clock that moves only when a test moves it, for the classes that take a `clock` (the compute
budget, the batcher, circuit breakers, a bucket's mirror): what they decide on time is then
decided on the test's time, not on how fast a loaded machine ran. Safe to read from a worker
thread while the test advances it."""

from __future__ import annotations

import threading


class FakeClock:
    def __init__(self, start: float = 100.0) -> None:
        self._now = start
        self._lock = threading.Lock()

    def __call__(self) -> float:
        with self._lock:
            return self._now

    def advance(self, seconds: float) -> None:
        with self._lock:
            self._now += seconds
