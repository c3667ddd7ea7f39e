"""What the publisher tracks per message, what it counts, and where failed messages go.

With an `Outbox` the publisher keeps durable messages through outages itself (in order, on
disk). `DeliveryHooks.on_undeliverable` receives what it still gives up on, already encoded:
messages the broker rejects for good, and ones neither the broker nor the outbox could take
(no outbox configured, or a full disk); `NatsEventPublisher.resend` takes them back later
(JetStream dedups on the same id). Overflow drops are counted, not handed over.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Protocol

import nats.errors
import nats.js.errors

from pipelines.events import DURABLE_KINDS, EventKind
from realtime.errors import ServiceError


@dataclass(frozen=True, slots=True)
class WireMessage:
    """One encoded event, exactly as it goes on the wire."""

    event_id: str
    kind: EventKind
    subject: str
    payload: bytes
    headers: dict[str, str]
    created_at: float  # time.monotonic() when publish() accepted it; for creation->ack delay
    severity: str | None = None  # alerts: data["severity"]; decides what an overfull outbox keeps

    @property
    def durable(self) -> bool:
        return self.kind in DURABLE_KINDS

    @property
    def stream_id(self) -> str:
        return self.subject.split(".", 2)[1]  # vidsentry.<stream_id>.<kind>


class DeliveryHooks(Protocol):
    """Called from the event loop; implementations must return quickly and never raise."""

    def on_acked(self, msg: WireMessage, delay_s: float, duplicate: bool) -> None: ...

    def on_undeliverable(self, msg: WireMessage, error: BaseException) -> None: ...


class NoHooks:
    def on_acked(self, msg: WireMessage, delay_s: float, duplicate: bool) -> None:
        return None

    def on_undeliverable(self, msg: WireMessage, error: BaseException) -> None:
        return None


# Ours, not nats-py's subclasses: callers catch these names, which must not change with the client
# library. What nats-py raises itself stays its own error (is_retryable and is_permanent read both).
class AckTimeoutError(ServiceError, TimeoutError):
    """JetStream did not acknowledge a durable publish in time (lost with a dying server?)."""


class PublisherClosedError(ServiceError):
    """A publish arrived before connect() or after close()."""


class UnconfirmedError(PublisherClosedError):
    """Given up at close() without an answer from JetStream: it may or may not have stored it."""


# Worth another try with the same Nats-Msg-Id (dedup makes the retry idempotent).
RETRYABLE_ERRORS: tuple[type[BaseException], ...] = (
    AckTimeoutError,
    nats.errors.TimeoutError,
    nats.errors.OutboundBufferLimitError,  # reconnect buffer full; may drain after reconnect
    nats.errors.ConnectionReconnectingError,
    nats.js.errors.NoStreamResponseError,  # JetStream not (yet) answering: restart, leader change
    nats.js.errors.ServiceUnavailableError,
    nats.js.errors.TooManyStalledMsgsError,
)


RETRY_BACKOFF_S = (0.25, 1.0, 4.0)
"""Waits before the 1st, 2nd and later re-sends (or replay rounds, or stream re-creations)."""


def is_retryable(error: BaseException) -> bool:
    return isinstance(error, RETRYABLE_ERRORS)


# Refused for good: sending the same bytes again cannot succeed.
_PERMANENT_ERRORS: tuple[type[BaseException], ...] = (
    nats.errors.MaxPayloadError,
    nats.errors.BadSubjectError,
    nats.errors.BadHeaderError,
    nats.js.errors.BadRequestError,
)


def is_permanent(error: BaseException) -> bool:
    return isinstance(error, _PERMANENT_ERRORS) and not is_retryable(error)


@dataclass(slots=True)
class KindStats:
    """Counts per event kind.

    Durable kinds: published == acked + failed + dropped_overflow + still in flight or queued in
    the outbox. Records an outbox brought from a previous run count in acked, failed or
    dropped_overflow, but not in published.
    Core kinds: published == sent + failed + dropped (sent is not counted separately).
    """

    published: int = 0  # accepted by publish() (encoded fine)
    acked: int = 0  # durable: stored by JetStream (duplicates included)
    duplicates: int = 0  # durable: acks that said "already stored"
    retries: int = 0  # durable: re-sends after a retryable failure
    failed: int = 0  # given up on (durable: after retries; core: the client raised)
    dropped: int = 0  # core: skipped while disconnected, on purpose (live-only data)
    spooled: int = 0  # durable: queued in the outbox instead of sent directly
    replayed: int = 0  # durable: acked after waiting in the outbox (part of acked)
    dropped_overflow: int = 0  # durable: dropped by a full outbox (oldest low-severity first)
    unconfirmed: int = 0  # durable: part of failed, given up at close without an answer (maybe stored)


@dataclass(slots=True)
class PublisherStats:
    kinds: dict[str, KindStats] = field(default_factory=dict)
    pending_acks: int = 0  # durable messages sent and not yet acked
    retry_backlog: int = 0  # durable messages waiting for their next attempt
    outbox_depth: int = 0  # durable messages queued on disk (in flight from there included)
    outbox_bytes: int = 0
    outbox_oldest_age_s: float = 0.0
    outbox_replayed: int = 0  # acked out of the outbox since start
    outbox_writable: bool = True  # no kind of outbox disk work is failing (see outbox_health.py)
    outbox_disk_errors: dict[str, int] = field(default_factory=dict)  # by kind: append, remove, delete, ...
    connected: bool = False
    alive: bool = True  # no background task (retries, outbox replay, stream re-creation) has died
    task_failures: int = 0  # background tasks that died with an exception
    disconnects: int = 0
    reconnects: int = 0
    stream_ready: bool = False  # connected and the VIDSENTRY stream is known to take durable events
    stream_checks: int = 0  # STREAM.INFO checks after a (re)connect or a durable send without an ack
    silence_pings: int = 0  # PINGs sent because durable sends waited a second with no ack arriving
    stream_recreations: int = 0  # the stream was found missing (deleted, broker lost its store) and made again
    last_error: str | None = None

    def kind(self, kind: EventKind | str) -> KindStats:
        key = EventKind(kind).value
        if key not in self.kinds:
            self.kinds[key] = KindStats()
        return self.kinds[key]

    def snapshot(self) -> PublisherStats:
        copy = dataclasses.replace(self)
        copy.kinds = {k: dataclasses.replace(v) for k, v in self.kinds.items()}
        copy.outbox_disk_errors = dict(self.outbox_disk_errors)
        return copy

    def totals(self) -> KindStats:
        total = KindStats()
        for stats in self.kinds.values():
            for f in dataclasses.fields(KindStats):
                setattr(total, f.name, getattr(total, f.name) + getattr(stats, f.name))
        return total
