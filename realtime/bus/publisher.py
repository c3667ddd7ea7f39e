"""NatsEventPublisher: the EventSink that puts pipeline events on NATS.

Live-only kinds (detections, partials) go over core NATS and are dropped while disconnected.
Durable kinds go to JetStream with `publish_async`; at most `max_pending_acks` wait for their
ack, each for at most `ack_timeout` s. Transport failures are counted and logged, never raised
into the pipeline.

Without an outbox, retryable failures are re-sent with the same Nats-Msg-Id (JetStream dedups)
up to `max_retries` times, then handed to `DeliveryHooks.on_undeliverable`; during an outage
nats-py's reconnect buffer holds what was sent.

With an `Outbox` the publisher "spools": from the moment the link is down (or a send fails in a
way worth retrying) every durable event goes to the disk outbox, and what was in flight is put
there first, oldest first. nats-py's reconnect buffer is off, and its unsent copies are dropped,
so nothing old reaches the broker behind something newer. After the reconnect, and once the
stream answers, the outbox is replayed in order (same Nats-Msg-Id, `max_pending_acks` in flight,
records removed as they are acked); only when it is empty do new events go direct again.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import socket
import time
from collections import deque
from dataclasses import dataclass
from functools import partial
from types import TracebackType

import nats.errors
import nats.js.errors
from nats.aio.client import Client as NatsClient
from nats.js.api import PubAck
from nats.js.client import JetStreamContext

from pipelines.events import Event, EventKind
from realtime.bus import cloudevents
from realtime.bus.connection import BusUnavailable, connect_nats, discard_unsent_publishes, redact_url
from realtime.bus.delivery import (
    AckTimeoutError,
    DeliveryHooks,
    NoHooks,
    PublisherClosedError,
    PublisherStats,
    WireMessage,
    is_permanent,
    is_retryable,
)
from realtime.bus.outbox import Outbox, OutboxRecord, OutboxWriteError
from realtime.bus.stream import StreamSetup, check_max_age, ensure_stream

log = logging.getLogger(__name__)

_RETRY_BACKOFF_S = (0.25, 1.0, 4.0)
_CORE_FLUSH_CAP_S = 2.0
_MAX_LOGGED_ERRORS = 64
_REPLAY_BATCH = 256  # records read from the outbox per step


@dataclass(slots=True)
class _InFlight:
    msg: WireMessage
    attempt: int
    future: asyncio.Future[PubAck]
    timer: asyncio.TimerHandle
    outbox_seq: int | None = None  # set for a replay out of the outbox


@dataclass(slots=True)
class _Retry:
    msg: WireMessage
    attempt: int
    not_before: float  # time.monotonic()


class NatsEventPublisher:
    """Publishes `Event`s as CloudEvents on `vidsentry.<stream_id>.<kind>`.

    `node` defaults to this host's name and ends up in `ce-source`. With `outbox`, durable
    events survive broker outages and restarts of this process (see the module docstring); the
    publisher owns the outbox from then on and closes it in close().
    """

    def __init__(
        self,
        url: str,
        *,
        node: str | None = None,
        connect_timeout: float = 5.0,
        stream_max_age_s: float = 7 * 24 * 3600,
        max_pending_acks: int = 1000,
        ack_timeout: float = 5.0,
        max_retries: int = 3,
        reconnect_wait: float = 1.0,
        hooks: DeliveryHooks | None = None,
        outbox: Outbox | None = None,
    ) -> None:
        if max_pending_acks < 1:
            raise ValueError("max_pending_acks must be >= 1")
        self.url = url
        self.node = node or socket.gethostname()
        self.connect_timeout = connect_timeout
        self.stream_max_age_s = check_max_age(stream_max_age_s)
        self.max_pending_acks = max_pending_acks
        self.ack_timeout = ack_timeout
        self.max_retries = max_retries
        self.reconnect_wait = reconnect_wait
        self.hooks: DeliveryHooks = hooks or NoHooks()
        self._shown_url = redact_url(url)

        self._nc: NatsClient | None = None
        self._js: JetStreamContext | None = None
        self._closed = False
        self._stats = PublisherStats()
        self._inflight: dict[int, _InFlight] = {}  # insertion order == send order
        self._keys = itertools.count()
        self._retries: deque[_Retry] = deque()
        self._retry_wakeup = asyncio.Event()
        self._unsettled = 0  # durable messages accepted and neither acked nor given up
        self._idle = asyncio.Event()
        self._idle.set()
        self._retry_task: asyncio.Task[None] | None = None
        self._reconcile_task: asyncio.Task[None] | None = None
        self._logged_errors: set[str] = set()  # distinct failure lines logged since the last reconnect

        self._outbox = outbox
        self._stream_ready = False  # the stream answered since the last (re)connect
        # Spooling: durable events go to the outbox. Leftovers from a previous run go out first.
        self._spooling = outbox is not None and outbox.depth > 0
        self._outbox_wakeup = asyncio.Event()
        self._outbox_task: asyncio.Task[None] | None = None
        self._replay_gen = 0  # bumped when in-flight replays are called back (requeued)
        self._replays_inflight = 0
        self._replay_probe = True  # after a break, one record alone until the broker acks it
        self._replay_failed = False  # back off before the next attempt
        self._replay_failures = 0  # consecutive failed attempts of the head record on a live link
        self._replay_backoff = 0  # consecutive failed replay rounds: index into _RETRY_BACKOFF_S
        self._replayed_total = 0
        self._replayed_since_spool = 0

    # -- lifecycle ----------------------------------------------------------------------------

    async def connect(self) -> None:
        """Connect (bounded by connect_timeout, else BusUnavailable) and ensure the stream."""
        if self._nc is not None:
            return
        if self._closed:
            raise PublisherClosedError("publisher is closed")
        if self._outbox is not None and self._outbox.closed:
            raise PublisherClosedError("the outbox is closed")
        nc = await connect_nats(
            self.url,
            connect_timeout=self.connect_timeout,
            name=f"vidsentry-publisher@{self.node}",
            reconnect_wait=self.reconnect_wait,
            disconnected_cb=self._on_disconnected,
            reconnected_cb=self._on_reconnected,
            error_cb=self._on_error,
            closed_cb=self._on_closed,
            # With an outbox, publishing while disconnected must fail fast rather than queue in
            # nats-py (which would re-send it, out of order, after the reconnect).
            pending_size=0 if self._outbox is not None else None,
        )
        # Headroom over our own bound: nats-py's semaphore must never be the one that stalls.
        js = nc.jetstream(publish_async_max_pending=2 * self.max_pending_acks + 16)
        self._nc, self._js = nc, js
        try:
            await self.ensure_stream()
        except BaseException:
            self._nc = self._js = None
            await nc.close()
            raise
        self._stream_ready = True
        if self._outbox is None:
            self._retry_task = asyncio.create_task(self._run_retries(), name="nats-publisher-retries")
        else:
            self._outbox_task = asyncio.create_task(self._run_outbox(), name="nats-publisher-outbox")
            if self._outbox.depth:
                log.info("replaying %d events left in the outbox dir=%s", self._outbox.depth, self._outbox.directory)
        log.info("NATS publisher connected url=%s node=%s", self._shown_url, self.node)

    async def ensure_stream(self) -> StreamSetup:
        """Create the VIDSENTRY stream if missing, or reconcile its subjects and limits."""
        if self._js is None:
            raise PublisherClosedError("connect() first")
        try:
            return await ensure_stream(self._js, self.stream_max_age_s)
        except (nats.errors.NoRespondersError, nats.js.errors.ServiceUnavailableError):
            raise BusUnavailable(f"JetStream is not enabled on {self._shown_url}; start nats-server with -js") from None
        except nats.errors.TimeoutError:
            raise BusUnavailable(f"JetStream on {self._shown_url} did not answer") from None

    async def flush(self, timeout: float = 10.0) -> bool:  # noqa: ASYNC109 - a bounded wait is the API
        """Wait until every durable message is acked or given up (False if that takes longer
        than `timeout` s), then push buffered live messages out, best effort."""
        deadline = time.monotonic() + timeout
        try:
            async with asyncio.timeout(timeout):
                await self._idle.wait()
        except TimeoutError:
            return False
        nc = self._nc
        if nc is not None and nc.is_connected:
            # nats-py forgets a PING whose connection dropped (the PONG future is never resolved
            # after a reconnect), so cap this wait; live data is worthless later anyway.
            wait = min(max(deadline - time.monotonic(), 0.001), _CORE_FLUSH_CAP_S)
            with contextlib.suppress(nats.errors.Error, TimeoutError):
                async with asyncio.timeout(wait):
                    await nc.flush()
        return True

    async def close(self, timeout: float = 10.0) -> None:  # noqa: ASYNC109 - bounded like flush
        """Flush, then drain the connection. Without an outbox whatever is still unacked counts as
        failed; with one it stays on disk for the next start (no waiting while disconnected)."""
        if self._closed:
            return
        # With an outbox nothing is lost by not waiting for a broker that is not there.
        can_flush = self._nc is not None and (self._outbox is None or self.connected)
        flushed = await self.flush(timeout) if can_flush else self._nc is None
        self._closed = True
        for task in (self._retry_task, self._reconcile_task, self._outbox_task):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        if self._outbox is not None and self._nc is not None:
            self._abort_replays()
            self._spill("closing")  # unacked direct sends wait on disk for the next start
        while self._retries:
            retry = self._retries.popleft()
            self._give_up(retry.msg, PublisherClosedError("publisher closed before retry"))
        nc, self._nc, self._js = self._nc, None, None
        if nc is not None:
            try:
                async with asyncio.timeout(timeout):
                    await nc.drain()
            except (nats.errors.Error, TimeoutError) as exc:
                log.debug("drain failed, closing instead: %r", exc)
                await nc.close()
        for entry in list(self._inflight.values()):
            if not entry.future.done():
                entry.future.set_exception(PublisherClosedError("publisher closed before ack"))
        await asyncio.sleep(0)  # let the done-callbacks settle them
        if self._outbox is not None:
            self._outbox.close()  # logs what is left for the next start
        stats = self._stats.totals()
        log.info(
            "NATS publisher closed flushed=%s published=%d acked=%d failed=%d dropped=%d outbox_left=%d",
            flushed,
            stats.published,
            stats.acked,
            stats.failed,
            stats.dropped,
            self._outbox.depth if self._outbox is not None else 0,
        )

    async def __aenter__(self) -> NatsEventPublisher:
        await self.connect()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    # -- state ----------------------------------------------------------------------------------

    @property
    def connected(self) -> bool:
        return self._nc is not None and self._nc.is_connected

    @property
    def nc(self) -> NatsClient | None:
        """The live connection, for helpers that share it (object store); None before connect / after close."""
        return self._nc

    @property
    def stats(self) -> PublisherStats:
        """A snapshot: published/acked/failed/... per kind, pending acks, last error."""
        snap = self._stats.snapshot()
        snap.pending_acks = len(self._inflight)
        snap.retry_backlog = len(self._retries)
        snap.connected = self.connected
        outbox = self._outbox
        if outbox is not None:
            snap.outbox_depth = outbox.depth
            snap.outbox_bytes = outbox.bytes
            snap.outbox_oldest_age_s = outbox.oldest_age_s
            snap.outbox_replayed = self._replayed_total
            for kind, count in outbox.dropped_overflow.items():
                snap.kind(kind).dropped_overflow = count
        return snap

    @property
    def outbox(self) -> Outbox | None:
        return self._outbox

    # -- publishing -----------------------------------------------------------------------------

    async def publish(self, event: Event) -> None:
        """Hand one event to NATS. Raises only for events that cannot be encoded
        (InvalidStreamId, EventEncodingError); transport failures are counted, not raised."""
        created = time.monotonic()
        payload, headers = cloudevents.encode(event, self.node, time.time())
        kind = EventKind(event.kind)
        severity = event.data.get("severity") if kind is EventKind.ALERTS else None
        msg = WireMessage(
            event.id,
            kind,
            cloudevents.subject_for(event),
            payload,
            headers,
            created,
            severity if isinstance(severity, str) else None,
        )
        self._stats.kind(kind).published += 1
        if msg.durable:
            await self._publish_durable(msg)
        else:
            await self._send_core(msg)

    async def resend(self, msg: WireMessage) -> None:
        """Publish an already-encoded durable message again (the outbox's replay path).
        Counted as newly published; JetStream drops it if the id is already stored."""
        if not msg.durable:
            raise ValueError(f"only durable messages can be re-sent, not {msg.kind.value}")
        self._stats.kind(msg.kind).published += 1
        await self._publish_durable(msg)

    async def _publish_durable(self, msg: WireMessage) -> None:
        nc = self._nc
        if self._outbox is not None and nc is not None and not self._closed:
            if not self._spooling and not nc.is_connected:
                self._link_down("disconnected")
            if self._spooling:
                self._spool(msg)
                return
        self._accept_durable()
        await self._send_durable(msg, attempt=0)

    async def _send_core(self, msg: WireMessage) -> None:
        nc = self._nc
        stats = self._stats.kind(msg.kind)
        if nc is None or self._closed or not nc.is_connected:
            # Live-only data is worthless after an outage; keep the reconnect buffer for durable kinds.
            stats.dropped += 1
            return
        try:
            await nc.publish(msg.subject, msg.payload, headers=msg.headers)
        except Exception as exc:
            stats.failed += 1
            self._note_error("live publish failed", msg, exc)

    def _accept_durable(self) -> None:
        self._unsettled += 1
        self._idle.clear()

    async def _send_durable(self, msg: WireMessage, attempt: int) -> None:
        await self._wait_for_ack_slot()
        nc, js = self._nc, self._js
        if nc is None or js is None or self._closed:
            self._give_up(msg, PublisherClosedError("publisher is not connected"))
            return
        if self._outbox is not None and not self._spooling and not nc.is_connected:
            self._link_down("disconnected")
        if self._spooling:  # the link broke while we waited: queue behind what went before
            self._spool(msg)
            self._settle()
            return
        try:
            # A payload nats-py refuses would leak one of its publish_async slots: refuse it first.
            if len(msg.payload) > nc.max_payload:
                raise nats.errors.MaxPayloadError
            # No wait_stall: nats-py's semaphore has headroom over our bound, and a wait_for per
            # message would yield to the flusher after every publish (one syscall each, 4x slower).
            future = await js.publish_async(msg.subject, msg.payload, headers=dict(msg.headers))
        except Exception as exc:
            self._after_failure(msg, attempt, exc)
            return
        if self._spooling:  # the link broke during the send; the outbox copy keeps the order
            future.cancel()
            self._spool(msg)
            self._settle()
            return
        key = next(self._keys)
        timer = asyncio.get_running_loop().call_later(self.ack_timeout, self._expire, key)
        self._inflight[key] = _InFlight(msg, attempt, future, timer)
        future.add_done_callback(partial(self._on_ack_done, key))

    async def _wait_for_ack_slot(self) -> None:
        # Back-pressure instead of growth: wait for the oldest ack (its timer bounds the wait).
        while len(self._inflight) >= self.max_pending_acks:
            oldest = next(iter(self._inflight.values()))
            await asyncio.wait({oldest.future})
            await asyncio.sleep(0)  # its done-callback frees the slot

    def _expire(self, key: int) -> None:
        entry = self._inflight.get(key)
        if entry is not None and not entry.future.done():
            entry.future.set_exception(AckTimeoutError(f"no JetStream ack within {self.ack_timeout:g} s"))

    def _on_ack_done(self, key: int, future: asyncio.Future[PubAck]) -> None:
        entry = self._inflight.pop(key, None)
        if entry is None:
            return
        entry.timer.cancel()
        error: BaseException | None
        error = PublisherClosedError("ack wait cancelled") if future.cancelled() else future.exception()
        if entry.outbox_seq is not None:
            self._on_replay_done(entry, error)
            return
        if error is not None:
            self._after_failure(entry.msg, entry.attempt, error)
            return
        ack = future.result()
        stats = self._stats.kind(entry.msg.kind)
        stats.acked += 1
        if ack.duplicate:
            stats.duplicates += 1
        self._settle()
        try:
            self.hooks.on_acked(entry.msg, time.monotonic() - entry.msg.created_at, bool(ack.duplicate))
        except Exception:
            log.exception("DeliveryHooks.on_acked raised")

    def _after_failure(self, msg: WireMessage, attempt: int, error: BaseException) -> None:
        if self._outbox is not None and not self._closed and is_retryable(error):
            self._note_error("durable publish failed, queued in the outbox", msg, error)
            self._spill("send failed", [msg])
            return
        can_retry = (
            is_retryable(error)
            and attempt < self.max_retries
            and not self._closed
            and len(self._retries) < self.max_pending_acks
        )
        if not can_retry:
            self._give_up(msg, error)
            return
        self._note_error("durable publish failed, will retry", msg, error)
        backoff = _RETRY_BACKOFF_S[min(attempt, len(_RETRY_BACKOFF_S) - 1)]
        self._retries.append(_Retry(msg, attempt + 1, time.monotonic() + backoff))
        self._retry_wakeup.set()

    def _give_up(self, msg: WireMessage, error: BaseException) -> None:
        self._fail(msg, error)
        self._settle()

    def _fail(self, msg: WireMessage, error: BaseException) -> None:
        self._stats.kind(msg.kind).failed += 1
        self._note_error("durable event undeliverable", msg, error)
        log.debug("undeliverable kind=%s id=%s error=%r", msg.kind.value, msg.event_id, error)
        try:
            self.hooks.on_undeliverable(msg, error)
        except Exception:
            log.exception("DeliveryHooks.on_undeliverable raised")

    def _settle(self) -> None:
        self._unsettled = max(0, self._unsettled - 1)
        self._update_idle()

    def _update_idle(self) -> None:
        if self._unsettled == 0 and (self._outbox is None or self._outbox.depth == 0):
            self._idle.set()
        else:
            self._idle.clear()

    async def _run_retries(self) -> None:
        while True:
            self._retry_wakeup.clear()
            head = self._retries[0] if self._retries else None
            if head is None or not self.connected:
                # While disconnected nats-py already buffers the first copy: hold retries until
                # the reconnect (the backlog is bounded by max_pending_acks).
                await self._retry_wakeup.wait()
                continue
            delay = head.not_before - time.monotonic()
            if delay > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._retry_wakeup.wait(), delay)
                continue
            self._retries.popleft()
            self._stats.kind(head.msg.kind).retries += 1
            await self._send_durable(head.msg, head.attempt)

    # -- outbox: spooling and replay ----------------------------------------------------------------

    def _spool(self, msg: WireMessage) -> None:
        assert self._outbox is not None
        try:
            self._outbox.append(msg)
        except OutboxWriteError as exc:  # disk full or failing: this one is lost, say so
            self._fail(msg, exc)
            return
        self._stats.kind(msg.kind).spooled += 1
        self._idle.clear()
        self._outbox_wakeup.set()

    def _spill(self, reason: str, failed: list[WireMessage] | None = None) -> None:
        """Send durable events through the outbox from now on. Direct sends still waiting for
        their ack (and `failed`, already unsettled) go in first, oldest first: whatever the
        broker stored of them is dropped again as a duplicate, what it lost keeps its place."""
        moved = list(failed or [])
        for key, entry in list(self._inflight.items()):
            if entry.outbox_seq is not None or _acked(entry.future):
                continue  # replays are requeued elsewhere; an ack already in hand still counts
            del self._inflight[key]
            entry.timer.cancel()
            entry.future.cancel()
            moved.append(entry.msg)
        if not self._spooling:
            self._spooling = True
            self._replayed_since_spool = 0
            log.info(
                "queueing durable events in the outbox (%s) dir=%s in_flight_moved=%d",
                reason,
                self._outbox.directory if self._outbox is not None else None,
                len(moved),
            )
        for msg in sorted(moved, key=lambda m: m.created_at):
            self._spool(msg)
            self._settle()

    def _link_down(self, reason: str) -> None:
        """The connection is gone: nothing in flight can be acked any more."""
        self._stream_ready = False
        nc = self._nc
        if nc is not None and not nc.is_connected:
            discarded = discard_unsent_publishes(nc)
            if discarded:
                log.debug("discarded %d unsent publishes held by nats-py", discarded)
        self._abort_replays()
        self._spill(reason)

    def _abort_replays(self) -> None:
        """Call back the replays in flight; the outbox hands them out again, in order."""
        for key, entry in list(self._inflight.items()):
            if entry.outbox_seq is None:
                continue
            del self._inflight[key]
            entry.timer.cancel()
            entry.future.cancel()
        self._replays_inflight = 0
        self._replay_gen += 1
        self._replay_probe = True
        if self._outbox is not None and not self._outbox.closed:
            self._outbox.requeue()

    async def _run_outbox(self) -> None:
        outbox = self._outbox
        assert outbox is not None
        while not self._closed:
            self._outbox_wakeup.clear()
            if not self.connected or not self._stream_ready:
                await self._wait_for_work()
                continue
            if self._replay_failed:
                self._replay_failed = False
                await asyncio.sleep(_RETRY_BACKOFF_S[self._replay_backoff - 1])
                continue
            if outbox.depth == 0:
                if self._spooling and not self._replays_inflight:
                    self._spooling = False
                    log.info("outbox drained: %d events replayed; sending directly again", self._replayed_since_spool)
                self._update_idle()
                await self._wait_for_work()
                continue
            room = self.max_pending_acks - len(self._inflight)
            if self._replay_probe:  # after a break, prove the broker takes the head before piling on
                room = 0 if self._replays_inflight else 1
            batch = outbox.take(min(room, _REPLAY_BATCH)) if room > 0 else []
            if not batch:
                await self._wait_for_work()
                continue
            generation = self._replay_gen
            for record in batch:
                if generation != self._replay_gen:
                    break  # aborted meanwhile: the rest of the batch was requeued
                await self._send_replay(record, generation)

    async def _wait_for_work(self) -> None:
        """Sleep until woken; meanwhile fsync what the outbox wrote once its interval is up, so a
        quiet outage does not leave the last appends unsynced."""
        outbox = self._outbox
        interval = outbox.fsync_interval_s if outbox is not None else None
        if outbox is None or interval is None or not outbox.needs_sync:
            await self._outbox_wakeup.wait()
            return
        try:
            async with asyncio.timeout(interval):
                await self._outbox_wakeup.wait()
        except TimeoutError:
            outbox.sync()

    async def _send_replay(self, record: OutboxRecord, generation: int) -> None:
        msg = record.to_wire()
        nc, js = self._nc, self._js
        if nc is None or js is None or not nc.is_connected:
            self._link_down("disconnected")
            return
        try:
            if len(msg.payload) > nc.max_payload:
                raise nats.errors.MaxPayloadError
            future = await js.publish_async(msg.subject, msg.payload, headers=dict(msg.headers))
        except Exception as exc:
            self._on_replay_failed(record.seq, msg, exc)
            return
        if generation != self._replay_gen:  # aborted during the send: it is queued again
            future.cancel()
            return
        key = next(self._keys)
        timer = asyncio.get_running_loop().call_later(self.ack_timeout, self._expire, key)
        self._inflight[key] = _InFlight(msg, 0, future, timer, record.seq)
        self._replays_inflight += 1
        future.add_done_callback(partial(self._on_ack_done, key))

    def _on_replay_done(self, entry: _InFlight, error: BaseException | None) -> None:
        assert self._outbox is not None and entry.outbox_seq is not None
        self._replays_inflight -= 1
        if error is not None:
            self._on_replay_failed(entry.outbox_seq, entry.msg, error)
            return
        ack = entry.future.result()
        if self._outbox.remove(entry.outbox_seq):
            stats = self._stats.kind(entry.msg.kind)
            stats.acked += 1
            stats.replayed += 1
            stats.duplicates += bool(ack.duplicate)
            self._replayed_total += 1
            self._replayed_since_spool += 1
            try:
                self.hooks.on_acked(entry.msg, time.monotonic() - entry.msg.created_at, bool(ack.duplicate))
            except Exception:
                log.exception("DeliveryHooks.on_acked raised")
        self._replay_probe = False
        self._replay_failures = self._replay_backoff = 0
        self._update_idle()
        self._outbox_wakeup.set()

    def _on_replay_failed(self, seq: int, msg: WireMessage, error: BaseException) -> None:
        assert self._outbox is not None
        probe = self._replay_probe
        if probe and self.connected and not isinstance(error, nats.js.errors.NoStreamResponseError):
            self._replay_failures += 1
        # A record the broker refuses, or that fails alone on a live link again and again (nats-py
        # turns JetStream error replies into ack timeouts), must not block everything behind it.
        if is_permanent(error) or self._replay_failures > self.max_retries:
            if self._outbox.remove(seq):
                self._fail(msg, error)
            self._replay_failures = 0
            self._update_idle()
            self._outbox_wakeup.set()
            return
        self._note_error("outbox replay failed, will retry", msg, error)
        if isinstance(error, nats.js.errors.NoStreamResponseError) and self.connected:
            # No stream takes the subject (deleted, or a broker that lost its store): make it again.
            self._stream_ready = False
            self._start_reconcile()
        self._abort_replays()
        self._replay_failed = True
        self._replay_backoff = min(self._replay_backoff + 1, len(_RETRY_BACKOFF_S))
        self._outbox_wakeup.set()

    # -- connection callbacks (nats-py awaits these) ----------------------------------------------

    async def _on_disconnected(self) -> None:
        if self._closed:
            return
        self._stats.disconnects += 1
        self._stream_ready = False
        where = "in the outbox" if self._outbox is not None else "in memory"
        log.warning("NATS disconnected url=%s; keeping durable events %s, dropping live ones", self._shown_url, where)
        if self._outbox is not None:
            self._link_down("disconnected")

    async def _on_reconnected(self) -> None:
        self._stats.reconnects += 1
        self._logged_errors.clear()  # the next outage's failures deserve a line again
        log.info("NATS reconnected url=%s", self._shown_url)
        now = time.monotonic()
        for retry in self._retries:  # success is likely now: skip the rest of the back-off
            retry.not_before = min(retry.not_before, now)
        self._retry_wakeup.set()
        # A broker restarted without its store has lost the stream: recreate it.
        self._start_reconcile()

    def _start_reconcile(self) -> None:
        if self._reconcile_task is None or self._reconcile_task.done():
            self._reconcile_task = asyncio.create_task(self._reconcile_stream(), name="nats-stream-reconcile")

    async def _reconcile_stream(self) -> None:
        attempt = 0
        while not self._closed:
            try:
                await self.ensure_stream()
            except Exception as exc:
                self._stats.last_error = f"ensure_stream after reconnect: {exc}"
                self._log_error_once(f"could not ensure stream after reconnect: {exc}")
                if not self.connected:
                    return  # the next reconnect tries again
                await asyncio.sleep(_RETRY_BACKOFF_S[min(attempt, len(_RETRY_BACKOFF_S) - 1)])
                attempt += 1
                continue
            self._stream_ready = True
            self._outbox_wakeup.set()
            return

    async def _on_error(self, exc: Exception) -> None:
        self._stats.last_error = _describe(exc)
        self._log_error_once(f"NATS client error: {_describe(exc)}")

    async def _on_closed(self) -> None:
        log.debug("NATS connection closed url=%s", self._shown_url)

    def _note_error(self, what: str, msg: WireMessage, error: BaseException) -> None:
        self._stats.last_error = f"{msg.kind.value}: {_describe(error)}"
        self._log_error_once(f"{what} kind={msg.kind.value}: {_describe(error)}")

    def _log_error_once(self, line: str) -> None:
        # An outage fails thousands of publishes the same way: log each distinct failure once.
        if line in self._logged_errors:
            log.debug("%s", line)
            return
        if len(self._logged_errors) >= _MAX_LOGGED_ERRORS:
            self._logged_errors.clear()
        self._logged_errors.add(line)
        log.warning("%s", line)


def _acked(future: asyncio.Future[PubAck]) -> bool:
    return future.done() and not future.cancelled() and future.exception() is None


def _describe(error: BaseException) -> str:
    text = str(error)
    return f"{type(error).__name__}: {text}" if text else type(error).__name__
