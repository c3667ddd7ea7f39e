"""Turns at a CPU that shared models would otherwise fight over.

On a small CPU machine the detector and the speech recognizer each use every core; run at the
same time, both get slower than either alone (oversubscribed threads that spin while they wait),
and the detector, which always has a frame ready, crowds the recognizer out. So each model call
takes a turn: a model alone never waits; when several wait, the one that has used least of its
share of recent compute time goes first. The detector is latest-frame-wins, so frames that
arrive while the recognizer has its turn are dropped and counted as usual; audio waits in its
bounded buffers. Shares are fractions (`captions.cpu_share` for the recognizer, the rest for the
detector); usage decays with a half-life, so a burst long ago does not count against a model now.
A model whose calls run side by side (several workers) may start another call during its own
turn, unless another model waits and is due first.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

MIN_SHARE = 0.01


@dataclass(slots=True)
class TurnStats:
    turns: int = 0
    waited: int = 0  # turns that had to wait for another model
    wait_s: float = 0.0
    busy_s: float = 0.0


class ComputeShares:
    def __init__(self, shares: Mapping[str, float], *, half_life_s: float = 2.0) -> None:
        if not shares:
            raise ValueError("at least one model needs a share")
        self._shares = {name: max(MIN_SHARE, share) for name, share in shares.items()}
        self._half_life_s = half_life_s
        self._usage = dict.fromkeys(self._shares, 0.0)
        self._usage_at = time.perf_counter()
        self._cond = threading.Condition()
        self._waiting: Counter[str] = Counter()  # calls waiting, per model (a model may have several)
        self._running: str | None = None
        self._calls: dict[int, float] = {}  # the running model's calls in progress: token -> started
        self._tokens = 0
        self.stats = {name: TurnStats() for name in self._shares}

    @contextlib.contextmanager
    def turn(self, name: str) -> Iterator[None]:
        """Hold the CPU for one model call (blocking: called on the model's own thread)."""
        if name not in self._shares:
            raise KeyError(f"no compute share for {name!r}")
        stats = self.stats[name]
        asked = time.perf_counter()
        with self._cond:
            self._waiting[name] += 1
            try:
                self._cond.wait_for(lambda: self._running in (None, name) and self._next() == name)
            finally:
                self._waiting[name] -= 1
                if not self._waiting[name]:
                    del self._waiting[name]
            self._running = name
            started = time.perf_counter()
            self._tokens += 1
            token = self._tokens
            self._calls[token] = started
        stats.turns += 1
        if started - asked > 0.001:
            stats.waited += 1
            stats.wait_s += started - asked
        try:
            yield
        finally:
            used = time.perf_counter() - started
            with self._cond:
                self._decay()
                self._usage[name] += used
                stats.busy_s += used
                del self._calls[token]
                if not self._calls:
                    self._running = None
                self._cond.notify_all()

    def _next(self) -> str:
        self._decay()
        now = time.perf_counter()
        # Calls still running count as used so far: otherwise a model with several workers
        # looks idle to the others until its calls end, and keeps starting new ones.
        running = sum(now - started for started in self._calls.values())

        def used(name: str) -> float:
            return (self._usage[name] + (running if name == self._running else 0.0)) / self._shares[name]

        return min(self._waiting, key=used)

    def _decay(self) -> None:
        now = time.perf_counter()
        factor = 0.5 ** ((now - self._usage_at) / self._half_life_s)
        self._usage_at = now
        for name in self._usage:
            self._usage[name] *= factor
