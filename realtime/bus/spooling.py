"""SpoolingDelivery: durable delivery through a disk `Outbox`, in order, across outages.

While the link is up and sends succeed, durable events go straight to JetStream. From the moment
the link is down (or a send fails in a way worth retrying) the delivery "spools": every durable
event goes to the outbox, and what was in flight is put there first, oldest first. nats-py's
reconnect buffer is off, and its unsent copies are dropped, so nothing old reaches the broker
behind something newer. After the reconnect, and once the stream answers, the outbox is replayed
in order (same Nats-Msg-Id, at most the ack window's capacity in flight, one record alone first
after every break, back-off after failed rounds, records removed as they are acked); only when it
is empty do new events go direct again. A record the broker refuses for good, or that fails alone
again and again on a live link, is given up on so it cannot block everything behind it.
A stream deleted under a live connection (see link.py) is the same break without a disconnect:
sends that get no ack in time spill into the outbox, the link checks and makes the stream again,
whatever was still waiting for an ack is spooled or handed out again, and the replay starts over.
The outbox's fsync and compaction run on its own worker thread (`Outbox.start_background_io`),
not on the event loop, where they would stall every stream at once.
"""

from __future__ import annotations

import asyncio
import logging

import nats.js.errors
from nats.aio.client import Client as NatsClient
from nats.js.api import PubAck

from pipelines.tasks import TaskOwner
from realtime.bus.ack_window import AckWindow, InFlight
from realtime.bus.connection import discard_unsent_publishes
from realtime.bus.delivery import RETRY_BACKOFF_S, PublisherStats, WireMessage, is_permanent, is_retryable
from realtime.bus.durable import DurableDelivery
from realtime.bus.ledger import DeliveryLedger
from realtime.bus.link import BusLink
from realtime.bus.outbox import Outbox, OutboxRecord, OutboxWriteError

log = logging.getLogger(__name__)

_REPLAY_BATCH = 256  # records read from the outbox per step
_HOUSEKEEPING_S = 1.0  # how often failed disk work is retried when the outbox never fsyncs


