"""A tee in front of the NATS publisher that also hands each stream's events to live viewers.

Pipelines publish into `EventFanout` exactly as into the publisher. After the publisher has
accepted an event, every viewer watching that stream gets a copy, encoded once as the same
JSON body NATS carries. A viewer is a bounded queue: a slow viewer loses its oldest events
(counted) and never slows the pipeline or the other viewers.

The number of viewers is bounded too, per stream and in total: each one costs a queue of
up to `queue_limit` encoded events and an open connection. Past either bound `watch` raises
`ViewerLimitReached` before anything is registered (counted in `rejected`).

Resuming: the SSE id of every event is the point a reconnecting viewer resumes from, the ce-id
of the stream's latest durable event (a durable event's own; for a live-only one, the durable
event before it), so `Last-Event-ID` always names an event JetStream keeps. The last
`RECENT_DURABLE` durable events of each stream stay here too, to splice a replay from JetStream
onto the live events without a gap: those the broker has not stored yet (acks in flight, an
outage) are still found here.

The start events of a stream's alerts still open (no end yet) are kept as well, at most
`MAX_OPEN_ALERTS` per stream (the oldest forgotten first, counted): a viewer that joins mid-alert
learns of it at once instead of at its end.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TypeVar

from pipelines.event_bodies import AlertBody
from pipelines.events import Event, EventSink
from pipelines.tasks import wait_set
from realtime.bus import cloudevents
from realtime.errors import LimitReached, ServiceError

log = logging.getLogger(__name__)
T = TypeVar("T")

RECENT_DURABLE = 64  # durable events kept per stream for resuming viewers
MAX_OPEN_ALERTS = 256  # open alerts' start events kept per stream for joining viewers


@dataclass(frozen=True, slots=True)
class SseMessage:
    """One server-sent event: `id` is the event's ce-id; `resume_id`, when set, goes on the wire
    instead (a live-only event carries the id of the durable event before it; "" sends none)."""

    event: str
    data: str
    id: str | None = None
    resume_id: str | None = None

    def encode(self) -> bytes:
        shown = self.id if self.resume_id is None else self.resume_id
        # No id line rather than an empty one: an empty id would reset the viewer's Last-Event-ID.
        lines = [f"id: {shown}"] if shown else []
        lines.append(f"event: {self.event}")
        # A data value may not contain raw newlines; each line becomes its own data field.
        lines += [f"data: {line}" for line in self.data.split("\n")]
        return ("\n".join(lines) + "\n\n").encode("utf-8")


# Called on the event loop with each event of one stream and its encoded message; must not block.
Listener = Callable[[Event, SseMessage], None]


def _unregister(table: dict[str, set[T]], stream_id: str, member: T) -> None:
    """Take one viewer or listener off a stream; a stream with none left leaves the table."""
    members = table.get(stream_id)
    if members is not None:
        members.discard(member)
        if not members:
            del table[stream_id]


class ViewerClosed(ServiceError):
    """The viewer was closed and everything queued has been taken."""


class ViewerLimitReached(LimitReached):
    """No room for another viewer; `setting` is the config key of the bound that was hit."""


class Viewer:
    """One client's bounded queue of a stream's events (drop-oldest)."""

    def __init__(self, stream_id: str, limit: int) -> None:
        if limit < 1:
            raise ValueError("limit must be >= 1")
        self.stream_id = stream_id
        self.limit = limit
        self.dropped = 0
        self._queue: deque[SseMessage] = deque()
        self._ready = asyncio.Event()
        self._closed = False

    def offer(self, message: SseMessage) -> None:
        if self._closed:
            return
        if len(self._queue) >= self.limit:
            self._queue.popleft()
            self.dropped += 1
        self._queue.append(message)
        self._ready.set()

    def close(self) -> None:
        self._closed = True
        self._ready.set()

    @property
    def depth(self) -> int:
        return len(self._queue)

    async def next(self, wait_s: float) -> SseMessage | None:
        """The oldest queued event; None if none came within `wait_s` (time for a heartbeat).
        Raises ViewerClosed once closed and drained, so final events still reach the client."""
        if not self._queue:
            if self._closed:
                raise ViewerClosed
            self._ready.clear()
            await wait_set(self._ready, wait_s)
        if self._queue:
            return self._queue.popleft()
        if self._closed:
            raise ViewerClosed
        return None


class EventFanout:
    """An EventSink: forwards to `sink`, then offers the event to the stream's viewers."""

    def __init__(
        self,
        sink: EventSink,
        *,
        node: str,
        queue_limit: int = 256,
        max_viewers_per_stream: int = 16,
        max_viewers: int = 256,
        taps: tuple[Callable[[Event], None], ...] = (),
    ) -> None:
        if max_viewers_per_stream < 1 or max_viewers < 1:
            raise ValueError("viewer limits must be >= 1")
        self._sink = sink
        self._taps = taps  # see every event of every stream (the caption store)
        self._node = node
        self._queue_limit = queue_limit
        self.max_viewers_per_stream = max_viewers_per_stream  # http.sse_max_viewers_per_stream
        self.max_viewers = max_viewers  # http.sse_max_viewers
        self._viewers: dict[str, set[Viewer]] = {}
        # In-process consumers (a browser session's DataChannel): bounded by their owners, not here.
        self._listeners: dict[str, set[Listener]] = {}
        self._recent: dict[str, deque[Event]] = {}  # per stream, newest last; dropped with the stream
        self._open_alerts: dict[str, OrderedDict[str, Event]] = {}  # per stream, by alert id, oldest first
        self.open_alerts_forgotten = 0  # open alerts past MAX_OPEN_ALERTS (monotonic)
        self._closed = False
        self.dropped_by_gone_viewers = 0  # drops of viewers that have since left, for a monotonic total
        self.rejected = 0  # viewers refused by either limit (monotonic)

    async def publish(self, event: Event) -> None:
        await self._sink.publish(event)
        for tap in self._taps:
            tap(event)
        if event.durable:
            self._recent.setdefault(event.stream_id, deque(maxlen=RECENT_DURABLE)).append(event)
        if isinstance(event.body, AlertBody):
            self._track_alert(event, event.body)
        viewers = self._viewers.get(event.stream_id)
        listeners = self._listeners.get(event.stream_id)
        if not viewers and not listeners:
            return
        message = self.message(event)  # encoded once for every viewer and listener
        for viewer in viewers or ():
            viewer.offer(message)
        for listener in list(listeners or ()):
            try:
                listener(event, message)
            except Exception:  # one consumer's bug must not cost the stream its events
                log.exception("event listener raised", extra={"stream_id": event.stream_id})

    def message(self, event: Event) -> SseMessage:
        """The event as viewers get it: the same body as on NATS (published_at differs by microseconds)."""
        payload, headers = cloudevents.encode(event, self._node, time.time())
        resume_id = None
        if not event.durable:
            recent = self._recent.get(event.stream_id)
            resume_id = recent[-1].id if recent else ""
        data = payload.decode("utf-8")
        return SseMessage(event=event.kind.value, data=data, id=headers["ce-id"], resume_id=resume_id)

    def _track_alert(self, event: Event, body: AlertBody) -> None:
        if body.event == "start":
            started = self._open_alerts.setdefault(event.stream_id, OrderedDict())
            started[body.alert_id] = event
            if len(started) > MAX_OPEN_ALERTS:
                started.popitem(last=False)
                self.open_alerts_forgotten += 1
        elif (opened := self._open_alerts.get(event.stream_id)) is not None:
            opened.pop(body.alert_id, None)
            if not opened:
                del self._open_alerts[event.stream_id]

    def open_alerts(self, stream_id: str) -> list[Event]:
        """The start events of the stream's alerts without an end yet, oldest first."""
        return list(self._open_alerts.get(stream_id, {}).values())

    def recent(self, stream_id: str) -> list[Event]:
        """The stream's last durable events the publisher accepted, oldest first (at most RECENT_DURABLE)."""
        return list(self._recent.get(stream_id, ()))

    @contextlib.contextmanager
    def watch(self, stream_id: str) -> Iterator[Viewer]:
        """A viewer of `stream_id` for the duration of the block (closed at once after close()).

        ViewerLimitReached on entering when the stream or the service has no room for another viewer."""
        self._check_room(stream_id)
        viewer = Viewer(stream_id, self._queue_limit)
        if self._closed:
            viewer.close()
        self._viewers.setdefault(stream_id, set()).add(viewer)
        try:
            yield viewer
        finally:
            _unregister(self._viewers, stream_id, viewer)
            self.dropped_by_gone_viewers += viewer.dropped

    @contextlib.contextmanager
    def listen(self, stream_id: str, listener: Listener) -> Iterator[None]:
        """Call `listener` with every event of `stream_id` for the duration of the block."""
        self._listeners.setdefault(stream_id, set()).add(listener)
        try:
            yield
        finally:
            _unregister(self._listeners, stream_id, listener)

    def _check_room(self, stream_id: str) -> None:
        if self.viewers_of(stream_id) >= self.max_viewers_per_stream:
            self.rejected += 1
            limit = self.max_viewers_per_stream
            raise ViewerLimitReached(
                f"viewer limit reached: {limit} viewers of stream {stream_id!r} (http.sse_max_viewers_per_stream)",
                limit=limit,
                setting="http.sse_max_viewers_per_stream",
            )
        if self.viewer_count >= self.max_viewers:
            self.rejected += 1
            raise ViewerLimitReached(
                f"viewer limit reached: {self.max_viewers} viewers in total (http.sse_max_viewers)",
                limit=self.max_viewers,
                setting="http.sse_max_viewers",
            )

    def close_stream(self, stream_id: str) -> None:
        """The stream is gone: its viewers get what is queued, then their responses end."""
        self._recent.pop(stream_id, None)
        self._open_alerts.pop(stream_id, None)
        for viewer in self._viewers.get(stream_id, ()):
            viewer.close()

    def close(self) -> None:
        self._closed = True
        for viewers in self._viewers.values():
            for viewer in viewers:
                viewer.close()

    @property
    def viewer_count(self) -> int:
        return sum(len(v) for v in self._viewers.values())

    def viewers_of(self, stream_id: str) -> int:
        """Event viewers of one stream now."""
        return len(self._viewers.get(stream_id, ()))

    @property
    def dropped_total(self) -> int:
        live = sum(v.dropped for viewers in self._viewers.values() for v in viewers)
        return self.dropped_by_gone_viewers + live
