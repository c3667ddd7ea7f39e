"""The NATS event bus: CloudEvents encoding, the publisher (an EventSink) with its disk outbox
for outages, the subscriber, and an embedded nats-server for running without a broker."""

from realtime.bus.cloudevents import EventEncodingError, decode, encode, rfc3339, subject_for
from realtime.bus.connection import BusUnavailable
from realtime.bus.delivery import DeliveryHooks, KindStats, PublisherStats, WireMessage
from realtime.bus.embedded import EmbeddedNatsServer, NatsServerError
from realtime.bus.jetstream import DURABLE_SUBJECTS, STREAM_NAME, StreamConflictError, StreamSetupError
from realtime.bus.outbox import Outbox, OutboxLockedError, OutboxRecord, OutboxStats, OutboxWriteError
from realtime.bus.publisher import NatsEventPublisher
from realtime.bus.subscriber import subscribe

__all__ = [
    "DURABLE_SUBJECTS",
    "STREAM_NAME",
    "BusUnavailable",
    "DeliveryHooks",
    "EmbeddedNatsServer",
    "EventEncodingError",
    "KindStats",
    "NatsEventPublisher",
    "NatsServerError",
    "Outbox",
    "OutboxLockedError",
    "OutboxRecord",
    "OutboxStats",
    "OutboxWriteError",
    "PublisherStats",
    "StreamConflictError",
    "StreamSetupError",
    "WireMessage",
    "decode",
    "encode",
    "rfc3339",
    "subject_for",
    "subscribe",
]
