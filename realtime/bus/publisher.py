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

`durable_ready` (readiness) is True only while connected with the VIDSENTRY stream known to be
there: a stream deleted under a live connection shows up as durable sends without an ack (with a
subscriber on our subjects) or "no responders" (without), and link.py then asks JetStream and
makes the stream again; meanwhile it is False.

This class is the façade; the parts live in their own modules:
  link.py        BusLink: the connection, the stream, checking for it and re-creating it when it
                 is lost (after a reconnect, or when durable sends go unanswered on a live link)
  ack_window.py  AckWindow: every durable send waiting for its ack, bounded, with ack timeouts
  ledger.py      DeliveryLedger: counters, delivery hooks, what is still unsettled (flush)
  durable.py     DurableDelivery: the direct send both modes share
  retrying.py    RetryingDelivery: without an outbox, retries with back-off
  spooling.py    SpoolingDelivery: with an outbox, spooling and in-order replay
  (pipelines/tasks.py TaskOwner: the background tasks; one that dies makes the publisher not `alive`)
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from types import TracebackType

import nats.errors
import nats.js.errors
from nats.aio.client import Client as NatsClient

from pipelines.event_bodies import AlertBody
from pipelines.events import Event, EventKind
from pipelines.tasks import TaskOwner, describe_error, wait_set
from realtime.bus import cloudevents
from realtime.bus.ack_window import AckWindow
from realtime.bus.async_acks import ErrorAwareJetStream
from realtime.bus.connection import BusUnavailable, connect_nats, redact_url, round_trip
from realtime.bus.delivery import (
    DeliveryHooks,
    NoHooks,
    PublisherClosedError,
    PublisherStats,
    UnconfirmedError,
    WireMessage,
)
from realtime.bus.durable import DurableDelivery
from realtime.bus.jetstream import StreamSetup, StreamSetupError, check_max_age, check_replicas, ensure_stream
from realtime.bus.ledger import DeliveryLedger
from realtime.bus.link import BusLink
from realtime.bus.outbox import Outbox
from realtime.bus.retrying import RetryingDelivery
from realtime.bus.spooling import SpoolingDelivery

__all__ = ["BusUnavailable", "NatsEventPublisher"]

log = logging.getLogger(__name__)


class JetStreamSilent(BusUnavailable):
    """JetStream did not answer in time (a cluster starting, a leader election, an overloaded server)."""


_CORE_FLUSH_CAP_S = 2.0
_LINK_CHECK_S = 0.1  # how often a flush with an outbox looks whether the link is still up
_MIN_DRAIN_S = 1.0  # close() gives draining the connection at least this long
# A cluster that has just started, or is electing its JetStream leader, may not answer the first
# stream set-up in time (nats-py's 5 s): it is asked again until this long has passed.
STREAM_SETUP_WAIT_S = 20.0


