"""One stream's ingest supervisor: connect, watch, reconnect, report.

    CONNECTING --first frame--> LIVE --no frame for watchdog_s--> STALLED
    STALLED --frames resume--> LIVE
    STALLED --stall_restart_s more--> RECONNECTING (the session is interrupted)
    LIVE / CONNECTING --EOF or error--> RECONNECTING --backoff--> CONNECTING ...
    any --stop()--> STOPPED;  a file's end --> STOPPED;  a file that cannot be read --> FAILED
    max_failed_connects failed connects of a source never reached --> FAILED
    (once a source has been live, outages are ridden through for ever)

The frame watchdog, not the reader, decides that a source went quiet: a reader's own read
timeout (`reader_timeout_s`) is never shorter than the watchdog's whole course, so a frozen
camera is reported STALLED after `watchdog_s` by either backend, then reconnected (the watch wakes
exactly when the restart is due, and a reader timeout that still gets in first, the event loop
having run late, is reported as that restart). (PyAV's
read timeout also hands out one last buffered frame when it fires, which used to restart the
watchdog just as it was due.)

Each connect attempt is a backend session driven by a dedicated daemon thread; attempt.py has
that reader side, and the `Feed` that numbers frames across reconnects and hands them to the
caller's inputs. This module keeps the supervision on the event loop: the states, the back-off,
the watchdog, and retiring an attempt, which is signalled and waited for a bounded time, then
abandoned if it is stuck in a blocking read.

A source that did not come from the config file (added over the API, or read from a fleet's
desired bucket) is given the `sources:` policy (`admit`): it is checked before every connect,
the first and each reconnect, because a host name may resolve elsewhere by then (DNS
rebinding). A refusal ends the run FAILED with the policy's reason (which never says whether a
file outside the allowed directories exists) before anything is opened, and is counted
(`refused_connects`); the registry retries a network source after its back-off, checking again.

Every state change is reported once, in order, through `on_status` on the event loop thread
(status.py). When `run()` returns, the mailbox and the audio buffer are closed, so consumers
awaiting them see `MailboxClosed`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from pipelines.frames import StatusChange, StreamState, validate_stream_id
from pipelines.graph.source import AudioInput, FrameInput, PacketInput
from pipelines.tasks import until_set, wait_set
from realtime.sources.attempt import Attempt, Feed
from realtime.sources.backends import create_session, normalize_backend
from realtime.sources.policy import SourcePolicy
from realtime.sources.session import SessionOptions
from realtime.sources.spec import InvalidSource, SourceSpec
from realtime.sources.status import StatusReport

log = logging.getLogger(__name__)

UNTRUSTED_REASON = "the source cannot be read (the service log has the details)"


@dataclass(frozen=True, slots=True)
class SupervisorPolicy:
    backoff_initial: float = 0.5  # first wait before reconnecting, seconds
    backoff_max: float = 10.0
    backoff_factor: float = 2.0  # each consecutive failed connect multiplies the wait
    backoff_jitter: float = 0.0  # up to this fraction is taken off each wait (spreads herds)
    watchdog_s: float = 5.0  # no frame this long -> STALLED
    stall_restart_s: float = 10.0  # stalled this long -> interrupt the session and reconnect
    open_timeout_s: float = 10.0  # connect + probe of a network source
    read_timeout_s: float = 5.0  # no data this long on an open connection -> the reader errors
    max_failed_connects: int | None = None  # None: retry forever
    reader_join_s: float = 0.5  # wait this long for a signalled reader thread, then abandon it

    def __post_init__(self) -> None:
        for name in (
            "backoff_initial",
            "backoff_max",
            "watchdog_s",
            "stall_restart_s",
            "open_timeout_s",
            "read_timeout_s",
            "reader_join_s",
        ):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0")
        if self.backoff_factor < 1:
            raise ValueError("backoff_factor must be >= 1")
        if not 0 <= self.backoff_jitter < 1:
            raise ValueError("backoff_jitter must be in [0, 1)")
        if self.max_failed_connects is not None and self.max_failed_connects < 1:
            raise ValueError("max_failed_connects must be >= 1 or None")

    def retry_delay(self, failures: int) -> float:
        """Wait before the next connect, after `failures` consecutive failed connects
        (0: the stream was live until now). The first retry waits `backoff_initial`."""
        delay = min(self.backoff_max, self.backoff_initial * self.backoff_factor ** max(0, failures - 1))
        if self.backoff_jitter:
            delay *= 1.0 - random.uniform(0.0, self.backoff_jitter)
        return delay

    @property
    def reader_timeout_s(self) -> float:
        """The silence after which a reader gives up by itself: at least the watchdog's whole course
        plus a second, so that it only ends a reader the supervisor abandoned (`read_timeout_s`
        can lengthen it, never shorten it)."""
        return max(self.read_timeout_s, self.watchdog_s + self.stall_restart_s + 1.0)

    @property
    def connect_deadline_s(self) -> float:
        """A connect attempt that has produced no frame after this long is given up."""
        return self.open_timeout_s + self.read_timeout_s


@dataclass(slots=True)
class SourceStats:
    frames: int = 0  # video frames handed to the mailbox
    audio_seconds: float = 0.0  # audio handed to the audio buffer
    connect_attempts: int = 0
    connects: int = 0  # sessions that opened
    reconnects: int = 0  # times the stream went RECONNECTING
    stalls: int = 0  # times the watchdog declared the stream STALLED
    corrupt_packets: int = 0  # undecodable packets skipped
    abandoned_readers: int = 0  # reader threads left to finish at their own timeout
    refused_connects: int = 0  # connects the sources policy refused (untrusted sources only)
    last_error: str | None = None


@dataclass(slots=True)
class _StallWatch:
    """The frame watchdog of one session.

    STALLED when no frame came for `watchdog_s` (time spent in pacing or in a blocking put
    does not count: then the consumer, not the source, is slow), and also when a frame ended
    such a silence before the watchdog looked (the reader counts those in `long_gaps`). Back
    to LIVE only after RESUME_FRAMES new frames, so that one frame flushed out of a decoder as
    a connection dies does not restart the stall clock.
    """

    watchdog_s: float
    since: float | None = None  # when the stall was declared
    frames_at_stall: int = 0
    quiet_for: float = 0.0
    gaps_seen: int = 0

    RESUME_FRAMES = 2

    def update(self, attempt: Attempt, now: float) -> str | None:
        """ "stalled", "resumed" or None (no change)."""
        self.quiet_for = 0.0 if attempt.delivering else now - attempt.last_frame_at
        missed = attempt.long_gaps != self.gaps_seen
        self.gaps_seen = attempt.long_gaps
        if self.since is None:
            if self.quiet_for > self.watchdog_s:
                self.since, self.frames_at_stall = now, attempt.frames
                return "stalled"
            if missed:  # the silence is over already, but it was one: report it
                self.quiet_for = attempt.long_gap_s
                self.since, self.frames_at_stall = now, attempt.frames
                return "stalled"
            return None
        if self.quiet_for <= self.watchdog_s and attempt.frames - self.frames_at_stall >= self.RESUME_FRAMES:
            self.since = None
            return "resumed"
        return None

    def stalled_for(self, now: float) -> float:
        return 0.0 if self.since is None else now - self.since

    def due_in(self, attempt: Attempt, now: float) -> float | None:
        """Seconds until a stall is due if no frame comes (None: not counting now)."""
        if self.since is not None or attempt.delivering:
            return None
        return max(0.0, attempt.last_frame_at + self.watchdog_s - now)

    def restart_due_in(self, stall_restart_s: float, now: float) -> float | None:
        """Seconds until a stall has lasted `stall_restart_s` (None: not stalled)."""
        return None if self.since is None else max(0.0, stall_restart_s - self.stalled_for(now))


@dataclass(frozen=True, slots=True)
class _Outcome:
    kind: str  # "ended" | "error" | "stalled" | "stopped" | "closed" | "limit"
    went_live: bool
    reason: str | None = None
    permanent: bool = False
    live_for: float = 0.0  # seconds between the session's first and last frame


class CameraSupervisor:
    def __init__(
        self,
        stream_id: str,
        spec: SourceSpec,
        *,
        video: FrameInput,
        audio: AudioInput | None,
        on_status: Callable[[StatusChange], None],
        backend: str = "pyav",
        policy: SupervisorPolicy | None = None,
        realtime: bool = False,
        max_frames: int | None = None,
        untrusted: bool = False,
        admit: SourcePolicy | None = None,
        packets: PacketInput | None = None,
    ) -> None:
        self.stream_id = validate_stream_id(stream_id)
        self.spec = spec
        self.backend = normalize_backend(backend)
        self.policy = policy or SupervisorPolicy()
        self.realtime = realtime and spec.is_file
        self.max_frames = max_frames
        # Added by an API client: why a network source failed (refused, timed out, not found...)
        # would make the service a port scanner, so status events carry UNTRUSTED_REASON and
        # only the log has the detail.
        self.untrusted = untrusted
        self.admit = admit  # checked before every connect: None for trusted sources
        self._want_audio = audio is not None
        self._status = StatusReport(self.stream_id, spec, self.backend, on_status)
        self._stats = SourceStats()  # frames, audio, connects and corrupt packets: kept by the feed
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake = asyncio.Event()
        self._stopping = asyncio.Event()
        self._stop_requested = threading.Event()
        self._feed = Feed(
            self.stream_id,
            spec,
            self.backend,
            video=video,
            audio=audio,
            packets=packets,
            realtime=self.realtime,
            max_frames=max_frames,
            stop_requested=self._stop_requested,
            wake=self._wake.set,
        )
        self._running = False

    # -- public -------------------------------------------------------------------------

    @property
    def state(self) -> StreamState:
        return self._status.state

    @property
    def stats(self) -> SourceStats:
        """A snapshot of the counters."""
        feed = self._feed
        return replace(
            self._stats,
            frames=feed.frames,
            audio_seconds=feed.audio_seconds,
            connects=feed.connects,
            corrupt_packets=feed.corrupt_packets,
        )

    def stop(self) -> None:
        """Ask run() to end (STOPPED). Safe from any thread; returns at once."""
        self._stop_requested.set()
        attempt = self._feed.current
        if attempt is not None:
            attempt.stop.set()
            attempt.session.interrupt()
        self._feed.close_outputs()  # unblocks a reader waiting in a blocking put
        loop = self._loop
        if loop is None:
            return
        if _running_loop() is loop:
            self._set_stopping()
        else:
            with contextlib.suppress(RuntimeError):  # loop already closed: nothing to wake
                loop.call_soon_threadsafe(self._set_stopping)

    async def run(self) -> StreamState:
        """Supervise until stopped (STOPPED), the file ends (STOPPED) or it gives up (FAILED)."""
        if self._running:
            raise RuntimeError(f"supervisor for {self.stream_id} is already running")
        self._running = True
        self._loop = asyncio.get_running_loop()
        if self._stop_requested.is_set():
            self._set_stopping()
        try:
            return await self._supervise()
        except asyncio.CancelledError:
            self._stop_requested.set()
            self._status.transition(StreamState.STOPPED, reason="cancelled")
            raise
        finally:
            self._feed.close_outputs()
            self._running = False

    # -- the state machine --------------------------------------------------------------

    async def _supervise(self) -> StreamState:
        failures = 0  # consecutive connect attempts that produced no frame
        backoff_step = 0  # consecutive attempts that did not stay live for watchdog_s
        reached = False  # the source has been live: from then on outages are ridden through
        while True:
            if self._stop_requested.is_set():
                return self._finish(StreamState.STOPPED, "stopped")
            self._status.transition(StreamState.CONNECTING, attempt=failures + 1)
            refused = await self._refused()
            if refused is not None:
                if self._stop_requested.is_set():
                    return self._finish(StreamState.STOPPED, "stopped")
                return self._finish(StreamState.FAILED, refused, attempt=failures + 1)
            outcome = await self._attempt(failures + 1)
            if outcome.kind == "stopped":
                return self._finish(StreamState.STOPPED, "stopped")
            if outcome.kind in ("closed", "limit"):
                return self._finish(StreamState.STOPPED, outcome.reason)
            if outcome.kind != "ended" or self.spec.is_network:
                self._stats.last_error = outcome.reason
            if self.spec.is_file or outcome.permanent:
                if outcome.kind == "ended" and outcome.went_live:
                    return self._finish(StreamState.STOPPED, outcome.reason or "end of file")
                return self._finish(StreamState.FAILED, outcome.reason, attempt=failures + 1)
            reached = reached or outcome.went_live
            failures = 0 if outcome.went_live else failures + 1
            # The backoff only starts over after a session that stayed up: a camera that
            # drops every connection after one frame must not be hammered twice a second.
            backoff_step = 0 if outcome.live_for >= self.policy.watchdog_s else backoff_step + 1
            limit = self.policy.max_failed_connects
            if limit is not None and not reached and failures >= limit:
                gave_up = f" (gave up after {failures} failed connect{'s' * (failures > 1)})"
                reason = f"{self._shown(outcome)}{gave_up}"
                return self._finish(StreamState.FAILED, reason, attempt=failures, detail=f"{outcome.reason}{gave_up}")
            delay = self.policy.retry_delay(backoff_step)
            self._stats.reconnects += 1
            self._status.transition(
                StreamState.RECONNECTING,
                reason=self._shown(outcome),
                detail=outcome.reason,
                attempt=failures,
                retry_in=delay,
            )
            if await self._sleep_unless_stopped(delay):
                return self._finish(StreamState.STOPPED, "stopped")

    async def _refused(self) -> str | None:
        """Why the sources policy refuses this connect (None: allowed, or a trusted source). Bounded
        by the policy's resolve timeout, and by stop()."""
        if self.admit is None:
            return None
        try:
            checked, _ = await until_set(self._stopping, self.admit.admit(self.spec.url), f"{self.stream_id}-admit")
        except InvalidSource as exc:
            self._stats.refused_connects += 1
            return f"source not allowed: {exc}"
        return None if checked else "stopped"

    def _shown(self, outcome: _Outcome) -> str | None:
        """The reason status events may carry for a network source's failed session."""
        if self.untrusted and self.spec.is_network and outcome.kind in ("error", "ended") and not outcome.permanent:
            return UNTRUSTED_REASON
        return outcome.reason

    async def _attempt(self, number: int) -> _Outcome:
        """Run one session until it ends, stalls for good, or the supervisor stops."""
        attempt = self._start_attempt(number)
        outcome = await self._watch(attempt)
        if attempt.first_frame_at is None:
            return outcome
        return replace(outcome, live_for=attempt.last_frame_at - attempt.first_frame_at)

    def _start_attempt(self, number: int) -> Attempt:
        options = SessionOptions(
            open_timeout_s=self.policy.open_timeout_s,
            read_timeout_s=self.policy.reader_timeout_s,
            want_audio=self._want_audio,
        )
        session = create_session(self.backend, self.spec, options)
        self._stats.connect_attempts += 1
        return self._feed.start(number, session, self.policy.watchdog_s, asyncio.get_running_loop())

    async def _watch(self, attempt: Attempt) -> _Outcome:
        """Follow a running attempt: LIVE / STALLED transitions, stall restart, connect deadline."""
        assert attempt.done is not None
        number = attempt.number
        started = time.monotonic()
        live = False
        watch = _StallWatch(self.policy.watchdog_s)
        tick = max(0.05, min(1.0, self.policy.watchdog_s / 5))
        try:
            while not attempt.done.done():
                self._wake.clear()
                if self._stop_requested.is_set():
                    await self._retire(attempt, "stopped")
                    return _Outcome("stopped", live)
                now = time.monotonic()
                if not live and attempt.frames > 0:
                    live = True
                    self._status.transition(StreamState.LIVE, attempt=number)
                elif live:
                    change = watch.update(attempt, now)
                    if change == "stalled":
                        self._stats.stalls += 1
                        self._status.transition(StreamState.STALLED, reason=self._quiet_reason(watch.quiet_for))
                    elif change == "resumed":
                        self._status.transition(StreamState.LIVE, reason="frames resumed")
                    elif self.spec.is_network and watch.stalled_for(now) >= self.policy.stall_restart_s:
                        await self._retire(attempt, "stalled")
                        reason = f"stalled for {watch.stalled_for(now):.1f} s: reconnecting"
                        return _Outcome("stalled", True, reason)
                elif now - started > self.policy.connect_deadline_s:
                    await self._retire(attempt, "connect deadline")
                    where = self.spec.host_port or self.spec.display
                    return _Outcome("error", False, f"no video from {where} within {now - started:.0f} s")
                # Wake when a stall or its restart is due, not on the next tick: the reader's
                # own timeout is only a second behind the restart.
                now = time.monotonic()
                restart_due = watch.restart_due_in(self.policy.stall_restart_s, now)
                dues = [watch.due_in(attempt, now), restart_due] if live else []
                wait = min([tick, *(due + 0.01 for due in dues if due is not None)])
                await wait_set(self._wake, wait)
        except asyncio.CancelledError:
            self._stop_requested.set()
            await self._retire(attempt, "cancelled")
            raise
        finally:
            self._feed.finished(attempt)
        if not live and attempt.frames > 0 and not self._stop_requested.is_set():
            live = True  # a short file can end before the loop saw its first frame
            self._status.transition(StreamState.LIVE, attempt=number)
        # How long the stall has lasted by the watchdog's schedule (the loop may have declared it late).
        stalled_for = time.monotonic() - attempt.last_frame_at - self.policy.watchdog_s
        if (
            live
            and self.spec.is_network
            and watch.since is not None
            and stalled_for >= self.policy.stall_restart_s
            and attempt.done.result() is not None
            and not self._stop_requested.is_set()
            and self._feed.end_reason is None
        ):
            # The restart was due when the reader's own timeout ended the session (the event
            # loop ran late): it is the stall restart all the same, and reported as one.
            return _Outcome("stalled", True, f"stalled for {stalled_for:.1f} s: reconnecting")
        return self._attempt_outcome(attempt, live)

    def _quiet_reason(self, seconds: float) -> str:
        if self.spec.is_network:
            return f"no video from {self.spec.host_port} for {seconds:.1f} s"
        return f"no frame for {seconds:.1f} s"

    def _attempt_outcome(self, attempt: Attempt, went_live: bool) -> _Outcome:
        assert attempt.done is not None
        error = attempt.done.result()
        if self._stop_requested.is_set():
            return _Outcome("stopped", went_live)
        end_reason = self._feed.end_reason
        if end_reason is not None:
            kind = "limit" if end_reason.startswith("frame limit") else "closed"
            return _Outcome(kind, went_live, end_reason)
        if error is not None:
            return _Outcome("error", went_live, error, permanent=attempt.permanent)
        if self.spec.is_file:
            return _Outcome("ended", went_live, "end of file" if went_live else None)
        return _Outcome("ended", went_live, "stream ended (the server closed the connection)")

    async def _retire(self, attempt: Attempt | None, why: str) -> None:
        """Signal a session to end and wait a bounded time for its thread."""
        if attempt is None:
            return
        attempt.stop.set()
        attempt.session.interrupt()
        if attempt.done is None or attempt.done.done():
            return
        await asyncio.wait({attempt.done}, timeout=self.policy.reader_join_s)
        if not attempt.done.done():
            self._stats.abandoned_readers += 1
            log.warning(
                "reader thread did not stop in time; abandoning it (it ends at its read timeout)",
                extra={
                    "stream_id": self.stream_id,
                    "source": self.spec.display,
                    "why": why,
                    "backend": self.backend,
                    "attempt": attempt.number,
                },
            )

    async def _sleep_unless_stopped(self, delay: float) -> bool:
        """Wait `delay` seconds; True if stop() came first."""
        await wait_set(self._stopping, delay)
        return self._stop_requested.is_set()

    def _finish(
        self, state: StreamState, reason: str | None, attempt: int = 0, detail: str | None = None
    ) -> StreamState:
        self._status.transition(state, reason=reason, detail=detail, attempt=attempt)
        return state

    def _set_stopping(self) -> None:
        self._stopping.set()
        self._wake.set()


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None
