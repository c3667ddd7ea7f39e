"""The DataChannel sender: bounded by the channel's own buffer, stale boxes replaced, alerts kept."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest
from pyee.asyncio import AsyncIOEventEmitter

from pipelines.events import Event, EventKind
from realtime.streams.fanout import EventFanout
from realtime.webrtc.channel import EventChannel
from tests.support.bodies import any_event


class FakeDataChannel(AsyncIOEventEmitter):
    """aiortc's RTCDataChannel surface the sender uses: readyState, bufferedAmount, send, events.
    The test plays the network: `drain` empties the buffer and emits bufferedamountlow as aiortc does."""

    def __init__(self) -> None:
        super().__init__()
        self.readyState = "connecting"
        self.bufferedAmount = 0
        self.bufferedAmountLowThreshold = 0
        self.sent: list[dict[str, Any]] = []

    def send(self, data: str) -> None:
        self.sent.append(json.loads(data))
        self.bufferedAmount += len(data)

    def open(self) -> None:
        self.readyState = "open"
        self.emit("open")

    def drain(self) -> None:
        self.bufferedAmount = 0
        self.emit("bufferedamountlow")


class NullSink:
    async def publish(self, event: Event) -> None:
        return None


def event(kind: EventKind, n: int, captured_at: float | None = None) -> Event:
    return any_event(kind, "s1", {"n": n}, pts=n / 10, captured_at=captured_at or time.time())


async def offer_all(channel: EventChannel, events: list[Event]) -> None:
    fanout = EventFanout(NullSink(), node="test")
    with fanout.listen("s1", channel.offer):
        for e in events:
            await fanout.publish(e)


@pytest.fixture
async def pump() -> Any:
    tasks: list[asyncio.Task[None]] = []

    def start(channel: EventChannel) -> None:
        tasks.append(asyncio.create_task(channel.run()))

    yield start
    for task in tasks:
        task.cancel()


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_messages_wrap_the_nats_body_and_detections_carry_their_lag(pump: Any) -> None:
    now = 1_700_000_000.0  # the channel's clock, fixed: the lag is the one the event carries
    channel, dc = EventChannel(max_buffered_bytes=1 << 20, clock=lambda: now), FakeDataChannel()
    channel.attach(dc)
    pump(channel)
    dc.open()
    await offer_all(channel, [event(EventKind.DETECTIONS, 1, now - 0.25), event(EventKind.TRACKS, 2)])
    await settle()
    kinds = {m["kind"]: m for m in dc.sent}
    assert set(kinds) == {"detections", "tracks"}
    assert kinds["detections"]["body"]["n"] == 1 and kinds["detections"]["body"]["stream_id"] == "s1"
    assert kinds["detections"]["lag_ms"] == 250.0
    assert "lag_ms" not in kinds["tracks"]
    assert channel.stats.sent == 2 and list(channel.stats.lag_ms) == [kinds["detections"]["lag_ms"]]


async def test_a_full_buffer_keeps_only_the_newest_detections_and_every_alert(pump: Any) -> None:
    channel, dc = EventChannel(max_buffered_bytes=10), FakeDataChannel()
    channel.attach(dc)
    pump(channel)
    dc.open()
    dc.bufferedAmount = 100  # the network is slow: nothing may be sent
    events = [event(EventKind.DETECTIONS, n) for n in range(50)] + [event(EventKind.ALERTS, n) for n in range(5)]
    await offer_all(channel, events)
    await settle()
    assert dc.sent == [] and channel.depth == 6
    assert channel.stats.dropped == 49  # every detections message but the newest
    for _ in range(10):
        dc.drain()
        await settle()
    sent = [(m["kind"], m["body"]["n"]) for m in dc.sent]
    assert sent == [("alerts", n) for n in range(5)] + [("detections", 49)]


async def test_past_max_pending_non_critical_events_go_first(pump: Any) -> None:
    channel = EventChannel(max_buffered_bytes=1 << 20, max_pending=4)
    await offer_all(channel, [event(EventKind.ALERTS, 0)] + [event(EventKind.TRACKS, n) for n in range(1, 6)])
    # No channel yet: the alert waits, the oldest tracks events made room.
    assert channel.depth == 4 and channel.stats.dropped == 2 and channel.stats.lost == 0
    dc = FakeDataChannel()
    channel.attach(dc)
    pump(channel)
    dc.open()
    await settle()
    sent = [(m["kind"], m["body"]["n"]) for m in dc.sent]
    assert sent == [("alerts", 0), ("tracks", 3), ("tracks", 4), ("tracks", 5)]


async def test_a_page_that_stops_reading_alerts_is_told_to_go(pump: Any) -> None:
    stuck: list[str] = []
    channel, dc = EventChannel(max_buffered_bytes=10, max_pending=3, on_stuck=stuck.append), FakeDataChannel()
    channel.attach(dc)
    pump(channel)
    dc.open()
    dc.bufferedAmount = 100
    await offer_all(channel, [event(EventKind.ALERTS, n) for n in range(3)])
    assert stuck == []
    await offer_all(channel, [event(EventKind.ALERTS, 3)])
    assert stuck == ["the page stopped reading its events"] and channel.depth == 3


async def test_alerts_without_any_channel_are_bounded_and_counted() -> None:
    channel = EventChannel(max_buffered_bytes=10, max_pending=3)
    await offer_all(channel, [event(EventKind.ALERTS, n) for n in range(5)])
    assert channel.depth == 3 and channel.stats.lost == 2
