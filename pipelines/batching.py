"""One model shared by every stream, fed through a cross-stream batcher (any model).

Each stream has a few items in flight at most (the detector: `in_flight`; the recognizer: one),
so the queue is bounded by a small multiple of the number of streams.
When the model is free the batcher takes the items that are ready, up to its batch limit, and
runs them in one call on its own thread. Streams that just got their results back need a moment
to submit their next item, so while fewer items are queued than streams are registered the
batcher waits for them, but never longer than `gather_window_s`: a paused stream costs the
others at most that. Without the window, four streams settle into alternating batches of two.

With `workers` above 1 that many calls run at once, each on its own thread, and a batch is
gathered whenever a worker is free. A runtime that runs concurrent calls in parallel
(CTranslate2 with `inter_threads`) then uses a small CPU better than one wide call: a greedy
decoder step is too small to keep two threads busy, two decodes side by side are not.

A call that hangs (a driver deadlock, a model stuck in a loop) cannot be cancelled from Python,
but it is noticed: a call running longer than `stuck_after_s` is counted once (`stuck_calls`),
logged, and `stuck` is true while it runs, which readiness reports. That is the watchdog Frigate
keeps on its detector process, without the restart a thread does not allow.

The batcher is supervised: if its runner task ends for any reason other than `aclose()`, if
the model breaks its contract (not one result per item), or if `max_consecutive_failures`
model calls in a row raise, the batcher is dead. It logs why once, `alive` turns False,
`failure` holds a one-line reason, and every item waiting and every later `submit()` fails at
once with the batcher's `failed_error` instead of hanging. A model call that raises below that
threshold fails only its items, with the model's error. Items waiting are capped at
`max_pending`; past it `submit()` raises `full_error` at once rather than queue without bound.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Generic, Self, TypeVar

from engines.cpu_grant import granted
from pipelines.compute import ComputeBudget, Grant
from pipelines.errors import PipelineError
from pipelines.tasks import cancel_and_wait, describe_error, wait_set

log = logging.getLogger(__name__)

In = TypeVar("In")
Out = TypeVar("Out")

DEFAULT_GATHER_WINDOW_S = 0.005
LOAD_WINDOW_S = 3.0  # load() looks this far back: a few decode rounds, short enough to follow streams coming and going
# Each stream has a few items waiting at most, so 256 is far above what one node's streams queue.
# Reaching it means a caller broke that contract (submitting without awaiting); refusing then
# keeps memory (256 1080p RGB frames are ~1.6 GB) and latency bounded.
DEFAULT_MAX_PENDING = 256
# Model calls in a row that may raise before the model is declared broken: enough that a few
# bad items do not take every stream down, few enough that a dead model is noticed in seconds.
DEFAULT_MAX_CONSECUTIVE_FAILURES = 5
# A model call running this long is stuck: far past any call of the models here on the slowest
# CPU they are sized for, short enough that a hung call shows in readiness within a scrape or two.
DEFAULT_STUCK_AFTER_S = 20.0


class ModelFailed(PipelineError, RuntimeError):
    """The shared model is unusable (crashed, broken, or closed); `reason` says why.

    Not transient: every later `submit()` raises it too."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class _Dead(PipelineError):
    """Raised by a model call that found the model broken (after `_die`): ends the runner."""


class QueueFull(PipelineError, RuntimeError):
    """`max_pending` items are already waiting; this one was refused, not queued."""


@dataclass(frozen=True, slots=True)
class Outcome(Generic[Out]):
    result: Out
    elapsed_ms: float  # wall time of the model call this item rode in
    batch_size: int
    started_mono: float  # time.monotonic() when that model call began


@dataclass(slots=True)
class BatcherStats:
    calls: int = 0
    items: int = 0
    failures: int = 0  # model calls that raised
    busy_s: float = 0.0
    rejected: int = 0  # submit() calls refused as full
    stuck_calls: int = 0  # calls seen running past stuck_after_s (each counted once)

    @property
    def frames(self) -> int:  # the detector's name for its items
        return self.items


