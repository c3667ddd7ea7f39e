"""Failing well: a circuit breaker per endpoint, a retry budget per client, jittered backoff."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from enum import StrEnum


class BreakerState(StrEnum):
    CLOSED = "closed"  # requests flow
    OPEN = "open"  # failing: requests go elsewhere (or fail fast) until reset_s has passed
    HALF_OPEN = "half_open"  # one probe request is let through; its outcome closes or re-opens


class CircuitBreaker:
    """Opens after `failures` consecutive transient failures (5xx, timeouts, refused connections);
    a refusal (4xx) means the server is up and counts as a success here."""

    def __init__(self, failures: int, reset_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        if failures < 1 or reset_s <= 0:
            raise ValueError("circuit breaker: failures >= 1 and reset_s > 0")
        self._threshold = failures
        self._reset_s = reset_s
        self._clock = clock
        self._failures = 0
        self._opened_at: float | None = None
        self._probing = False
        self.times_opened = 0

    @property
    def state(self) -> BreakerState:
        if self._opened_at is None:
            return BreakerState.CLOSED
        if self._clock() - self._opened_at < self._reset_s:
            return BreakerState.OPEN
        return BreakerState.HALF_OPEN

    @property
    def consecutive_failures(self) -> int:
        return self._failures

    def retry_after_s(self) -> float:
        if self._opened_at is None:
            return 0.0
        return max(0.0, self._reset_s - (self._clock() - self._opened_at))

    def acquire(self) -> bool:
        """May a request go to this endpoint now? In half-open state only one probe at a time."""
        state = self.state
        if state is BreakerState.CLOSED:
            return True
        if state is BreakerState.HALF_OPEN and not self._probing:
            self._probing = True
            return True
        return False

    def release(self) -> None:
        """The admitted request ended without an outcome (cancelled): let another probe go."""
        self._probing = False

    def record_success(self) -> None:
        self._failures = 0
        self._opened_at = None
        self._probing = False

    def record_failure(self) -> None:
        self._failures += 1
        if self._probing or self._failures >= self._threshold:
            if self._opened_at is None or self.state is not BreakerState.OPEN:
                self.times_opened += 1
            self._opened_at = self._clock()
        self._probing = False


class RetryBudget:
    """A token bucket: each request earns `ratio` of a retry, each retry spends one. During an
    outage this caps retries at that fraction of traffic instead of multiplying the load by
    max_retries; `floor` retries are allowed even before any traffic earned them."""

    def __init__(self, ratio: float, floor: float = 5.0) -> None:
        if ratio < 0 or floor < 0:
            raise ValueError("retry budget: ratio and floor must not be negative")
        self._ratio = ratio
        self._cap = max(floor, 1.0)
        self._tokens = self._cap

    def on_request(self) -> None:
        self._tokens = min(self._cap, self._tokens + self._ratio)

    def try_spend(self) -> bool:
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return True
        return False


def backoff_s(attempt: int, base_s: float = 0.1, cap_s: float = 2.0) -> float:
    """Full-jitter exponential backoff before retry number `attempt` (1, 2, ...)."""
    return random.uniform(0.0, min(cap_s, base_s * 2 ** (attempt - 1)))
