"""AckWindow: the durable sends that are waiting for their JetStream ack.

Every durable send, direct or replayed out of the outbox, goes through `AckWindow.send`: it
publishes with `publish_async` and keeps the ack future in a map keyed in send order, with a
timer that fails it with AckTimeoutError after `ack_timeout` s. At most `capacity` sends wait at
once; `wait_for_slot` is the back-pressure (the oldest ack, bounded by its timer, frees a slot).
When an ack or its failure arrives the send leaves the window and the `on_done` it was sent with
hears about it; `recall` takes sends back unanswered (their acks no longer count).
`silent_for` says how long sends have waited with no ack arriving at all: the link's sign of a
server that stopped answering (see link.py).
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import nats.errors
from nats.js.api import PubAck
from nats.js.client import JetStreamContext

from realtime.bus.delivery import AckTimeoutError, PublisherClosedError, WireMessage

AckCallback = Callable[["InFlight", PubAck | None, BaseException | None], None]
"""Called once per send that leaves the window by itself: (send, ack or None, error or None)."""


@dataclass(slots=True)
class InFlight:
    msg: WireMessage
    attempt: int  # 0 for the first send; retries count up
    future: asyncio.Future[PubAck]
    timer: asyncio.TimerHandle
    on_done: AckCallback
    outbox_seq: int | None = None  # set for a replay out of the outbox
    sent_at: float = 0.0  # time.monotonic() when it was handed to the connection

    @property
    def acked(self) -> bool:
        """The ack is in hand (its callback may not have run yet)."""
        future = self.future
        return future.done() and not future.cancelled() and future.exception() is None


class AckWindow:
    def __init__(self, capacity: int, ack_timeout: float) -> None:
        self.capacity = capacity
        self.ack_timeout = ack_timeout
        self._inflight: dict[int, InFlight] = {}  # insertion order == send order
        self._keys = itertools.count()
        self._answered_at = 0.0  # time.monotonic() of the last ack that arrived

    def __len__(self) -> int:
        return len(self._inflight)

    @property
    def room(self) -> int:
        return self.capacity - len(self._inflight)

    def silent_for(self, now: float) -> float:
        """Seconds the oldest waiting send has gone without any ack arriving since it was sent
        (0 when nothing waits)."""
        oldest = next(iter(self._inflight.values()), None)
        if oldest is None:
            return 0.0
        return max(0.0, now - max(oldest.sent_at, self._answered_at))

    async def wait_for_slot(self) -> None:
        # Back-pressure instead of growth: wait for the oldest ack (its timer bounds the wait).
        while len(self._inflight) >= self.capacity:
            oldest = next(iter(self._inflight.values()))
            await asyncio.wait({oldest.future})
            await asyncio.sleep(0)  # its done-callback frees the slot

    async def send(
        self,
        js: JetStreamContext,
        max_payload: int,
        msg: WireMessage,
        on_done: AckCallback,
        *,
        attempt: int = 0,
        outbox_seq: int | None = None,
        still_wanted: Callable[[], bool] | None = None,
    ) -> bool:
        """Publish `msg` and track its ack. Raises what publish_async raises, and nothing is
        tracked then. If `still_wanted()` says no once publish_async returned (the caller's plans
        changed while it waited), the ack is abandoned and False returned."""
        # A payload nats-py refuses would leak one of its publish_async slots: refuse it first.
        if len(msg.payload) > max_payload:
            raise nats.errors.MaxPayloadError
        # No wait_stall: nats-py's semaphore has headroom over our bound, and a wait_for per
        # message would yield to the flusher after every publish (one syscall each, 4x slower).
        future = await js.publish_async(msg.subject, msg.payload, headers=dict(msg.headers))
        if still_wanted is not None and not still_wanted():
            future.cancel()
            return False
        key = next(self._keys)
        timer = asyncio.get_running_loop().call_later(self.ack_timeout, self._expire, key)
        self._inflight[key] = InFlight(msg, attempt, future, timer, on_done, outbox_seq, time.monotonic())
        future.add_done_callback(partial(self._on_ack_done, key))
        return True

    def recall(self, pick: Callable[[InFlight], bool]) -> list[InFlight]:
        """Take the sends `pick` chooses out of the window, in send order, and stop waiting for
        their acks (their on_done is not called)."""
        recalled: list[InFlight] = []
        for key, entry in list(self._inflight.items()):
            if not pick(entry):
                continue
            del self._inflight[key]
            entry.timer.cancel()
            entry.future.cancel()
            recalled.append(entry)
        return recalled

    def fail_unanswered(self, error: BaseException) -> None:
        """Fail every ack still awaited with `error` (their on_done runs soon after)."""
        for entry in list(self._inflight.values()):
            if not entry.future.done():
                entry.future.set_exception(error)

    def _expire(self, key: int) -> None:
        entry = self._inflight.get(key)
        if entry is not None and not entry.future.done():
            entry.future.set_exception(AckTimeoutError(f"no JetStream ack within {self.ack_timeout:g} s"))

    def _on_ack_done(self, key: int, future: asyncio.Future[PubAck]) -> None:
        entry = self._inflight.pop(key, None)
        if entry is None:
            return  # recalled
        entry.timer.cancel()
        if not future.cancelled() and future.exception() is None:
            self._answered_at = time.monotonic()
        error = PublisherClosedError("ack wait cancelled") if future.cancelled() else future.exception()
        entry.on_done(entry, None if error is not None else future.result(), error)
