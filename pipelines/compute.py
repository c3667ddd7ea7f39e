"""One budget for the machine's cores, shared by every model that runs on them.

On a small CPU the detector, the speech recognizer and the segmenter each could use every core;
run side by side unscheduled, their threads oversubscribe the cores, and the detector, which always
has a frame ready, crowds out the recognizer, whose words are lost if they are late. So every model
call asks this budget for threads (`turn`) and runs only when they are free:

- The budget hands out `cores` thread slots. A call needs `threads` slots and may take up to
  `max_threads` when they are free (the detector's wide ONNX Runtime session); the grant is told to
  the engine through engines.cpu_grant, so no engine ever runs more threads than it was given.
- Priorities. A CRITICAL model (the recognizer: cheap, latency-bound, its misses unrecoverable) goes
  first, always; with `reserve_hold_s`, one slot is also kept free for it that long after it was
  active, so its next call never waits for a detector call to end (off by default: see
  docs/compute.md for what that costs the detector). BULK models (the detector, the
  segmenter) share what is left by their weights. BACKGROUND work (the describer's frame encoding)
  runs when nobody else waits, or once it has waited `background_patience_s`.
- The starvation bound. Once the critical models have used more than `critical_max_share` of the
  cores' recent time and a bulk model waits, the bulk model goes first and nothing is reserved:
  detection slows under a flood of speech but never stops.
- Usage decays with a half-life, so a burst long ago does not count against a model now. Calls
  still running count as used so far.

When slots are short the detector simply gets fewer turns: its loop predicts boxes for the frames it
could not measure (pipelines.frame_loop), and the describer samples fewer frames (`short`).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

from engines.cpu_grant import granted
from pipelines.tasks import wait_set


class Priority(IntEnum):
    CRITICAL = 0
    BULK = 1
    BACKGROUND = 2


@dataclass(frozen=True, slots=True)
class ModelClaim:
    """How one model uses the cores."""

    priority: Priority = Priority.BULK
    share: float = 1.0  # weight among the models of its priority
    threads: int = 1  # threads one call needs
    max_threads: int | None = None  # a call may use up to this many when they are free (default: threads)

    def __post_init__(self) -> None:
        if self.threads < 1:
            raise ValueError(f"a model call needs at least one thread, not {self.threads}")
        if self.share <= 0:
            raise ValueError(f"a model's share must be above 0, not {self.share}")
        if self.max_threads is not None and self.max_threads < self.threads:
            raise ValueError(f"max_threads {self.max_threads} is below threads {self.threads}")


@dataclass(slots=True)
class TurnStats:
    turns: int = 0
    waited: int = 0  # turns that had to wait for threads
    wait_s: float = 0.0
    busy_s: float = 0.0  # wall time of its calls
    thread_s: float = 0.0  # the same, times the threads each call held
    wide: int = 0  # calls granted more than `threads`


@dataclass(slots=True, eq=False)
class _Waiter:
    name: str
    asked_at: float
    # Its place among the waiters of its model (asked_at, or when its caller was last served).
    order: float
    wake: Callable[[], object] | None = None  # an event loop's waiter: how to wake it


@dataclass(frozen=True, slots=True)
class Grant:
    """Threads held for one model call, from `acquire` until `release`."""

    name: str
    threads: int
    token: int
    started: float


@dataclass(slots=True)
class _Running:
    name: str
    threads: int
    started: float


@dataclass(slots=True)
class _Usage:
    """Thread-seconds per model and offered thread-seconds, both decayed by the same half-life."""

    used: dict[str, float] = field(default_factory=dict)
    offered: float = 0.0
    at: float = field(default_factory=time.perf_counter)


class ComputeBudget:
    def __init__(
        self,
        cores: int,
        models: Mapping[str, ModelClaim] | None = None,
        *,
        critical_max_share: float = 0.75,
        half_life_s: float = 2.0,
        reserve_hold_s: float = 0.0,
        background_patience_s: float = 0.5,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        if cores < 1:
            raise ValueError(f"a compute budget needs at least one core, not {cores}")
        if not 0.0 < critical_max_share <= 1.0:
            raise ValueError(f"critical_max_share must be in (0, 1], not {critical_max_share}")
        self.cores = cores
        # Every decision reads this clock (holds, patience, decayed usage); a test drives a fake one.
        self._clock = clock
        self.critical_max_share = critical_max_share
        self._half_life_s = half_life_s
        self._reserve_hold_s = reserve_hold_s
        self._patience_s = background_patience_s
        self._claims: dict[str, ModelClaim] = {}
        self._cond = threading.Condition()
        self._waiting: list[_Waiter] = []
        self._running: dict[int, _Running] = {}
        self._tokens = 0
        self._critical_seen = float("-inf")  # when a critical call last ran or waited
        # Offered thread-seconds start where a long idle history leaves them (cores * tau), so the
        # first seconds' usage is not read as a large share.
        self._usage = _Usage(offered=cores * half_life_s / math.log(2), at=clock())
        self.stats: dict[str, TurnStats] = {}
        for name, claim in (models or {}).items():
            self.add(name, claim)

    def add(self, name: str, claim: ModelClaim) -> None:
        """Register a model (before its first call); its threads are capped to the budget's cores."""
        threads = min(claim.threads, self.cores)
        widest = min(claim.max_threads or claim.threads, self.cores)
        with self._cond:
            self._claims[name] = ModelClaim(claim.priority, claim.share, threads, max(threads, widest))
            self._usage.used.setdefault(name, 0.0)
            self.stats.setdefault(name, TurnStats())

    @property
    def models(self) -> dict[str, ModelClaim]:
        return dict(self._claims)

    @contextlib.contextmanager
    def turn(self, name: str) -> Iterator[int]:
        """Hold threads for one model call (blocking: called on the model's own thread); yields how
        many were granted, which engines.cpu_grant also tells the engine."""
        grant = self.acquire(name)
        try:
            with granted(grant.threads):
                yield grant.threads
        finally:
            self.release(grant)

    def acquire(self, name: str) -> Grant:
        """Wait (blocking) for threads for one call of `name`; `release` the grant when it ends."""
        claim, waiter = self._ask(name)
        with self._cond:
            try:
                while (threads := self._grant(waiter, claim)) == 0:
                    # Woken when a call ends or a waiter arrives; the timeout lets a reservation
                    # lapse and a background waiter's patience run out without either.
                    self._cond.wait(0.05)
            finally:
                self._waiting.remove(waiter)
            return self._start(waiter, claim, threads)

    async def acquire_async(self, name: str, *, last_served: float | None = None) -> Grant:
        """`acquire` for a coroutine: the event loop goes on while it waits. Cancelling the wait
        leaves nothing held.

        `last_served` (the `started` of the caller's previous grant) ranks the caller among the
        waiters of the same model by when it was last served rather than when it asked: the
        detector's streams ask only once a frame has arrived, so a 15 fps stream would otherwise
        be back in line before a 10 fps one after every turn and take the turns that free up in
        between; served longest ago goes first, and they alternate."""
        claim, waiter = self._ask(name, last_served)
        loop = asyncio.get_running_loop()
        woken = asyncio.Event()
        waiter.wake = lambda: loop.call_soon_threadsafe(woken.set)
        try:
            while True:
                woken.clear()
                with self._cond:
                    threads = self._grant(waiter, claim)
                    if threads:
                        self._waiting.remove(waiter)
                        return self._start(waiter, claim, threads)
                await wait_set(woken, 0.05)
        except BaseException:
            with self._cond:
                if waiter in self._waiting:
                    self._waiting.remove(waiter)
                    self._notify()  # a waiter behind this one may go now
            raise

    def release(self, grant: Grant) -> None:
        ended = self._clock()
        claim = self._claims[grant.name]
        with self._cond:
            if self._running.pop(grant.token, None) is None:
                return  # released already
            self._decay(ended)
            self._usage.used[grant.name] += (ended - grant.started) * grant.threads
            if claim.priority is Priority.CRITICAL:
                self._critical_seen = ended
            self._notify()
        stats = self.stats[grant.name]
        stats.busy_s += ended - grant.started
        stats.thread_s += (ended - grant.started) * grant.threads

    def _ask(self, name: str, last_served: float | None = None) -> tuple[ModelClaim, _Waiter]:
        claim = self._claims.get(name)
        if claim is None:
            raise KeyError(f"no compute claim for {name!r}")
        now = self._clock()
        waiter = _Waiter(name, now, min(now, last_served) if last_served is not None else now)
        with self._cond:
            self._waiting.append(waiter)
            self._notify()  # a higher-ranked waiter changes what the others may do
        return claim, waiter

    def _start(self, waiter: _Waiter, claim: ModelClaim, threads: int) -> Grant:
        """Under the lock: the waiter's call starts with `threads`."""
        started = self._clock()
        self._tokens += 1
        grant = Grant(waiter.name, threads, self._tokens, started)
        self._running[grant.token] = _Running(waiter.name, threads, started)
        if claim.priority is Priority.CRITICAL:
            self._critical_seen = started
        self._notify()  # another waiter may fit beside this call
        stats = self.stats[waiter.name]
        stats.turns += 1
        stats.wide += threads > claim.threads
        if started - waiter.asked_at > 0.001:
            stats.waited += 1
            stats.wait_s += started - waiter.asked_at
        return grant

    def _notify(self) -> None:
        """Under the lock: wake every waiter, on threads and on event loops."""
        self._cond.notify_all()
        for waiter in self._waiting:
            if waiter.wake is not None:
                waiter.wake()

    # -- decisions (under the lock) ------------------------------------------------------------------

    def _grant(self, waiter: _Waiter, claim: ModelClaim) -> int:
        """Threads this waiter may start with now, or 0 if it must wait."""
        now = self._clock()
        if claim.priority is Priority.CRITICAL:
            self._critical_seen = now
        nxt = self._next(now)
        if nxt is not waiter:  # the waiters of one model too go in their order, not as they wake
            return 0
        free = self.cores - sum(r.threads for r in self._running.values())
        if self._rank(waiter.name, now)[0] > Priority.CRITICAL:
            free -= self._reserved(now)
        if free < claim.threads:
            return 0
        return min(free, claim.max_threads or claim.threads)

    def _next(self, now: float) -> _Waiter | None:
        """The waiter that goes next: by priority (see _rank), then the least used for its share,
        then the longest waiting (or, for a caller that said when it was last served, served
        longest ago)."""
        if not self._waiting:
            return None
        return min(self._waiting, key=lambda w: (*self._rank(w.name, now), w.order))

    def _rank(self, name: str, now: float) -> tuple[int, float]:
        claim = self._claims[name]
        priority = claim.priority
        # Critical work past its bound queues with the bulk work it would otherwise starve;
        # background work that has waited its patience joins it too.
        past_bound = priority is Priority.CRITICAL and self._critical_over_bound(now) and self._bulk_waiting()
        impatient = priority is Priority.BACKGROUND and any(
            w.name == name and now - w.asked_at >= self._patience_s for w in self._waiting
        )
        if past_bound or impatient:
            priority = Priority.BULK
        return priority, self._used(name, now) / claim.share

    def _reserved(self, now: float) -> int:
        """Slots bulk work may not take: one for a critical model active within reserve_hold_s,
        unless it is past its bound (or the budget has a single core, which it cannot split)."""
        if self.cores < 2 or now - self._critical_seen > self._reserve_hold_s:
            return 0
        return 0 if self._critical_over_bound(now) else 1

    def _bulk_waiting(self) -> bool:
        return any(self._claims[w.name].priority is not Priority.CRITICAL for w in self._waiting)

    def _critical_over_bound(self, now: float) -> bool:
        critical = sum(self._used(name, now) for name, c in self._claims.items() if c.priority is Priority.CRITICAL)
        return critical > self.critical_max_share * self._usage.offered

    def _used(self, name: str, now: float) -> float:
        self._decay(now)
        running = sum((now - r.started) * r.threads for r in self._running.values() if r.name == name)
        return self._usage.used[name] + running

    def _decay(self, now: float) -> None:
        usage = self._usage
        elapsed = now - usage.at
        if elapsed <= 0:
            return
        factor = 0.5 ** (elapsed / self._half_life_s)
        usage.at = now
        for name in usage.used:
            usage.used[name] *= factor
        # Offered capacity decays the same way: after a few half-lives it is cores * tau.
        tau = self._half_life_s / math.log(2)
        usage.offered = usage.offered * factor + self.cores * tau * (1 - factor)

    # -- what it decided --------------------------------------------------------------------------

    def busy_shares(self) -> dict[str, float]:
        """Per model, its part of the cores' recent time (decayed; 0..1 over all models together)."""
        with self._cond:
            now = self._clock()
            self._decay(now)
            offered = self._usage.offered
            return {name: (self._used(name, now) / offered if offered > 0 else 0.0) for name in self._claims}

    def short(self) -> bool:
        """A model call waits for threads now: optional work (another sampled frame) should wait too."""
        with self._cond:
            return bool(self._waiting)

    def threads_in_use(self) -> int:
        with self._cond:
            return sum(r.threads for r in self._running.values())

    def snapshot(self) -> dict[str, Any]:
        """What the budget is deciding, as JSON: its cores and, per model, its claim, its recent part
        of the cores and what it waited."""
        shares = self.busy_shares()
        return {
            "cores": self.cores,
            "threads_in_use": self.threads_in_use(),
            "critical_max_share": self.critical_max_share,
            "models": {
                name: {
                    "priority": claim.priority.name.lower(),
                    "threads": claim.threads,
                    "max_threads": claim.max_threads,
                    "busy_share": round(shares[name], 3),
                    "turns": self.stats[name].turns,
                    "waits": self.stats[name].waited,
                    "wait_s": round(self.stats[name].wait_s, 3),
                    "thread_s": round(self.stats[name].thread_s, 3),
                }
                for name, claim in self.models.items()
            },
        }
