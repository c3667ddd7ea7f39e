"""A stream's durable events from JetStream, for event viewers that reconnect (`Last-Event-ID`).

One ephemeral ordered consumer per resume reads `vidsentry.<stream_id>.*` in the VIDSENTRY
stream from `window_s` ago up to what is stored now, and keeps the events after the given id:
at most `max_events`, the newest (older ones are counted, not kept). Scans share the publisher's
NATS connection, a few at a time, each bounded in time.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Callable, Set
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import nats.errors
import nats.js.errors
from nats.aio.client import Client as NatsClient
from nats.js.api import ConsumerConfig, DeliverPolicy

from realtime.bus.cloudevents import MSG_ID_HEADER, SUBJECT_PREFIX
from realtime.bus.jetstream import STREAM_NAME
from realtime.errors import ServiceError
from realtime.streams.fanout import SseMessage

SCAN_TIMEOUT_S = 5.0
MAX_CONCURRENT_SCANS = 4  # a reconnect storm must not open hundreds of consumers at once


class HistoryUnavailable(ServiceError):
    """JetStream cannot be read now (not connected, no stream, no answer in time)."""


@dataclass(slots=True)
class Scan:
    found: bool  # the id was among the stored events of the window
    messages: list[SseMessage] = field(default_factory=list)  # after the id, oldest first
    skipped: int = 0  # after the id but older than the newest max_events
    stored: set[str] = field(default_factory=set)  # which of the watched ids JetStream holds


class JetStreamHistory:
    def __init__(self, connection: Callable[[], NatsClient | None], *, timeout_s: float = SCAN_TIMEOUT_S) -> None:
        self._connection = connection  # the publisher's; None while it has none
        self._timeout_s = timeout_s
        self._slots = asyncio.Semaphore(MAX_CONCURRENT_SCANS)

    async def after(
        self, stream_id: str, last_id: str, *, window_s: float, max_events: int, watch: Set[str] = frozenset()
    ) -> Scan:
        """The stream's stored events after `last_id`; HistoryUnavailable when JetStream cannot say."""
        nc = self._connection()
        if nc is None or not nc.is_connected:
            raise HistoryUnavailable("not connected to NATS")
        try:
            async with asyncio.timeout(self._timeout_s), self._slots:
                return await self._scan(nc, stream_id, last_id, window_s=window_s, max_events=max_events, watch=watch)
        except TimeoutError:
            raise HistoryUnavailable(f"JetStream did not answer within {self._timeout_s:g} s") from None
        except (nats.errors.Error, nats.js.errors.Error) as exc:
            raise HistoryUnavailable(f"JetStream: {exc.__class__.__name__}") from None

    async def _scan(
        self, nc: NatsClient, stream_id: str, last_id: str, *, window_s: float, max_events: int, watch: Set[str]
    ) -> Scan:
        start = datetime.now(UTC) - timedelta(seconds=window_s)
        sub = await nc.jetstream().subscribe(
            f"{SUBJECT_PREFIX}.{stream_id}.*",
            stream=STREAM_NAME,
            ordered_consumer=True,
            deliver_policy=DeliverPolicy.BY_START_TIME,
            config=ConsumerConfig(opt_start_time=start),
        )
        scan = Scan(found=False)
        kept: deque[SseMessage] = deque(maxlen=max(max_events, 1))
        after = 0
        try:
            info = await sub.consumer_info()
            if info.num_pending == 0 and (info.delivered is None or info.delivered.consumer_seq == 0):
                return scan  # nothing stored in the window
            while True:
                msg = await sub.next_msg(timeout=self._timeout_s)
                headers = msg.headers or {}
                event_id = headers.get("ce-id") or headers.get(MSG_ID_HEADER)
                if event_id is not None and event_id in watch:
                    scan.stored.add(event_id)
                if scan.found:
                    after += 1
                    kind = msg.subject.rsplit(".", 1)[-1]
                    kept.append(SseMessage(kind, msg.data.decode("utf-8", "replace"), id=event_id))
                elif event_id == last_id:
                    scan.found = True
                if msg.metadata.num_pending == 0:
                    break  # caught up with what was stored when the consumer started
        finally:
            with contextlib.suppress(Exception):  # the consumer is ephemeral; the server drops it anyway
                await sub.unsubscribe()
        if max_events == 0:
            kept.clear()
        scan.messages = list(kept)
        scan.skipped = after - len(kept)
        return scan
