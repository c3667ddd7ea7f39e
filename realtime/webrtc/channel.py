"""A session's events, sent to its browser over the DataChannel the page opened, bounded.

Each message is `{"kind": <event kind>, "body": <the NATS body>}`; a `detections` message also
carries `lag_ms`, the time from the frame reaching the service to the message being handed to
the channel. The channel's own send buffer (`bufferedAmount`) is watched: above the limit,
nothing is sent and events wait here. Waiting `detections` and `partials` are replaced by newer
ones (only the newest frame's boxes and the newest tentative text are worth showing; each replaced
one is counted as dropped); other kinds
wait in order, at most `max_pending`, the oldest non-critical ones going first. Alerts and
captions are never dropped for a page that reads: when only they are left and there is still
no room, the page has stopped reading and the session is ended (`on_stuck`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pipelines.events import Delivery, Event, EventKind, kinds_where
from realtime.streams.fanout import SseMessage

log = logging.getLogger(__name__)

LATEST_ONLY = kinds_where(delivery=Delivery.LATEST)
CRITICAL = kinds_where(delivery=Delivery.CRITICAL)
LAG_WINDOW = 2048


@dataclass(slots=True)
class ChannelStats:
    sent: int = 0
    dropped: int = 0  # stale detections replaced, and non-critical events past max_pending
    lost: int = 0  # critical events dropped because no channel ever opened to take them
    lag_ms: deque[float] = field(default_factory=lambda: deque(maxlen=LAG_WINDOW))


class EventChannel:
    def __init__(
        self,
        *,
        max_buffered_bytes: int,
        max_pending: int = 512,
        on_stuck: Callable[[str], None] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.max_buffered_bytes = max_buffered_bytes
        self._clock = clock  # wall-clock seconds, as events' captured_at (a test drives its own)
        self.max_pending = max_pending
        self.stats = ChannelStats()
        self._on_stuck = on_stuck
        self._channel: Any = None  # aiortc RTCDataChannel, once the page's channel arrives
        self._pending: deque[tuple[Event, SseMessage]] = deque()
        self._latest: dict[EventKind, tuple[Event, SseMessage]] = {}
        self._wake = asyncio.Event()

    def attach(self, channel: Any) -> None:
        """The page's DataChannel (aiortc `RTCDataChannel`); sending starts once it is open."""
        self._channel = channel
        channel.bufferedAmountLowThreshold = self.max_buffered_bytes // 2
        channel.on("open", self._wake.set)
        channel.on("bufferedamountlow", self._wake.set)
        self._wake.set()

    @property
    def attached(self) -> bool:
        return self._channel is not None

    @property
    def depth(self) -> int:
        return len(self._pending) + len(self._latest)

    def offer(self, event: Event, message: SseMessage) -> None:
        """A fan-out listener: called on the event loop for each of the stream's events."""
        kind = EventKind(event.kind)
        if kind in LATEST_ONLY:
            if self._latest.pop(kind, None) is not None:
                self.stats.dropped += 1
            self._latest[kind] = (event, message)
        else:
            if len(self._pending) >= self.max_pending:
                self._make_room()
            self._pending.append((event, message))
        self._wake.set()

    def _make_room(self) -> None:
        for index, (queued, _) in enumerate(self._pending):
            if EventKind(queued.kind) not in CRITICAL:
                del self._pending[index]
                self.stats.dropped += 1
                return
        self._pending.popleft()
        if self._is_open():
            self.stats.dropped += 1
            if self._on_stuck is not None:
                self._on_stuck("the page stopped reading its events")
        else:
            self.stats.lost += 1

    def _is_open(self) -> bool:
        return self._channel is not None and self._channel.readyState == "open"

    async def run(self) -> None:
        """Send what waits whenever the channel has room; runs until cancelled."""
        while True:
            await self._wake.wait()
            self._wake.clear()
            self.flush()

    def flush(self) -> None:
        channel = self._channel
        while self._is_open() and channel.bufferedAmount < self.max_buffered_bytes:
            if self._pending:
                event, message = self._pending.popleft()
            elif self._latest:
                _, (event, message) = self._latest.popitem()
            else:
                return
            channel.send(self._encode(event, message))
            self.stats.sent += 1

    def _encode(self, event: Event, message: SseMessage) -> str:
        # The body is already JSON (encoded once for every viewer): wrap it, never re-encode it.
        if event.kind == EventKind.DETECTIONS:
            lag_ms = round((self._clock() - event.captured_at) * 1000, 1)
            self.stats.lag_ms.append(lag_ms)
            return f'{{"kind":"{message.event}","lag_ms":{lag_ms},"body":{message.data}}}'
        return f'{{"kind":"{message.event}","body":{message.data}}}'
