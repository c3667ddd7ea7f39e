"""DurableDelivery: how a durable message gets from publish() to a JetStream ack.

Both delivery modes send straight to JetStream while they can: `send_direct` waits for a slot
in the `AckWindow`, publishes, and settles the message when its ack arrives. They differ in what
happens otherwise, which is what a subclass fills in:

  RetryingDelivery (retrying.py)  no outbox: retryable failures are re-sent after a back-off,
                                  then given up on (DeliveryHooks.on_undeliverable)
  SpoolingDelivery (spooling.py)  with an outbox: while the link is down, or after a retryable
                                  failure, durable events wait on disk and are replayed in order

A send on a live link that gets no ack in time, or "no responders", may mean the stream is gone
(see link.py): both modes ask the link to check it (`suspect_stream`), and when it was missing
`on_stream_lost` hands them back every send still waiting for its ack, to send again.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import nats.js.errors
from nats.aio.client import Client as NatsClient
from nats.js.api import PubAck

from pipelines.tasks import TaskOwner
from realtime.bus.ack_window import AckWindow, InFlight
from realtime.bus.delivery import AckTimeoutError, PublisherClosedError, PublisherStats, WireMessage
from realtime.bus.ledger import DeliveryLedger
from realtime.bus.link import BusLink


class DurableDelivery(ABC):
    keeps_durable_events_in: str  # for the disconnect log line: "in memory", "in the outbox"

    def __init__(
        self,
        *,
        link: BusLink,
        window: AckWindow,
        ledger: DeliveryLedger,
        supervisor: TaskOwner,
        max_retries: int,
    ) -> None:
        self.max_retries = max_retries
        self._link = link
        self._window = window
        self._ledger = ledger
        self._supervisor = supervisor

    # -- what publish() calls -----------------------------------------------------------------

    async def publish(self, msg: WireMessage) -> None:
        """Deliver one durable message (counted as published already)."""
        self._ledger.accept()
        await self.send_direct(msg, attempt=0)

    async def send_direct(self, msg: WireMessage, attempt: int) -> None:
        """Send an accepted message to JetStream now and settle it when the ack arrives."""
        await self._window.wait_for_slot()
        link = self._link
        nc, js = link.nc, link.js
        if nc is None or js is None or link.closed:
            self._ledger.give_up(msg, PublisherClosedError("publisher is not connected"))
            return
        if self._diverted(nc):
            self._divert(msg)
            return
        try:
            sent = await self._window.send(
                js, nc.max_payload, msg, self._on_direct_ack, attempt=attempt, still_wanted=self._direct_still_wanted
            )
        except Exception as exc:
            self._on_send_failed(msg, attempt, exc)
            return
        if not sent:
            self._divert(msg)

    def _on_direct_ack(self, entry: InFlight, ack: PubAck | None, error: BaseException | None) -> None:
        if error is not None:
            self.suspect_stream(error)
            self._on_send_failed(entry.msg, entry.attempt, error)
            return
        assert ack is not None
        self._ledger.settle()
        self._ledger.acked(entry.msg, ack)

    def suspect_stream(self, error: BaseException) -> None:
        """No ack in time, or no stream took the subject: have JetStream say whether the stream
        is still there (a subscriber on our subjects turns "no responders" into silence)."""
        if isinstance(error, AckTimeoutError | nats.js.errors.NoStreamResponseError):
            self._link.suspect_stream(error)

    # -- what a mode fills in -------------------------------------------------------------------

    def _diverted(self, nc: NatsClient) -> bool:
        """Whether accepted messages must go elsewhere instead of straight to JetStream now."""
        return False

    def _direct_still_wanted(self) -> bool:
        """Asked once publish_async returned: False diverts the message after all."""
        return True

    def _divert(self, msg: WireMessage) -> None:
        """Take an accepted message that cannot be sent directly (only if _diverted can say so)."""
        raise NotImplementedError

    @abstractmethod
    def _on_send_failed(self, msg: WireMessage, attempt: int, error: BaseException) -> None:
        """A direct send failed (publish_async raised, or no ack): retry, divert or give up."""

    # -- lifecycle, for the publisher -----------------------------------------------------------

    @abstractmethod
    def start(self) -> None:
        """Connected and the stream answered: start the background work."""

    def on_disconnected(self) -> None:
        return None

    def on_reconnected(self) -> None:
        return None

    def on_stream_ready(self) -> None:
        return None

    @abstractmethod
    def on_stream_lost(self) -> None:
        """The stream was missing and is made again: nothing still waiting for an ack can get
        one (it reached subscribers at most). Send it again."""

    @abstractmethod
    def on_closing(self) -> None:
        """Closed, background tasks stopped, connection not drained yet: put away what is unsent."""

    async def on_closed(self) -> None:
        """The connection is gone and every ack wait has ended."""
        return None

    @abstractmethod
    def add_stats(self, snap: PublisherStats) -> None:
        """Fill in what this mode keeps: retry backlog or outbox figures."""