class ModelBatcher(Generic[In, Out]):
    def __init__(
        self,
        call: Callable[[list[In]], list[Out]],
        *,
        name: str,
        unit: str,
        max_batch: int,
        gather_window_s: float = DEFAULT_GATHER_WINDOW_S,
        max_pending: int = DEFAULT_MAX_PENDING,
        max_consecutive_failures: int = DEFAULT_MAX_CONSECUTIVE_FAILURES,
        failed_error: type[ModelFailed] = ModelFailed,
        full_error: type[QueueFull] = QueueFull,
        thread_name: str | None = None,
        compute: ComputeBudget | None = None,
        workers: int = 1,
        stuck_after_s: float = DEFAULT_STUCK_AFTER_S,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        if max_pending < 1:
            raise ValueError(f"max_pending must be at least 1, got {max_pending}")
        if max_consecutive_failures < 1:
            raise ValueError(f"max_consecutive_failures must be at least 1, got {max_consecutive_failures}")
        if workers < 1:
            raise ValueError(f"workers must be at least 1, got {workers}")
        self.compute = compute  # each call waits for this model's turn at the CPU
        # Times calls, load() and the stuck watchdog; a test drives a fake one so figures it checks
        # do not hang on how fast a loaded machine ran.
        self._clock = clock
        self.workers = workers
        self._model_call = call
        self.name = name  # "detector": in reasons and logs
        self.unit = unit  # "frames": what the items are, in messages
        self.max_batch = max(1, max_batch)
        self.gather_window_s = gather_window_s
        self.max_pending = max_pending
        self.max_consecutive_failures = max_consecutive_failures
        self._failed_error = failed_error
        self._full_error = full_error
        self._clients = 0
        self._arrived = asyncio.Event()
        self._pending: asyncio.Queue[tuple[In, asyncio.Future[Outcome[Out]]]] = asyncio.Queue(maxsize=max_pending)
        # Every future a submit() awaits until it resolves, wherever it is (queued, gathered into
        # a batch, in the model call), so dying or closing can resolve them all.
        self._waiting: set[asyncio.Future[Outcome[Out]]] = set()
        thread_name = thread_name or f"vidsentry-{name.replace(' ', '-')}"
        self._executor = ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix=thread_name)
        self._runner: asyncio.Task[None] | None = None
        self._closed = False
        self._failure: str | None = None
        self._consecutive_failures = 0
        self._in_flight = 0  # model calls running now (or handed to a worker)
        self._items_in_flight = 0  # items in those calls
        self._recent: deque[tuple[float, float]] = deque(maxlen=1024)  # (ended, model seconds) of calls
        self._load = (float("-inf"), 0.0)  # (worked out at, value)
        self.stats = BatcherStats()
        self.stuck_after_s = stuck_after_s
        # Model calls running now: id -> perf_counter() at the model's start (worker threads write it).
        self._calls: dict[int, float] = {}
        self._calls_lock = threading.Lock()
        self._call_ids = itertools.count()
        self._stuck_seen: set[int] = set()

    async def __aenter__(self) -> Self:
        self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    @property
    def alive(self) -> bool:
        """Started, and neither dead nor closed: `submit()` calls are being served."""
        return self._runner is not None and self._failure is None and not self._closed

    @property
    def failure(self) -> str | None:
        """Why the batcher died (one line, for users), or None while it has not."""
        return self._failure

    @property
    def pending(self) -> int:
        """Items queued and not yet gathered into a batch."""
        return self._pending.qsize()

    def load(self) -> float:
        """The share of the workers' time spent in model calls over the last LOAD_WINDOW_S
        (0: idle, 1: every worker busy all the time); worked out at most every 0.1 s."""
        now = self._clock()
        if now - self._load[0] >= 0.1:
            since = now - LOAD_WINDOW_S
            while self._recent and self._recent[0][0] <= since:
                self._recent.popleft()
            spent = sum(min(model_s, ended - since) for ended, model_s in self._recent)
            self._load = (now, spent / (LOAD_WINDOW_S * self.workers))
        return self._load[1]

    def oldest_call_s(self) -> float:
        """How long the longest-running model call has been running (0 when none runs)."""
        now = self._clock()
        with self._calls_lock:
            starts = list(self._calls.items())
            newly = [(i, now - t) for i, t in starts if now - t > self.stuck_after_s and i not in self._stuck_seen]
            self._stuck_seen.update(i for i, _ in newly)
        for _, running_s in newly:
            self._count_stuck(running_s)
        return now - min(t for _, t in starts) if starts else 0.0

    def _count_stuck(self, running_s: float) -> None:
        with self._calls_lock:  # worker threads count too
            self.stats.stuck_calls += 1
        log.error(f"{self.name} call stuck: still running; streams waiting on it get no results",
                  extra={"running_s": round(running_s, 1), "stuck_after_s": self.stuck_after_s})

    @property
    def stuck(self) -> bool:
        """A model call has been running for longer than stuck_after_s."""
        return self.oldest_call_s() > self.stuck_after_s

    @property
    def busy(self) -> bool:
        """A model call is running now."""
        return self._in_flight > 0

    def start(self) -> None:
        if self._closed:
            raise RuntimeError(f"the {self.name} batcher was closed; it cannot be started again")
        if self._runner is None:
            self._runner = asyncio.create_task(self._run(), name=f"{self.name.replace(' ', '-')}-batcher")
            self._runner.add_done_callback(self._runner_done)

    @contextlib.contextmanager
    def client(self) -> Iterator[None]:
        """Register a stream for the lifetime of its loop (sizes the gather window's wait)."""
        self._clients += 1
        try:
            yield
        finally:
            self._clients -= 1

    async def submit(self, item: In) -> Outcome[Out]:
        """Run the model on one item, batched with other streams' items.

        Raises the model's error if its call failed, `failed_error` if the batcher is dead or
        closed (at once, or while waiting if it dies then), and `full_error` if `max_pending`
        items are already waiting."""
        self._check_serving()
        future: asyncio.Future[Outcome[Out]] = asyncio.get_running_loop().create_future()
        try:
            self._pending.put_nowait((item, future))
        except asyncio.QueueFull:
            self.stats.rejected += 1
            raise self._full_error(f"{self.max_pending} {self.unit} are already waiting for the {self.name}") from None
        self._waiting.add(future)
        future.add_done_callback(self._waiting.discard)
        self._arrived.set()
        return await future

    async def submit_granted(self, item: In, grant: Grant) -> Outcome[Out]:
        """Run the model on one item now, on threads already granted by the compute budget (the
        caller waited for them before it chose the item, so the item is as fresh as can be). The
        grant is released when the call ends, whatever happens. Fails like `submit`."""
        try:
            self._check_serving()
        except BaseException:
            self._release(grant)
            raise
        future: asyncio.Future[Outcome[Out]] = asyncio.get_running_loop().create_future()
        self._waiting.add(future)
        future.add_done_callback(self._waiting.discard)
        self._in_flight += 1
        self._items_in_flight += 1
        with contextlib.suppress(_Dead):  # _die() has failed the future with the reason
            await self._serve([(item, future)], asyncio.Semaphore(), grant)
        return await future

    def _check_serving(self) -> None:
        """Raise at once what a call now would meet: the batcher dead, closed, or never started."""
        if self._failure is not None:
            raise self._failed_error(self._failure)
        if self._closed:
            raise self._failed_error(f"{self.name} is closed")
        if self._runner is None:
            raise RuntimeError(f"the {self.name} batcher's start() was not called")

    def _release(self, grant: Grant) -> None:
        if self.compute is not None:
            self.compute.release(grant)

    async def _gather(self) -> list[tuple[In, asyncio.Future[Outcome[Out]]]]:
        batch = [await self._pending.get()]
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.gather_window_s
        limit = self.max_batch
        if self._clients:
            # The streams not in a running call, shared among the free workers (this one included):
            # two calls of three finish sooner than one of six beside an idle worker.
            free = max(1, self.workers - self._in_flight)
            limit = min(limit, max(1, -(-(self._clients - self._items_in_flight) // free)))
        while len(batch) < limit:
            if not self._pending.empty():
                batch.append(self._pending.get_nowait())
                continue
            remaining = deadline - loop.time()
            if len(batch) >= self._clients or remaining <= 0:
                break
            self._arrived.clear()
            await wait_set(self._arrived, remaining)
        return batch

    async def _run(self) -> None:
        """Serve batches until cancelled by aclose() or the model is found broken (then return dead).

        Futures still unresolved when it ends are resolved by aclose() or _die(), not here."""
        free = asyncio.Semaphore(self.workers)
        try:
            async with asyncio.TaskGroup() as calls:
                while True:
                    # Gather only once a worker is free: items arriving meanwhile join the batch.
                    await free.acquire()
                    try:
                        batch = await self._gather()
                    except BaseException:
                        free.release()
                        raise
                    live = [(item, fut) for item, fut in batch if not fut.done()]
                    if not live:
                        free.release()
                        continue
                    self._in_flight += 1
                    self._items_in_flight += len(live)
                    calls.create_task(self._serve(live, free))
        except BaseExceptionGroup as group:
            rest = group.subgroup(lambda e: not isinstance(e, _Dead | BaseExceptionGroup))
            if rest is None:
                return  # _die() has said why and failed every waiting item
            leaf: BaseException = rest
            while isinstance(leaf, BaseExceptionGroup):
                leaf = leaf.exceptions[0]
            raise leaf from None  # a bug in the batcher itself: the runner dies with its own error

    async def _serve(
        self,
        live: list[tuple[In, asyncio.Future[Outcome[Out]]]],
        free: asyncio.Semaphore,
        grant: Grant | None = None,
    ) -> None:
        """One model call on a worker thread; raises _Dead once the model is found broken."""
        items = [item for item, _ in live]
        started_mono = time.monotonic()
        started = self._clock()
        try:
            try:
                results, model_s = await asyncio.get_running_loop().run_in_executor(
                    self._executor, self._timed_call, items, grant
                )
            except RuntimeError:  # the executor is shut down: the call never ran to release it
                if grant is not None:
                    self._release(grant)
                raise
        except Exception as exc:  # the model failed: fail these items, keep serving
            self.stats.failures += 1
            self._consecutive_failures += 1
            log.warning(f"{self.name} call failed", extra={"error": repr(exc), "batch": len(items)})
            for _, fut in live:
                if not fut.done():
                    fut.set_exception(exc)
            if self._consecutive_failures >= self.max_consecutive_failures:
                self._die(
                    f"{self.name} failed {self._consecutive_failures} model calls in a row; "
                    f"last error: {describe_error(exc)}",
                    exc,
                )
                raise _Dead from None
            return
        finally:
            self._in_flight -= 1
            self._items_in_flight -= len(items)
            free.release()
        if not isinstance(results, list) or len(results) != len(items):
            got = f"{len(results)} results" if isinstance(results, list) else f"a {type(results).__name__}"
            self._die(f"{self.name} engine is broken: backend returned {got} for {len(items)} {self.unit}")
            raise _Dead
        self._consecutive_failures = 0
        # The model's own time: a wait for a CPU turn is neither inference nor busy time.
        ended = self._clock()
        elapsed_ms = min(ended - started, model_s) * 1000
        self.stats.calls += 1
        self.stats.items += len(items)
        self.stats.busy_s += elapsed_ms / 1000
        self._recent.append((ended, elapsed_ms / 1000))
        for (_, fut), result in zip(live, results, strict=True):
            if not fut.done():
                fut.set_result(Outcome(result, elapsed_ms, len(items), started_mono))

    def _timed_call(self, items: list[In], grant: Grant | None = None) -> tuple[list[Out], float]:
        if grant is not None:  # threads granted before the items were chosen
            try:
                with granted(grant.threads):
                    return self._watched_call(items)
            finally:
                self._release(grant)
        turn = self.compute.turn(self.name) if self.compute is not None else contextlib.nullcontext()
        with turn:
            return self._watched_call(items)

    def _watched_call(self, items: list[In]) -> tuple[list[Out], float]:
        """The model call itself (after any wait for the CPU), seen by the watchdog while it runs."""
        call_id = next(self._call_ids)
        started = self._clock()
        with self._calls_lock:
            self._calls[call_id] = started
        try:
            return self._model_call(items), self._clock() - started
        finally:
            ran_s = self._clock() - started
            with self._calls_lock:
                del self._calls[call_id]
                seen = call_id in self._stuck_seen
                self._stuck_seen.discard(call_id)
            if seen:
                log.warning(f"{self.name} call that was stuck has returned", extra={"ran_s": round(ran_s, 1)})
            elif ran_s > self.stuck_after_s:  # stuck while nobody looked: counted all the same
                self._count_stuck(ran_s)

    def _runner_done(self, task: asyncio.Task[None]) -> None:
        if task.cancelled():
            if not self._closed:
                self._die(f"{self.name} batcher was cancelled")
            return
        exc = task.exception()  # retrieving it also keeps asyncio from logging it again
        if exc is not None:
            self._die(f"{self.name} batcher crashed: {describe_error(exc)}", exc)
        elif not self._closed:
            self._die(f"{self.name} batcher stopped")  # no-op after _run returned through _die

    def _die(self, reason: str, exc: BaseException | None = None) -> None:
        """Mark the batcher dead (once) and fail everything waiting with `failed_error(reason)`."""
        if self._failure is not None:
            return
        self._failure = reason
        log.error("%s batcher is dead: %s", self.name, reason, exc_info=exc, extra={"reason": reason})
        self._drain_queue()
        for fut in list(self._waiting):
            if not fut.done():
                fut.set_exception(self._failed_error(reason))

    def _drain_queue(self) -> None:
        while not self._pending.empty():
            self._pending.get_nowait()

    async def aclose(self) -> None:
        self._closed = True
        runner, self._runner = self._runner, None
        if runner is not None and not runner.done():
            await cancel_and_wait(runner)
        # Items still waiting (queued, gathered, or in the interrupted model call) are cancelled.
        self._drain_queue()
        for fut in list(self._waiting):
            fut.cancel()
        # Wait for an in-flight model call so the model is not closed under it.
        await asyncio.get_running_loop().run_in_executor(None, self._executor.shutdown, True)

