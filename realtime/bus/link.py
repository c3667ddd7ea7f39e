"""BusLink: the publisher's connection to NATS, and the VIDSENTRY stream on it.

It holds the nats-py client and its JetStream context while connected, whether the publisher is
closed, and whether the stream is known to take durable events (`stream_ready`).

The stream can vanish under a live connection: a broker restarted without its store, or someone
deleting it (`nats stream rm`, `js.delete_stream`). A publish to a subject no stream takes is
answered "no responders" only while nobody else listens; as soon as any plain subscriber is on
`vidsentry.>` (a dashboard, `vidsentry subscribe`) the server delivers it there and answers
nothing, so each durable publish just times out and nothing in the reply says why. So the
publish path never guesses: a durable send on a live connection that gets no ack in time, or
"no responders", makes the deliveries call `suspect_stream`, and the link asks JetStream's own
API (`ensure_stream`: STREAM.INFO, and STREAM.CREATE when it is gone). Until that answers,
`stream_ready` is False: replays and retries wait, and readiness says durable delivery is not
possible. A stream found missing is made again (counted in `stream_recreations`, logged), and
`on_stream_lost` tells the delivery that every send still waiting for an ack went nowhere (it
re-sends them, through the outbox when there is one), then `on_stream_ready` that sends may go
again. If the stream cannot be made (JetStream not answering, another stream now owning our
subjects), the link keeps trying with back-off while the connection lasts, `stream_ready` stays
False, and the last error says why.

A server that stops answering without closing the connection (frozen by SIGSTOP, a hung VM, a
half-open TCP link) looks, from here, just like JetStream not answering; nats-py's own pings
notice it only after minutes, while every durable event waits. So when a send goes unanswered
(before the stream check) and when a check fails on a live connection, the link pings the server
itself (PING/PONG within `_PING_TIMEOUT_S`): a server that does not answer that either is left
for another one of the list (`force_reconnect`; logged), whose reconnect checks the stream again.
A server that answers the ping is fine and JetStream is only electing a leader: the link keeps
asking it. Waiting for an ack to time out before asking costs `ack_timeout` (5 s) on top, so the
link also watches the ack window (`watch`): once sends have waited `_SILENT_S` with no ack
arriving at all, it pings then. A healthy but slow JetStream answers that ping and costs one
PING per `_SILENT_S`; a frozen server is left a few seconds after it went silent.

Bounds: one check or re-creation runs at a time; checks that a send failure asks for start at
most once per `_CHECK_INTERVAL_S` (a slow broker that times out thousands of acks gets one
STREAM.INFO a second, not thousands); each check is counted in `stream_checks`. After every
(re)connect the stream is checked the same way (a broker that came back without its store).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import cast

import nats.errors
from nats.aio.client import Client as NatsClient
from nats.js.client import JetStreamContext

from pipelines.tasks import TaskOwner, describe_error
from realtime.bus.ack_window import AckWindow
from realtime.bus.delivery import RETRY_BACKOFF_S
from realtime.bus.jetstream import STREAM_NAME, StreamSetup
from realtime.bus.ledger import DeliveryLedger

log = logging.getLogger(__name__)

_CHECK_INTERVAL_S = 1.0  # at most one send-failure-triggered stream check per this many seconds
# Asked only after JetStream failed to answer for seconds: a server slower than this to answer a
# bare PING is of no use to the publisher anyway.
_PING_TIMEOUT_S = 2.0
# Acks usually come back within milliseconds, even replicated three ways; a second of none while
# sends wait is worth one PING.
_SILENT_S = 1.0
_WATCH_EVERY_S = 0.25


class BusLink:
    def __init__(
        self,
        *,
        ensure_stream: Callable[[], Awaitable[StreamSetup]],
        on_stream_ready: Callable[[], None],
        on_stream_lost: Callable[[], None],
        ledger: DeliveryLedger,
        supervisor: TaskOwner,
    ) -> None:
        self.nc: NatsClient | None = None
        self.js: JetStreamContext | None = None
        self.closed = False
        # The stream answered since the last (re)connect, and no check is under way.
        self.stream_ready = False
        self._ensure_stream = ensure_stream
        self._on_stream_ready = on_stream_ready
        self._on_stream_lost = on_stream_lost
        self._ledger = ledger
        self._supervisor = supervisor
        self._reconcile_task: asyncio.Task[None] | None = None
        self._last_check = -_CHECK_INTERVAL_S  # time.monotonic() when the last suspicion check started
        self._connection_gen = 0  # bumped at every (re)connect: an answer from before it is stale

    @property
    def connected(self) -> bool:
        return self.nc is not None and self.nc.is_connected

    @property
    def durable_ready(self) -> bool:
        """Connected, and the VIDSENTRY stream is known to be there: durable events can be stored."""
        return self.connected and self.stream_ready and not self.closed

    def start_reconcile(self) -> None:
        """After a (re)connect: check the stream (and make it again if the broker lost it)."""
        self.stream_ready = False
        self._connection_gen += 1
        if self._reconcile_task is None or self._reconcile_task.done():
            self._reconcile_task = self._supervisor.spawn(self._reconcile_stream(0.0), name="nats-stream-reconcile")

    def watch(self, window: AckWindow) -> None:
        """Ping the server whenever `window`'s sends go `_SILENT_S` without an ack (until closed)."""
        self._supervisor.spawn(self._watch_silence(window), name="nats-silence-watch")

    async def _watch_silence(self, window: AckWindow) -> None:
        quiet_until = 0.0
        while not self.closed:
            await asyncio.sleep(_WATCH_EVERY_S)
            now = time.monotonic()
            if now < quiet_until or not self.durable_ready or window.silent_for(now) < _SILENT_S:
                continue
            if self._reconcile_task is not None and not self._reconcile_task.done():
                continue  # a check is asking the server already
            self._ledger.stats.silence_pings += 1
            await self._left_silent_server()
            quiet_until = time.monotonic() + _SILENT_S  # answered: JetStream is slow, not the server

    def suspect_stream(self, error: BaseException) -> None:
        """A durable send on a live connection got no ack in time, or "no responders": ask
        JetStream whether the stream is still there (see the module docstring)."""
        if self.closed or not self.connected:
            return  # the reconnect checks the stream anyway
        if self._reconcile_task is not None and not self._reconcile_task.done():
            return  # a check or re-creation is already under way
        self.stream_ready = False  # unknown until JetStream answers: hold replays and retries
        delay = max(0.0, self._last_check + _CHECK_INTERVAL_S - time.monotonic())
        log.debug("durable send failed on a live connection (%s); checking stream %s",
                  describe_error(error), STREAM_NAME)
        self._reconcile_task = self._supervisor.spawn(self._reconcile_stream(delay, ping_first=True),
                                                      name="nats-stream-check")

    async def _reconcile_stream(self, delay: float, *, ping_first: bool = False) -> None:
        if delay > 0:
            await asyncio.sleep(delay)
        self._last_check = time.monotonic()
        # A send went unanswered: a frozen server is found in one ping, before the stream check's
        # own timeout, so leases renewed over this connection are not lost waiting for it.
        if ping_first and await self._left_silent_server():
            return
        attempt = 0
        while not self.closed:
            self._ledger.stats.stream_checks += 1
            generation = self._connection_gen
            try:
                setup = await self._ensure_stream()
            except Exception as exc:
                self.stream_ready = False
                self._ledger.stats.last_error = f"ensure_stream: {describe_error(exc)}"
                self._ledger.log_error_once(
                    f"JetStream stream {STREAM_NAME} cannot take durable events: {describe_error(exc)}"
                )
                if not self.connected or await self._left_silent_server():
                    return  # the next reconnect tries again
                await asyncio.sleep(RETRY_BACKOFF_S[min(attempt, len(RETRY_BACKOFF_S) - 1)])
                attempt += 1
                continue
            if self.closed:
                return
            if generation != self._connection_gen and setup != "created":
                continue  # reconnected meanwhile: that answer may predate it, ask again
            if setup == "created":
                # Sent before it existed: they reached subscribers at most, never the stream.
                self._ledger.stats.stream_recreations += 1
                log.warning(
                    "JetStream stream %s was missing; created it again and re-sending the durable "
                    "events that were waiting for an ack recreations=%d",
                    STREAM_NAME,
                    self._ledger.stats.stream_recreations,
                    extra={"stream": STREAM_NAME, "recreations": self._ledger.stats.stream_recreations},
                )
                self._on_stream_lost()
            self.stream_ready = True
            self._on_stream_ready()
            return

    async def _left_silent_server(self) -> bool:
        """Ping the server this connection is on; if it does not answer, reconnect to another of the
        list and return True (see the module docstring)."""
        nc = self.nc
        if nc is None or not nc.is_connected:
            return False
        try:
            await nc.flush(timeout=cast(int, _PING_TIMEOUT_S))  # nats-py annotates int, takes seconds
            return False
        except nats.errors.TimeoutError:
            pass
        except nats.errors.Error as exc:  # closed or reconnecting meanwhile: the reconnect takes over
            log.debug("ping after a failed stream check: %s", describe_error(exc))
            return not self.connected
        url = nc.connected_url  # host and port only: the URL may carry credentials
        server = f"{url.hostname}:{url.port}" if url is not None else "?"
        self._ledger.log_error_once(
            f"NATS server {server} did not answer a ping within {_PING_TIMEOUT_S:g} s; reconnecting to another"
        )
        await nc.force_reconnect()
        return True
