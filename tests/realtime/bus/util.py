"""Small helpers for bus tests: events, an inspecting client, bounded waits."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import nats
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.js.api import RawStreamMsg
from nats.js.client import JetStreamContext
from nats.js.errors import NotFoundError

from pipelines.events import Event, EventKind, EventSink
from realtime.bus.connection import round_trip
from realtime.bus.jetstream import STREAM_NAME
from tests.support.bodies import any_event


def event(kind: EventKind, stream_id: str = "cam1", **data: object) -> Event:
    pts = None if kind is EventKind.STATUS else 1.25
    return any_event(kind, stream_id, dict(data) or {"n": 1}, pts=pts)


@dataclass
class Inspector:
    """A plain client that sees what went over the wire and what JetStream stored."""

    nc: NatsClient
    js: JetStreamContext
    live: list[Msg] = field(default_factory=list)

    async def stored_count(self) -> int:
        try:
            info = await self.js.stream_info(STREAM_NAME)
        except NotFoundError:
            return 0
        return int(info.state.messages)

    async def stored(self) -> list[RawStreamMsg]:
        info = await self.js.stream_info(STREAM_NAME)
        first, last = info.state.first_seq, info.state.last_seq
        if not info.state.messages:
            return []
        return [await self.js.get_msg(STREAM_NAME, seq) for seq in range(first, last + 1)]


@asynccontextmanager
async def inspector(url: str, subject: str = "vidsentry.>") -> AsyncIterator[Inspector]:
    nc = await nats.connect(url, connect_timeout=2, max_reconnect_attempts=-1, reconnect_time_wait=0.1)
    insp = Inspector(nc, nc.jetstream())

    async def collect(msg: Msg) -> None:
        insp.live.append(msg)

    await nc.subscribe(subject, cb=collect)
    await round_trip(nc)
    try:
        yield insp
    finally:
        await nc.close()




async def camera(
    pub: EventSink,
    stream: str,
    stop: asyncio.Event,
    produced: list[str],
    *,
    rate: float,
    next_event: Callable[[str, int], Event],
    with_detections: bool = False,
) -> None:
    """One stream's pipeline: durable events in order at `rate` a second (their ids appended to
    `produced`), each followed by a live detections event when asked, until `stop` is set."""
    loop = asyncio.get_running_loop()
    due = loop.time()
    for i in itertools.count():
        if stop.is_set():
            return
        ev = next_event(stream, i)
        await pub.publish(ev)
        produced.append(ev.id)
        if with_detections:
            await pub.publish(event(EventKind.DETECTIONS, stream))
        due += 1 / rate
        await asyncio.sleep(max(0.0, due - loop.time()))