def live_client(source: NatsClient | NatsEventPublisher) -> NatsClient | None:
    """The connected client behind `source` (a client, or a publisher whose connection is looked up
    on each call: it may connect after its users are built), or None while there is none."""
    nc: NatsClient | None = source if isinstance(source, NatsClient) else source.nc
    return None if nc is None or nc.is_closed else nc


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
        stream_replicas: int = 1,
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
        self.stream_replicas = check_replicas(stream_replicas)
        self.reconnect_wait = reconnect_wait
        self._shown_url = redact_url(url)
        self._outbox = outbox
        self._flushed_at_close = True

        self._ledger = DeliveryLedger(hooks or NoHooks(), queued=(lambda: outbox.depth) if outbox is not None else None)
        self._window = AckWindow(max_pending_acks, ack_timeout)
        self._supervisor = TaskOwner("NATS publisher")
        self._link = BusLink(
            ensure_stream=self.ensure_stream,
            on_stream_ready=self._on_stream_ready,
            on_stream_lost=self._on_stream_lost,
            ledger=self._ledger,
            supervisor=self._supervisor,
        )
        self._delivery: DurableDelivery
        if outbox is None:
            self._delivery = RetryingDelivery(
                link=self._link,
                window=self._window,
                ledger=self._ledger,
                supervisor=self._supervisor,
                max_retries=max_retries,
            )
        else:
            self._delivery = SpoolingDelivery(
                outbox=outbox,
                link=self._link,
                window=self._window,
                ledger=self._ledger,
                supervisor=self._supervisor,
                max_retries=max_retries,
            )

    # -- settings that the parts read (writable, as plain attributes were) ------------------------

    @property
    def max_pending_acks(self) -> int:
        return self._window.capacity

    @max_pending_acks.setter
    def max_pending_acks(self, value: int) -> None:
        self._window.capacity = value

    @property
    def ack_timeout(self) -> float:
        return self._window.ack_timeout

    @ack_timeout.setter
    def ack_timeout(self, value: float) -> None:
        self._window.ack_timeout = value

    @property
    def max_retries(self) -> int:
        return self._delivery.max_retries

    @max_retries.setter
    def max_retries(self, value: int) -> None:
        self._delivery.max_retries = value

    @property
    def hooks(self) -> DeliveryHooks:
        return self._ledger.hooks

    @hooks.setter
    def hooks(self, value: DeliveryHooks) -> None:
        self._ledger.hooks = value

    # -- lifecycle ----------------------------------------------------------------------------

    async def connect(self) -> None:
        """Connect (bounded by connect_timeout, else BusUnavailable) and ensure the stream."""
        link = self._link
        if link.nc is not None:
            return
        if link.closed:
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
        js = ErrorAwareJetStream(nc, publish_async_max_pending=2 * self.max_pending_acks + 16)
        link.nc, link.js = nc, js
        try:
            await self._ensure_stream_at_start()
        except BaseException:
            link.nc = link.js = None
            await nc.close()
            raise
        link.stream_ready = True
        self._delivery.start()
        link.watch(self._window)
        log.info("NATS publisher connected url=%s node=%s", self._shown_url, self.node)

    async def _ensure_stream_at_start(self) -> None:
        deadline = time.monotonic() + STREAM_SETUP_WAIT_S
        while True:
            try:
                await self.ensure_stream()
                return
            except JetStreamSilent:
                if time.monotonic() >= deadline:
                    raise
                log.warning("JetStream did not answer the stream set-up; asking again url=%s", self._shown_url)
                await asyncio.sleep(1.0)

    async def ensure_stream(self) -> StreamSetup:
        """Create the VIDSENTRY stream if missing, or reconcile its subjects and limits."""
        if self._link.js is None:
            raise PublisherClosedError("connect() first")
        try:
            return await ensure_stream(self._link.js, self.stream_max_age_s, self.stream_replicas)
        except (nats.errors.NoRespondersError, nats.js.errors.ServiceUnavailableError):
            raise BusUnavailable(f"JetStream is not enabled on {self._shown_url}; start nats-server with -js") from None
        except nats.errors.TimeoutError:
            raise JetStreamSilent(f"JetStream on {self._shown_url} did not answer") from None
        except nats.errors.MaxPayloadError:
            max_payload = self._link.nc.max_payload if self._link.nc is not None else 0
            raise StreamSetupError(
                f"NATS server {self._shown_url} takes messages of at most {max_payload} bytes, too small "
                "even to set up the JetStream stream; raise its max_payload"
            ) from None

    async def flush(self, timeout: float = 10.0) -> bool:  # noqa: ASYNC109 - a bounded wait is the API
        """Wait until every durable message is acked or given up (False if that takes longer
        than `timeout` s), then push buffered live messages out, best effort."""
        return await self._flush(timeout, while_connected=False)

    async def _flush(self, timeout: float, *, while_connected: bool) -> bool:  # noqa: ASYNC109
        # while_connected (with an outbox): nothing settles without a connection, the outbox keeps
        # it for the next one, so stop waiting as soon as the link is down (False).
        deadline = time.monotonic() + timeout
        try:
            async with asyncio.timeout(timeout):
                if not await self._wait_settled(while_connected and self._outbox is not None):
                    return False
        except TimeoutError:
            return False
        nc = self._link.nc
        if nc is not None and nc.is_connected:
            # nats-py forgets a PING whose connection dropped (the PONG future is never resolved
            # after a reconnect), so cap this wait; live data is worthless later anyway.
            wait = min(max(deadline - time.monotonic(), 0.001), _CORE_FLUSH_CAP_S)
            with contextlib.suppress(nats.errors.Error, TimeoutError):
                async with asyncio.timeout(wait):
                    await round_trip(nc)
        return True

    async def _wait_settled(self, while_connected: bool) -> bool:
        idle = self._ledger.idle
        if not while_connected:
            await idle.wait()
            return True
        while not idle.is_set():
            if not self.connected:
                return False  # it waits on disk for the next connection, or the next start
            await wait_set(idle, _LINK_CHECK_S)
        return True

    async def close(self, timeout: float = 10.0) -> bool:  # noqa: ASYNC109 - bounded like flush
        """Flush, then drain the connection, all within about `timeout` s; True if everything was
        settled. Without an outbox whatever is still unanswered counts as failed (and as
        `unconfirmed`); with one it stays on disk for the next start (no waiting while
        disconnected)."""
        link = self._link
        if link.closed:
            return self._flushed_at_close
        deadline = time.monotonic() + timeout
        # With an outbox nothing is lost by not waiting for a broker that is not there.
        can_flush = link.nc is not None and (self._outbox is None or self.connected)
        flushed = await self._flush(timeout, while_connected=True) if can_flush else link.nc is None
        self._flushed_at_close = flushed
        link.closed = True
        await self._supervisor.cancel_all()
        self._delivery.on_closing()
        nc, link.nc, link.js = link.nc, None, None
        if nc is not None:
            try:
                async with asyncio.timeout(max(deadline - time.monotonic(), _MIN_DRAIN_S)):
                    await nc.drain()
            except (nats.errors.Error, TimeoutError) as exc:
                log.debug("drain failed, closing instead: %r", exc)
                await nc.close()
        self._window.fail_unanswered(UnconfirmedError("publisher closed before ack"))
        await asyncio.sleep(0)  # let the done-callbacks settle them
        await self._delivery.on_closed()
        stats = self._ledger.stats.totals()
        log.info(
            "NATS publisher closed flushed=%s published=%d acked=%d failed=%d dropped=%d outbox_left=%d",
            flushed,
            stats.published,
            stats.acked,
            stats.failed,
            stats.dropped,
            self._outbox.depth if self._outbox is not None else 0,
        )
        return flushed

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
        return self._link.connected

    @property
    def durable_ready(self) -> bool:
        """Connected and the VIDSENTRY stream is known to be there, so durable events can be
        stored now; False while a missing stream is being checked for or made again (readiness)."""
        return self._link.durable_ready

    @property
    def alive(self) -> bool:
        """Open, and none of the background tasks (retries, outbox replay, stream re-creation)
        has died; False for good once one has (`failure` says why)."""
        return not self._link.closed and self._supervisor.failure is None

    @property
    def failure(self) -> str | None:
        """Why the publisher is not alive although open: the first background task that died."""
        return self._supervisor.failure

    @property
    def nc(self) -> NatsClient | None:
        """The live connection, for helpers that share it (object store); None before connect / after close."""
        return self._link.nc

    @property
    def stats(self) -> PublisherStats:
        """A snapshot: published/acked/failed/... per kind, pending acks, last error."""
        snap = self._ledger.stats.snapshot()
        snap.pending_acks = len(self._window)
        snap.connected = self.connected
        snap.stream_ready = self.durable_ready
        snap.alive = self.alive
        snap.task_failures = self._supervisor.crashes
        self._delivery.add_stats(snap)
        return snap

    @property
    def outbox(self) -> Outbox | None:
        return self._outbox

    @property
    def outbox_writable(self) -> bool:
        """The outbox's disk takes what it must write (True without an outbox); for readiness."""
        return self._outbox is None or self._outbox.writable

    # -- publishing -----------------------------------------------------------------------------

    async def publish(self, event: Event) -> None:
        """Hand one event to NATS. Raises only for events that cannot be encoded
        (InvalidStreamId, EventEncodingError); transport failures are counted, not raised."""
        created = time.monotonic()
        payload, headers = cloudevents.encode(event, self.node, time.time())
        kind = EventKind(event.kind)
        severity = event.body.severity if isinstance(event.body, AlertBody) else None
        msg = WireMessage(
            event.id,
            kind,
            cloudevents.subject_for(event),
            payload,
            headers,
            created,
            severity if isinstance(severity, str) else None,
        )
        self._ledger.stats.kind(kind).published += 1
        if msg.durable:
            await self._delivery.publish(msg)
        else:
            await self._send_core(msg)

    async def resend(self, msg: WireMessage) -> None:
        """Publish an already-encoded durable message again (the outbox's replay path).
        Counted as newly published; JetStream drops it if the id is already stored."""
        if not msg.durable:
            raise ValueError(f"only durable messages can be re-sent, not {msg.kind.value}")
        self._ledger.stats.kind(msg.kind).published += 1
        await self._delivery.publish(msg)

    async def _send_core(self, msg: WireMessage) -> None:
        nc = self._link.nc
        stats = self._ledger.stats.kind(msg.kind)
        if nc is None or self._link.closed or not nc.is_connected:
            # Live-only data is worthless after an outage; keep the reconnect buffer for durable kinds.
            stats.dropped += 1
            return
        try:
            await nc.publish(msg.subject, msg.payload, headers=msg.headers)
        except Exception as exc:
            stats.failed += 1
            self._ledger.note_error("live publish failed", msg, exc)

    # -- connection callbacks (nats-py awaits these) ----------------------------------------------

    async def _on_disconnected(self) -> None:
        if self._link.closed:
            return
        self._ledger.stats.disconnects += 1
        self._link.stream_ready = False
        log.warning(
            "NATS disconnected url=%s; keeping durable events %s, dropping live ones",
            self._shown_url,
            self._delivery.keeps_durable_events_in,
        )
        self._delivery.on_disconnected()

    async def _on_reconnected(self) -> None:
        self._ledger.stats.reconnects += 1
        self._ledger.forget_logged_errors()  # the next outage's failures deserve a line again
        log.info("NATS reconnected url=%s", self._shown_url)
        self._delivery.on_reconnected()
        # A broker restarted without its store has lost the stream: recreate it.
        self._link.start_reconcile()

    def _on_stream_ready(self) -> None:
        self._delivery.on_stream_ready()

    def _on_stream_lost(self) -> None:
        self._delivery.on_stream_lost()

    async def _on_error(self, exc: Exception) -> None:
        self._ledger.stats.last_error = describe_error(exc)
        self._ledger.log_error_once(f"NATS client error: {describe_error(exc)}")

    async def _on_closed(self) -> None:
        log.debug("NATS connection closed url=%s", self._shown_url)
