"""A stream's status changes, in order, to the event sink, without ever blocking the source.

The source reports changes on the event loop thread; they wait in a bounded queue (a flapping
camera drops the oldest, counted) and one task publishes them as `status` events.
"""

from __future__ import annotations

import asyncio
import logging

from pipelines.event_bodies import status_event
from pipelines.events import EventSink
from pipelines.frames import StatusChange
from pipelines.tasks import cancel_and_wait

log = logging.getLogger(__name__)

STATUS_QUEUE_LIMIT = 256


class StatusRelay:
    def __init__(self, stream_id: str, sink: EventSink, *, source: str, limit: int = STATUS_QUEUE_LIMIT) -> None:
        self.stream_id = stream_id
        self._sink = sink
        self._source = source
        self._queue: asyncio.Queue[StatusChange] = asyncio.Queue(limit)
        self.dropped = 0

    def offer(self, change: StatusChange) -> None:
        if self._queue.full():
            self._queue.get_nowait()
            self._queue.task_done()
            self.dropped += 1
        self._queue.put_nowait(change)

    @property
    def depth(self) -> int:
        return self._queue.qsize()

    async def run(self) -> None:
        """Publish until cancelled; `drain()` first lets everything queued out."""
        while True:
            change = await self._queue.get()
            try:
                await self._sink.publish(status_event(change, source=self._source))
            except Exception as exc:
                log.warning("status publish failed", extra={"stream_id": self.stream_id, "error": repr(exc)})
            finally:
                self._queue.task_done()

    async def drain_and_stop(self, task: asyncio.Task[None]) -> None:
        """Let everything queued out, then end `task` (the one running `run()`); a relay task that
        died meanwhile cannot hold the stream's end up."""
        joined = asyncio.ensure_future(self._queue.join())
        await asyncio.wait({joined, task}, return_when=asyncio.FIRST_COMPLETED)
        joined.cancel()
        await cancel_and_wait(task)