class SpoolingDelivery(DurableDelivery):
    keeps_durable_events_in = "in the outbox"

    def __init__(
        self,
        *,
        outbox: Outbox,
        link: BusLink,
        window: AckWindow,
        ledger: DeliveryLedger,
        supervisor: TaskOwner,
        max_retries: int,
    ) -> None:
        super().__init__(link=link, window=window, ledger=ledger, supervisor=supervisor, max_retries=max_retries)
        self.outbox = outbox
        # Spooling: durable events go to the outbox. Leftovers from a previous run go out first.
        self._spooling = outbox.depth > 0
        self._wakeup = asyncio.Event()
        self._replay_gen = 0  # bumped when in-flight replays are called back (requeued)
        self._replays_inflight = 0
        self._replay_probe = True  # after a break, one record alone until the broker acks it
        self._replay_failed = False  # back off before the next attempt
        self._replay_failures = 0  # consecutive failed attempts of the head record on a live link
        self._replay_backoff = 0  # consecutive failed replay rounds: index into RETRY_BACKOFF_S
        self.replayed_total = 0
        self._replayed_since_spool = 0

    # -- publishing -----------------------------------------------------------------------------

    async def publish(self, msg: WireMessage) -> None:
        link = self._link
        nc = link.nc
        if nc is not None and not link.closed:
            if not self._spooling and not nc.is_connected:
                self._link_down("disconnected")
            if self._spooling:
                self._spool(msg)
                return
        await super().publish(msg)

    def _diverted(self, nc: NatsClient) -> bool:
        if not self._spooling and not nc.is_connected:
            self._link_down("disconnected")
        return self._spooling

    def _direct_still_wanted(self) -> bool:
        return not self._spooling

    def _divert(self, msg: WireMessage) -> None:
        # The link broke while the message waited for a slot, or during its send: queue it behind
        # what went before (the outbox copy keeps the order).
        self._spool(msg)
        self._ledger.settle()

    def _on_send_failed(self, msg: WireMessage, attempt: int, error: BaseException) -> None:
        if not self._link.closed and is_retryable(error):
            self._ledger.note_error("durable publish failed, queued in the outbox", msg, error)
            self._spill("send failed", [msg])
            return
        self._ledger.give_up(msg, error)

    # -- lifecycle ------------------------------------------------------------------------------

    def start(self) -> None:
        self.outbox.start_background_io()  # fsync and compaction must not stall the event loop
        self._supervisor.spawn(self._run_outbox(), name="nats-publisher-outbox")
        if self.outbox.depth:
            log.info("replaying %d events left in the outbox dir=%s", self.outbox.depth, self.outbox.directory)

    def on_disconnected(self) -> None:
        self._link_down("disconnected")

    def on_stream_ready(self) -> None:
        self._wakeup.set()

    def on_stream_lost(self) -> None:
        # Nothing in flight can be acked: it reached subscribers at most. Direct sends go to the
        # outbox behind what is there, replays are handed out again, and the head's failures were
        # the missing stream's, not its own.
        self._abort_replays()
        self._spill("stream was missing")
        self._replay_failures = self._replay_backoff = 0
        self._replay_failed = False

    def on_closing(self) -> None:
        if self._link.nc is not None:
            self._abort_replays()
            self._spill("closing")  # unacked direct sends wait on disk for the next start

    async def on_closed(self) -> None:
        outbox = self.outbox
        if not outbox.closed:
            outbox.sync()  # the last fsync too runs off the event loop; close() finds it done
            await asyncio.to_thread(outbox.wait_for_background_io)
        outbox.close()  # logs what is left for the next start

    def add_stats(self, snap: PublisherStats) -> None:
        outbox = self.outbox
        snap.outbox_depth = outbox.depth
        snap.outbox_bytes = outbox.bytes
        snap.outbox_oldest_age_s = outbox.oldest_age_s
        snap.outbox_replayed = self.replayed_total
        snap.outbox_writable = outbox.writable
        snap.outbox_disk_errors = outbox.disk_errors
        for kind, count in outbox.dropped_overflow.items():
            snap.kind(kind).dropped_overflow = count

    # -- spooling -------------------------------------------------------------------------------

    def _spool(self, msg: WireMessage) -> None:
        try:
            self.outbox.append(msg)
        except OutboxWriteError as exc:  # disk full or failing: this one is lost, say so
            self._ledger.failed(msg, exc)
            return
        self._ledger.stats.kind(msg.kind).spooled += 1
        self._ledger.idle.clear()
        self._wakeup.set()

    def _spill(self, reason: str, failed: list[WireMessage] | None = None) -> None:
        """Send durable events through the outbox from now on. Direct sends still waiting for
        their ack (and `failed`, already unsettled) go in first, oldest first: whatever the
        broker stored of them is dropped again as a duplicate, what it lost keeps its place."""
        moved = list(failed or [])
        # Replays are requeued elsewhere; an ack already in hand still counts.
        recalled = self._window.recall(lambda entry: entry.outbox_seq is None and not entry.acked)
        moved += [entry.msg for entry in recalled]
        if not self._spooling:
            self._spooling = True
            self._replayed_since_spool = 0
            log.info(
                "queueing durable events in the outbox (%s) dir=%s in_flight_moved=%d",
                reason,
                self.outbox.directory,
                len(moved),
            )
        for msg in sorted(moved, key=lambda m: m.created_at):
            self._spool(msg)
            self._ledger.settle()

    def _link_down(self, reason: str) -> None:
        """The connection is gone: nothing in flight can be acked any more."""
        self._link.stream_ready = False
        nc = self._link.nc
        if nc is not None and not nc.is_connected:
            discarded = discard_unsent_publishes(nc)
            if discarded:
                log.debug("discarded %d unsent publishes held by nats-py", discarded)
        self._abort_replays()
        self._spill(reason)

    # -- replay ---------------------------------------------------------------------------------

    def _abort_replays(self) -> None:
        """Call back the replays in flight; the outbox hands them out again, in order."""
        self._window.recall(lambda entry: entry.outbox_seq is not None)
        self._replays_inflight = 0
        self._replay_gen += 1
        self._replay_probe = True
        if not self.outbox.closed:
            self.outbox.requeue()

    async def _run_outbox(self) -> None:
        outbox, link = self.outbox, self._link
        while not link.closed:
            self._wakeup.clear()
            if not link.connected or not link.stream_ready:
                await self._wait_for_work()
                continue
            if self._replay_failed:
                self._replay_failed = False
                await asyncio.sleep(RETRY_BACKOFF_S[self._replay_backoff - 1])
                continue
            if outbox.depth == 0:
                if self._spooling and not self._replays_inflight:
                    self._spooling = False
                    log.info("outbox drained: %d events replayed; sending directly again", self._replayed_since_spool)
                self._ledger.update_idle()
                await self._wait_for_work()
                continue
            room = self._window.room
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
        quiet outage does not leave the last appends unsynced, and retry disk work that failed
        (so a disk that works again is seen to, without waiting for traffic)."""
        outbox = self.outbox
        if not outbox.needs_sync:
            await self._wakeup.wait()
            return
        try:
            async with asyncio.timeout(outbox.fsync_interval_s or _HOUSEKEEPING_S):
                await self._wakeup.wait()
        except TimeoutError:
            outbox.sync()

    async def _send_replay(self, record: OutboxRecord, generation: int) -> None:
        msg = record.to_wire()
        nc, js = self._link.nc, self._link.js
        if nc is None or js is None or not nc.is_connected:
            self._link_down("disconnected")
            return
        try:
            sent = await self._window.send(
                js,
                nc.max_payload,
                msg,
                self._on_replay_done,
                outbox_seq=record.seq,
                still_wanted=lambda: generation == self._replay_gen,  # else aborted: it is queued again
            )
        except Exception as exc:
            self._on_replay_failed(record.seq, msg, exc)
            return
        if sent:
            self._replays_inflight += 1

    def _on_replay_done(self, entry: InFlight, ack: PubAck | None, error: BaseException | None) -> None:
        assert entry.outbox_seq is not None
        self._replays_inflight -= 1
        if error is not None:
            self._on_replay_failed(entry.outbox_seq, entry.msg, error)
            return
        assert ack is not None
        if self.outbox.remove(entry.outbox_seq):
            self._ledger.acked(entry.msg, ack, replayed=True)
            self.replayed_total += 1
            self._replayed_since_spool += 1
        self._replay_probe = False
        self._replay_failures = self._replay_backoff = 0
        self._ledger.update_idle()
        self._wakeup.set()

    def _on_replay_failed(self, seq: int, msg: WireMessage, error: BaseException) -> None:
        link = self._link
        if self._replay_probe and link.connected and not isinstance(error, nats.js.errors.NoStreamResponseError):
            self._replay_failures += 1
        # A record the broker refuses, or that fails alone on a live link again and again (nats-py
        # turns JetStream error replies into ack timeouts), must not block everything behind it.
        if is_permanent(error) or self._replay_failures > self.max_retries:
            if self.outbox.remove(seq):
                self._ledger.failed(msg, error)
            self._replay_failures = 0
            self._ledger.update_idle()
            self._wakeup.set()
            return
        self._ledger.note_error("outbox replay failed, will retry", msg, error)
        # No stream takes the subject (deleted, or a broker that lost its store)? Ask JetStream,
        # and make it again if so; replays wait for the answer.
        self.suspect_stream(error)
        self._abort_replays()
        self._replay_failed = True
        self._replay_backoff = min(self._replay_backoff + 1, len(RETRY_BACKOFF_S))
        self._wakeup.set()
