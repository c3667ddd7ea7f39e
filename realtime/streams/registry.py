"""Streams as desired state plus a reconciler.

The config file and the HTTP API only write the *desired* set of streams (`apply`, `add`,
`remove`). The reconciler (`run`) is the one place that starts and stops `StreamRunner`s:
it compares what is wanted with what runs, stops runs nobody wants any more, starts the
missing ones, and reports each stream's state. Nothing else holds a stream's lifecycle, so
when the desired set moves to a JetStream key-value bucket with per-worker leases, only
the writers of the desired set change.

Every desired entry has a generation. Deleting an id and adding it again makes a new
generation; its run starts only once the previous run of that id has stopped, so two runs
of one id never publish side by side.

A run that ends by itself is recorded. A network source that ends (a permanent error, a bug
in a stage) is started again after a back-off; a file that reached its end, or cannot be
read, stays ended until it is deleted and added again.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from pipelines.frames import StreamState
from pipelines.graph.counters import Counters, zero_counters
from pipelines.tasks import wait_set
from realtime.config import AnyStreamSettings, CameraStreamSettings
from realtime.errors import LimitReached, ServiceError
from realtime.sources.spec import InvalidSource, parse_source
from realtime.streams.runner import StreamRunner
from realtime.streams.view import PENDING, StreamView, public_url

log = logging.getLogger("realtime.service.registry")  # the registry's log, under the name it always had

RunnerFactory = Callable[[AnyStreamSettings], StreamRunner]


class StreamExists(ServiceError):
    """The desired set already holds a stream with this id."""


class UnknownStream(ServiceError, LookupError):
    """No stream with this id is desired."""


class RegistryClosed(ServiceError, RuntimeError):
    """The service is shutting down; the desired set no longer changes."""


class StreamLimitReached(LimitReached):
    """The desired set would hold more than `limit` streams (`http.max_streams`); nothing changed."""

    setting = "http.max_streams"

    def __init__(self, limit: int, wanted: int, *, where: str = "") -> None:
        super().__init__(f"stream limit reached: {limit} streams{where} ({self.setting})", limit=limit)
        self.wanted = wanted  # how many streams the refused write asked for


@dataclass(frozen=True, slots=True)
class RestartPolicy:
    initial_s: float = 2.0
    max_s: float = 60.0
    healthy_after_s: float = 60.0  # a run that lasted this long starts the back-off over

    def delay(self, failures: int) -> float:
        return min(self.max_s, self.initial_s * 2 ** max(0, failures - 1))


@dataclass(slots=True, eq=False)
class _Wanted:
    settings: AnyStreamSettings
    generation: int
    shown_url: str | None  # None: no URL (a browser session)
    is_network: bool
    runs: int = 0
    ended: StreamState | None = None  # how the last run ended by itself
    reason: str | None = None
    last_counters: Counters = field(default_factory=zero_counters)
    failures: int = 0  # consecutive runs that ended early
    retry_at: float | None = None  # time.monotonic() of the next start after an end


@dataclass(slots=True, eq=False)
class _Running:
    generation: int
    runner: StreamRunner
    task: asyncio.Task[StreamState]
    started_at: float
    stopping: bool = False


class StreamRegistry:
    def __init__(
        self,
        factory: RunnerFactory,
        *,
        on_gone: Callable[[str], None] | None = None,
        restart: RestartPolicy | None = None,
        max_streams: int = 64,
    ) -> None:
        if max_streams < 1:
            raise ValueError("max_streams must be >= 1")
        self.max_streams = max_streams  # bounds every writer of the desired set (http.max_streams)
        self.rejected = 0  # writes refused by max_streams (monotonic)
        self._factory = factory
        self._on_gone = on_gone  # an id is neither desired nor running any more
        self._restart = restart or RestartPolicy()
        self._wanted: dict[str, _Wanted] = {}
        self._running: dict[str, _Running] = {}
        self._generations = itertools.count(1)
        self._wake = asyncio.Event()
        self._closing = False
        self._reconciling = False

    # -- the desired set ------------------------------------------------------------------

    def apply(self, streams: Iterable[AnyStreamSettings]) -> None:
        """Make the desired set exactly `streams` (the config file's view); unchanged entries keep running."""
        self._check_open()
        new = {s.id: s for s in streams}
        self._check_room(len(new))  # all or nothing: a refused set leaves the current one running
        for stream_id in [sid for sid in self._wanted if sid not in new]:
            del self._wanted[stream_id]
            self._gone_if_idle(stream_id)
        for stream_id, settings in new.items():
            current = self._wanted.get(stream_id)
            if current is None or current.settings != settings:
                self._wanted[stream_id] = self._new_wanted(settings)
        self._wake.set()

    def add(self, settings: AnyStreamSettings) -> StreamView:
        self._check_open()
        if settings.id in self._wanted:
            raise StreamExists(settings.id)
        self._check_room(len(self._wanted) + 1)
        wanted = self._wanted[settings.id] = self._new_wanted(settings)
        self._wake.set()
        log.info("stream desired", extra={"stream_id": settings.id, "generation": wanted.generation})
        return self._view(wanted)

    def remove(self, stream_id: str) -> None:
        self._check_open()
        wanted = self._wanted.pop(stream_id, None)
        if wanted is None:
            raise UnknownStream(stream_id)
        self._wake.set()
        log.info("stream removed", extra={"stream_id": stream_id, "generation": wanted.generation})
        self._gone_if_idle(stream_id)

    def close(self) -> None:
        """Want nothing any more: the reconciler stops every run, then returns."""
        self._closing = True
        removed = list(self._wanted)
        self._wanted.clear()
        self._wake.set()
        for stream_id in removed:
            self._gone_if_idle(stream_id)

    # -- what is -------------------------------------------------------------------------

    def __contains__(self, stream_id: object) -> bool:
        return stream_id in self._wanted

    def get(self, stream_id: str) -> StreamView:
        wanted = self._wanted.get(stream_id)
        if wanted is None:
            raise UnknownStream(stream_id)
        return self._view(wanted)

    def views(self) -> list[StreamView]:
        return [self._view(w) for w in self._wanted.values()]

    def runner(self, stream_id: str) -> StreamRunner | None:
        """The current run of a desired stream (None while pending, ended or stopping a deleted one)."""
        wanted = self._wanted.get(stream_id)
        running = self._running.get(stream_id)
        if wanted is None or running is None or running.generation != wanted.generation:
            return None
        return running.runner

    def active(self, stream_id: str) -> bool:
        """A run of this id is alive (its own, or a deleted one's still stopping)."""
        return stream_id in self._running

    @property
    def running_count(self) -> int:
        """Runs alive, including those still stopping after a delete."""
        return len(self._running)

    @property
    def closing(self) -> bool:
        return self._closing

    # -- the reconciler ------------------------------------------------------------------

    async def run(self) -> None:
        """Reconcile until close() has been called and every run has ended.

        Runs are children of this task: cancelling it cancels them (the graceful path is close()).
        """
        if self._reconciling:
            raise RuntimeError("the reconciler is already running")
        self._reconciling = True
        try:
            async with asyncio.TaskGroup() as group:
                while True:
                    self._wake.clear()
                    self._reap()
                    self._converge(group)
                    if self._closing and not self._running:
                        return
                    # Sleep until something changes, or until the next restart after a back-off is due.
                    await wait_set(self._wake, self._next_retry_in())
        finally:
            self._reconciling = False

    def _converge(self, group: asyncio.TaskGroup) -> None:
        for stream_id, running in self._running.items():
            wanted = self._wanted.get(stream_id)
            if running.stopping or (wanted is not None and wanted.generation == running.generation):
                continue
            running.stopping = True
            running.runner.stop()
            log.info("stopping stream", extra={"stream_id": stream_id, "generation": running.generation})
        if self._closing:
            return
        now = time.monotonic()
        for stream_id, wanted in self._wanted.items():
            if stream_id in self._running:
                continue  # its own run, or the previous generation's, still stopping
            if wanted.ended is not None and wanted.retry_at is None:
                continue  # ended for good
            if wanted.retry_at is not None and wanted.retry_at > now:
                continue
            self._start(group, wanted)

    def _start(self, group: asyncio.TaskGroup, wanted: _Wanted) -> None:
        stream_id = wanted.settings.id
        wanted.retry_at = None
        try:
            runner = self._factory(wanted.settings)
        except Exception as exc:  # e.g. a file deleted since it was added: this stream fails, not the service
            log.warning("stream cannot start", extra={"stream_id": stream_id, "error": str(exc)})
            wanted.ended, wanted.reason = StreamState.FAILED, str(exc)
            self._schedule_restart(wanted, ran_for=0.0)
            return
        wanted.runs += 1
        wanted.ended = wanted.reason = None
        task = group.create_task(self._run_one(runner), name=f"stream-{stream_id}-{wanted.generation}")
        task.add_done_callback(lambda _: self._wake.set())
        self._running[stream_id] = _Running(wanted.generation, runner, task, time.monotonic())
        log.info("stream started", extra={"stream_id": stream_id, "generation": wanted.generation, "run": wanted.runs})

    @staticmethod
    async def _run_one(runner: StreamRunner) -> StreamState:
        try:
            return await runner.run()
        except Exception:  # runners promise not to raise; if one does, it must not end the others
            log.exception("stream runner raised", extra={"stream_id": runner.stream_id})
            runner.reason = runner.reason or "internal error"
            return StreamState.FAILED

    def _reap(self) -> None:
        for stream_id, running in list(self._running.items()):
            if not running.task.done():
                continue
            del self._running[stream_id]
            wanted = self._wanted.get(stream_id)
            if wanted is not None and wanted.generation == running.generation:
                self._record_end(wanted, running)
            log.info(
                "stream ended",
                extra={"stream_id": stream_id, "generation": running.generation, "state": running.runner.state.value},
            )
            running.runner.release()
            self._gone_if_idle(stream_id)

    def _record_end(self, wanted: _Wanted, running: _Running) -> None:
        """A run that is still wanted ended by itself."""
        runner = running.runner
        state = StreamState.STOPPED if running.task.cancelled() else running.task.result()
        wanted.ended, wanted.reason = state, runner.reason
        wanted.last_counters = runner.counters()
        self._schedule_restart(wanted, ran_for=time.monotonic() - running.started_at)

    def _schedule_restart(self, wanted: _Wanted, *, ran_for: float) -> None:
        if not wanted.is_network:
            return
        wanted.failures = 1 if ran_for >= self._restart.healthy_after_s else wanted.failures + 1
        delay = self._restart.delay(wanted.failures)
        wanted.retry_at = time.monotonic() + delay
        log.warning(
            "stream ended by itself; restarting",
            extra={"stream_id": wanted.settings.id, "reason": wanted.reason, "retry_in": round(delay, 1)},
        )

    def _next_retry_in(self) -> float | None:
        times = [w.retry_at for sid, w in self._wanted.items() if w.retry_at is not None and sid not in self._running]
        return max(0.0, min(times) - time.monotonic()) if times else None

    # -- helpers -------------------------------------------------------------------------

    def _gone_if_idle(self, stream_id: str) -> None:
        """Tell the owner once an id is neither desired nor running: its viewers and series can go."""
        if stream_id in self._wanted or stream_id in self._running or self._on_gone is None:
            return
        try:
            self._on_gone(stream_id)
        except Exception:
            log.exception("on_gone hook raised", extra={"stream_id": stream_id})

    def _check_open(self) -> None:
        if self._closing:
            raise RegistryClosed("the service is shutting down")

    def _check_room(self, wanted: int) -> None:
        """Counts desired streams, not runs: a deleted stream still stopping frees its slot at once."""
        if wanted > self.max_streams:
            self.rejected += 1
            log.warning("stream limit reached", extra={"limit": self.max_streams, "wanted": wanted})
            raise StreamLimitReached(self.max_streams, wanted)

    def _new_wanted(self, settings: AnyStreamSettings) -> _Wanted:
        if not isinstance(settings, CameraStreamSettings):
            return _Wanted(settings, next(self._generations), None, is_network=False)  # a session ends for good
        try:
            is_network = parse_source(settings.url).is_network
        except InvalidSource:
            is_network = False  # starting it fails and says why
        return _Wanted(settings, next(self._generations), public_url(settings.url), is_network)

    def _view(self, wanted: _Wanted) -> StreamView:
        running = self._running.get(wanted.settings.id)
        restart_in: float | None = None
        if running is not None and running.generation == wanted.generation:
            runner = running.runner
            state, reason, counters = runner.state.value, runner.reason, runner.counters()
        elif running is not None:
            state, reason, counters = PENDING, "waiting for the previous run of this id to stop", zero_counters()
        elif wanted.ended is not None:
            state, reason, counters = wanted.ended.value, wanted.reason, wanted.last_counters
            if wanted.retry_at is not None:
                restart_in = max(0.0, wanted.retry_at - time.monotonic())
        else:
            state, reason, counters = PENDING, None, zero_counters()
        return StreamView(
            settings=wanted.settings,
            shown_url=wanted.shown_url,
            state=state,
            reason=reason,
            restarts=max(0, wanted.runs - 1),
            restart_in=restart_in,
            counters=counters,
        )
