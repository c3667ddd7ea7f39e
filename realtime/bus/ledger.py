"""DeliveryLedger: what became of each durable message, who hears about it, and when all are settled.

It keeps the publisher's counters (`PublisherStats`), calls the `DeliveryHooks` for acked and
undeliverable messages, counts the durable messages accepted and neither acked nor given up
(plus whatever still waits on disk, through `queued`) so flush() knows when everything is
settled, and logs each distinct transport failure once per connection instead of thousands of
times during an outage.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from nats.js.api import PubAck

from pipelines.tasks import describe_error
from realtime.bus.delivery import DeliveryHooks, PublisherStats, UnconfirmedError, WireMessage

log = logging.getLogger(__name__)

_MAX_LOGGED_ERRORS = 64


class DeliveryLedger:
    def __init__(self, hooks: DeliveryHooks, queued: Callable[[], int] | None = None) -> None:
        self.hooks = hooks
        self.stats = PublisherStats()
        self._queued = queued  # durable messages waiting elsewhere (the outbox) to be sent
        self._unsettled = 0  # durable messages accepted and neither acked nor given up
        self.idle = asyncio.Event()
        self.idle.set()
        self._logged_errors: set[str] = set()  # distinct failure lines logged since the last reconnect

    # -- settling -------------------------------------------------------------------------------

    def accept(self) -> None:
        """One more durable message on its way (until settle())."""
        self._unsettled += 1
        self.idle.clear()

    def settle(self) -> None:
        """One accepted message is acked, given up, or handed to the outbox."""
        self._unsettled = max(0, self._unsettled - 1)
        self.update_idle()

    def update_idle(self) -> None:
        if self._unsettled == 0 and (self._queued is None or self._queued() == 0):
            self.idle.set()
        else:
            self.idle.clear()

    # -- outcomes -------------------------------------------------------------------------------

    def acked(self, msg: WireMessage, ack: PubAck, *, replayed: bool = False) -> None:
        stats = self.stats.kind(msg.kind)
        stats.acked += 1
        stats.replayed += replayed
        stats.duplicates += bool(ack.duplicate)
        try:
            self.hooks.on_acked(msg, time.monotonic() - msg.created_at, bool(ack.duplicate))
        except Exception:
            log.exception("DeliveryHooks.on_acked raised")

    def failed(self, msg: WireMessage, error: BaseException) -> None:
        """Count `msg` as undeliverable and hand it to the hooks (it does not settle it)."""
        stats = self.stats.kind(msg.kind)
        stats.failed += 1
        stats.unconfirmed += isinstance(error, UnconfirmedError)
        self.note_error("durable event undeliverable", msg, error)
        log.debug("undeliverable kind=%s id=%s error=%r", msg.kind.value, msg.event_id, error)
        try:
            self.hooks.on_undeliverable(msg, error)
        except Exception:
            log.exception("DeliveryHooks.on_undeliverable raised")

    def give_up(self, msg: WireMessage, error: BaseException) -> None:
        """An accepted message is undeliverable: failed() and settle()."""
        self.failed(msg, error)
        self.settle()

    # -- error lines ----------------------------------------------------------------------------

    def note_error(self, what: str, msg: WireMessage, error: BaseException) -> None:
        self.stats.last_error = f"{msg.kind.value}: {describe_error(error)}"
        self.log_error_once(f"{what} kind={msg.kind.value}: {describe_error(error)}")

    def log_error_once(self, line: str) -> None:
        # An outage fails thousands of publishes the same way: log each distinct failure once.
        if line in self._logged_errors:
            log.debug("%s", line)
            return
        if len(self._logged_errors) >= _MAX_LOGGED_ERRORS:
            self._logged_errors.clear()
        self._logged_errors.add(line)
        log.warning("%s", line)

    def forget_logged_errors(self) -> None:
        """After a reconnect: the next outage's failures deserve a line again."""
        self._logged_errors.clear()


