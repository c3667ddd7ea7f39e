"""RetryingDelivery: durable delivery without an outbox.

A send that fails in a way worth retrying (see `is_retryable`) is re-sent with the same
Nats-Msg-Id (JetStream drops the copy it may already have) after a back-off, up to
`max_retries` times; the backlog of retries is bounded by the ack window's capacity. What cannot
be retried, or has run out of tries, is handed to `DeliveryHooks.on_undeliverable`. During an
outage nats-py's reconnect buffer holds what was sent, and retries wait for the reconnect.

Retries also wait while the link checks or re-creates the stream (`BusLink.stream_ready`), so
they are not spent on a stream that is not there. When the stream was missing, every direct send
still waiting for its ack went nowhere: it joins the retries at once instead of waiting out its
ack timeout. Nothing is dropped silently: what does not fit the retry backlog, or runs out of
tries, is counted in `failed` and handed to the hooks.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from dataclasses import dataclass

from pipelines.tasks import TaskOwner, wait_set
from realtime.bus.ack_window import AckWindow
from realtime.bus.delivery import (
    RETRY_BACKOFF_S,
    AckTimeoutError,
    PublisherStats,
    UnconfirmedError,
    WireMessage,
    is_retryable,
)
from realtime.bus.durable import DurableDelivery
from realtime.bus.ledger import DeliveryLedger
from realtime.bus.link import BusLink


@dataclass(slots=True)
class _Retry:
    msg: WireMessage
    attempt: int
    not_before: float  # time.monotonic()


class RetryingDelivery(DurableDelivery):
    keeps_durable_events_in = "in memory"

    def __init__(
        self, *, link: BusLink, window: AckWindow, ledger: DeliveryLedger, supervisor: TaskOwner, max_retries: int
    ) -> None:
        super().__init__(link=link, window=window, ledger=ledger, supervisor=supervisor, max_retries=max_retries)
        self._retries: deque[_Retry] = deque()
        self._wakeup = asyncio.Event()

    def start(self) -> None:
        self._supervisor.spawn(self._run_retries(), name="nats-publisher-retries")

    def _on_send_failed(self, msg: WireMessage, attempt: int, error: BaseException) -> None:
        can_retry = (
            is_retryable(error)
            and attempt < self.max_retries
            and not self._link.closed
            and len(self._retries) < self._window.capacity
        )
        if not can_retry:
            self._ledger.give_up(msg, error)
            return
        self._ledger.note_error("durable publish failed, will retry", msg, error)
        backoff = RETRY_BACKOFF_S[min(attempt, len(RETRY_BACKOFF_S) - 1)]
        self._retries.append(_Retry(msg, attempt + 1, time.monotonic() + backoff))
        self._wakeup.set()

    async def _run_retries(self) -> None:
        while True:
            self._wakeup.clear()
            head = self._retries[0] if self._retries else None
            if head is None or not self._link.durable_ready:
                # While disconnected nats-py already buffers the first copy: hold retries until
                # the reconnect, and until the stream answers (the backlog is bounded by
                # max_pending_acks).
                await self._wakeup.wait()
                continue
            delay = head.not_before - time.monotonic()
            if delay > 0:
                await wait_set(self._wakeup, delay)
                continue
            self._retries.popleft()
            self._ledger.stats.kind(head.msg.kind).retries += 1
            await self.send_direct(head.msg, head.attempt)

    def on_reconnected(self) -> None:
        now = time.monotonic()
        for retry in self._retries:  # success is likely now: skip the rest of the back-off
            retry.not_before = min(retry.not_before, now)
        self._wakeup.set()

    def on_stream_ready(self) -> None:
        self._wakeup.set()

    def on_stream_lost(self) -> None:
        recalled = self._window.recall(lambda entry: entry.outbox_seq is None and not entry.acked)
        now = time.monotonic()
        for entry in recalled:
            if self._link.closed or len(self._retries) >= self._window.capacity:
                self._ledger.give_up(entry.msg, AckTimeoutError("JetStream stream was missing; retry backlog full"))
                continue
            self._retries.append(_Retry(entry.msg, entry.attempt, now))  # the stream failed, not the send
        self._wakeup.set()

    def on_closing(self) -> None:
        while self._retries:
            retry = self._retries.popleft()
            self._ledger.give_up(retry.msg, UnconfirmedError("publisher closed before retry"))

    def add_stats(self, snap: PublisherStats) -> None:
        snap.retry_backlog = len(self._retries)
